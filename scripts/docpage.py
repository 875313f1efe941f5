"""The one ending of the scripts that render a documentation page from its data
(scripts/measurements.py, scripts/bug_record.py): write the page, or with ``--check`` only say
whether the page on disk is the one the data gives."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def check_or_write(page: Path, text: str, check: bool, script: str) -> int:
    """With ``check``: 0 when ``page`` exists and its text is ``text``, else 1 after one line on
    stderr naming the page and the ``script`` that rewrites it. Without: write ``text`` to ``page``
    and return 0. ``page`` is a path, ``text`` the whole rendered page (str), ``script`` as the user
    runs it (``scripts/bug_record.py``)."""
    if check:
        if not page.exists() or page.read_text() != text:
            shown = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
            print(f"{shown} is stale: run {script}", file=sys.stderr)
            return 1
        return 0
    page.write_text(text)
    return 0

"""What the hostile-input tests share (tests/app/test_cli_hostile_inputs.py, test_cli_hostile_classes.py):
a fresh working directory per example, the assertion that ``pdrig ARGV`` was refused in one line with
exit code 2 creating nothing, and a valid config of never-started fake servers."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rig.cli import main
from tests.helpers.fake_rig import fake_config


@contextlib.contextmanager
def in_fresh_dir() -> Iterator[Path]:
    """A new empty working directory for one example (the previous one restored after)."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="pdrig-hostile-") as d:
        os.chdir(d)
        try:
            yield Path(d)
        finally:
            os.chdir(old)


def refused(argv: list[str], cwd: Path, given: set[str]) -> str:
    """Run ``pdrig ARGV`` in-process in ``cwd``; assert exit code 2, one stderr line, no traceback,
    no file in ``cwd`` but ``given`` and nothing new at ``/``. Returns the line."""
    root = set(os.listdir("/"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    text = err.getvalue()
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == 2, (argv, text)
    assert len(lines) == 1 and lines[0].startswith("pdrig"), (argv, text)
    assert "Traceback" not in text, text
    made = {str(p.relative_to(cwd)) for p in cwd.rglob("*")} - given
    assert not made, (argv, made)
    assert set(os.listdir("/")) == root, (argv, set(os.listdir("/")) - root)
    return lines[0]


def base_config(d: Path) -> dict:
    """A valid config of (never started) fake servers, with one edge scenario."""
    return fake_config(d, scenarios=[{"name": "s", "decode": "decode", "prompt_tokens": 8, "max_tokens": 1}])



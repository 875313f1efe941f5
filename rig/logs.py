"""Where an instance's log is read from: the seam between log checks and log locations.

A launched instance writes its log to a file in the run directory; a deployment the rig did not
launch (``--attach``: Docker Compose, Kubernetes, an llm-d install) keeps its logs elsewhere. The
log checks (``no-fatal-log``, ``kv-integrity``) read every instance's log through one
:class:`LogSource`, so they work the same whatever the deployment, and a source that cannot be
read makes those checks "not checked", never ok.

A source is read by *mark*: :meth:`LogSource.mark` returns the current end of the log (a
character offset into the text the source returns), and :meth:`LogSource.since` returns the text
written after a mark. Both return ``None`` when the log cannot be read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class LogSource(Protocol):
    """One instance's log. Implementations: :class:`FileLog` (launched instances, or a path given
    for an attached one); others (Compose, Kubernetes) live next to their deployment code."""

    instance: str

    def describe(self) -> str:
        """Where the log is read from, for diagnoses ('file runs/x/logs/decode.log')."""
        ...

    def mark(self) -> int | None:
        """The current end of the log as an offset usable with :meth:`since`; None if unreadable."""
        ...

    def since(self, mark: int) -> str | None:
        """The log text written after ``mark`` (decoded UTF-8, errors replaced); None if unreadable."""
        ...


@dataclass(frozen=True)
class FileLog:
    """A log file on this host; marks are byte offsets. A missing file is unreadable (None)."""

    instance: str
    path: str

    def describe(self) -> str:
        """'file <path>'."""
        return f"file {self.path}"

    def mark(self) -> int | None:
        """Size of the file in bytes, or None when it does not exist."""
        try:
            return os.path.getsize(self.path)
        except OSError:
            return None

    def since(self, mark: int) -> str | None:
        """Text from byte ``mark`` to the end, or None when the file cannot be read."""
        try:
            with open(Path(self.path), "rb") as f:
                f.seek(mark)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return None


def matching_lines(text: str, patterns: tuple[str, ...]) -> list[str]:
    """Stripped lines of ``text`` containing any of ``patterns`` (substring match)."""
    return [ln.strip() for ln in text.splitlines() if any(p in ln for p in patterns)]


# A vLLM log line's prefix: "(EngineCore pid=11661) ERROR 11-30 20:00:07 [core.py:1368] ".
_VLLM_PREFIX = re.compile(r"^(\([\w-]+ pid=\d+\) )?(\w+ \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] )?")


def first_fatal_line(text: str, patterns: tuple[str, ...]) -> str | None:
    """The first line of ``text`` matching ``patterns``, stripped; None when no line matches.

    A Python traceback header ("Traceback (most recent call last):") names nothing, so for it
    the exception line that ends that traceback is returned instead (the first later line whose
    message, after vLLM's "(Proc pid=N) LEVEL date [file:line] " prefix, is neither indented nor
    empty), e.g. "(Worker pid=11739) ERROR ... TypeError: Cannot inspect kernel parameters for
    function" in tests/data/vllm-0.30.0-decode-ngram-crash.log.
    """
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if not any(p in ln for p in patterns):
            continue
        if "Traceback (most recent call last)" not in ln:
            return ln.strip()
        for later in lines[i + 1:]:
            msg = later[_VLLM_PREFIX.match(later).end():]
            if msg.strip() and not msg[:1].isspace() and not msg.lstrip().startswith("^"):
                return later.strip()
        return ln.strip()
    return None

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
from datetime import datetime, timezone
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


# Lines the rig itself writes into a launched instance's log (rig.cluster.Cluster): where it
# started the process and where it began stopping it. What vLLM logs after a stop marker is the
# teardown the rig caused (EngineDeadError tracebacks, nanobind "leaked" lines), not a finding.
START_MARKER = "pdrig: starting"
STOP_MARKER = "pdrig: stopping"
_TEARDOWN = re.compile(rf"^{re.escape(STOP_MARKER)} .*?(?=^{re.escape(START_MARKER)} |\Z)", re.M | re.S)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def start_marker(instance: str, pid: int) -> str:
    """The line written into ``instance``'s log right after the rig spawned it (pid ``pid``)."""
    return f"{START_MARKER} {instance} (pid {pid}) at {_now()}\n"


def stop_marker(instance: str, signal_name: str = "SIGTERM") -> str:
    """The line written into ``instance``'s log right before the rig sends it ``signal_name``:
    ``pdrig: stopping decode (SIGTERM) at 2026-11-30T20:01:02+00:00``."""
    return f"{STOP_MARKER} {instance} ({signal_name}) at {_now()}\n"


def until_stop_marker(text: str) -> str:
    """``text`` without the teardown the rig caused: each section from a :func:`stop_marker`
    line up to the next :func:`start_marker` line (a restart into the same log) or the end.

    Every log check reads text through :func:`matching_lines`, which applies this cut, so a
    fatal-line scan never reports the shutdown the rig itself asked for.
    """
    return _TEARDOWN.sub("", text) if STOP_MARKER in text else text


def matching_lines(text: str, patterns: tuple[str, ...]) -> list[str]:
    """Stripped lines of ``text`` containing any of ``patterns`` (substring match), not counting
    the rig's own teardown (:func:`until_stop_marker`)."""
    return [ln.strip() for ln in until_stop_marker(text).splitlines() if any(p in ln for p in patterns)]


# A vLLM log line's prefix: "(EngineCore pid=11661) ERROR 11-30 20:00:07 [core.py:1368] ".
_VLLM_PREFIX = re.compile(r"^(\([\w-]+ pid=\d+\) )?(\w+ \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] )?")


def first_fatal_line(text: str, patterns: tuple[str, ...]) -> str | None:
    """The first line of ``text`` matching ``patterns``, stripped; None when no line matches.

    A Python traceback header ("Traceback (most recent call last):") names nothing, so for it
    the exception line that ends that traceback is returned instead (the first later line whose
    message, after vLLM's "(Proc pid=N) LEVEL date [file:line] " prefix, is neither indented nor
    empty), e.g. "(Worker pid=11739) ERROR ... TypeError: Cannot inspect kernel parameters for
    function" in tests/data/vllm-0.30.0-decode-ngram-crash.log. The rig's own teardown is
    left out (:func:`until_stop_marker`).
    """
    lines = until_stop_marker(text).splitlines()
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

"""Processes a test left behind: found by a path in their argv, waited for, killed by PID (never by
name)."""

from __future__ import annotations

import os
import signal
import time
from contextlib import suppress
from pathlib import Path


def processes_mentioning(text: str) -> dict[int, str]:
    """``{pid: cmdline}`` of live (non-zombie) processes whose cmdline contains ``text``,
    other than this test process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            out[int(entry)] = cmd.strip()
    return out


def wait_no_survivors(text: str, within_s: float) -> dict[int, str]:
    """Wait up to ``within_s`` for every process mentioning ``text`` to be gone; return the rest."""
    deadline = time.monotonic() + within_s
    while True:
        left = processes_mentioning(text)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def kill_pids(pids) -> None:
    """SIGKILL leftover processes of a failed test by PID (never by name)."""
    for pid in pids:
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def assert_no_survivors(path: Path, within_s: float) -> None:
    """Fail the test if a process mentioning ``path`` is still alive ``within_s`` seconds after
    it ended (leftovers are killed by PID first, so one leak does not spill into other tests)."""
    left = wait_no_survivors(str(path), within_s=within_s)
    kill_pids(left)
    assert left == {}, f"servers survived the test: {left}"

"""A watchdog process that kills the rig's servers if the rig dies without tearing down.

In-process teardown covers success, failure, exceptions, SIGINT and SIGTERM; it cannot run when
the rig is SIGKILLed or the interpreter crashes. For that, :class:`Reaper` starts this module
as a separate process holding the read end of a pipe. The rig writes ``add PGID`` / ``del PGID``
lines as it starts and stops process groups. When the pipe reaches EOF (the rig exited, however
it exited) the reaper sends SIGTERM to every group still registered, waits ``grace`` seconds,
then SIGKILLs what is left.

The reaper runs in its own session and ignores SIGINT/SIGTERM, so a Ctrl-C on the terminal or
a ``kill`` of the rig's process group does not take it down before it has done its job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def kill_groups(pgids: set[int], grace_s: float, reap: Callable[[], object] | None = None) -> None:
    """SIGTERM every process group in ``pgids``, wait up to ``grace_s`` seconds, SIGKILL the rest.

    ``reap`` is called while waiting: a caller whose children lead the groups passes a function
    that reaps them (``Popen.poll``). An exited but unreaped leader is a zombie that still counts
    as a group member, so without it every stop would wait the whole grace period.
    """
    for pg in pgids:
        try:
            os.killpg(pg, signal.SIGTERM)
            # A group a fault left SIGSTOPped (rig.workload.faults) only sees the SIGTERM once continued.
            os.killpg(pg, signal.SIGCONT)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        if not any(_alive(pg) for pg in pgids):
            break
        time.sleep(0.1)
    for pg in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pg, signal.SIGKILL)


def main() -> None:
    """Reaper entry point: ``python -m rig.cluster.reaper GRACE_S``; protocol on stdin (module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grace = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    groups: set[int] = set()
    for line in sys.stdin:
        op, _, arg = line.strip().partition(" ")
        if op == "add":
            groups.add(int(arg))
        elif op == "del":
            groups.discard(int(arg))
    # EOF: the rig is gone (or closed us after its own teardown, leaving nothing registered).
    kill_groups({g for g in groups if _alive(g)}, grace)


class Reaper:
    """Client side: start the watchdog and keep it informed of the rig's process groups."""

    def __init__(self, grace_s: float):
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "rig.cluster.reaper", str(grace_s)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, text=True,
        )

    def _send(self, line: str) -> None:
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # the reaper is gone; in-process teardown still runs

    def add(self, pgid: int) -> None:
        """Register a process group to kill if the rig dies."""
        self._send(f"add {pgid}")

    def remove(self, pgid: int) -> None:
        """Forget a process group the rig has stopped itself."""
        self._send(f"del {pgid}")

    def close(self) -> None:
        """Close the pipe: the reaper kills whatever is still registered, then exits."""
        if self._proc.stdin and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()


if __name__ == "__main__":
    main()

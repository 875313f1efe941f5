"""The cluster's one error: a process that could not be started, made ready or acted on.

Its own module because the cluster (rig/cluster/processes.py), the deployment backends
(rig/cluster/backends/) and the port locks (rig/cluster/ports.py) all raise it, and the backends
may not import the cluster that drives them.
"""

from __future__ import annotations


class ClusterError(RuntimeError):
    """A process could not be started or made ready; ``log_tail`` holds its last log lines,
    ``exit_code`` the code it exited with when it exited before it was ready (else None) and
    ``summary`` the message without the log tail (one line, for a verdict's reason)."""

    def __init__(self, message: str, name: str = "", log_tail: str = "", exit_code: int | None = None):
        super().__init__(message + (f"\n--- last lines of {name}'s log ---\n{log_tail}" if log_tail else ""))
        self.name = name
        self.log_tail = log_tail
        self.exit_code = exit_code
        self.summary = message

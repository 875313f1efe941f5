"""The CLI's signal handling, in a module of its own: :func:`install_signal_handlers` runs before
any command (a refusal included), so it must not import the cluster, httpx or the display
(rig.cluster.processes re-exports both names). ``INTERRUPTED`` ends start-up waits in worker
threads (rig.cluster.processes.Cluster)."""

from __future__ import annotations

import signal
import threading

# Set by the CLI's signal handlers (install_signal_handlers): stop waiting for servers to start.
INTERRUPTED = threading.Event()


def install_signal_handlers() -> None:
    """Turn SIGINT, SIGTERM and SIGHUP into KeyboardInterrupt so ``finally``/``with`` teardown runs."""
    def _raise(signum, _frame):
        INTERRUPTED.set()  # ends start-up waits in worker threads (Cluster._wait_ready)
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    INTERRUPTED.clear()

    # SIGINT too: a job started in the background by a non-interactive shell inherits SIGINT
    # as ignored, and Python then installs no KeyboardInterrupt handler of its own.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise)

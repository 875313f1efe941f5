"""One way to run the rig's asyncio code: uvloop's event loop when it is installed, else asyncio's.

uvloop (libuv) makes the wave engine's HTTP hops cheaper than asyncio's default loop
(scripts/bench_workload.py measures it; figures in docs/measurements.md). Semantics stay
asyncio's (``uvloop.run`` is ``asyncio.run`` with another loop): task cancellation behaves the
same. Ctrl-C does not quite: the CLI's handler (rig.cluster.signals) raises KeyboardInterrupt in
whatever runs when the signal lands, and when that is a uvloop transport callback
(``data_received``), uvloop reports "Fatal error on transport" and swallows it; the exploration
then went on for minutes after a Ctrl-C (measured 2026-12-03, tests/explore/test_explore_sigint.py
under load). :func:`run` raises it again once the loop is over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from rig.cluster.signals import INTERRUPTED

T = TypeVar("T")


def loop_name() -> str:
    """``"uvloop"`` when :func:`run` will use uvloop, else ``"asyncio"``."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh event loop (uvloop's when installed) and return its
    result; exceptions, including KeyboardInterrupt, propagate as from ``asyncio.run``. Raises
    KeyboardInterrupt when a signal the CLI turns into one (rig.cluster.signals.INTERRUPTED)
    arrived while the loop ran and a callback swallowed it (the coroutine then ended normally or
    with another error, chained); a run started after the signal (teardown) is left alone."""
    before = INTERRUPTED.is_set()
    try:
        result = _run(coro)
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        if not before and INTERRUPTED.is_set():
            raise KeyboardInterrupt(SWALLOWED) from e
        raise
    if not before and INTERRUPTED.is_set():
        raise KeyboardInterrupt(SWALLOWED)
    return result


SWALLOWED = "signal received while the event loop ran (a loop callback had swallowed its KeyboardInterrupt)"


def _run(coro: Coroutine[Any, Any, T]) -> T:
    if loop_name() == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)

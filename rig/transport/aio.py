"""One way to run the rig's asyncio code: uvloop's event loop when it is installed, else asyncio's.

uvloop (libuv) makes the wave engine's HTTP hops cheaper than asyncio's default loop
(scripts/bench_workload.py measures it; figures in docs/measurements.md). Semantics stay
asyncio's (``uvloop.run`` is ``asyncio.run`` with another loop): Ctrl-C and task cancellation
behave the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

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
    result; exceptions, including KeyboardInterrupt, propagate as from ``asyncio.run``."""
    if loop_name() == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)

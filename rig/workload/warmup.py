"""The warm-up before measured traffic: what `pdrig e2e` (each phase) and `pdrig up` send first.

A fresh vLLM CPU instance pays JIT compilation and first-request costs on its first request,
and the first P->D round trip pays the NIXL handshake and D's first UCX transfer (seconds on a
2-core CPU host: docs/measurements.md). Sent here, outside any deadline, stall window or wave
statistics.

On a busy host an instance's first (direct) request can outlast its deadline
(``timeouts.request_s``) while the engine is still working on it. Such a timeout is not a failure:
while the instance is alive and its processes use CPU, the request is sent again, within
``timeouts.warmup_s`` for the whole warm-up (:class:`WarmupWatch`). An instance that exits is
reported as such, at once.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from rig.transport.client import Transport
from rig.transport.endpoint import Endpoint
from rig.transport.records import Hop
from rig.workload.prompts import make_prompt

# CPU seconds an instance's processes must have used during a timed-out attempt for the
# timeout to count as "busy, not hung" (a few /proc ticks are bookkeeping, not work).
BUSY_CPU_S = 0.5


@dataclass
class WarmupWatch:
    """How a warm-up may wait: ``cpu_s(name)`` gives instance ``name``'s processes' CPU seconds
    now (None when it has exited or cannot be read), ``exit_code(name)`` its exit code (None while
    alive), ``bound_s`` the seconds the whole warm-up may spend retrying timed-out requests.
    ``retries`` counts the retries made, per instance; ``died`` the instances found exited."""

    cpu_s: Callable[[str], float | None]
    exit_code: Callable[[str], int | None]
    bound_s: float
    started: float = field(default_factory=time.monotonic)
    retries: dict[str, int] = field(default_factory=dict)
    died: dict[str, int] = field(default_factory=dict)

    def left_s(self) -> float:
        """Seconds of the bound still left."""
        return self.bound_s - (time.monotonic() - self.started)


async def _send(send: Callable[[], Awaitable[Hop]], name: str, watch: WarmupWatch | None,
                log: Callable[[str], None]) -> Hop:
    """One warm-up request to instance ``name``, re-sent after a timeout while ``watch`` says its
    instance is alive and busy (CPU used during the attempt) and the bound is not spent."""
    while True:
        before = watch.cpu_s(name) if watch is not None else None
        t = time.monotonic()
        hop = await send()
        if watch is None or not hop.error:
            return hop
        rc = watch.exit_code(name)
        if rc is not None:
            watch.died[name] = rc
            return hop
        after = watch.cpu_s(name)
        used = None if before is None or after is None else after - before
        if not hop.error.startswith("timeout") or used is None or used < BUSY_CPU_S or watch.left_s() <= 0:
            return hop
        watch.retries[name] = watch.retries.get(name, 0) + 1
        log(f"warm-up request to {name} timed out after {time.monotonic() - t:.0f} s while its processes used "
            f"{used:.1f} CPU-s (busy, not hung): sending it again ({watch.left_s():.0f} s of "
            "timeouts.warmup_s left)")


async def warm_up(client: Transport, http: httpx.AsyncClient, prefill: Endpoint, decode: Endpoint,
                  log: Callable[[str], None], watch: WarmupWatch | None = None) -> tuple[str, list[str]]:
    """One short direct request (8-token prompt, 2 tokens) to each instance, then one throw-away
    P/D round trip. Returns ``(vLLM version from decode's /version or "", names of instances
    whose direct request failed)``. Failures are logged, never raised: the measured traffic meets
    the same failure and is judged on it. With ``watch``, a direct request that timed out while
    its instance kept using CPU is sent again (module docstring; the first request of an instance
    pays its JIT and first-request costs), and an instance that exited is logged as a death
    (``watch.died``) and sent nothing more."""
    failed = []
    def direct(ep: Endpoint) -> Callable[[], Awaitable[Hop]]:
        return lambda: client.direct(ep, make_prompt(8, 7), 2)

    for ep in (prefill, decode):
        hop = await _send(direct(ep), ep.name, watch, log)
        if hop.error:
            why = f"died (exit {watch.died[ep.name]})" if watch is not None and ep.name in watch.died else "failed"
            log(f"warm-up request to {ep.name} {why}: {hop.error}")
            failed.append(ep.name)
    if watch is not None and watch.died:
        return "", failed
    # The P/D round trip is sent once: an idle vLLM CPU instance with NIXL spins anyway, and a
    # decode whose request waits forever (an admission livelock) keeps its EngineCore stepping, so
    # CPU use is no sign that a P/D request progresses; its failure is for the scenarios to meet.
    p_hop = await client.prefill(prefill, make_prompt(8, 11))
    if p_hop.kv_transfer_params:
        d_hop = await client.decode(decode, make_prompt(8, 11), 2, p_hop.kv_transfer_params)
        if d_hop.error:
            log(f"warm-up P/D request to {decode.name} failed: {d_hop.error}")
    try:
        return (await http.get(decode.url + "/version")).json().get("version", ""), failed
    except (httpx.HTTPError, ValueError):
        return "", failed

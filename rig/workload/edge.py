"""The edge workload: exact-length prompts at block and ``max_model_len`` edges, through P/D.

For each scenario the rig sends ``concurrent`` distinct prompts of exactly ``prompt_tokens``
token IDs through the two hops, while a watcher samples the decode instance's ``/metrics``
about every ``metrics_interval_s`` and feeds a :class:`~rig.observe.stall.StallWatcher`. When the
detector fires, the outstanding decode requests are cancelled (the client disconnects, so vLLM
drops them) and marked ``stalled`` with the diagnosis and the time from sending to D until the
verdict. Then each answered request is compared with a non-disaggregated reference served by
the prefill instance (:mod:`rig.observe.parity`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

import httpx

from rig.cluster.proctree import ProcSample
from rig.config import ScenarioConfig
from rig.config.request_fields import RequestFields
from rig.observe import metrics as m
from rig.observe.events import SampleEvents, trigger_of
from rig.observe.observations import ScenarioObservation, SnapshotStore
from rig.observe.parity import record_parity
from rig.observe.stall import EarlyRule, Stall, StallWatcher, watch
from rig.transport.client import Transport, cancel_task
from rig.transport.endpoint import Endpoint
from rig.transport.records import Hop, PDRecord, classify, prefill_failure
from rig.workload.prompts import make_prompt, resolve, seed_of

BetweenHops = Callable[[PDRecord], Awaitable[None]]


async def flush_prefill_pool(client: Transport, p: Endpoint, usable_blocks: int, block_size: int,
                             max_model_len: int, seed: int) -> None:
    """Send P direct (non-disaggregated) requests whose prompts together need more than its
    ``usable_blocks`` KV blocks, one after another, so every free block is allocated and written
    once: blocks P released earlier then hold other prompts' KV (units: blocks, tokens). Prompts are distinct
    ``max_model_len - 1``-token lists (no prefix-cache hits), ``max_tokens`` 1. A failed flush
    request raises nothing: the scenario's parity and kv-integrity checks show what D read."""
    tokens = max_model_len - 1
    # Only full blocks advance through the free queue: vLLM 0.32.0 appends freed blocks that
    # carry a prefix-cache hash to its tail (FIFO) and prepends partial ones to its head (LIFO,
    # reused by the very next request; v1/core/block_pool.py free_blocks). So each request takes
    # tokens // block_size fresh blocks from the head. + 3: the first requests may be scheduled
    # before the step that releases the expired blocks behind the free ones.
    per_request = max(1, tokens // block_size)
    n = -(-usable_blocks // per_request) + 3
    for k in range(n):
        await client.direct(p, make_prompt(tokens, seed + 7_000_001 + k), 1)


async def _pd_one(client: Transport, rec: PDRecord, p: Endpoint, d: Endpoint,
                  decode_tasks: dict[str, asyncio.Task], tamper_prompt: list[int] | None = None,
                  between: BetweenHops | None = None, fields: RequestFields | None = None,
                  router: Endpoint | None = None) -> None:
    fields = fields or RequestFields()
    if router is not None:
        # Through a router: one request (the decode fields: the hop that answers); the router
        # drives P and D itself and the client sees only its answer (kept as the decode hop).
        rec.decode_sent_at = time.monotonic()
        task = asyncio.create_task(client.direct(router, rec.prompt, rec.max_tokens, fields=fields.for_hop("decode"),
                                                 endpoint=fields.endpoint))
    else:
        rec.prefill = await client.prefill(p, rec.prompt, fields=fields.for_hop("prefill"), endpoint=fields.endpoint)
        failure = prefill_failure(rec.prefill)
        if failure:
            rec.outcome, rec.diagnosis = failure
            return
        if between is not None:  # e.g. hold the decode hop past P's kv_lease_duration
            await between(rec)
        rec.decode_sent_at = time.monotonic()
        if tamper_prompt is not None:
            # Negative control: D gets another prompt with P's KV. The reference (and so parity)
            # uses the prompt D was given, so wrong KV shows up as a divergence.
            rec.prompt = tamper_prompt
        task = asyncio.create_task(client.decode(d, rec.prompt, rec.max_tokens, rec.prefill.kv_transfer_params or {},
                                                 fields=fields.for_hop("decode"), endpoint=fields.endpoint))
    decode_tasks[rec.request_id] = task
    try:
        rec.decode = await task
    except asyncio.CancelledError:
        if rec.outcome == "stalled":  # the watcher cancelled it with a diagnosis
            return
        raise
    rec.verdict_after_s = time.monotonic() - rec.decode_sent_at
    rec.outcome = classify(rec.decode)
    if rec.outcome != "ok":
        rec.diagnosis = f"{'router' if router is not None else 'decode'}: {rec.decode.error or 'empty answer'}"


async def cancel_stalled(records: list[PDRecord], decode_tasks: dict[str, asyncio.Task], stall: Stall) -> None:
    """Mark every pending request whose decode hop is in flight ``stalled`` with the stall's
    diagnosis, its structured facts (``PDRecord.stall``, what a known issue's signature matches)
    and the time since it was sent to D, then cancel the hop (the client disconnects, so vLLM
    drops the request)."""
    now = time.monotonic()
    for r in records:
        task = decode_tasks.get(r.request_id)
        if r.outcome == "pending" and task is not None and not task.done():
            r.outcome, r.diagnosis, r.stall = "stalled", stall.diagnosis, stall.facts
            r.verdict_after_s = now - (r.decode_sent_at or now)
            await cancel_task(task)


async def _watch(http: httpx.AsyncClient, d: Endpoint, window_s: float, interval_s: float,
                 records: list[PDRecord], decode_tasks: dict[str, asyncio.Task],
                 store: SnapshotStore | None, scenario: str, transfer_window_s: float | None = None,
                 early: EarlyRule | None = None, engine_cpu: Callable[[], float | ProcSample | None] | None = None,
                 inconclusive_s: float = 0.0, events: SampleEvents | None = None) -> str:
    """Sample D until all requests are done (:func:`rig.observe.stall.watch`); on a stall cancel
    the outstanding decode hops and return the diagnosis ('' without a stall).

    ``window_s`` / ``transfer_window_s`` / ``early`` / ``inconclusive_s``: see
    :class:`rig.observe.stall.StallDetector`; ``engine_cpu`` reads D's process tree (or just its
    EngineCore CPU seconds) after each sample: the early rule's evidence of scheduler iterations
    (rig.judge.early_verdict) and every stall's evidence. ``events``: D is also sampled at its
    hops' events (rig.observe.events)."""
    # Fed D alone, whose pool holds only its own requests' blocks: a full pool with nothing
    # running is a stall even with nothing waiting (bug record R01, rig.observe.stall.is_blocked).
    watcher = StallWatcher(window_s, transfer_window_s=transfer_window_s, early=early, full_pool=True,
                           inconclusive_s=inconclusive_s)
    with trigger_of(events, d.name) as trigger:
        stall = await watch(watcher, lambda: m.scrape(http, d.url, d.name),
                            lambda: not any(r.outcome == "pending" for r in records), interval_s,
                            on_sample=(lambda snap: store.sample(scenario, snap)) if store else None,
                            engine_cpu=engine_cpu, trigger=trigger)
    if stall is None:
        return ""
    await cancel_stalled(records, decode_tasks, stall)
    return stall.diagnosis


async def run_edge(sc: ScenarioConfig, client: Transport, http: httpx.AsyncClient, p: Endpoint,
                   d: Endpoint, deadline_s: float, window_s: float, interval_s: float,
                   store: SnapshotStore | None, obs: ScenarioObservation,
                   transfer_window_s: float | None = None, between: BetweenHops | None = None,
                   early: EarlyRule | None = None, engine_cpu: Callable[[], float | ProcSample | None] | None = None,
                   inconclusive_s: float = 0.0, router: Endpoint | None = None,
                   scenarios: Sequence[ScenarioConfig] = (), events: SampleEvents | None = None) -> None:
    """Run one edge scenario, filling ``obs.records``, ``obs.parity`` and ``obs.stall_diagnosis``.
    With ``router`` every request is one request to that router (which drives both hops) instead
    of the rig's prefill and decode hops; the router's answer is kept as the decode hop.

    Request ``i``'s prompt follows the seed rule, or the scenario's ``same_as`` / ``head_of``
    resolved among ``scenarios`` (the run's; rig.workload.prompts.resolve).

    Each request has ``deadline_s`` seconds for both hops; past it the request is ``timeout``.
    D frozen for ``window_s`` seconds (``transfer_window_s`` while a KV read is in flight) is a
    stall: the outstanding decode hops are cancelled and marked ``stalled``. ``early`` (with
    ``engine_cpu``, rig.judge.early_verdict) may decide such a stall sooner, by reasoning; a stall whose
    evidence is inconclusive is watched ``inconclusive_s`` longer (rig.observe.stall). ``between``
    (if given) is awaited after P's answer and before the decode hop of each request. ``events``:
    D is also sampled at its hops' events (rig.observe.events), not only every ``interval_s``.
    """
    seed = sc.seed if sc.seed is not None else seed_of(sc.name)
    fields = sc.request or RequestFields()
    obs.records = [PDRecord(request_id=f"{sc.name}-{i}", prompt_len=sc.prompt_tokens, max_tokens=sc.max_tokens,
                            prompt=resolve(scenarios, sc, None, i),
                            endpoint=fields.endpoint)
                   for i in range(sc.concurrent)]
    decode_tasks: dict[str, asyncio.Task] = {}

    async def bounded(rec: PDRecord) -> None:
        try:
            async with asyncio.timeout(deadline_s):
                swapped = (make_prompt(sc.prompt_tokens, seed + 1_000_003 + int(rec.request_id.rsplit("-", 1)[1]))
                           if sc.tamper == "swap-prompt" else None)
                await _pd_one(client, rec, p, d, decode_tasks, swapped, between, sc.request, router)
        except TimeoutError:
            rec.outcome = "timeout"
            rec.diagnosis = f"no answer within the {deadline_s:.0f} s deadline"
            if rec.decode_sent_at:
                rec.verdict_after_s = time.monotonic() - rec.decode_sent_at

    watcher = asyncio.create_task(_watch(http, d, window_s, interval_s, obs.records, decode_tasks, store, sc.name,
                                         transfer_window_s, early, engine_cpu, inconclusive_s, events))
    try:
        await asyncio.gather(*(bounded(r) for r in obs.records))
    finally:
        for r in obs.records:
            if r.outcome == "pending":
                r.outcome = "cancelled"
        obs.stall_diagnosis = await watcher if not watcher.cancelled() else ""

    obs.parity = [None] * len(obs.records)
    if sc.parity:
        obs.parity = await record_parity(obs.records, lambda rec: reference(client, p, rec, sc.request),
                                         sc.parity_tolerance)


async def reference(client: Transport, p: Endpoint, rec: PDRecord, fields: RequestFields | None) -> Hop:
    """The non-disaggregated reference of ``rec`` on P, with the scenario's reference fields
    (e.g. the same ``n`` as the decode hop, so parity compares choice by choice)."""
    fields = fields or RequestFields()
    return await client.direct(p, rec.prompt, rec.max_tokens, fields=fields.for_hop("reference"),
                               endpoint=fields.endpoint)

"""The request side of the Mooncake store scenarios (rig.workload.store): the context a store
scenario runs in, scraping and waiting for the master, sending one request by route (``store``:
plainly to D; ``pd``: P then D), a batch under the one stall watcher, and parity against P.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from rig.cluster.processes import Cluster
from rig.cluster.proctree import ProcSample
from rig.config import RigConfig, ScenarioConfig
from rig.connectors.mooncake import MASTER_ROLE
from rig.observe import metrics as m
from rig.observe.events import SampleEvents, trigger_of
from rig.observe.observations import ScenarioObservation, SnapshotStore
from rig.observe.parity import record_parity
from rig.observe.stall import StallWatcher, watch
from rig.observe.store_metrics import (
    CACHED_BY_SOURCE,
    STORE_SOURCE,
    StoreObservation,
    master_values,
    op,
    requeued,
    store_ops,
)
from rig.transport.client import Transport, cancel_task
from rig.transport.endpoint import Endpoint
from rig.transport.records import Hop, PDRecord, classify, prefill_failure
from rig.workload.edge import cancel_stalled
from rig.workload.prompts import make_prompt

FLUSH_PROMPT_TOKENS = 4  # below one block: the flush request touches no store key


@dataclass
class StoreContext:
    """What a store scenario needs from the runner: config, endpoints, clients, where to write.

    ``master`` is the master's admin endpoint (``/metrics``, ``/health``); None when the topology
    has none (then the scenario is an error: the config validator refuses such topologies).
    """

    cfg: RigConfig
    p: Endpoint
    d: Endpoint
    master: Endpoint | None
    client: Transport
    http: httpx.AsyncClient
    snapshots: SnapshotStore | None
    run_dir: Path
    quiet: bool = True
    probe: Callable[[str], ProcSample | None] | None = None  # an instance's process tree (stall evidence)
    events: SampleEvents | None = None  # D is also sampled at its hops' events (rig.observe.events)

    @classmethod
    def of(cls, cfg: RigConfig, cluster: Cluster, p: Endpoint, d: Endpoint, client: Transport,
           http: httpx.AsyncClient, snapshots: SnapshotStore | None, run_dir: str | Path) -> StoreContext:
        """Build the context from a running :class:`~rig.cluster.processes.Cluster` (finds the master)."""
        master = next((Endpoint(s.name, s.base_url) for s in cluster.plan.processes
                       if s.role == MASTER_ROLE), None)
        return cls(cfg, p, d, master, client, http, snapshots, Path(run_dir), probe=cluster.proc_sample)

    def deadline(self, sc: ScenarioConfig) -> float:
        """Seconds one request may take (both hops)."""
        return sc.deadline_s or self.cfg.timeouts.request_s


# --------------------------------------------------------------------------------- helpers


async def scrape(ctx: StoreContext, ep: Endpoint) -> m.MetricSnapshot:
    """``ep``'s /metrics (raises httpx.HTTPError / ValueError like rig.observe.metrics.scrape)."""
    return await m.scrape(ctx.http, ep.url, ep.name)


async def master_snapshot(ctx: StoreContext) -> m.MetricSnapshot | None:
    """The master's /metrics, or None when there is no master or it does not answer."""
    if ctx.master is None:
        return None
    try:
        return await scrape(ctx, ctx.master)
    except (httpx.HTTPError, ValueError):
        return None


async def wait_master(ctx: StoreContext, base: m.MetricSnapshot | None, items: int,
                       timeout_s: float) -> float | None:
    """Wait until the master's ``put_end_items`` grew by ``items`` since ``base``; seconds
    waited, or None on timeout / no master."""
    if base is None or items <= 0:
        return 0.0 if items <= 0 else None
    t0 = time.monotonic()
    start = master_values(base)["put_end_items"]
    while True:
        snap = await master_snapshot(ctx)
        if snap is not None and master_values(snap)["put_end_items"] - start >= items:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            return None
        await asyncio.sleep(0.1)


SETTLE_TIMEOUT_S, SETTLE_INTERVAL_S = 3.0, 0.3


async def settled(ctx: StoreContext, ep: Endpoint, keys: Callable[[m.MetricSnapshot], tuple],
                   timeout_s: float | None = None, interval_s: float | None = None) -> m.MetricSnapshot:
    """Scrape ``ep`` until ``keys(snapshot)`` is the same twice in a row (stats of a finished
    request can reach /metrics a step later), at most ``timeout_s`` (:data:`SETTLE_TIMEOUT_S`)."""
    timeout_s = SETTLE_TIMEOUT_S if timeout_s is None else timeout_s
    interval_s = SETTLE_INTERVAL_S if interval_s is None else interval_s
    t0 = time.monotonic()
    prev = await scrape(ctx, ep)
    while time.monotonic() - t0 < timeout_s:
        await asyncio.sleep(interval_s)
        cur = await scrape(ctx, ep)
        if keys(cur) == keys(prev):
            return cur
        prev = cur
    return prev


def d_keys(s: m.MetricSnapshot) -> tuple:
    """The values of D that must stop moving before its counters count as settled (:func:`settled`)."""
    ops = store_ops(s)
    return (s.value(CACHED_BY_SOURCE, source=STORE_SOURCE), s.value(m.EXT_PREFIX_HITS),
            op(ops, "load_get", "keys"), op(ops, "load_get", "bytes"), s.value(m.REQUEST_SUCCESS))


async def flush(ctx: StoreContext, ep: Endpoint, seed: int) -> None:
    """One tiny direct request so the instance steps once and publishes pending connector stats."""
    await ctx.client.direct(ep, make_prompt(FLUSH_PROMPT_TOKENS, seed), 1)



async def watch_decode(ctx: StoreContext, sc: ScenarioConfig, records: list[PDRecord],
                 tasks: dict[str, asyncio.Task], done: asyncio.Event, so: StoreObservation | None = None) -> str:
    """Sample D while requests run (:func:`rig.observe.stall.watch`); on a stall cancel the
    outstanding ones (marked ``stalled``) and return the diagnosis. With ``so``, count requeues
    (:func:`~rig.observe.store_metrics.requeued`) and peak running/waiting into it."""
    t = ctx.cfg.timeouts
    prev: list[m.MetricSnapshot] = []

    def on_sample(snap: m.MetricSnapshot) -> None:
        if ctx.snapshots:
            ctx.snapshots.sample(sc.name, snap)
        if so is not None:
            so.requeues_seen += requeued(prev[-1], snap) if prev else 0
            so.peak_running = max(so.peak_running, snap.value(m.RUNNING))
            so.peak_waiting = max(so.peak_waiting, snap.value(m.WAITING))
        prev[:] = [snap]

    with trigger_of(ctx.events, ctx.d.name) as trigger:
        stall = await watch(StallWatcher(t.stall_window_s, transfer_window_s=t.kv_transfer_s,
                                         inconclusive_s=t.stall_inconclusive_wait(sc.deadline_s), probe=ctx.probe),
                            lambda: scrape(ctx, ctx.d), done.is_set, t.metrics_interval_s, wake=done,
                            on_sample=on_sample, trigger=trigger)
    if stall is None:
        return ""
    await cancel_stalled(records, tasks, stall)
    return stall.diagnosis


async def _hop(coro: Awaitable[Hop], rec: PDRecord, hop: str) -> Hop | None:
    """Await one hop; when ``rec.cancel`` names ``hop``, close it ``after_ms`` after it was sent
    (not before: the timer starts here, as the hop is sent) and return None. A hop that answers
    first is returned as it is (``fired_ms`` stays None)."""
    task = asyncio.ensure_future(coro)
    c = rec.cancel
    if c is None or c.hop != hop:
        return await task
    sent = c.sent_at = time.monotonic()
    try:
        done, _ = await asyncio.wait({task}, timeout=c.after_ms / 1000)
    except BaseException:  # the request itself was cancelled (deadline, stall): close the hop too
        await cancel_task(task)
        raise
    if task in done:
        return task.result()
    await cancel_task(task)  # closes the connection: vLLM aborts the request
    c.fired_ms = 1000 * (time.monotonic() - sent)
    return None


def _cancelled(rec: PDRecord, point: str, hop: str) -> None:
    """Mark ``rec`` cancelled on purpose at ``point`` (its
    :class:`~rig.transport.records.PlannedCancel` fired on ``hop``; ``between``: P answered before
    the cancel was due, so the decode hop is never sent)."""
    assert rec.cancel is not None
    rec.cancel.point, rec.outcome = point, "cancelled"
    if point == "between":
        rec.diagnosis = (f"P answered in {1000 * (rec.prefill.latency_s or 0) if rec.prefill else 0:.0f} ms, "
                         f"before the {rec.cancel.after_ms:.0f} ms cancel: the decode hop was never sent")
    else:
        rec.diagnosis = f"{hop} closed on purpose {rec.cancel.fired_ms or 0:.0f} ms after it was sent"


async def send(ctx: StoreContext, rec: PDRecord, route: str) -> None:
    """One request to D: ``store`` = plain request to D; ``pd`` = P prefill hop, then D with P's
    ``kv_transfer_params``. Fills ``rec`` (outcome, hops, timings). ``rec.stream`` streams D's hop;
    ``rec.cancel`` closes the hop it names at its time (:class:`~rig.transport.records.PlannedCancel`
    says how the request ends then)."""
    c = ctx.client
    stream = {"stream": True} if rec.stream else None
    if route == "pd":
        prefill = await _hop(c.prefill(ctx.p, rec.prompt), rec, "prefill")
        if prefill is None:
            _cancelled(rec, "before-prefill", "prefill hop")
            return
        rec.prefill = prefill
        failure = prefill_failure(rec.prefill)
        if failure:
            rec.outcome, rec.diagnosis = failure
            return
        assert rec.prefill.kv_transfer_params is not None  # prefill_failure is None only when P gave them
        if rec.cancel is not None and rec.cancel.hop == "prefill":  # P answered first: abandon, as a wave does
            _cancelled(rec, "between", "")
            return
        rec.decode_sent_at = time.monotonic()
        decode = await _hop(c.decode(ctx.d, rec.prompt, rec.max_tokens, rec.prefill.kv_transfer_params,
                                     stream=rec.stream), rec, "decode")
    else:
        rec.decode_sent_at = time.monotonic()
        decode = await _hop(c.direct(ctx.d, rec.prompt, rec.max_tokens, fields=stream), rec, "decode")
    rec.verdict_after_s = time.monotonic() - rec.decode_sent_at
    if decode is None:
        _cancelled(rec, "during-decode", "decode hop")
        return
    rec.decode = decode
    rec.outcome = classify(rec.decode)
    if rec.outcome != "ok":
        rec.diagnosis = f"decode: {rec.decode.error or 'empty answer'}"


async def run_batch(ctx: StoreContext, sc: ScenarioConfig, recs: list[PDRecord], routes: list[str],
                     concurrency: int, so: StoreObservation | None = None) -> str:
    """Run ``recs`` (routes per record) at most ``concurrency`` at a time under one stall watcher;
    returns the stall diagnosis ('' without a stall)."""
    sem = asyncio.Semaphore(concurrency)
    tasks: dict[str, asyncio.Task] = {}
    deadline = ctx.deadline(sc)

    async def one(rec: PDRecord, route: str) -> None:
        async with sem:
            if rec.outcome != "pending":
                return
            try:
                async with asyncio.timeout(deadline):
                    await send(ctx, rec, route)
            except TimeoutError:
                rec.outcome = "timeout"
                rec.diagnosis = f"no answer within the {deadline:.0f} s deadline"
                if rec.decode_sent_at:
                    rec.verdict_after_s = time.monotonic() - rec.decode_sent_at

    done = asyncio.Event()
    for rec, route in zip(recs, routes, strict=True):
        tasks[rec.request_id] = asyncio.create_task(one(rec, route))
    watcher = asyncio.create_task(watch_decode(ctx, sc, recs, tasks, done, so))
    try:
        results = await asyncio.gather(*tasks.values(), return_exceptions=True)
    finally:
        done.set()
        for r in recs:
            if r.outcome == "pending":
                r.outcome = "cancelled"
    diagnosis = await watcher
    # return_exceptions keeps one request's failure from cancelling the others, but a rig
    # exception is the rig's bug, not a vLLM symptom: re-raise it (the runner reports ERROR and
    # writes rig-traceback.txt) instead of leaving its requests "cancelled".
    for res in results:
        if isinstance(res, Exception):
            raise res
    return diagnosis


async def store_parity(ctx: StoreContext, obs: ScenarioObservation, refs: dict[str, Hop] | None = None) -> None:
    """Compare every answered record with a direct request to P (or a reference already taken)."""
    async def reference(rec: PDRecord) -> Hop:
        return (refs or {}).get(rec.request_id) or await ctx.client.direct(ctx.p, rec.prompt, rec.max_tokens)

    obs.parity = await record_parity(obs.records, reference)

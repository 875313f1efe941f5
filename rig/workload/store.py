"""Mooncake store scenarios (issue #3): workloads, observations and verdict.

The topology is P (``kv_producer``) + D (``kv_consumer``) with ``nixl+store`` (or
``mooncake-store``) and a supervised ``mooncake_master`` (rig.plan.mooncake, rig.connectors.mooncake).
P writes the full blocks
of every prompt it computes into the store; any instance that later meets the same prefix may
load them instead of computing them. D loads only *full* blocks and never the block holding the
last prompt token, so a prompt of ``n`` tokens can take at most ``floor((n-1)/bs) x bs`` tokens
from the store (measured, docs/mooncake-notes.md).

Kinds (``ScenarioConfig.kind``, settings in ``ScenarioConfig.store``):

``store-roundtrip``
    For each of ``store.requests`` fresh prompts: P computes it (a direct request, whose answer is
    also the parity reference); the rig waits until the master has the prompt's keys
    (``master_batch_put_end_items_total``); then the same prompt goes plainly to D, which has
    never seen it (D's own prefix cache cannot hold it: D's ``prefix_cache_hits`` must not move).
    D must take exactly ``floor((n-1)/bs) x bs`` tokens from the store
    (``prompt_tokens_cached_by_source{source="external_unspecified"}``, the store's source; NIXL is
    ``p2p``), with ``load_get`` bytes > 0, zero failed keys and no NIXL bytes, and answer the same
    tokens as P.
``prefix-wave-store``
    ``groups`` prefixes of ``prefix_tokens`` are first computed on P (so they are resident in the
    store); then ``waves`` waves of ``groups x per_group`` prompts (a group's prefix + a unique
    suffix) run at ``concurrency`` against D, whose blocks are capped: ``route: store`` sends them
    plainly to D (the prefix comes from the store or D's own cache), ``pd`` through P -> D over
    NIXL, ``mixed`` alternates. Every request must complete (no ``Cannot get N free blocks``
    crash, no stall), with real store loads on D and zero failed GETs.
``long-generation``
    ``store.requests`` P/D requests with long outputs at once on the capped D, so D must preempt
    (free) running requests and later recompute them; a resumed request's prompt blocks can be
    reloaded from the store. Judged: every request completes with parity, failed GETs = 0, D
    preempted at least once (else the scenario did not test what it claims). Reported: bytes
    reloaded, rejected PUTs (``save_put`` failed keys: allowed), preemptions.

Every store scenario also checks that the master is alive to the end (process and ``/health``)
and reports store bytes put/got, the store hit ratio and the master's own counters, in
``summary.md`` (a section per scenario) and ``<run_dir>/store/<scenario>.json``.

Counters are read as deltas of ``/metrics``. The connector's per-operation counters
(``vllm:mooncake_store_operation_*``) reach Prometheus with the *next* engine step after the
operation, so before the final scrape each instance gets one tiny request (4 tokens, no full
block: no store key) that makes it step once ("stats flush").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rig.config import STORE_KINDS, RigConfig, ScenarioConfig, StoreScenarioConfig
from rig.connectors.mooncake import MASTER_ROLE
from rig.judge.checks import Check, alive_check, completion_checks, fatal_log_check, idle_check, parity_check
from rig.judge.verdict import ScenarioVerdict, decide, expectation_of, judge
from rig.observe import metrics as m
from rig.observe.observations import ScenarioObservation, SnapshotStore
from rig.observe.parity import compare
from rig.observe.stall import StallDetector
from rig.transport.client import Transport, make_transport
from rig.transport.endpoint import Endpoint
from rig.transport.records import Hop, PDRecord, classify, prefill_failure
from rig.workload.edge import cancel_stalled
from rig.workload.prompts import make_prompt, seed_of

__all__ = ["STORE_KINDS", "StoreContext", "StoreObservation", "run_store_scenario", "judge_store",
           "store_section", "store_ops", "master_values", "loadable_tokens"]

# vLLM's store connector metrics (vllm/.../mooncake/store/metrics.py); labels operation, status
# (ok | partial_failure | error); a series exists only after its first operation.
STORE_OP_METRICS = {
    "calls": "vllm:mooncake_store_operation_total",
    "keys": "vllm:mooncake_store_operation_keys_total",
    "bytes": "vllm:mooncake_store_operation_bytes_total",
    "failed_keys": "vllm:mooncake_store_operation_failed_keys_total",
}
CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"
STORE_SOURCE = "external_unspecified"  # CacheHitSource of the store connector (NIXL is "p2p")

# mooncake_master's /metrics. Counters whose family name lacks "_total" (valid_get_nums_, ...)
# come out of prometheus_client's parser with "_total" appended: both spellings are tried.
MASTER_COUNTERS: dict[str, tuple[str, ...]] = {
    "put_start_items": ("master_batch_put_start_items_total",),
    "put_start_failed_items": ("master_batch_put_start_failed_items_total",),
    "put_end_items": ("master_batch_put_end_items_total",),
    "put_end_failed_items": ("master_batch_put_end_failed_items_total",),
    "put_start_alloc_failures": ("master_put_start_alloc_failures_total",),
    "get_replica_list_items": ("master_batch_get_replica_list_items_total",),
    "get_replica_list_failed_items": ("master_batch_get_replica_list_failed_items_total",),
    "exist_key_items": ("master_batch_exist_key_items_total",),
    "mem_cache_hit_bytes": ("mem_cache_hit_bytes_total",),
    "valid_get_nums": ("valid_get_nums__total", "valid_get_nums_"),
    "total_get_nums": ("total_get_nums__total", "total_get_nums_"),
    "evicted_keys": ("master_evicted_key_count_total", "master_evicted_key_count"),
    "evicted_bytes": ("master_evicted_size_bytes_total", "master_evicted_size_bytes"),
}
MASTER_GAUGES: dict[str, tuple[str, ...]] = {
    "key_count": ("master_key_count",),
    "allocated_bytes": ("master_allocated_bytes",),
    "capacity_bytes": ("master_total_capacity_bytes",),
    "active_clients": ("master_active_clients",),
}

FLUSH_PROMPT_TOKENS = 4  # below one block: the flush request touches no store key


def loadable_tokens(prompt_tokens: int, block_size: int) -> int:
    """Tokens D can take from the store for a prompt: the full blocks before the last token."""
    return max(0, (prompt_tokens - 1) // block_size) * block_size


# ------------------------------------------------------------------------------ metric reading


def store_ops(snap: m.MetricSnapshot) -> dict[str, dict[str, float]]:
    """``{operation: {calls, keys, bytes, failed_keys, ok_bytes, bad_calls}}`` of one snapshot.

    ``ok_bytes`` counts only ``status="ok"``; ``bad_calls`` the calls with another status
    (``partial_failure`` / ``error``). Summed over ``engine`` / ``model_name``.
    """
    out: dict[str, dict[str, float]] = {}
    for (name, labels), v in snap.samples.items():
        field_ = next((f for f, n in STORE_OP_METRICS.items() if n == name), None)
        if field_ is None:
            continue
        lab = dict(labels)
        op, status = lab.get("operation", "?"), lab.get("status", "?")
        row = out.setdefault(op, {"calls": 0.0, "keys": 0.0, "bytes": 0.0, "failed_keys": 0.0,
                                  "ok_bytes": 0.0, "bad_calls": 0.0})
        row[field_] += v
        if field_ == "bytes" and status == "ok":
            row["ok_bytes"] += v
        if field_ == "calls" and status != "ok":
            row["bad_calls"] += v
    return out


def ops_delta(before: m.MetricSnapshot, after: m.MetricSnapshot) -> dict[str, dict[str, float]]:
    """:func:`store_ops` of ``after`` minus ``before`` (an absent series counts as 0)."""
    a, b = store_ops(after), store_ops(before)
    out = {}
    for op, row in a.items():
        base = b.get(op, {})
        out[op] = {k: v - base.get(k, 0.0) for k, v in row.items()}
    return out


def _op(ops: dict[str, dict[str, float]], op: str, key: str) -> float:
    return ops.get(op, {}).get(key, 0.0)


def _first(snap: m.MetricSnapshot, names: tuple[str, ...]) -> float:
    for n in names:
        if snap.has(n):
            return snap.value(n)
    return 0.0


def master_values(snap: m.MetricSnapshot) -> dict[str, float]:
    """The master's counters and gauges the rig reads (:data:`MASTER_COUNTERS`, ``MASTER_GAUGES``)."""
    return {k: _first(snap, names) for k, names in {**MASTER_COUNTERS, **MASTER_GAUGES}.items()}


def engine_values(snap: m.MetricSnapshot) -> dict[str, float]:
    """The vLLM counters a store verdict reads from one instance (flat dict, for deltas)."""
    out = {
        "prefix_queries": snap.value(m.PREFIX_QUERIES), "prefix_hits": snap.value(m.PREFIX_HITS),
        "external_queries": snap.value(m.EXT_PREFIX_QUERIES), "external_hits": snap.value(m.EXT_PREFIX_HITS),
        "nixl_bytes": snap.value(m.NIXL_BYTES_SUM), "preemptions": snap.value(m.PREEMPTIONS),
        "generation_tokens": snap.value(m.GENERATION_TOKENS),
    }
    for src, v in snap.by_label(m.PROMPT_TOKENS_BY_SOURCE, "source").items():
        out[f"prompt_{src}"] = v
    for src, v in snap.by_label(CACHED_BY_SOURCE, "source").items():
        out[f"cached_{src}"] = v
    return out


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(before) | set(after))}


# ------------------------------------------------------------------------------- observation


@dataclass
class StoreObservation:
    """What a store scenario saw besides the requests (in ``ScenarioObservation.records``).

    Deltas over the scenario: ``p_ops`` / ``d_ops`` are :func:`store_ops` deltas per instance,
    ``p`` / ``d`` :func:`engine_values` deltas, ``master`` :func:`master_values` deltas (gauges:
    ``master_after``). ``per_request`` (store-roundtrip) and ``waves`` (prefix-wave-store) hold
    the same facts per request / per wave. Bytes and tokens are counts, times seconds.
    """

    kind: str
    block_size: int
    master_name: str = ""
    p_ops: dict[str, dict[str, float]] = field(default_factory=dict)
    d_ops: dict[str, dict[str, float]] = field(default_factory=dict)
    p: dict[str, float] = field(default_factory=dict)
    d: dict[str, float] = field(default_factory=dict)
    master: dict[str, float] = field(default_factory=dict)
    master_after: dict[str, float] = field(default_factory=dict)
    master_health: str = ""
    master_alive_end: bool = False
    routes: list[str] = field(default_factory=list)  # per record: "store" | "pd"
    expected_store_tokens: int | None = None  # store-roundtrip: sum of loadable_tokens
    keys_expected_in_master: int = 0  # put_end items the rig waited for before asking D
    put_waits: list[float] = field(default_factory=list)  # seconds until the master had them
    per_request: list[dict[str, Any]] = field(default_factory=list)
    waves: list[dict[str, Any]] = field(default_factory=list)
    requeues_seen: int = 0  # running -> waiting transitions seen in D's samples
    peak_running: float = 0.0
    peak_waiting: float = 0.0
    stall_diagnosis: str = ""
    notes: list[str] = field(default_factory=list)
    error: str = ""

    # -- derived facts (what the report shows) ------------------------------------------------

    @property
    def bytes_put(self) -> float:
        """Bytes written into the store with status ok (``save_put``, every instance)."""
        return _op(self.p_ops, "save_put", "ok_bytes") + _op(self.d_ops, "save_put", "ok_bytes")

    @property
    def bytes_got(self) -> float:
        """Bytes loaded from the store with status ok (``load_get``, every instance)."""
        return _op(self.p_ops, "load_get", "ok_bytes") + _op(self.d_ops, "load_get", "ok_bytes")

    @property
    def d_bytes_got(self) -> float:
        """Bytes D loaded from the store (status ok)."""
        return _op(self.d_ops, "load_get", "ok_bytes")

    @property
    def failed_load_keys(self) -> float:
        """Keys whose GET failed (``load_get`` failed_keys, any status, every instance)."""
        return _op(self.p_ops, "load_get", "failed_keys") + _op(self.d_ops, "load_get", "failed_keys")

    @property
    def failed_load_calls(self) -> float:
        """``load_get`` calls with status partial_failure / error."""
        return _op(self.p_ops, "load_get", "bad_calls") + _op(self.d_ops, "load_get", "bad_calls")

    @property
    def rejected_put_keys(self) -> float:
        """Keys a ``save_put`` could not store (e.g. the pool is full); allowed, reported."""
        return _op(self.p_ops, "save_put", "failed_keys") + _op(self.d_ops, "save_put", "failed_keys")

    @property
    def d_store_tokens(self) -> float:
        """Prompt tokens D took from the store (``cached_by_source{external_unspecified}``)."""
        return self.d.get(f"cached_{STORE_SOURCE}", 0.0)

    @property
    def store_hit_ratio(self) -> float | None:
        """D's store tokens / the prompt tokens D asked its connectors about
        (``external_prefix_cache_queries``); None when D asked about none."""
        q = self.d.get("external_queries", 0.0)
        return self.d_store_tokens / q if q > 0 else None

    @property
    def master_get_ratio(self) -> float | None:
        """The master's ``valid_get_nums_ / total_get_nums_`` delta (None without GETs)."""
        t = self.master.get("total_get_nums", 0.0)
        return self.master.get("valid_get_nums", 0.0) / t if t > 0 else None

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict with the derived facts."""
        out = asdict(self)
        for k in ("bytes_put", "bytes_got", "d_bytes_got", "failed_load_keys", "failed_load_calls",
                  "rejected_put_keys", "d_store_tokens", "store_hit_ratio", "master_get_ratio"):
            out[k] = getattr(self, k)
        return out


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

    @classmethod
    def of(cls, cfg: RigConfig, cluster: Any, p: Endpoint, d: Endpoint, client: Transport,
           http: httpx.AsyncClient, snapshots: SnapshotStore | None, run_dir: str | Path) -> StoreContext:
        """Build the context from a running :class:`~rig.cluster.processes.Cluster` (finds the master)."""
        master = next((Endpoint(s.name, s.base_url) for s in cluster.plan.processes
                       if s.role == MASTER_ROLE), None)
        return cls(cfg, p, d, master, client, http, snapshots, Path(run_dir))

    def deadline(self, sc: ScenarioConfig) -> float:
        """Seconds one request may take (both hops)."""
        return sc.deadline_s or self.cfg.timeouts.request_s


# --------------------------------------------------------------------------------- helpers


async def _scrape(ctx: StoreContext, ep: Endpoint) -> m.MetricSnapshot:
    return await m.scrape(ctx.http, ep.url, ep.name)


async def _master_snap(ctx: StoreContext) -> m.MetricSnapshot | None:
    if ctx.master is None:
        return None
    try:
        return await _scrape(ctx, ctx.master)
    except (httpx.HTTPError, ValueError):
        return None


async def _wait_master(ctx: StoreContext, base: m.MetricSnapshot | None, items: int,
                       timeout_s: float) -> float | None:
    """Wait until the master's ``put_end_items`` grew by ``items`` since ``base``; seconds
    waited, or None on timeout / no master."""
    if base is None or items <= 0:
        return 0.0 if items <= 0 else None
    t0 = time.monotonic()
    start = master_values(base)["put_end_items"]
    while True:
        snap = await _master_snap(ctx)
        if snap is not None and master_values(snap)["put_end_items"] - start >= items:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            return None
        await asyncio.sleep(0.1)


SETTLE_TIMEOUT_S, SETTLE_INTERVAL_S = 3.0, 0.3


async def _settled(ctx: StoreContext, ep: Endpoint, keys: Callable[[m.MetricSnapshot], tuple],
                   timeout_s: float | None = None, interval_s: float | None = None) -> m.MetricSnapshot:
    """Scrape ``ep`` until ``keys(snapshot)`` is the same twice in a row (stats of a finished
    request can reach /metrics a step later), at most ``timeout_s`` (:data:`SETTLE_TIMEOUT_S`)."""
    timeout_s = SETTLE_TIMEOUT_S if timeout_s is None else timeout_s
    interval_s = SETTLE_INTERVAL_S if interval_s is None else interval_s
    t0 = time.monotonic()
    prev = await _scrape(ctx, ep)
    while time.monotonic() - t0 < timeout_s:
        await asyncio.sleep(interval_s)
        cur = await _scrape(ctx, ep)
        if keys(cur) == keys(prev):
            return cur
        prev = cur
    return prev


def _d_keys(s: m.MetricSnapshot) -> tuple:
    ops = store_ops(s)
    return (s.value(CACHED_BY_SOURCE, source=STORE_SOURCE), s.value(m.EXT_PREFIX_HITS),
            _op(ops, "load_get", "keys"), _op(ops, "load_get", "bytes"), s.value(m.REQUEST_SUCCESS))


async def _flush(ctx: StoreContext, ep: Endpoint, seed: int) -> None:
    """One tiny direct request so the instance steps once and publishes pending connector stats."""
    await ctx.client.direct(ep, make_prompt(FLUSH_PROMPT_TOKENS, seed), 1)


def requeued(prev: m.MetricSnapshot, cur: m.MetricSnapshot) -> int:
    """Requests that went from running back to waiting between two samples of one instance:
    running fell and waiting rose while no request finished (a preemption seen from outside;
    vLLM counts ``num_preemptions_total`` only with the preempted request's next output)."""
    if cur.value(m.REQUEST_SUCCESS) != prev.value(m.REQUEST_SUCCESS):
        return 0
    fell = prev.value(m.RUNNING) - cur.value(m.RUNNING)
    rose = cur.value(m.WAITING) - prev.value(m.WAITING)
    return int(max(0.0, min(fell, rose)))


async def _watch(ctx: StoreContext, sc: ScenarioConfig, records: list[PDRecord],
                 tasks: dict[str, asyncio.Task], done: asyncio.Event, so: StoreObservation | None = None) -> str:
    """Sample D while requests run; on a stall cancel the outstanding ones (marked ``stalled``).
    With ``so``, count requeues (:func:`requeued`) and peak running/waiting into it."""
    t = ctx.cfg.timeouts
    detector = StallDetector(t.stall_window_s, transfer_window_s=t.kv_transfer_s)
    prev: m.MetricSnapshot | None = None
    while not done.is_set():
        try:
            snap = await _scrape(ctx, ctx.d)
        except (httpx.HTTPError, ValueError):
            snap = None
        if snap is not None:
            if ctx.snapshots:
                ctx.snapshots.sample(sc.name, snap)
            if so is not None:
                so.requeues_seen += requeued(prev, snap) if prev is not None else 0
                so.peak_running = max(so.peak_running, snap.value(m.RUNNING))
                so.peak_waiting = max(so.peak_waiting, snap.value(m.WAITING))
            prev = snap
            stall = detector.feed(snap)
            if stall:
                await cancel_stalled(records, tasks, stall)
                return stall.diagnosis
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), t.metrics_interval_s)
    return ""


async def _send(ctx: StoreContext, rec: PDRecord, route: str) -> None:
    """One request to D: ``store`` = plain request to D; ``pd`` = P prefill hop, then D with P's
    ``kv_transfer_params``. Fills ``rec`` (outcome, hops, timings)."""
    c = ctx.client
    if route == "pd":
        rec.prefill = await c.prefill(ctx.p, rec.prompt)
        failure = prefill_failure(rec.prefill)
        if failure:
            rec.outcome, rec.diagnosis = failure
            return
        assert rec.prefill.kv_transfer_params is not None  # prefill_failure is None only when P gave them
        rec.decode_sent_at = time.monotonic()
        rec.decode = await c.decode(ctx.d, rec.prompt, rec.max_tokens, rec.prefill.kv_transfer_params or {})
    else:
        rec.decode_sent_at = time.monotonic()
        rec.decode = await c.direct(ctx.d, rec.prompt, rec.max_tokens)
    rec.verdict_after_s = time.monotonic() - rec.decode_sent_at
    rec.outcome = classify(rec.decode)
    if rec.outcome != "ok":
        rec.diagnosis = f"decode: {rec.decode.error or 'empty answer'}"


async def _run_batch(ctx: StoreContext, sc: ScenarioConfig, recs: list[PDRecord], routes: list[str],
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
                    await _send(ctx, rec, route)
            except TimeoutError:
                rec.outcome = "timeout"
                rec.diagnosis = f"no answer within the {deadline:.0f} s deadline"
                if rec.decode_sent_at:
                    rec.verdict_after_s = time.monotonic() - rec.decode_sent_at

    done = asyncio.Event()
    for rec, route in zip(recs, routes, strict=True):
        tasks[rec.request_id] = asyncio.create_task(one(rec, route))
    watcher = asyncio.create_task(_watch(ctx, sc, recs, tasks, done, so))
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
    # writes rig-traceback.txt) instead of leaving its requests "cancelled" (issue #9).
    for res in results:
        if isinstance(res, Exception):
            raise res
    return diagnosis


async def _parity(ctx: StoreContext, obs: ScenarioObservation, refs: dict[str, Hop] | None = None) -> None:
    """Compare every answered record with a direct request to P (or a reference already taken)."""
    obs.parity = [None] * len(obs.records)
    for i, rec in enumerate(obs.records):
        if rec.outcome != "ok" or rec.decode is None:
            continue
        ref = (refs or {}).get(rec.request_id) or await ctx.client.direct(ctx.p, rec.prompt, rec.max_tokens)
        if ref.error or ref.token_ids is None:
            rec.diagnosis = f"parity reference failed: {ref.error or 'no token_ids'}"
            continue
        obs.parity[i] = compare(rec.decode.token_ids or [], ref.token_ids, rec.max_tokens, rec.max_tokens)


# ------------------------------------------------------------------------------- workloads


async def _roundtrip(sc: ScenarioConfig, st: StoreScenarioConfig, ctx: StoreContext,
                     obs: ScenarioObservation, so: StoreObservation, seed: int) -> None:
    bs = ctx.cfg.block_size
    n = sc.prompt_tokens
    expected = loadable_tokens(n, bs)
    so.expected_store_tokens = expected * st.requests
    refs: dict[str, Hop] = {}
    for i in range(st.requests):
        rec = PDRecord(request_id=f"{sc.name}-{i}", prompt_len=n, max_tokens=sc.max_tokens,
                       prompt=make_prompt(n, seed_of(f"{seed}/roundtrip/{i}")))
        obs.records.append(rec)
        so.routes.append("store")
        row: dict[str, Any] = {"request_id": rec.request_id, "prompt_tokens": n, "expected_store_tokens": expected}
        so.per_request.append(row)
        # 1. P computes the prompt (and writes its full blocks to the store).
        base = await _master_snap(ctx)
        rec.prefill = await ctx.client.direct(ctx.p, rec.prompt, sc.max_tokens)
        if classify(rec.prefill) != "ok":
            rec.outcome = classify(rec.prefill)
            rec.diagnosis = f"P (store writer): {rec.prefill.error or 'empty answer'}"
            continue
        refs[rec.request_id] = rec.prefill
        keys = n // bs
        so.keys_expected_in_master += keys
        waited = await _wait_master(ctx, base, keys, st.put_wait_s)
        row["put_wait_s"] = waited
        if waited is None:
            so.notes.append(f"{rec.request_id}: the master did not count {keys} put_end items within "
                            f"{st.put_wait_s:.0f} s; D was asked anyway")
        else:
            so.put_waits.append(waited)
        # 2. The same prompt, plainly, on D (never seen there).
        d0 = await _scrape(ctx, ctx.d)
        try:
            async with asyncio.timeout(ctx.deadline(sc)):
                await _send(ctx, rec, "store")
        except TimeoutError:
            rec.outcome, rec.diagnosis = "timeout", f"D gave no answer within {ctx.deadline(sc):.0f} s"
        d1 = await _settled(ctx, ctx.d, _d_keys)
        dv = _delta(engine_values(d0), engine_values(d1))
        ops = ops_delta(d0, d1)
        row.update({
            "store_tokens": dv.get(f"cached_{STORE_SOURCE}", 0.0),
            "external_kv_tokens": dv.get("prompt_external_kv_transfer", 0.0),
            "local_prefix_hits": dv.get("prefix_hits", 0.0),
            "nixl_bytes": dv.get("nixl_bytes", 0.0),
            "load_get_keys": _op(ops, "load_get", "keys"),
            "load_get_ok_bytes": _op(ops, "load_get", "ok_bytes"),
            "load_get_failed_keys": _op(ops, "load_get", "failed_keys"),
            "d_latency_s": rec.decode.latency_s if rec.decode else None,
        })
    await _parity(ctx, obs, refs)


def _route_of(route: str, index: int) -> str:
    return route if route != "mixed" else ("store" if index % 2 == 0 else "pd")


async def _prefix_wave(sc: ScenarioConfig, st: StoreScenarioConfig, ctx: StoreContext,
                       obs: ScenarioObservation, so: StoreObservation, seed: int) -> None:
    bs = ctx.cfg.block_size
    suffix = sc.prompt_tokens - st.prefix_tokens
    prefixes = [make_prompt(st.prefix_tokens, seed_of(f"{seed}/prefix/{g}")) for g in range(st.groups)]
    # Seed: P computes each group's prefix (plus a suffix of its own), so the prefix's full blocks
    # are resident in the store before D sees any request of the group.
    base = await _master_snap(ctx)
    seeds = await asyncio.gather(*(ctx.client.direct(
        ctx.p, prefixes[g] + make_prompt(suffix, seed_of(f"{seed}/seed/{g}")), 1) for g in range(st.groups)))
    bad = [h for h in seeds if classify(h) != "ok"]
    if bad:
        so.notes.append(f"seeding P failed for {len(bad)} group(s): {bad[0].error or 'empty answer'}")
    keys = st.groups * (sc.prompt_tokens // bs)
    so.keys_expected_in_master = keys
    waited = await _wait_master(ctx, base, keys, st.put_wait_s)
    if waited is None:
        so.notes.append(f"the master did not count {keys} put_end items within {st.put_wait_s:.0f} s "
                        "after seeding; the waves ran anyway")
    else:
        so.put_waits.append(waited)
    index = 0
    for w in range(st.waves):
        recs, routes = [], []
        for g in range(st.groups):
            for j in range(st.per_group):
                prompt = prefixes[g] + make_prompt(suffix, seed_of(f"{seed}/w{w}/g{g}/r{j}"))
                recs.append(PDRecord(request_id=f"{sc.name}-w{w}-g{g}-{j}", prompt_len=sc.prompt_tokens,
                                     max_tokens=sc.max_tokens, prompt=prompt))
                routes.append(_route_of(st.route, index))
                index += 1
        obs.records += recs
        so.routes += routes
        d0 = await _scrape(ctx, ctx.d)
        t0 = time.monotonic()
        diag = await _run_batch(ctx, sc, recs, routes, st.concurrency, so)
        wall = time.monotonic() - t0
        d1 = await _settled(ctx, ctx.d, _d_keys)
        dv = _delta(engine_values(d0), engine_values(d1))
        ops = ops_delta(d0, d1)
        so.waves.append({
            "wave": w, "requests": len(recs), "ok": sum(r.outcome == "ok" for r in recs),
            "store_routed": routes.count("store"), "wall_s": round(wall, 3),
            "store_tokens": dv.get(f"cached_{STORE_SOURCE}", 0.0),
            "nixl_tokens": dv.get("cached_p2p", 0.0),
            "local_prefix_hits": dv.get("prefix_hits", 0.0),
            "load_get_ok_bytes": _op(ops, "load_get", "ok_bytes"),
            "load_get_failed_keys": _op(ops, "load_get", "failed_keys"),
            "nixl_bytes": dv.get("nixl_bytes", 0.0), "preemptions": dv.get("preemptions", 0.0),
        })
        if diag:
            so.stall_diagnosis = diag
            break
    if sc.parity:
        await _parity(ctx, obs)
    else:
        obs.parity = [None] * len(obs.records)


async def _long_generation(sc: ScenarioConfig, st: StoreScenarioConfig, ctx: StoreContext,
                           obs: ScenarioObservation, so: StoreObservation, seed: int) -> None:
    recs = [PDRecord(request_id=f"{sc.name}-{i}", prompt_len=sc.prompt_tokens, max_tokens=sc.max_tokens,
                     prompt=make_prompt(sc.prompt_tokens, seed_of(f"{seed}/long/{i}")))
            for i in range(st.requests)]
    obs.records += recs
    so.routes += ["pd"] * len(recs)
    so.stall_diagnosis = await _run_batch(ctx, sc, recs, ["pd"] * len(recs), len(recs), so)
    if sc.parity:
        await _parity(ctx, obs)
    else:
        obs.parity = [None] * len(obs.records)


WORKLOADS: dict[str, Callable[..., Awaitable[None]]] = {
    "store-roundtrip": _roundtrip,
    "prefix-wave-store": _prefix_wave,
    "long-generation": _long_generation,
}


async def run_store_scenario(sc: ScenarioConfig, ctx: StoreContext, obs: ScenarioObservation) -> StoreObservation:
    """Run store scenario ``sc`` (kinds in the module docstring), filling ``obs.records``,
    ``obs.parity`` and ``obs.stall_diagnosis``; returns the :class:`StoreObservation` (also
    written to ``<run_dir>/store/<scenario>.json``). HTTP failures of the metrics endpoints end
    up in ``StoreObservation.error`` (the verdict is then ERROR); request failures are records.
    """
    if sc.kind not in WORKLOADS:
        raise ValueError(f"{sc.name}: kind {sc.kind!r} is not a store kind ({', '.join(STORE_KINDS)})")
    st = sc.store or StoreScenarioConfig()
    seed = sc.seed if sc.seed is not None else seed_of(sc.name)
    so = StoreObservation(kind=sc.kind, block_size=ctx.cfg.block_size,
                          master_name=ctx.master.name if ctx.master else "")
    if ctx.master is None:
        so.error = "no Mooncake master in this topology (connector is not a store mode)"
        return so
    own_client = None
    if ctx.deadline(sc) > ctx.client.timeout_s:
        # The runner's client times a hop out at timeouts.request_s; a longer deadline_s
        # (long outputs) needs a client that waits as long.
        own_client = make_transport(ctx.client.name, ctx.cfg.model.served_name, ctx.deadline(sc))
        ctx = dataclasses.replace(ctx, client=own_client)
    try:
        return await _run(sc, st, ctx, obs, so, seed)
    finally:
        if own_client is not None:
            await own_client.aclose()


async def _run(sc: ScenarioConfig, st: StoreScenarioConfig, ctx: StoreContext, obs: ScenarioObservation,
               so: StoreObservation, seed: int) -> StoreObservation:
    assert ctx.master is not None
    m0: m.MetricSnapshot | None = None
    try:
        p0, d0, m0 = await _scrape(ctx, ctx.p), await _scrape(ctx, ctx.d), await _scrape(ctx, ctx.master)
        await WORKLOADS[sc.kind](sc, st, ctx, obs, so, seed)
        obs.stall_diagnosis = obs.stall_diagnosis or so.stall_diagnosis
        # Engine counters before the stats flush (its 4 tokens are not the scenario's), the
        # connector's operation counters after it.
        pe, de = await _scrape(ctx, ctx.p), await _settled(ctx, ctx.d, _d_keys)
        for k, ep in enumerate((ctx.p, ctx.d)):
            await _flush(ctx, ep, seed + 7 + k)
        p1 = await _scrape(ctx, ctx.p)
        d1 = await _settled(ctx, ctx.d, _d_keys)
        so.p_ops, so.d_ops = ops_delta(p0, p1), ops_delta(d0, d1)
        so.p = _delta(engine_values(p0), engine_values(pe))
        so.d = _delta(engine_values(d0), engine_values(de))
        if ctx.snapshots:
            for snap in (p1, d1):
                ctx.snapshots.save(f"{sc.name}-store-after", snap)
            ctx.snapshots.save(f"{sc.name}-store-before", m0)
    except (httpx.HTTPError, ValueError) as e:
        so.error = f"metrics unavailable: {type(e).__name__}: {e}"
    m1 = await _master_snap(ctx)
    if m1 is not None:
        so.master = _delta(master_values(m0), master_values(m1)) if m0 is not None else {}
        so.master_after = master_values(m1)
        if ctx.snapshots:
            ctx.snapshots.save(f"{sc.name}-store-after", m1)
    try:
        r = await ctx.http.get(ctx.master.url + "/health", timeout=5.0)
        so.master_health = f"HTTP {r.status_code} {r.text.strip()[:160]}"
        so.master_alive_end = r.status_code == 200 and '"ok"' in r.text
    except httpx.HTTPError as e:
        so.master_health = f"unreachable: {type(e).__name__}: {e}"
    out = ctx.run_dir / "store"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{sc.name}.json").write_text(json.dumps(so.to_json(), indent=1, default=str))
    return so


# --------------------------------------------------------------------------------- verdict


def _fmt_bytes(v: float) -> str:
    return f"{v:,.0f} B"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def store_checks(sc: ScenarioConfig, obs: ScenarioObservation, so: StoreObservation) -> list[Check]:
    """The named checks of a store scenario (see the module docstring), each tri-state."""
    recs = obs.records
    out = completion_checks(sc.expect, recs)
    if sc.parity:
        out.append(parity_check(recs, obs.parity, "equal to a direct request to P"))

    # -- the store ----------------------------------------------------------------------------
    load_keys = _op(so.d_ops, "load_get", "keys") + _op(so.p_ops, "load_get", "keys")
    out.append(Check("failed-loads", so.failed_load_keys == 0 and so.failed_load_calls == 0,
                     f"load_get failed_keys {so.failed_load_keys:.0f}, non-ok calls {so.failed_load_calls:.0f} "
                     f"(of {load_keys:.0f} keys)"))
    put_keys = _op(so.p_ops, "save_put", "keys")
    out.append(Check("store-written", so.master.get("put_end_items", 0) > 0 and so.bytes_put > 0,
                     f"P save_put {put_keys:.0f} keys / {_fmt_bytes(so.bytes_put)} ok, rejected "
                     f"{so.rejected_put_keys:.0f}; master put_end +{so.master.get('put_end_items', 0):.0f} items, "
                     f"key_count {so.master_after.get('key_count', 0):.0f}"))
    if so.kind == "store-roundtrip":
        rows = so.per_request
        wrong_load = [r for r in rows if r.get("store_tokens") != r["expected_store_tokens"]]
        out.append(Check(
            "store-loaded",
            bool(rows) and not wrong_load and so.d_bytes_got > 0 and "store_tokens" in rows[-1],
            (f"D took {sum(r.get('store_tokens', 0) for r in rows):.0f}/{so.expected_store_tokens} "
             f"expected tokens from the store, load_get {_fmt_bytes(so.d_bytes_got)} ok") +
            (f"; {wrong_load[0]['request_id']}: {wrong_load[0].get('store_tokens', 'no answer')} tokens, expected "
             f"{wrong_load[0]['expected_store_tokens']}" if wrong_load else ""),
            tuple(r["request_id"] for r in wrong_load)))
        warm = [r for r in rows if r.get("local_prefix_hits", 0) > 0]
        out.append(Check("d-cache-cold", bool(rows) and not warm,
                         "D's own prefix cache held none of the prompts" if not warm else
                         f"{warm[0]['request_id']}: D's prefix cache hit {warm[0]['local_prefix_hits']:.0f} tokens "
                         "(the store was not what served it)", tuple(r["request_id"] for r in warm)))
        nixl = sum(r.get("nixl_bytes", 0) for r in rows)
        out.append(Check("not-nixl", nixl == 0, f"NIXL bytes on D during the store requests: {nixl:.0f}"))
        out.append(Check("master-served", so.master.get("get_replica_list_items", 0) > 0,
                         f"master get_replica_list +{so.master.get('get_replica_list_items', 0):.0f} items, "
                         f"mem_cache_hit_bytes +{so.master.get('mem_cache_hit_bytes', 0):,.0f}"))
    elif so.kind == "prefix-wave-store":
        routed = so.routes.count("store")
        answered = sum(r.outcome == "ok" and route == "store" for r, route in zip(recs, so.routes, strict=False))
        detail = (f"D took {so.d_store_tokens:.0f} prompt tokens from the store "
                  f"({_fmt_bytes(so.d_bytes_got)}) over {routed} store-routed requests ({answered} answered)")
        out.append(Check("store-loaded", so.d_store_tokens > 0 and so.d_bytes_got > 0, detail) if answered else
                   Check("store-loaded", None, f"not checked: no answered request went through the store; {detail}"))
    elif so.kind == "long-generation":
        pre = so.d.get("preemptions", 0)
        pressed = pre > 0 or so.requeues_seen > 0
        out.append(Check("kv-pressure", pressed,
                         f"D preempted {pre:.0f} times (num_preemptions_total), {so.requeues_seen} running->waiting "
                         f"seen in samples, peak running {so.peak_running:.0f}; reloaded "
                         f"{_fmt_bytes(so.d_bytes_got)} from the store" +
                         ("" if pressed else " (no pressure: raise store.requests or max_tokens)")))
    master_dead = so.master_name in obs.dead
    out.append(Check("master-alive", so.master_alive_end and not master_dead,
                     (f"{so.master_name} exited ({obs.dead[so.master_name]})" if master_dead else
                      f"{so.master_name} /health: {so.master_health}")))
    out.append(alive_check(obs, skip=(so.master_name,)))
    out.append(fatal_log_check(obs))
    out.append(idle_check(obs))
    return out


def judge_store(sc: ScenarioConfig, obs: ScenarioObservation, so: StoreObservation | None = None,
                sections: list[str] | None = None) -> ScenarioVerdict:
    """The verdict of a store scenario through the one engine (:func:`rig.judge.verdict.judge`) on
    :func:`store_checks`; ERROR when the rig could not run it. ``so`` is what
    :func:`run_store_scenario` returned; with ``sections`` (RunResult.extra_sections) a markdown
    section is appended. A ``known_issue`` is honoured like on any kind."""
    if so is None or obs.error or so.error:
        v = decide(sc.name, [], expectation_of(sc, obs), error=obs.error or (so.error if so else "")
                   or "no store observation (scenario not run)")
    else:
        v = judge(sc, obs, checks=store_checks(sc, obs, so))
    if sections is not None and so is not None:
        sections.append(store_section(sc, obs, so, v))
    return v


def store_section(sc: ScenarioConfig, obs: ScenarioObservation, so: StoreObservation,
                  verdict: ScenarioVerdict | None = None) -> str:
    """Markdown for summary.md: the store facts of one scenario."""
    lines = [f"## Mooncake store: `{sc.name}` ({so.kind})" + (f" - {verdict.verdict}" if verdict else ""), ""]
    if sc.description:
        lines += [sc.description.strip(), ""]
    if verdict and verdict.checks:
        lines.append("| check | ok | detail |")
        lines.append("|---|---|---|")
        for c in verdict.checks:
            lines.append(f"| {c.name} | {'yes' if c.ok else '**NO**'} | {c.detail.replace('|', '/')} |")
        lines.append("")
    ma = so.master_after
    facts = [
        ("master alive to the end", f"{'yes' if so.master_alive_end and so.master_name not in obs.dead else 'NO'} "
                                    f"({so.master_health[:80]})"),
        ("failed GET keys (load_get)", f"{so.failed_load_keys:.0f}"),
        ("rejected PUT keys (save_put, allowed)", f"{so.rejected_put_keys:.0f}"),
        ("bytes put / got (ok)", f"{_fmt_bytes(so.bytes_put)} / {_fmt_bytes(so.bytes_got)}"),
        ("D prompt tokens from the store", f"{so.d_store_tokens:.0f}" +
         (f" (expected {so.expected_store_tokens})" if so.expected_store_tokens is not None else "")),
        ("store hit ratio (D store tokens / external-cache queries)", _ratio(so.store_hit_ratio)),
        ("master valid/total GETs", _ratio(so.master_get_ratio)),
        ("D preemptions (counter / running->waiting seen)", f"{so.d.get('preemptions', 0):.0f} / {so.requeues_seen}"),
        ("D NIXL bytes", f"{so.d.get('nixl_bytes', 0):,.0f}"),
        ("master keys / allocated / capacity",
         f"{ma.get('key_count', 0):.0f} / {_fmt_bytes(ma.get('allocated_bytes', 0))}"
         f" / {_fmt_bytes(ma.get('capacity_bytes', 0))}"),
        ("master put_end / get_replica_list items", f"+{so.master.get('put_end_items', 0):.0f} / "
                                                    f"+{so.master.get('get_replica_list_items', 0):.0f}"),
        ("master evicted keys / alloc failures", f"+{so.master.get('evicted_keys', 0):.0f} / "
                                                 f"+{so.master.get('put_start_alloc_failures', 0):.0f}"),
        ("P puts visible in the master after", ", ".join(f"{w:.2f} s" for w in so.put_waits) or "-"),
    ]
    lines.append("| fact | value |")
    lines.append("|---|---|")
    lines += [f"| {k} | {v} |" for k, v in facts]
    if so.per_request:
        lines += ["", "| request | prompt | store tokens (expected) | D local hits | load_get bytes | NIXL bytes |",
                  "|---|---|---|---|---|---|"]
        for r in so.per_request:
            lines.append(f"| {r['request_id']} | {r['prompt_tokens']} | {r.get('store_tokens', 0):.0f} "
                         f"({r['expected_store_tokens']}) | {r.get('local_prefix_hits', 0):.0f} | "
                         f"{r.get('load_get_ok_bytes', 0):,.0f} | {r.get('nixl_bytes', 0):,.0f} |")
    if so.waves:
        lines += ["", "| wave | ok/requests | store-routed | store tokens | NIXL tokens | D local hits | "
                      "load_get bytes | preemptions | wall s |", "|---|---|---|---|---|---|---|---|---|"]
        for w in so.waves:
            lines.append(f"| {w['wave']} | {w['ok']}/{w['requests']} | {w['store_routed']} | {w['store_tokens']:.0f} | "
                         f"{w['nixl_tokens']:.0f} | {w['local_prefix_hits']:.0f} | {w['load_get_ok_bytes']:,.0f} | "
                         f"{w['preemptions']:.0f} | {w['wall_s']:.1f} |")
    for note in so.notes:
        lines.append(f"\n- note: {note}")
    return "\n".join(lines) + "\n"

"""Mooncake store scenarios: the workloads and what they record.

The topology is P (``kv_producer``) + D (``kv_consumer``) with ``nixl+store`` (or
``mooncake-store``) and a supervised ``mooncake_master`` (rig.plan.mooncake, rig.connectors.mooncake).
P writes the full blocks
of every prompt it computes into the store; any instance that later meets the same prefix may
load them instead of computing them. D loads only *full* blocks and never the block holding the
last prompt token, so a prompt of ``n`` tokens can take at most ``floor((n-1)/bs) x bs`` tokens
from the store (measured, docs/explanation/mooncake.md).

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
    crash, no stall), with real store loads on D and zero failed GETs. With the R14 options
    (rig.workload.store_rounds): ``rounds`` rounds of those waves (same prefixes, new suffixes),
    ``reset_prefix_cache`` between rounds on P and D; ``cancel_fraction`` of each wave's requests
    closed ``cancel_after_ms`` after their ``cancel_hop`` was sent (intended outcomes, not
    failures); ``stream`` for D's hop. Every request not cancelled on purpose must still answer
    with parity, and P and D must drain back to their baseline.
``long-generation``
    ``store.requests`` P/D requests with long outputs at once on the capped D, so D must preempt
    (free) running requests and later recompute them; a resumed request's prompt blocks can be
    reloaded from the store. Judged: every request completes with parity, failed GETs = 0, D
    preempted at least once (else the scenario did not test what it claims). Reported: bytes
    reloaded, rejected PUTs (``save_put`` failed keys: allowed), preemptions.

Every store scenario also checks that the master is alive to the end (process and ``/health``)
and reports store bytes put/got, the store hit ratio and the master's own counters, in
``summary.md`` (a section per scenario) and ``<run_dir>/store/<scenario>.json``.

This module drives the requests and fills a :class:`~rig.observe.store_metrics.StoreObservation`
(the metric readers live there too); the checks and verdict are rig.judge.store_checks, the
summary.md section rig.report.store_section.

Counters are read as deltas of ``/metrics``. The connector's per-operation counters
(``vllm:mooncake_store_operation_*``) reach Prometheus with the *next* engine step after the
operation, so before the final scrape each instance gets one tiny request (4 tokens, no full
block: no store key) that makes it step once ("stats flush").
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from rig.config import STORE_KINDS, ScenarioConfig, StoreScenarioConfig
from rig.observe import metrics as m
from rig.observe.observations import ScenarioObservation
from rig.observe.store_metrics import (
    STORE_SOURCE,
    StoreObservation,
    engine_values,
    loadable_tokens,
    master_values,
    op,
    ops_delta,
    values_delta,
)
from rig.transport.client import make_transport
from rig.transport.records import Hop, PDRecord, classify
from rig.workload.prompts import make_prompt, seed_of
from rig.workload.store_requests import (
    StoreContext,
    d_keys,
    flush,
    master_snapshot,
    run_batch,
    scrape,
    send,
    settled,
    store_parity,
    wait_master,
)
from rig.workload.store_rounds import plan_store_cancels, reset_prefix_cache, streamed

__all__ = ["STORE_KINDS", "StoreContext", "run_store_scenario"]



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
        base = await master_snapshot(ctx)
        rec.prefill = await ctx.client.direct(ctx.p, rec.prompt, sc.max_tokens)
        if classify(rec.prefill) != "ok":
            rec.outcome = classify(rec.prefill)
            rec.diagnosis = f"P (store writer): {rec.prefill.error or 'empty answer'}"
            continue
        refs[rec.request_id] = rec.prefill
        keys = n // bs
        so.keys_expected_in_master += keys
        waited = await wait_master(ctx, base, keys, st.put_wait_s)
        row["put_wait_s"] = waited
        if waited is None:
            so.notes.append(f"{rec.request_id}: the master did not count {keys} put_end items within "
                            f"{st.put_wait_s:.0f} s; D was asked anyway")
        else:
            so.put_waits.append(waited)
        # 2. The same prompt, plainly, on D (never seen there).
        d0 = await scrape(ctx, ctx.d)
        try:
            async with asyncio.timeout(ctx.deadline(sc)):
                await send(ctx, rec, "store")
        except TimeoutError:
            rec.outcome, rec.diagnosis = "timeout", f"D gave no answer within {ctx.deadline(sc):.0f} s"
        d1 = await settled(ctx, ctx.d, d_keys)
        dv = values_delta(engine_values(d0), engine_values(d1))
        ops = ops_delta(d0, d1)
        row.update({
            "store_tokens": dv.get(f"cached_{STORE_SOURCE}", 0.0),
            "external_kv_tokens": dv.get("prompt_external_kv_transfer", 0.0),
            "local_prefix_hits": dv.get("prefix_hits", 0.0),
            "nixl_bytes": dv.get("nixl_bytes", 0.0),
            "load_get_keys": op(ops, "load_get", "keys"),
            "load_get_ok_bytes": op(ops, "load_get", "ok_bytes"),
            "load_get_failed_keys": op(ops, "load_get", "failed_keys"),
            "d_latency_s": rec.decode.latency_s if rec.decode else None,
        })
    await store_parity(ctx, obs, refs)


def _route_of(route: str, index: int) -> str:
    return route if route != "mixed" else ("store" if index % 2 == 0 else "pd")


async def _prefix_wave(sc: ScenarioConfig, st: StoreScenarioConfig, ctx: StoreContext,
                       obs: ScenarioObservation, so: StoreObservation, seed: int) -> None:
    bs = ctx.cfg.block_size
    suffix = sc.prompt_tokens - st.prefix_tokens
    prefixes = [make_prompt(st.prefix_tokens, seed_of(f"{seed}/prefix/{g}")) for g in range(st.groups)]
    # Seed: P computes each group's prefix (plus a suffix of its own), so the prefix's full blocks
    # are resident in the store before D sees any request of the group.
    base = await master_snapshot(ctx)
    seeds = await asyncio.gather(*(ctx.client.direct(
        ctx.p, prefixes[g] + make_prompt(suffix, seed_of(f"{seed}/seed/{g}")), 1) for g in range(st.groups)))
    bad = [h for h in seeds if classify(h) != "ok"]
    if bad:
        so.notes.append(f"seeding P failed for {len(bad)} group(s): {bad[0].error or 'empty answer'}")
    keys = st.groups * (sc.prompt_tokens // bs)
    so.keys_expected_in_master = keys
    waited = await wait_master(ctx, base, keys, st.put_wait_s)
    if waited is None:
        so.notes.append(f"the master did not count {keys} put_end items within {st.put_wait_s:.0f} s "
                        "after seeding; the waves ran anyway")
    else:
        so.put_waits.append(waited)
    index = 0
    for rnd in range(st.rounds):
        if rnd > 0 and st.reset_prefix_cache:
            # bug record R14: empty P's and D's own prefix caches (the store stays warm), so the next
            # round's prefixes come from the store again while requests are being cancelled.
            for ep in (ctx.p, ctx.d):
                so.resets.append({"round": rnd, **await reset_prefix_cache(ctx.http, ep, st.reset_timeout_s)})
        for w in range(st.waves):
            tag = f"r{rnd}-w{w}" if st.rounds > 1 else f"w{w}"
            salt = f"{seed}/w{w}" if rnd == 0 else f"{seed}/round{rnd}/w{w}"
            recs, routes = [], []
            for g in range(st.groups):
                for j in range(st.per_group):
                    prompt = prefixes[g] + make_prompt(suffix, seed_of(f"{salt}/g{g}/r{j}"))
                    recs.append(PDRecord(request_id=f"{sc.name}-{tag}-g{g}-{j}", prompt_len=sc.prompt_tokens,
                                         max_tokens=sc.max_tokens, prompt=prompt,
                                         stream=streamed(st.stream, index)))
                    routes.append(_route_of(st.route, index))
                    index += 1
            for rec, cancel in zip(recs, plan_store_cancels(routes, st, seed_of(f"{salt}/cancel")), strict=True):
                rec.cancel = cancel
            obs.records += recs
            so.routes += routes
            d0 = await scrape(ctx, ctx.d)
            t0 = time.monotonic()
            diag = await run_batch(ctx, sc, recs, routes, st.concurrency, so)
            wall = time.monotonic() - t0
            d1 = await settled(ctx, ctx.d, d_keys)
            dv = values_delta(engine_values(d0), engine_values(d1))
            ops = ops_delta(d0, d1)
            so.waves.append({
                "wave": w, "round": rnd, "requests": len(recs), "ok": sum(r.outcome == "ok" for r in recs),
                "cancelled": sum(r.intentional for r in recs),
                "store_routed": routes.count("store"), "wall_s": round(wall, 3),
                "store_tokens": dv.get(f"cached_{STORE_SOURCE}", 0.0),
                "nixl_tokens": dv.get("cached_p2p", 0.0),
                "local_prefix_hits": dv.get("prefix_hits", 0.0),
                "load_get_ok_bytes": op(ops, "load_get", "ok_bytes"),
                "load_get_failed_keys": op(ops, "load_get", "failed_keys"),
                "nixl_bytes": dv.get("nixl_bytes", 0.0), "preemptions": dv.get("preemptions", 0.0),
            })
            if diag:
                so.stall_diagnosis = diag
                break
        if so.stall_diagnosis:
            break
    if sc.parity:
        await store_parity(ctx, obs)
    else:
        obs.parity = [None] * len(obs.records)


async def _long_generation(sc: ScenarioConfig, st: StoreScenarioConfig, ctx: StoreContext,
                           obs: ScenarioObservation, so: StoreObservation, seed: int) -> None:
    recs = [PDRecord(request_id=f"{sc.name}-{i}", prompt_len=sc.prompt_tokens, max_tokens=sc.max_tokens,
                     prompt=make_prompt(sc.prompt_tokens, seed_of(f"{seed}/long/{i}")))
            for i in range(st.requests)]
    obs.records += recs
    so.routes += ["pd"] * len(recs)
    so.stall_diagnosis = await run_batch(ctx, sc, recs, ["pd"] * len(recs), len(recs), so)
    if sc.parity:
        await store_parity(ctx, obs)
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
        p0, d0, m0 = await scrape(ctx, ctx.p), await scrape(ctx, ctx.d), await scrape(ctx, ctx.master)
        await WORKLOADS[sc.kind](sc, st, ctx, obs, so, seed)
        obs.stall_diagnosis = obs.stall_diagnosis or so.stall_diagnosis
        # Engine counters before the stats flush (its 4 tokens are not the scenario's), the
        # connector's operation counters after it.
        pe, de = await scrape(ctx, ctx.p), await settled(ctx, ctx.d, d_keys)
        for k, ep in enumerate((ctx.p, ctx.d)):
            await flush(ctx, ep, seed + 7 + k)
        p1 = await scrape(ctx, ctx.p)
        d1 = await settled(ctx, ctx.d, d_keys)
        so.p_ops, so.d_ops = ops_delta(p0, p1), ops_delta(d0, d1)
        so.p = values_delta(engine_values(p0), engine_values(pe))
        so.d = values_delta(engine_values(d0), engine_values(de))
        if ctx.snapshots:
            for snap in (p1, d1):
                ctx.snapshots.save(f"{sc.name}-store-after", snap)
            ctx.snapshots.save(f"{sc.name}-store-before", m0)
    except (httpx.HTTPError, ValueError) as e:
        so.error = f"metrics unavailable: {type(e).__name__}: {e}"
    m1 = await master_snapshot(ctx)
    if m1 is not None:
        so.master = values_delta(master_values(m0), master_values(m1)) if m0 is not None else {}
        so.master_after = master_values(m1)
        if ctx.snapshots:
            ctx.snapshots.save(f"{sc.name}-store-after", m1)
    try:
        r = await ctx.http.get(ctx.master.url + "/health", timeout=5.0)
        so.master_health = f"HTTP {r.status_code} {r.text.strip()[:160]}"
        so.master_alive_end = r.status_code == 200 and '"ok"' in r.text
    except httpx.HTTPError as e:
        so.master_health = f"unreachable: {type(e).__name__}: {e}"
    return so  # store/<name>.json is the report's: rig.report.render writes it from the report model

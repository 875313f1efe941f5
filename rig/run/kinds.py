"""The scenario kinds: for each ``ScenarioConfig.kind``, how to run it and how to judge it.

The runner owns what every kind shares (metric snapshots before and after, transfer evidence,
drain-to-idle, liveness, fatal log lines); a kind only fills the request-level part of the
:class:`~rig.observe.observations.ScenarioObservation` and may return a kind-specific result that its
judge reads (wave statistics, store counters, retrieval rates). Adding a kind = one entry here;
its summary.md section is one entry in rig.report.sections, rendered from the report's data
(rig.report.build puts the kind's result into the scenario's report). This module is the glue:
workload (rig.workload) -> checks and verdict (rig.judge).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from rig.cluster.processes import Cluster
from rig.config import RigConfig, ScenarioConfig
from rig.config.blocks import BlockFacts, usable_in_pool
from rig.judge.cached_tokens import cached_tokens_check
from rig.judge.checks import lease_release_check, retrieval_check, stream_check
from rig.judge.early_verdict import AdmissionReasoning
from rig.judge.fault_checks import fault_checks
from rig.judge.latency import latency_check
from rig.judge.sequence_checks import judge_sequence
from rig.judge.store_checks import judge_store
from rig.judge.verdict import ScenarioVerdict, judge
from rig.judge.wave_checks import explain_stall, judge_wave
from rig.observe import metrics as m
from rig.observe.events import SampleEvents
from rig.observe.observations import ScenarioObservation, SnapshotStore
from rig.observe.stall import cache_info
from rig.transport.client import Transport
from rig.transport.endpoint import Endpoint
from rig.transport.records import PDRecord
from rig.workload.edge import flush_prefill_pool, run_edge
from rig.workload.faults import FaultResult, run_fault_scenario
from rig.workload.prompts import seed_of
from rig.workload.retrieval import RetrievalResult, run_retrieval
from rig.workload.sequence import run_sequence_scenario
from rig.workload.store import StoreContext, run_store_scenario
from rig.workload.waves import run_wave_scenario, usable_blocks_of


@dataclass
class ScenarioContext:
    """What a kind may use while it runs: the topology's endpoints and the rig's clients."""

    cfg: RigConfig
    cluster: Cluster
    prefill: Endpoint
    decode: Endpoint
    client: Transport
    http: httpx.AsyncClient  # no keep-alive: for /metrics
    store: SnapshotStore
    run_dir: Path
    quiet: bool
    router_url: str | None = None  # pdrig proxy the runner started for a scenario's router steps
    events: SampleEvents | None = None  # request events that wake the sampling loops (rig.observe.events)


@dataclass(frozen=True)
class Kind:
    """``run(sc, ctx, obs) -> result`` fills ``obs``; ``judge(sc, obs, result)`` returns the
    verdict, nothing else (the report renders the kind's section from ``result``)."""

    run: Callable[[ScenarioConfig, ScenarioContext, ScenarioObservation], Awaitable[Any]]
    judge: Callable[[ScenarioConfig, ScenarioObservation, Any], ScenarioVerdict]


def block_facts(cfg: RigConfig, decode: str) -> BlockFacts:
    """The decode instance's block arithmetic from the config (block size, usable blocks =
    ``InstanceConfig.usable_blocks``, k, max_model_len); the stall facts' ``vllm:cache_config_info``
    overrides the usable blocks where the server exposes it (rig.judge.signatures.admission_of)."""
    spec = cfg.instance(decode).speculative
    return BlockFacts(block_size=cfg.instance(decode).block_size or cfg.block_size,
                      usable_blocks=cfg.instance(decode).usable_blocks,
                      num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
                      max_model_len=cfg.max_model_len_of(decode))


async def _run_edge(sc: ScenarioConfig, ctx: ScenarioContext, obs: ScenarioObservation) -> BlockFacts:
    t = ctx.cfg.timeouts
    between = None
    if sc.hold_between_s:
        hold_s = sc.hold_between_s
        usable = None
        if sc.flush_prefill:
            usable = usable_blocks_of(ctx.cfg, [ctx.prefill.name])[ctx.prefill.name] or await _usable_from_metrics(ctx)

        async def hold(rec: PDRecord) -> None:
            # A router that queues the decode hop: P's blocks wait for D, and P's lease runs.
            await asyncio.sleep(hold_s)
            if usable:
                await flush_prefill_pool(ctx.client, ctx.prefill, usable, ctx.cfg.block_size,
                                         ctx.cfg.max_model_len_of(ctx.prefill.name), seed_of(sc.name))
        between = hold
    blocks = block_facts(ctx.cfg, ctx.decode.name)
    # Reasoning instead of waiting: an admission stall is decided once the block
    # arithmetic and D's EngineCore CPU time prove it; held decode hops keep the plain window.
    early = None if between is not None else AdmissionReasoning(blocks, (sc.prompt_tokens,))
    name = ctx.decode.name
    router = Endpoint("router", sc.router_url or ctx.router_url or "") if sc.router is not None else None
    await run_edge(sc, ctx.client, ctx.http, ctx.prefill, ctx.decode, sc.deadline_s or t.request_s,
                   t.stall_window_s, t.metrics_interval_s, ctx.store, obs, transfer_window_s=t.kv_transfer_s,
                   between=between, early=early, engine_cpu=lambda: ctx.cluster.proc_sample(name),
                   inconclusive_s=t.stall_inconclusive_wait(sc.deadline_s), router=router,
                   scenarios=ctx.cfg.scenarios, events=ctx.events)
    return blocks


async def _usable_from_metrics(ctx: ScenarioContext) -> int | None:
    """P's usable blocks from its ``vllm:cache_config_info`` (vLLM sized the pool itself)."""
    n = cache_info(await m.scrape(ctx.http, ctx.prefill.url, ctx.prefill.name)).get("num_gpu_blocks")
    return usable_in_pool(n)


def _judge_edge(sc: ScenarioConfig, obs: ScenarioObservation, result: Any) -> ScenarioVerdict:
    # The checks that follow request fields: a streamed decode hop must be
    # complete and in order; fields such as n on the prefill hop must not leave blocks to the lease.
    extra = [c for c in (stream_check(obs.records),) if c is not None]
    # every answered hop against the deployment's measured request; a held decode hop is left out
    extra.append(latency_check(obs, sc.hold_between_s or 0.0))
    if sc.request is not None:
        extra.append(lease_release_check(obs))
    # bug record R15: D's usage.prompt_tokens_details.cached_tokens, on the scenarios that ask for it
    # (``require: [cached-tokens]``). Not on every scenario whose hops report it: the bug record asks for an
    # informational verdict until upstream settles the semantics, and on 0.28.0 every P/D answer
    # shows R15 (docs/bug-record.md), which would hide each scenario's own subject behind it.
    if "cached-tokens" in sc.require:
        extra.append(cached_tokens_check(obs))
    return judge(sc, obs, blocks=result if isinstance(result, BlockFacts) else None, extra=extra or None)


async def _run_wave(sc: ScenarioConfig, ctx: ScenarioContext, obs: ScenarioObservation) -> Any:
    return await run_wave_scenario(sc, ctx.cfg, ctx.prefill, ctx.decode, ctx.http, ctx.store, ctx.run_dir, ctx.quiet,
                                   explain=explain_stall, probe=ctx.cluster.proc_sample, events=ctx.events)


async def _run_store(sc: ScenarioConfig, ctx: ScenarioContext, obs: ScenarioObservation) -> Any:
    sctx = StoreContext.of(ctx.cfg, ctx.cluster, ctx.prefill, ctx.decode, ctx.client, ctx.http, ctx.store, ctx.run_dir)
    sctx.events = ctx.events
    return await run_store_scenario(sc, sctx, obs)


async def _run_retrieval(sc: ScenarioConfig, ctx: ScenarioContext, obs: ScenarioObservation) -> Any:
    r = sc.retrieval
    assert r is not None  # the config validator fills it for this kind
    ref = ctx.prefill if r.reference is None else Endpoint(r.reference, ctx.cluster.url(r.reference))
    result = await run_retrieval(ctx.client, ctx.prefill, ctx.decode, ref, r.requests, r.context_words,
                                 sc.max_tokens, sc.seed if sc.seed is not None else seed_of(sc.name))
    obs.records, obs.parity = result.records, result.parity
    return result


def _judge_retrieval(sc: ScenarioConfig, obs: ScenarioObservation, result: RetrievalResult | None) -> ScenarioVerdict:
    """The edge checks (completion, parity, transfer, liveness, idle) plus
    rig.judge.checks.retrieval_check and rig.judge.latency.latency_check, through the one engine."""
    return judge(sc, obs, extra=[retrieval_check(result), latency_check(obs)])


async def _run_fault(sc: ScenarioConfig, ctx: ScenarioContext, obs: ScenarioObservation) -> Any:
    return await run_fault_scenario(sc, ctx, obs)


def _judge_fault(sc: ScenarioConfig, obs: ScenarioObservation, result: FaultResult | None) -> ScenarioVerdict:
    """Fault scenarios: rig.judge.fault_checks.fault_checks through the one engine."""
    return judge(sc, obs, checks=fault_checks(sc, obs, result))


async def _run_sequence(sc: ScenarioConfig, ctx: ScenarioContext, obs: ScenarioObservation) -> Any:
    result = await run_sequence_scenario(sc, ctx, obs)
    # As the edge kind: a stall signature's admission is decided from the decode's block arithmetic
    # (without it an emitted livelock scenario could never match its known issue: admission unknown).
    result.blocks = block_facts(ctx.cfg, ctx.decode.name)
    return result


_WAVE = Kind(_run_wave, judge_wave)
_STORE = Kind(_run_store, judge_store)
KINDS: dict[str, Kind] = {
    "edge": Kind(_run_edge, _judge_edge),
    "prefix-wave": _WAVE,
    "pressure-wave": _WAVE,
    "store-roundtrip": _STORE,
    "prefix-wave-store": _STORE,
    "long-generation": _STORE,
    "retrieval": Kind(_run_retrieval, _judge_retrieval),
    "fault": Kind(_run_fault, _judge_fault),
    "sequence": Kind(_run_sequence, judge_sequence),
}

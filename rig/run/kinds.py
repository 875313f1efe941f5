"""The scenario kinds: for each ``ScenarioConfig.kind``, how to run it and how to judge it.

The runner owns what every kind shares (metric snapshots before and after, transfer evidence,
drain-to-idle, liveness, fatal log lines); a kind only fills the request-level part of the
:class:`~rig.observe.observations.ScenarioObservation` and may return a kind-specific result that its
judge reads (wave statistics, store counters, retrieval rates). Adding a kind = one entry here.
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
from rig.judge.cached_tokens import cached_of, cached_tokens_check
from rig.judge.early_verdict import AdmissionReasoning
from rig.judge.signatures import BlockFacts
from rig.judge.verdict import Check, ScenarioVerdict, judge
from rig.observe import metrics as m
from rig.observe.observations import ScenarioObservation, SnapshotStore
from rig.transport.client import Transport
from rig.transport.endpoint import Endpoint
from rig.transport.records import PDRecord
from rig.workload.edge import flush_prefill_pool, run_edge
from rig.workload.prompts import seed_of


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


@dataclass(frozen=True)
class Kind:
    """``run(sc, ctx, obs) -> result`` fills ``obs``; ``judge(sc, obs, result, sections)`` returns
    the verdict and may append markdown sections for summary.md."""

    run: Callable[[ScenarioConfig, ScenarioContext, ScenarioObservation], Awaitable[Any]]
    judge: Callable[[ScenarioConfig, ScenarioObservation, Any, list[str]], ScenarioVerdict]


def block_facts(cfg: RigConfig, decode: str) -> BlockFacts:
    """The decode instance's block arithmetic from the config (block size, usable blocks =
    num_gpu_blocks_override - 1, k, max_model_len); the stall facts' ``vllm:cache_config_info``
    overrides the usable blocks where the server exposes it (rig.judge.signatures.admission_of)."""
    from rig.workload.waves import usable_blocks_of

    spec = cfg.instance(decode).speculative
    return BlockFacts(block_size=cfg.instance(decode).block_size or cfg.block_size,
                      usable_blocks=usable_blocks_of(cfg, [decode])[decode],
                      num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
                      max_model_len=cfg.max_model_len)


async def _run_edge(sc: ScenarioConfig, ctx: ScenarioContext, obs: ScenarioObservation) -> BlockFacts:
    t = ctx.cfg.timeouts
    between = None
    if sc.hold_between_s:
        hold_s = sc.hold_between_s
        usable = None
        if sc.flush_prefill:
            from rig.workload.waves import usable_blocks_of

            usable = usable_blocks_of(ctx.cfg, [ctx.prefill.name])[ctx.prefill.name] or await _usable_from_metrics(ctx)

        async def hold(rec: PDRecord) -> None:
            # A router that queues the decode hop: P's blocks wait for D, and P's lease runs.
            await asyncio.sleep(hold_s)
            if usable:
                await flush_prefill_pool(ctx.client, ctx.prefill, usable, ctx.cfg.block_size,
                                         ctx.cfg.max_model_len, seed_of(sc.name))
        between = hold
    blocks = block_facts(ctx.cfg, ctx.decode.name)
    # Reasoning instead of waiting (issue #13): an admission stall is decided once the block
    # arithmetic and D's EngineCore CPU time prove it; held decode hops keep the plain window.
    early = None if between is not None else AdmissionReasoning(blocks, (sc.prompt_tokens,))
    name = ctx.decode.name
    await run_edge(sc, ctx.client, ctx.http, ctx.prefill, ctx.decode, sc.deadline_s or t.request_s,
                   t.stall_window_s, t.metrics_interval_s, ctx.store, obs, transfer_window_s=t.kv_transfer_s,
                   between=between, early=early, engine_cpu=lambda: ctx.cluster.engine_cpu_s(name))
    return blocks


async def _usable_from_metrics(ctx: ScenarioContext) -> int | None:
    """P's usable blocks from its ``vllm:cache_config_info`` (vLLM sized the pool itself)."""
    from rig.workload.waves import cache_info

    n = cache_info(await m.scrape(ctx.http, ctx.prefill.url, ctx.prefill.name)).get("num_gpu_blocks")
    return n - 1 if n else None


def _judge_edge(sc: ScenarioConfig, obs: ScenarioObservation, result: Any, _sections: list[str]) -> ScenarioVerdict:
    from rig.judge.checks import lease_release_check, stream_check

    # The checks that follow request fields (issue #12 item 1): a streamed decode hop must be
    # complete and in order; fields such as n on the prefill hop must not leave blocks to the lease.
    extra = [c for c in (stream_check(obs.records),) if c is not None]
    if sc.request is not None:
        extra.append(lease_release_check(obs))
    # BUGS R15: D's usage.prompt_tokens_details.cached_tokens, when a hop reports it or asked for.
    if "cached-tokens" in sc.require or any(cached_of(h.usage) is not None for r in obs.records
                                            for h in (r.prefill, r.decode) if h is not None):
        extra.append(cached_tokens_check(obs))
    return judge(sc, obs, blocks=result if isinstance(result, BlockFacts) else None, extra=extra or None)


async def _run_wave(sc: ScenarioConfig, ctx: ScenarioContext, obs: ScenarioObservation) -> Any:
    from rig.workload.waves import run_wave_scenario

    return await run_wave_scenario(sc, ctx.cfg, ctx.prefill, ctx.decode, ctx.http, ctx.store, ctx.run_dir, ctx.quiet)


def _judge_wave(sc: ScenarioConfig, obs: ScenarioObservation, result: Any, sections: list[str]) -> ScenarioVerdict:
    from rig.workload.waves import judge_wave

    return judge_wave(sc, obs, result, sections)


async def _run_store(sc: ScenarioConfig, ctx: ScenarioContext, obs: ScenarioObservation) -> Any:
    from rig.workload.store import StoreContext, run_store_scenario

    return await run_store_scenario(sc, StoreContext.of(ctx.cfg, ctx.cluster, ctx.prefill, ctx.decode, ctx.client,
                                                        ctx.http, ctx.store, ctx.run_dir), obs)


def _judge_store(sc: ScenarioConfig, obs: ScenarioObservation, result: Any, sections: list[str]) -> ScenarioVerdict:
    from rig.workload.store import judge_store

    return judge_store(sc, obs, result, sections)


async def _run_retrieval(sc: ScenarioConfig, ctx: ScenarioContext, obs: ScenarioObservation) -> Any:
    from rig.workload.retrieval import run_retrieval

    r = sc.retrieval
    assert r is not None  # the config validator fills it for this kind
    ref = ctx.prefill if r.reference is None else Endpoint(r.reference, ctx.cluster.url(r.reference))
    result = await run_retrieval(ctx.client, ctx.prefill, ctx.decode, ref, r.requests, r.context_words,
                                 sc.max_tokens, sc.seed if sc.seed is not None else seed_of(sc.name))
    obs.records, obs.parity = result.records, result.parity
    return result


def retrieval_check(result: Any) -> Check:
    """``retrieval``: P/D retrieves at least as many identifiers as the non-disaggregated
    reference. Not checked when nothing was compared or the reference retrieved none (0 >= 0
    says nothing: the tiny random model retrieves nothing on either side)."""
    if result is None:
        return Check("retrieval", None, "not checked: the retrieval workload did not run")
    pd, ref = result.rates()
    detail = (f"P/D {result.pd_hits}/{result.compared} ({pd:.0%}), "
              f"reference {result.ref_hits}/{result.compared} ({ref:.0%})")
    if result.compared == 0 or result.ref_hits == 0:
        return Check("retrieval", None, f"not checked: the reference retrieved nothing to compare with; {detail}")
    return Check("retrieval", result.pd_hits >= result.ref_hits, detail,
                 () if result.pd_hits >= result.ref_hits else tuple(r.request_id for r in result.records))


def _judge_retrieval(sc: ScenarioConfig, obs: ScenarioObservation, result: Any, sections: list[str]) -> ScenarioVerdict:
    """The edge checks (completion, parity, transfer, liveness, idle) plus :func:`retrieval_check`,
    through the one engine."""
    v = judge(sc, obs, extra=[retrieval_check(result)])
    if result is not None:
        pd, ref = result.rates()
        sections.append(f"### Retrieval `{sc.name}`\n\n| requests compared | P/D retrieved | reference retrieved |\n"
                        f"|---|---|---|\n| {result.compared} | {result.pd_hits} ({pd:.0%}) "
                        f"| {result.ref_hits} ({ref:.0%}) |\n")
    return v


async def _run_fault(sc: ScenarioConfig, ctx: ScenarioContext, obs: ScenarioObservation) -> Any:
    from rig.workload.faults import run_fault_scenario

    return await run_fault_scenario(sc, ctx, obs)


def _judge_fault(sc: ScenarioConfig, obs: ScenarioObservation, result: Any, sections: list[str]) -> ScenarioVerdict:
    """Fault scenarios (issue #12): rig.judge.fault_checks.fault_checks through the one engine."""
    from rig.judge.fault_checks import fault_checks
    from rig.workload.faults import fault_section

    if result is not None:
        sections.append(fault_section(sc.name, result))
    return judge(sc, obs, checks=fault_checks(sc, obs, result))


_WAVE = Kind(_run_wave, _judge_wave)
_STORE = Kind(_run_store, _judge_store)
KINDS: dict[str, Kind] = {
    "edge": Kind(_run_edge, _judge_edge),
    "prefix-wave": _WAVE,
    "pressure-wave": _WAVE,
    "store-roundtrip": _STORE,
    "prefix-wave-store": _STORE,
    "long-generation": _STORE,
    "retrieval": Kind(_run_retrieval, _judge_retrieval),
    "fault": Kind(_run_fault, _judge_fault),
}

"""The scenario kinds: for each ``ScenarioConfig.kind``, how to run it and how to judge it.

The runner owns what every kind shares (metric snapshots before and after, transfer evidence,
drain-to-idle, liveness, fatal log lines); a kind only fills the request-level part of the
:class:`~rig.observations.ScenarioObservation` and may return a kind-specific result that its
judge reads (wave statistics, store counters, retrieval rates). Adding a kind = one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx

from rig.client import PDClient
from rig.cluster import Cluster
from rig.config import RigConfig, ScenarioConfig
from rig.observations import ScenarioObservation, SnapshotStore
from rig.verdict import Check, ScenarioVerdict, judge
from rig.workload.edge import Endpoint, run_edge


@dataclass
class ScenarioContext:
    """What a kind may use while it runs: the topology's endpoints and the rig's clients."""

    cfg: RigConfig
    cluster: Cluster
    prefill: Endpoint
    decode: Endpoint
    client: PDClient
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


async def _run_edge(sc: ScenarioConfig, ctx: ScenarioContext, obs: ScenarioObservation) -> None:
    t = ctx.cfg.timeouts
    await run_edge(sc, ctx.client, ctx.http, ctx.prefill, ctx.decode, sc.deadline_s or t.request_s,
                   t.stall_window_s, t.metrics_interval_s, ctx.store, obs, transfer_window_s=t.kv_transfer_s)


def _judge_edge(sc: ScenarioConfig, obs: ScenarioObservation, _result: Any, _sections: list[str]) -> ScenarioVerdict:
    return judge(sc, obs)


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
    from rig.workload.prompts import seed_of
    from rig.workload.retrieval import run_retrieval

    r = sc.retrieval
    assert r is not None  # the config validator fills it for this kind
    ref = ctx.prefill if r.reference is None else Endpoint(r.reference, ctx.cluster.url(r.reference))
    result = await run_retrieval(ctx.client, ctx.prefill, ctx.decode, ref, r.requests, r.context_words,
                                 sc.max_tokens, sc.seed if sc.seed is not None else seed_of(sc.name))
    obs.records, obs.parity = result.records, result.parity
    return result


def _judge_retrieval(sc: ScenarioConfig, obs: ScenarioObservation, result: Any, sections: list[str]) -> ScenarioVerdict:
    """The edge checks (completion, parity, transfer, liveness, idle) plus the retrieval rate:
    P/D must retrieve at least as many identifiers as the non-disaggregated reference."""
    v = judge(sc, obs)
    if result is None:
        return v
    pd, ref = result.rates()
    ok = result.compared > 0 and result.pd_hits >= result.ref_hits
    v.checks.append(Check("retrieval", ok, f"P/D {result.pd_hits}/{result.compared} ({pd:.0%}), "
                                           f"reference {result.ref_hits}/{result.compared} ({ref:.0%})"))
    if not ok and v.verdict == "PASS":
        v.verdict, v.reason = "FAIL", f"retrieval: {v.checks[-1].detail}"
    sections.append(f"### Retrieval `{sc.name}`\n\n| requests compared | P/D retrieved | reference retrieved |\n"
                    f"|---|---|---|\n| {result.compared} | {result.pd_hits} ({pd:.0%}) | {result.ref_hits} ({ref:.0%}) |\n")
    return v


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
}

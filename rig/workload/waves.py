"""Prefix waves and pressure waves through P/D: the requests and what they did.

**Prefix wave** (``kind: prefix-wave``): ``groups`` (G) x ``per_group`` (N) requests; the
prompts of a group share a ``prefix_tokens`` (K) prefix and end in a unique suffix. P's prefix
cache should serve every request of a group after the first from cache:
``expected P hits = G x (N-1) x floor(K / block_size) x block_size`` tokens
(``vllm:prefix_cache_hits_total`` delta), when the prefixes stay cached (the check is made only
when the wave's working set fits in P's usable blocks, see :func:`prefix_fits`). D's local and
external (``vllm:external_prefix_cache_hits_total``) hits are reported too.

**Pressure wave** (``kind: pressure-wave``): ``requests`` (R) distinct prompts at
``concurrency`` (C), a fraction ``cancel_fraction`` (X) cancelled on purpose. Reported:
completions, intentional cancellations per point, errors by class, empty streams, peak running
and waiting per instance (sampled), preemptions (``vllm:num_preemptions_total`` delta),
throughput.

A configurable sample of completed requests (``parity_fraction``, default 10 %) is compared
token by token with a direct, non-disaggregated request to P (:func:`rig.observe.parity.compare`).

This module drives the requests and records a :class:`~rig.workload.wave_result.WaveResult`.
The drain to idle after the wave is rig.observe.drain, the checks and verdict
rig.judge.wave_checks, the summary.md section rig.report.wave_section.

Files (under ``<run_dir>/waves/``): ``<scenario>-records.jsonl`` (one line per request),
``<scenario>.json`` (the wave's facts) and ``<scenario>-timeline.png``; the samples go to
``<run_dir>/metrics/timeline.jsonl``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import httpx

from rig.cluster.proctree import ProcSample
from rig.config import RigConfig, ScenarioConfig, WaveConfig
from rig.config.blocks import blocks_for, usable_in_pool
from rig.observe import metrics as m
from rig.observe.events import SampleEvents, SampleTrigger
from rig.observe.observations import (
    SnapshotStore,
)
from rig.observe.progress import WaveProgress
from rig.observe.stall import StallWatcher, cache_info
from rig.observe.timeline import TimelineSampler, plot_timeline
from rig.transport.client import Transport, make_transport
from rig.transport.endpoint import Endpoint
from rig.transport.records import WaveRecord, WaveRecordLine
from rig.workload.engine import WaveEngine, WaveRequest, plan_cancels
from rig.workload.prompts import make_prompt, prefix_group_prompts, seed_of
from rig.workload.wave_result import WaveResult

# Why a stall episode is expected, or "" (rig.judge.wave_checks.explain_stall, passed in by the app layer).
ExplainStall = Callable[[dict[str, Any], WaveResult], str]

COUNTER_DELTAS = {  # key in WaveResult.deltas -> metric
    "prefix_queries": m.PREFIX_QUERIES, "prefix_hits": m.PREFIX_HITS,
    "external_prefix_queries": m.EXT_PREFIX_QUERIES, "external_prefix_hits": m.EXT_PREFIX_HITS,
    "preemptions": m.PREEMPTIONS, "generation_tokens": m.GENERATION_TOKENS,
    "request_success": m.REQUEST_SUCCESS, "prompt_tokens": m.PROMPT_TOKENS,
    "nixl_bytes": m.NIXL_BYTES_SUM,
}


# ------------------------------------------------------------------------------------ prompts


def wave_requests(sc: ScenarioConfig, seed: int) -> list[WaveRequest]:
    """The requests of a wave scenario: prompts, streaming, planned cancels, parity sample.

    Prefix wave: group-major order (all of group 0, then group 1, ...). Streaming per
    ``wave.stream`` (``mixed``: odd indexes streamed); during-decode cancels are always streamed.
    The parity sample is ``round(parity_fraction x requests not planned to cancel)`` requests
    (at least one when the fraction is above 0), chosen with the seed.
    """
    w = sc.wave or WaveConfig()
    prompts: list[tuple[int | None, list[int]]]  # (prefix group, prompt); no group in a pressure wave
    if sc.kind == "prefix-wave":
        groups = prefix_group_prompts(w.groups, w.per_group, w.prefix_tokens,
                                      sc.prompt_tokens - w.prefix_tokens, seed)
        prompts = [(g, p) for g, ps in enumerate(groups) for p in ps]
    elif sc.kind == "pressure-wave":
        prompts = [(None, make_prompt(sc.prompt_tokens, seed_of(f"{seed}/pressure/{i}"))) for i in range(w.requests)]
    else:
        raise ValueError(f"{sc.name}: kind {sc.kind!r} is not a wave")
    n = len(prompts)
    cancels = plan_cancels(n, w.cancel_fraction, list(w.cancel_points), seed_of(f"{seed}/cancel"))
    eligible = [i for i in range(n) if cancels[i] is None]
    k = 0
    if w.parity_fraction > 0 and sc.parity:
        k = min(len(eligible), max(1, round(w.parity_fraction * len(eligible))))
    sample = set(random.Random(seed_of(f"{seed}/parity")).sample(eligible, k)) if k else set()
    stream_of = {"always": lambda i: True, "never": lambda i: False, "mixed": lambda i: i % 2 == 1}[w.stream]
    return [WaveRequest(index=i, request_id=f"{sc.name}-{i}", prompt=p, max_tokens=sc.max_tokens,
                        stream=stream_of(i) or cancels[i] == "during-decode", cancel_at=cancels[i],
                        group=g, keep_tokens=i in sample)
            for i, (g, p) in enumerate(prompts)]


def expected_prefix_hits(groups: int, per_group: int, prefix_tokens: int, block_size: int) -> int:
    """Prefix-cache hit tokens a prefix wave should produce on P: every request of a group after
    the first hits the group's full prefix blocks, ``(N-1) x floor(K/bs) x bs`` per group."""
    return groups * max(per_group - 1, 0) * (prefix_tokens // block_size) * block_size


def prefix_fits(groups: int, per_group: int, concurrency: int, prefix_tokens: int, prompt_tokens: int,
                block_size: int, usable_blocks: int | None) -> tuple[bool, str]:
    """Whether P can keep every group's prefix cached while the wave runs: all prefixes
    (``G x floor(K/bs)`` blocks) plus the blocks of the requests in flight
    (``min(C, G x N) x cdiv(L+1, bs)``) within P's usable blocks. Returns ``(fits, why)``."""
    full = prefix_tokens // block_size
    if full == 0:
        return False, f"prefix of {prefix_tokens} tokens is shorter than one block ({block_size} tokens)"
    if usable_blocks is None:
        return True, "P's block count unknown: assumed to fit"
    need = groups * full + min(concurrency, groups * per_group) * blocks_for(prompt_tokens + 1, block_size)
    if need > usable_blocks:
        return False, f"working set {need} blocks > P's {usable_blocks} usable blocks (evictions possible)"
    return True, f"working set {need} of P's {usable_blocks} usable blocks"




# ------------------------------------------------------------------------------------ helpers


async def served_model(http: httpx.AsyncClient, url: str) -> tuple[str, int | None]:
    """``(model id, max_model_len)`` of the first model listed by ``url``/v1/models.

    Raises httpx.HTTPError when the server does not answer, ValueError when it lists none.
    """
    r = await http.get(f"{url}/v1/models")
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data:
        raise ValueError(f"{url}/v1/models lists no model")
    return data[0]["id"], data[0].get("max_model_len")



# ------------------------------------------------------------------------------------ the wave


async def run_wave(sc: ScenarioConfig, model: str, prefills: list[Endpoint], decodes: list[Endpoint],
                   http: httpx.AsyncClient, store: SnapshotStore | None, out_dir: str | Path | None, *,
                   deadline_s: float, usable_blocks: dict[str, int | None] | None = None,
                   block_size: int | None = None, max_model_len: int | None = None,
                   progress: str = "auto", seed: int | None = None,
                   stall_window_s: float = 8.0, transfer_window_s: float | None = 30.0,
                   kv_lease_s: float = 30.0, explain: ExplainStall | None = None,
                   stall_inconclusive_s: float = 0.0,
                   probe: Callable[[str], ProcSample | None] | None = None,
                   events: SampleEvents | None = None) -> WaveResult:
    """Run one wave scenario against running servers; no drain check (see :func:`check_drains`).

    Every instance's samples go through the stall watcher (``stall_window_s``, and
    ``transfer_window_s`` while a KV read is in flight; :mod:`rig.observe.stall`); each episode is
    explained or not by ``explain`` (rig.judge.wave_checks.explain_stall; ``kv_lease_s`` = P's NIXL
    kv_lease_duration); without ``explain`` the episode has no ``explained`` entry and the judge
    explains it.

    Takes a baseline scrape of every instance, samples the timeline while the engine sends the
    requests, scrapes again (counter deltas), then runs the parity sample and writes the records,
    and the timeline PNG into ``out_dir`` (the wave's JSON, ``<name>.json`` beside them, is the report's:
    rig.report.render writes it from the report model). Problems reaching the servers end up in
    ``WaveResult.error``; this function does not raise for them. ``events``: see :func:`_listen`.
    """
    w = sc.wave or WaveConfig()
    seed = sc.seed if sc.seed is not None else (seed if seed is not None else seed_of(sc.name))
    endpoints = [*prefills, *decodes]
    res = _new_result(sc, seed, prefills, decodes, deadline_s, usable_blocks, block_size, max_model_len, kv_lease_s)
    out = Path(out_dir) if out_dir is not None else None
    try:
        requests = wave_requests(sc, seed)
    except ValueError as e:
        res.error = str(e)
        return res
    res.params["requests"] = len(requests)
    try:
        before = dict(zip([e.name for e in endpoints],
                          await asyncio.gather(*(m.scrape(http, e.url, e.name) for e in endpoints)), strict=True))
    except (httpx.HTTPError, ValueError) as e:
        res.error = f"metrics unavailable before the wave: {type(e).__name__}: {e}"
        return res
    _baseline(sc, res, before, store, prefills[0].name)
    transport = make_transport(w.client, model, deadline_s, max(2 * w.concurrency, 8))
    engine = WaveEngine(transport, prefills, decodes, w.concurrency, deadline_s, w.cancel_prefill_after_s)
    episodes = StallWatcher(stall_window_s, transfer_window_s, inconclusive_s=stall_inconclusive_s, probe=probe)
    trigger = _listen(transport, events, endpoints, w.sample_interval_s)
    sampler = TimelineSampler(http, endpoints, store, sc.name, w.sample_interval_s, stalls=episodes, trigger=trigger)
    title = sc.name if sc.name == sc.kind else f"{sc.kind} {sc.name}"
    prog = WaveProgress(title, len(requests), engine.counts, sampler.latest, mode=progress)
    t_wave = 0.0
    try:
        sampler.start()
        prog.start()
        t0, cpu0 = time.monotonic(), time.process_time()
        try:
            res.records = await engine.run(requests)
        except BaseException:  # Ctrl-C or a crash: keep what the wave did so far
            res.records = engine.records  # unfinished ones are "cancelled: wave aborted"
            res.error = res.error or "the wave was interrupted: partial records"
            if out is not None:
                _write_records(out / f"{sc.name}-records.jsonl", res.records)
            raise
        finally:
            t_wave = time.monotonic() - t0
            res.wall_s, res.client_cpu_s = t_wave, time.process_time() - cpu0
            await sampler.stop()
            await prog.stop()
        await _counter_deltas(res, http, endpoints, before, store)
        if any(r.token_ids is not None for r in res.records):
            res.parity = await engine.parity(res.records, requests)
    finally:
        await transport.aclose()
        if events is not None and trigger is not None:
            events.release(trigger)
    _sampled(res, sampler, episodes, engine.t0 or 0.0, explain)
    if out is not None:
        _write_files(res, out, sampler.rows, f"{title}: {len(requests)} requests, C={w.concurrency}", t_wave)
    for rec in res.records:  # the sample's tokens were only needed for parity
        rec.token_ids = None
    return res


def _listen(transport: Transport, events: SampleEvents | None, endpoints: list[Endpoint],
            interval_s: float) -> SampleTrigger | None:
    """The wave's hops reported to ``events``, and the timeline's trigger: woken by them at most
    every fifth of its period ``interval_s`` (it scrapes every instance per round); None without events."""
    if events is None:
        return None
    transport.listeners.append(events)
    return events.trigger(*(e.name for e in endpoints), min_gap_s=interval_s / 5)


async def _counter_deltas(res: WaveResult, http: httpx.AsyncClient, endpoints: list[Endpoint],
                         before: dict[str, m.MetricSnapshot], store: SnapshotStore | None) -> None:
    """Scrape every instance after the wave: its counter deltas (:data:`COUNTER_DELTAS`) into
    ``res.deltas``; an instance that does not answer is ``res.error`` (no deltas at all)."""
    try:
        after = dict(zip([e.name for e in endpoints],
                         await asyncio.gather(*(m.scrape(http, e.url, e.name) for e in endpoints)), strict=True))
    except (httpx.HTTPError, ValueError) as e:
        res.error = f"metrics unavailable after the wave: {type(e).__name__}: {e}"
        return
    for name, snap in after.items():
        res.deltas[name] = {k: m.delta(before[name], snap, metric) for k, metric in COUNTER_DELTAS.items()}
        if store is not None:
            store.save(f"{res.scenario}-wave-end", snap)


def _sampled(res: WaveResult, sampler: TimelineSampler, episodes: StallWatcher, t0: float,
             explain: ExplainStall | None) -> None:
    """What the sampler saw (peaks, scrape errors, samples per instance) and the stall episodes,
    their start in seconds after the wave's start ``t0`` (monotonic), each explained by ``explain``."""
    res.peaks = sampler.peaks
    res.scrape_errors = sampler.scrape_errors
    res.samples = dict(sampler.samples)
    for ep in episodes.episodes:
        st = {"instance": ep.instance, "start_s": round(ep.since - t0, 1), "duration_s": round(ep.duration_s, 1),
              "diagnosis": ep.diagnosis, "inconclusive": ep.inconclusive}
        if explain is not None:
            st["explained"] = explain(st, res)
        res.stalls.append(st)


def _new_result(sc: ScenarioConfig, seed: int, prefills: list[Endpoint], decodes: list[Endpoint], deadline_s: float,
                usable_blocks: dict[str, int | None] | None, block_size: int | None, max_model_len: int | None,
                kv_lease_s: float) -> WaveResult:
    """The wave's result before any request: its parameters (``requests`` set once the requests
    are made), each instance's role and what the caller knows of the blocks (tokens, blocks)."""
    w = sc.wave or WaveConfig()
    roles = {e.name: "prefill" for e in prefills} | {e.name: "decode" for e in decodes}
    params = {"requests": None, "concurrency": w.concurrency, "cancel_fraction": w.cancel_fraction,
              "cancel_points": list(w.cancel_points), "prompt_tokens": sc.prompt_tokens,
              "max_tokens": sc.max_tokens, "stream": w.stream,
              "parity_fraction": w.parity_fraction if sc.parity else 0.0,
              "deadline_s": deadline_s, "seed": seed}
    if sc.kind == "prefix-wave":
        params.update(groups=w.groups, per_group=w.per_group, prefix_tokens=w.prefix_tokens)
    return WaveResult(sc.name, sc.kind, w.client, params, roles, usable_blocks=dict(usable_blocks or {}),
                      block_size=block_size, max_model_len=max_model_len, kv_lease_s=kv_lease_s)


def _baseline(sc: ScenarioConfig, res: WaveResult, before: dict[str, m.MetricSnapshot],
              store: SnapshotStore | None, prefill: str) -> None:
    """What the scrapes before the wave say: each instance's KV usage, its usable blocks and the
    block size where the caller did not know them (``vllm:cache_config_info``), and a prefix wave's
    expected hits on ``prefill`` (tokens) when its working set fits (:func:`prefix_fits`)."""
    w = sc.wave or WaveConfig()
    for name, snap in before.items():
        res.baseline_kv[name] = snap.value(m.KV_USAGE)
        info = cache_info(snap)
        if res.usable_blocks.get(name) is None and info.get("num_gpu_blocks"):
            res.usable_blocks[name] = usable_in_pool(info["num_gpu_blocks"])
        if res.block_size is None and info.get("block_size"):
            res.block_size = info["block_size"]
        if store is not None:
            store.save(f"{sc.name}-wave-start", snap)
    if sc.kind == "prefix-wave":
        bs = res.block_size
        if bs:
            res.expected_prefix_hits = expected_prefix_hits(w.groups, w.per_group, w.prefix_tokens, bs)
            res.prefix_fits, res.prefix_note = prefix_fits(
                w.groups, w.per_group, w.concurrency, w.prefix_tokens, sc.prompt_tokens, bs,
                res.usable_blocks.get(prefill))
        else:
            res.prefix_fits, res.prefix_note = False, "block size unknown: no expectation"


def _write_files(res: WaveResult, out: Path, rows: list[dict[str, Any]], title: str, t_wave: float) -> None:
    """``<out>/<scenario>-records.jsonl`` and the timeline PNG of the sampler's ``rows`` (the wave's
    end marked at ``t_wave`` seconds); a plot that fails is ``res.plot_error``, never the verdict's."""
    out.mkdir(parents=True, exist_ok=True)
    rp = out / f"{res.scenario}-records.jsonl"
    _write_records(rp, res.records)
    res.records_path = str(rp)
    try:
        png = plot_timeline(rows, out / f"{res.scenario}-timeline.png", title, {"wave end": t_wave})
        res.timeline_png = str(png) if png else None
    except Exception as e:  # a plot must never cost the run its verdict
        res.timeline_png = None
        res.plot_error = f"{type(e).__name__}: {e}"


def _write_records(path: Path, records: list[WaveRecord]) -> None:
    """One JSON line per request (:class:`WaveRecordLine`) into ``path`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write(WaveRecordLine.of(r).model_dump_json() + "\n")


def usable_blocks_of(cfg: RigConfig, names: list[str]) -> dict[str, int | None]:
    """Usable KV blocks per instance from the config (``InstanceConfig.usable_blocks``; None when
    vLLM sizes the cache itself or the config has no such instance)."""
    out: dict[str, int | None] = {}
    for n in names:
        try:
            out[n] = cfg.instance(n).usable_blocks
        except KeyError:
            out[n] = None
    return out


async def run_wave_scenario(sc: ScenarioConfig, cfg: RigConfig, p: Endpoint, d: Endpoint,
                            http: httpx.AsyncClient, store: SnapshotStore | None, run_dir: str | Path,
                            quiet: bool = False, explain: ExplainStall | None = None,
                            probe: Callable[[str], ProcSample | None] | None = None,
                            events: SampleEvents | None = None) -> WaveResult:
    """The suite runner's entry (rig/run/runner.py): one wave on the phase's P and D with the
    config's model, block size, deadlines and block counts; ``probe`` reads an instance's process
    tree for the stall evidence (``Cluster.proc_sample``). The runner checks the drains."""
    return await run_wave(sc, cfg.model.served_name, [p], [d], http, store, Path(run_dir) / "waves",
                          deadline_s=sc.deadline_s or cfg.timeouts.request_s,
                          usable_blocks=usable_blocks_of(cfg, [p.name, d.name]),
                          block_size=cfg.block_size, max_model_len=cfg.max_model_len_of(d.name),
                          progress="off" if quiet else "auto", explain=explain, probe=probe, events=events,
                          **stall_settings(cfg, sc.deadline_s))


class StallSettings(TypedDict, total=False):
    """:func:`run_wave`'s stall keywords (seconds); a key left out keeps run_wave's default."""

    stall_window_s: float
    transfer_window_s: float
    kv_lease_s: float
    stall_inconclusive_s: float


def stall_settings(cfg: RigConfig, deadline_s: float | None = None) -> StallSettings:
    """:func:`run_wave`'s stall keywords from a config: its stall and transfer windows, the wait
    past the window for an inconclusive stall (for requests of ``deadline_s``, default the
    config's) and prefill's NIXL lease (seconds)."""
    return StallSettings(stall_window_s=cfg.timeouts.stall_window_s, transfer_window_s=cfg.timeouts.kv_transfer_s,
                         kv_lease_s=cfg.nixl.lease_s,
                         stall_inconclusive_s=cfg.timeouts.stall_inconclusive_wait(deadline_s))


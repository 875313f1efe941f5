"""Prefix waves and pressure waves through P/D (issue #4), their drain checks and verdict.

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
throughput. It passes only with zero errors and zero empty streams besides the intentional
cancellations.

After every wave both P and D must drain back to idle (waiting 0, running 0, KV usage at the
pre-wave baseline) within ``drain_s`` (:func:`rig.observe.observations.wait_idle`); otherwise the verdict
names the leak: instance, gauge, and how many blocks' worth (KV usage x usable blocks).

A configurable sample of completed requests (``parity_fraction``, default 10 %) is compared
token by token with a direct, non-disaggregated request to P (:func:`rig.observe.parity.compare`).

Files (under ``<run_dir>/waves/``): ``<scenario>-records.jsonl`` (one line per request),
``<scenario>.json`` (the wave's facts) and ``<scenario>-timeline.png``; the samples go to
``<run_dir>/metrics/timeline.jsonl``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import httpx

from rig.config import RigConfig, ScenarioConfig, WaveConfig
from rig.judge.checks import (
    KV_PULLED_METRICS,
    PREFIX_HIT_METRICS,
    Check,
    alive_check,
    fatal_log_check,
    idle_check,
    kv_integrity_check,
    not_checked_for_metrics,
)
from rig.judge.signatures import facts_of_wave
from rig.judge.verdict import ScenarioVerdict, decide, expectation_of, judge
from rig.observe import metrics as m
from rig.observe.observations import (
    KV_EPS,
    DrainResult,
    ScenarioObservation,
    SnapshotStore,
    absent_gauges,
    idle_verdict,
    wait_idle,
)
from rig.observe.progress import WaveProgress
from rig.observe.stall import StallEpisodes, cache_info  # noqa: F401  (cache_info: re-exported)
from rig.observe.timeline import TimelineSampler, plot_timeline
from rig.transport.client import make_transport
from rig.transport.endpoint import Endpoint
from rig.transport.records import WaveRecord
from rig.workload.engine import WaveEngine, WaveRequest, plan_cancels
from rig.workload.prompts import make_prompt, prefix_group_prompts, seed_of

ERRORS = ("timeout", "http_error", "connection_error")  # and unplanned cancels ("aborted")
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
    need = groups * full + min(concurrency, groups * per_group) * math.ceil((prompt_tokens + 1) / block_size)
    if need > usable_blocks:
        return False, f"working set {need} blocks > P's {usable_blocks} usable blocks (evictions possible)"
    return True, f"working set {need} of P's {usable_blocks} usable blocks"


# ------------------------------------------------------------------------------------ result


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[min(98, max(0, round(q) - 1))]


@dataclass
class WaveResult:
    """What one wave produced (times in seconds; ``deltas`` are counter deltas per instance
    over the wave, before any parity reference request)."""

    scenario: str
    kind: str
    client: str
    params: dict[str, Any]
    instances: dict[str, str]  # name -> role (prefill | decode)
    records: list[WaveRecord] = field(default_factory=list)
    wall_s: float = 0.0
    client_cpu_s: float = 0.0  # CPU time of the rig's process while the wave ran (engine + sampler)
    usable_blocks: dict[str, int | None] = field(default_factory=dict)
    block_size: int | None = None
    max_model_len: int | None = None
    baseline_kv: dict[str, float] = field(default_factory=dict)
    deltas: dict[str, dict[str, float]] = field(default_factory=dict)
    peaks: dict[str, dict[str, float]] = field(default_factory=dict)
    expected_prefix_hits: int | None = None
    prefix_fits: bool | None = None
    prefix_note: str = ""
    parity: dict[str, int] = field(default_factory=dict)
    drains: list[DrainResult] = field(default_factory=list)
    timeline_png: str | None = None
    records_path: str | None = None
    scrape_errors: int = 0
    plot_error: str = ""
    error: str = ""
    # Stall episodes seen in the timeline (instance, start s after the wave began, duration s,
    # diagnosis, and ``explained``: why the pool was legitimately full, or "" = unexplained).
    stalls: list[dict[str, Any]] = field(default_factory=list)
    kv_lease_s: float = 30.0  # the NIXL lease P keeps unread blocks for (explains P stalls), s

    def counts(self) -> Counter:
        """Records per outcome, with intentional cancels as ``cancelled`` and unplanned ones as
        ``aborted``."""
        c: Counter[str] = Counter()
        for r in self.records:
            c["aborted" if r.outcome == "cancelled" and not r.intentional else r.outcome] += 1
        return c

    def summary(self) -> dict[str, Any]:
        """Counts, cancel points, errors by class, throughput and latency percentiles."""
        c = self.counts()
        ok = [r for r in self.records if r.outcome == "ok"]
        lat = sorted(r.latency_s for r in ok if r.latency_s is not None)
        ttft = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
        errors = {k: c[k] for k in (*ERRORS, "aborted", "parity_mismatch") if c.get(k)}
        return {
            "requests": len(self.records), "ok": c.get("ok", 0), "cancelled": c.get("cancelled", 0),
            "cancel_points": dict(Counter(r.cancel_point for r in self.records if r.intentional)),
            "planned_cancels": dict(Counter(r.planned_cancel for r in self.records if r.planned_cancel)),
            "errors": errors, "empty": c.get("empty", 0),
            "streamed": sum(r.stream for r in self.records),
            "wall_s": round(self.wall_s, 3),
            "client_cpu_s": round(self.client_cpu_s, 3),
            "client_cpu_share": round(self.client_cpu_s / self.wall_s, 3) if self.wall_s > 0 else None,
            "throughput_req_s": round(len(ok) / self.wall_s, 2) if self.wall_s > 0 else None,
            "throughput_tok_s": round(sum(r.tokens or 0 for r in ok) / self.wall_s, 1) if self.wall_s > 0 else None,
            "latency_s": {"p50": _pct(lat, 50), "p95": _pct(lat, 95), "p99": _pct(lat, 99),
                          "max": lat[-1] if lat else None},
            "ttft_s": {"p50": _pct(ttft, 50), "p95": _pct(ttft, 95), "p99": _pct(ttft, 99)},
        }

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict (records are in the records file, not here)."""
        return {"scenario": self.scenario, "kind": self.kind, "client": self.client, "params": self.params,
                "instances": self.instances, "summary": self.summary(), "usable_blocks": self.usable_blocks,
                "block_size": self.block_size, "max_model_len": self.max_model_len,
                "baseline_kv": self.baseline_kv, "deltas": self.deltas, "peaks": self.peaks,
                "expected_prefix_hits": self.expected_prefix_hits, "prefix_fits": self.prefix_fits,
                "prefix_note": self.prefix_note, "parity": self.parity,
                "drains": [d.__dict__ for d in self.drains], "timeline_png": self.timeline_png,
                "records_path": self.records_path, "scrape_errors": self.scrape_errors,
                "stalls": self.stalls, "kv_lease_s": self.kv_lease_s,
                "plot_error": self.plot_error, "error": self.error}


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


def drain_from_samples(instance: str, samples: Sequence[m.MetricSnapshot | dict[str, Any]], baseline_kv: float,
                       t_end: float, drain_s: float) -> DrainResult:
    """The drain check on recorded samples: did ``instance`` reach idle (waiting 0, running 0,
    KV usage <= baseline) at a sample taken within ``drain_s`` after ``t_end``?

    ``samples`` are snapshots or timeline rows (keys as in timeline.jsonl, ``t`` monotonic).
    The verdict is drawn from the first idle sample, else from the last sample in the window.
    """
    last: dict[str, float | None] = {}
    seen = False
    for s in sorted(samples, key=lambda s: s.t if isinstance(s, m.MetricSnapshot) else s["t"]):
        if isinstance(s, m.MetricSnapshot):
            if s.instance != instance:
                continue
            t, state = s.t, m.idle_state(s)
        else:
            if s.get("instance") != instance:
                continue
            t = s["t"]
            state = {"waiting": s.get("num_requests_waiting"), "running": s.get("num_requests_running"),
                     "kv_usage": s.get("kv_cache_usage_perc")}
        if t < t_end or t > t_end + drain_s:
            continue
        seen, last = True, state
        idle = idle_verdict(state, baseline_kv)
        if idle is None:  # an absent gauge is never idle
            return DrainResult(instance, None, t - t_end, baseline_kv, state, absent_gauges(state))
        if idle:
            return DrainResult(instance, True, t - t_end, baseline_kv, state)
    return DrainResult(instance, False, drain_s, baseline_kv, last,
                       "" if seen else f"no sample within {drain_s:g} s after the wave")


def describe_drain(d: DrainResult, usable_blocks: int | None) -> str:
    """:meth:`DrainResult.describe` plus the leak in blocks: ``kv_usage x usable blocks``."""
    text = d.describe()
    kv = d.final.get("kv_usage") or 0.0
    if not d.idle and not d.error and kv > d.baseline_kv + KV_EPS:
        if usable_blocks:
            held, base = kv * usable_blocks, d.baseline_kv * usable_blocks
            text += (f" = {held:.1f} of {usable_blocks} usable blocks held "
                     f"({held - base:.1f} blocks' worth above the baseline)")
        else:
            text += " (usable block count unknown)"
    return text


async def check_drains(http: httpx.AsyncClient, endpoints: list[Endpoint], baseline_kv: dict[str, float],
                       drain_s: float, interval_s: float = 0.5) -> list[DrainResult]:
    """:func:`rig.observe.observations.wait_idle` for every endpoint, concurrently."""
    return list(await asyncio.gather(*(wait_idle(http, e.name, e.url, baseline_kv.get(e.name, 0.0), drain_s, interval_s)
                                       for e in endpoints)))


# ------------------------------------------------------------------------------------ the wave


async def run_wave(sc: ScenarioConfig, model: str, prefills: list[Endpoint], decodes: list[Endpoint],
                   http: httpx.AsyncClient, store: SnapshotStore | None, out_dir: str | Path | None, *,
                   deadline_s: float, usable_blocks: dict[str, int | None] | None = None,
                   block_size: int | None = None, max_model_len: int | None = None,
                   progress: str = "auto", seed: int | None = None,
                   stall_window_s: float = 8.0, transfer_window_s: float | None = 30.0,
                   kv_lease_s: float = 30.0) -> WaveResult:
    """Run one wave scenario against running servers; no drain check (see :func:`check_drains`).

    Every instance's samples go through a stall detector (``stall_window_s``, and
    ``transfer_window_s`` while a KV read is in flight; :mod:`rig.observe.stall`); each episode is
    explained or not by :func:`explain_stall` (``kv_lease_s`` = P's NIXL kv_lease_duration).

    Takes a baseline scrape of every instance, samples the timeline while the engine sends the
    requests, scrapes again (counter deltas), then runs the parity sample and writes the records,
    the wave JSON and the timeline PNG into ``out_dir``. Problems reaching the servers end up in
    ``WaveResult.error``; this function does not raise for them.
    """
    w = sc.wave or WaveConfig()
    seed = sc.seed if sc.seed is not None else (seed if seed is not None else seed_of(sc.name))
    endpoints = [*prefills, *decodes]
    roles = {e.name: "prefill" for e in prefills} | {e.name: "decode" for e in decodes}
    params = {"requests": None, "concurrency": w.concurrency, "cancel_fraction": w.cancel_fraction,
              "cancel_points": list(w.cancel_points), "prompt_tokens": sc.prompt_tokens,
              "max_tokens": sc.max_tokens, "stream": w.stream,
              "parity_fraction": w.parity_fraction if sc.parity else 0.0,
              "deadline_s": deadline_s, "seed": seed}
    if sc.kind == "prefix-wave":
        params.update(groups=w.groups, per_group=w.per_group, prefix_tokens=w.prefix_tokens)
    client = w.client
    res = WaveResult(sc.name, sc.kind, client, params, roles, usable_blocks=dict(usable_blocks or {}),
                     block_size=block_size, max_model_len=max_model_len, kv_lease_s=kv_lease_s)
    out = Path(out_dir) if out_dir is not None else None
    try:
        requests = wave_requests(sc, seed)
    except ValueError as e:
        res.error = str(e)
        return res
    params["requests"] = len(requests)
    try:
        before = dict(zip([e.name for e in endpoints],
                          await asyncio.gather(*(m.scrape(http, e.url, e.name) for e in endpoints)), strict=True))
    except (httpx.HTTPError, ValueError) as e:
        res.error = f"metrics unavailable before the wave: {type(e).__name__}: {e}"
        return res
    for name, snap in before.items():
        res.baseline_kv[name] = snap.value(m.KV_USAGE)
        info = cache_info(snap)
        if res.usable_blocks.get(name) is None and info.get("num_gpu_blocks"):
            res.usable_blocks[name] = info["num_gpu_blocks"] - 1  # minus vLLM's null block
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
                res.usable_blocks.get(prefills[0].name))
        else:
            res.prefix_fits, res.prefix_note = False, "block size unknown: no expectation"

    transport = make_transport(client, model, deadline_s, max(2 * w.concurrency, 8))
    engine = WaveEngine(transport, prefills, decodes, w.concurrency, deadline_s, w.cancel_prefill_after_s)
    episodes = StallEpisodes(stall_window_s, transfer_window_s)
    sampler = TimelineSampler(http, endpoints, store, sc.name, w.sample_interval_s, stalls=episodes)
    title = sc.name if sc.name == sc.kind else f"{sc.kind} {sc.name}"
    prog = WaveProgress(title, len(requests), engine.counts, sampler.latest, mode=progress)
    after: dict[str, m.MetricSnapshot] = {}
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
        try:
            after = dict(zip([e.name for e in endpoints],
                             await asyncio.gather(*(m.scrape(http, e.url, e.name) for e in endpoints)), strict=True))
        except (httpx.HTTPError, ValueError) as e:
            res.error = f"metrics unavailable after the wave: {type(e).__name__}: {e}"
        for name, snap in after.items():
            res.deltas[name] = {k: m.delta(before[name], snap, metric) for k, metric in COUNTER_DELTAS.items()}
            if store is not None:
                store.save(f"{sc.name}-wave-end", snap)
        if any(r.token_ids is not None for r in res.records):
            res.parity = await engine.parity(res.records, requests)
    finally:
        await transport.aclose()
    res.peaks = sampler.peaks
    res.scrape_errors = sampler.scrape_errors
    t0 = engine.t0 or 0.0
    for ep in episodes.episodes:
        st = {"instance": ep.instance, "start_s": round(ep.since - t0, 1), "duration_s": round(ep.duration_s, 1),
              "diagnosis": ep.diagnosis}
        st["explained"] = explain_stall(st, res)
        res.stalls.append(st)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        rp = out / f"{sc.name}-records.jsonl"
        _write_records(rp, res.records)
        res.records_path = str(rp)
        try:
            png = plot_timeline(sampler.rows, out / f"{sc.name}-timeline.png",
                                f"{title}: {len(requests)} requests, C={w.concurrency}",
                                {"wave end": t_wave})
            res.timeline_png = str(png) if png else None
        except Exception as e:  # a plot must never cost the run its verdict
            res.timeline_png = None
            res.plot_error = f"{type(e).__name__}: {e}"
        (out / f"{sc.name}.json").write_text(json.dumps(res.to_json(), indent=1, default=str))
    for rec in res.records:  # the sample's tokens were only needed for parity
        rec.token_ids = None
    return res


def _write_records(path: Path, records: list[WaveRecord]) -> None:
    """One JSON line per request (:meth:`WaveRecord.to_json`) into ``path`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r.to_json(), separators=(",", ":")) + "\n")


def usable_blocks_of(cfg: RigConfig, names: list[str]) -> dict[str, int | None]:
    """Usable KV blocks per instance from the config (``num_gpu_blocks_override - 1``; None when
    vLLM sizes the cache itself)."""
    out: dict[str, int | None] = {}
    for n in names:
        try:
            o = cfg.instance(n).num_gpu_blocks_override
        except KeyError:
            o = None
        out[n] = o - 1 if o else None
    return out


async def run_wave_scenario(sc: ScenarioConfig, cfg: RigConfig, p: Endpoint, d: Endpoint,
                            http: httpx.AsyncClient, store: SnapshotStore | None, run_dir: str | Path,
                            quiet: bool = False) -> WaveResult:
    """The suite runner's entry (rig/run/runner.py): one wave on the phase's P and D with the
    config's model, block size, deadlines and block counts. The runner checks the drains."""
    return await run_wave(sc, cfg.model.served_name, [p], [d], http, store, Path(run_dir) / "waves",
                          deadline_s=sc.deadline_s or cfg.timeouts.request_s,
                          usable_blocks=usable_blocks_of(cfg, [p.name, d.name]),
                          block_size=cfg.block_size, max_model_len=cfg.max_model_len,
                          progress="off" if quiet else "auto", **stall_settings(cfg))


class StallSettings(TypedDict, total=False):
    """:func:`run_wave`'s stall keywords (seconds); a key left out keeps run_wave's default."""

    stall_window_s: float
    transfer_window_s: float
    kv_lease_s: float


def stall_settings(cfg: RigConfig) -> StallSettings:
    """:func:`run_wave`'s stall keywords from a config: its stall and transfer windows and
    prefill's NIXL lease (seconds)."""
    return StallSettings(stall_window_s=cfg.timeouts.stall_window_s, transfer_window_s=cfg.timeouts.kv_transfer_s,
                         kv_lease_s=cfg.nixl.lease_s)


# ------------------------------------------------------------------------------------ verdict


def explain_stall(stall: dict[str, Any], wave: WaveResult, slack_s: float = 12.0) -> str:
    """Why a stall episode of ``wave`` is expected, or "" when nothing explains it.

    A prefill instance whose KV pool is full of blocks kept for requests abandoned between the
    hops: P cannot know that D will never read them and keeps them until its NIXL
    ``kv_lease_duration`` expires (vllm/.../nixl/base_worker.py ``_reap_expired_send_leases``).
    Explained when (1) the requests cancelled ``between`` in the lease before the stall, plus one
    block set per request in flight, need at least the usable blocks of that P (estimates:
    prompt + 1 token per abandoned request, prefix sharing ignored) and (2) the stall ended by
    the time the first of those leases expired (+ ``slack_s`` for the sampling and the window):
    a P that stays frozen after its leases ran out is not explained by them. Stalls on decode
    are never explained here: the 0.32.0 admission livelock looks exactly like one.
    """
    name = stall["instance"]
    if wave.instances.get(name) != "prefill":
        return ""
    bs = wave.block_size or 16
    usable = wave.usable_blocks.get(name)
    start = stall["start_s"]
    held = [r for r in wave.records if r.cancel_point == "between" and r.p_instance == name
            and r.t_end is not None and start - wave.kv_lease_s - 1.0 <= r.t_end <= start + 1.0]
    if not held:
        return ""
    blocks = sum(math.ceil((r.prompt_len + 1) / bs) for r in held)
    per_request = math.ceil(((wave.params.get("prompt_tokens") or 0) + 1) / bs)
    in_flight = (wave.params.get("concurrency") or 0) * per_request
    if usable is not None and blocks + in_flight < usable:
        return ""
    first_expiry = min(r.t_end for r in held if r.t_end is not None) + wave.kv_lease_s
    if start + stall["duration_s"] > first_expiry + slack_s:
        return ""
    return (f"{len(held)} requests abandoned between the hops in the {wave.kv_lease_s:g} s before hold "
            f"~{blocks} of P's {usable if usable is not None else '?'} usable blocks until NIXL's "
            "kv_lease_duration expires (nobody tells P that D will never read them)")


def _stall_check(wave: WaveResult) -> Check:
    if not wave.stalls:
        return Check("no-stall", True, "no instance froze with requests waiting")
    parts = [f"{st['instance']} at {st['start_s']:g} s for {st['duration_s']:g} s: "
             + (f"explained: {st['explained']}" if st["explained"] else f"UNEXPLAINED: {st['diagnosis']}")
             for st in wave.stalls]
    return Check("no-stall", all(st["explained"] for st in wave.stalls), "; ".join(parts[:4])
                 + (f"; +{len(parts) - 4} more" if len(parts) > 4 else ""))


def _first_error(recs: list[WaveRecord]) -> str:
    return f"; first: {recs[0].request_id}: {recs[0].outcome} {recs[0].diagnosis}".rstrip() if recs else ""


def _ids(recs: list[WaveRecord]) -> tuple[str, ...]:
    return tuple(r.request_id for r in recs)


ANSWERED = ("ok", "parity_mismatch")


def wave_kv_pulled(obs: ScenarioObservation, recs: list[WaveRecord]) -> Check:
    """``kv-pulled`` per request: every prompt D answered came over NIXL or from D's own prefix
    cache, none recomputed: D's ``prompt_tokens_by_source`` external_kv_transfer + local_cache_hit
    >= the answered prompts' tokens, at least one NIXL transfer. (Counters are per instance: a
    shortfall fails on every answered request.) Not checked without D's counters."""
    answered = [r for r in recs if r.outcome in ANSWERED]
    if not answered:
        return Check("kv-pulled", False, "no answered request to show a transfer for", _ids(recs))
    ev = obs.evidence
    gap = not_checked_for_metrics("kv-pulled", obs, [obs.decode], KV_PULLED_METRICS)
    if gap or ev is None:
        return gap or Check("kv-pulled", None, "not checked: no decode metrics")
    want = sum(r.prompt_len for r in answered)
    got = ev.external_prompt_tokens + ev.cached_prompt_tokens
    ok = got >= want and ev.nixl_transfers > 0
    return Check("kv-pulled", ok,
                 f"D: {ev.external_prompt_tokens:.0f} prompt tokens from external_kv_transfer + "
                 f"{ev.cached_prompt_tokens:.0f} from its prefix cache (expected >= {want} for {len(answered)} "
                 f"answered prompts), nixl {ev.nixl_bytes:.0f} B in {ev.nixl_transfers:.0f} transfers",
                 () if ok else _ids(answered))


def wave_checks(sc: ScenarioConfig, obs: ScenarioObservation, wave: WaveResult) -> list[Check]:
    """The named checks of a wave (see :func:`judge_wave`), each naming the requests it failed on."""
    recs = wave.records
    s = wave.summary()
    out: list[Check] = []
    intentional = [r for r in recs if r.intentional]
    points = ", ".join(f"{k} {v}" for k, v in sorted(s["cancel_points"].items(), key=lambda kv: str(kv[0])))
    # Answered = D answered (a parity mismatch is answered; the parity check judges its tokens).
    ok_n = sum(r.outcome in ANSWERED for r in recs)
    want = len(recs) - len(intentional)
    unanswered = [r for r in recs if not r.intentional and r.outcome not in ANSWERED]
    out.append(Check("completed", bool(recs) and ok_n == want,
                     f"{ok_n}/{want} completed ({len(recs)} requests, {len(intentional)} cancelled on purpose"
                     + (f": {points}" if points else "") + ")", _ids(unanswered)))
    bad = [r for r in recs if r.outcome in ERRORS or (r.outcome == "cancelled" and not r.intentional)]
    by = Counter("aborted" if r.outcome == "cancelled" else r.outcome for r in bad)
    out.append(Check("no-errors", not bad,
                     "no timeouts, HTTP or connection errors" if not bad else
                     ", ".join(f"{k} {v}" for k, v in sorted(by.items())) + _first_error(bad), _ids(bad)))
    empty = [r for r in recs if r.outcome == "empty"]
    out.append(Check("no-empty", not empty, "no empty answers" if not empty else
                     f"{len(empty)} empty answers (200 without tokens)" + _first_error(empty), _ids(empty)))
    wrong, wrong_recs = [], []
    for r in recs:
        if r.outcome not in ANSWERED:
            continue
        exp = sc.expect.completion_tokens
        if exp is None:
            exp = r.max_tokens if wave.max_model_len is None else min(r.max_tokens, wave.max_model_len - r.prompt_len)
        if r.tokens != exp:
            wrong.append(f"{r.request_id}: {r.tokens} tokens, expected {exp}")
            wrong_recs.append(r)
        elif r.usage_tokens is not None and r.usage_tokens != r.tokens:
            wrong.append(f"{r.request_id}: {r.tokens} token_ids but usage says {r.usage_tokens}")
            wrong_recs.append(r)
    out.append(Check("token-counts", not wrong and ok_n > 0,
                     (f"{len(wrong)} wrong: " + "; ".join(wrong[:3])) if wrong else
                     ("every answer has its expected token count" if ok_n else "no answer to count"),
                     _ids(wrong_recs) if wrong else () if ok_n else _ids(unanswered)))
    out.append(wave_kv_pulled(obs, recs))
    if wave.kind == "prefix-wave":
        out.append(_prefix_hits(obs, wave, recs))
    if sc.parity and (wave.params.get("parity_fraction") or 0) > 0:
        out.append(_wave_parity(wave, recs, ok_n))
    if obs.dead or obs.fatal_lines or obs.unscanned_logs:
        out.append(alive_check(obs))
        out.append(fatal_log_check(obs))
    else:  # pdrig wave against a deployment the rig did not launch: no processes, no logs
        out.append(Check("alive", None, "not checked: the rig does not run these processes"))
        out.append(Check("no-fatal-log", None, "not checked: no log of these processes was scanned"))
    rid = {r.remote_request_id: r.request_id for r in recs if r.remote_request_id}
    out.append(kv_integrity_check(
        obs, {k: v for k, v in rid.items() if any(r.request_id == v and r.outcome in ANSWERED for r in recs)},
        {k: v for k, v in rid.items() if any(r.request_id == v and r.outcome not in ANSWERED for r in recs)}))
    out.append(_stall_check(wave))
    out.append(idle_check(obs, obs.drains or wave.drains,
                          lambda dr: describe_drain(dr, wave.usable_blocks.get(dr.instance))))
    return out


def _prefix_hits(obs: ScenarioObservation, wave: WaveResult, recs: list[WaveRecord]) -> Check:
    """``prefix-hits``: P's prefix-cache hits equal the expected count; not checked (never ok)
    when the expectation is unknown, the prefixes cannot all stay cached, requests were
    cancelled before P answered, or P lacks the counter."""
    p_names = [n for n, role in wave.instances.items() if role == "prefill"]
    hits = sum(wave.deltas.get(n, {}).get("prefix_hits", 0.0) for n in p_names)
    d_parts = [f"{n}: local {wave.deltas.get(n, {}).get('prefix_hits', 0):.0f}, external "
               f"{wave.deltas.get(n, {}).get('external_prefix_hits', 0):.0f}"
               for n, role in wave.instances.items() if role == "decode"]
    exp = wave.expected_prefix_hits
    early = sum(r.cancel_point == "before-prefill" for r in recs)
    detail = (f"P hits {hits:.0f} tokens, expected {exp if exp is not None else '?'} "
              f"({wave.prefix_note}); D {'; '.join(d_parts)}")
    gap = not_checked_for_metrics("prefix-hits", obs, p_names, PREFIX_HIT_METRICS)
    if gap:
        return gap
    if exp is None or not wave.prefix_fits or early:
        why = (f"{early} requests cancelled before P answered" if early else
               "the expected hits are unknown" if exp is None else "the prefixes cannot all stay cached on P")
        return Check("prefix-hits", None, f"not checked: {why}; {detail}")
    return Check("prefix-hits", hits == exp, detail)


def _wave_parity(wave: WaveResult, recs: list[WaveRecord], ok_n: int) -> Check:
    pr = wave.parity
    mism = [r for r in recs if r.outcome == "parity_mismatch"]
    detail = (f"{pr.get('equal', 0)}/{pr.get('compared', 0)} sampled answers equal to a direct request to P"
              + (f", {pr['failed']} references failed" if pr.get("failed") else "")
              + (f"; {mism[0].request_id}: {mism[0].parity}" if mism else ""))
    if mism or pr.get("refused"):
        return Check("parity", False, detail, _ids(mism))
    if ok_n and (pr.get("compared", 0) == 0 or pr.get("failed")):
        return Check("parity", None, f"not checked: {detail}")
    if not ok_n:
        return Check("parity", False, "no answer to compare", _ids([r for r in recs if not r.intentional]))
    return Check("parity", True, detail)


def judge_wave(sc: ScenarioConfig, obs: ScenarioObservation, wave: WaveResult | None,
               sections: list[str] | None = None, required: tuple[str, ...] | None = None) -> ScenarioVerdict:
    """The verdict of a wave scenario through the one engine (:func:`rig.judge.verdict.judge`), with
    named checks: ``completed`` (every request not cancelled on purpose answered), ``no-errors``
    (no timeout / HTTP / connection error or unplanned cancel), ``no-empty``, ``token-counts``,
    ``kv-pulled`` (per request, :func:`wave_kv_pulled`), ``prefix-hits`` (prefix waves),
    ``parity`` (the sample), ``alive`` and ``no-fatal-log`` (not checked when the rig does not
    run the processes), ``kv-integrity``, ``no-stall`` (no instance froze with requests waiting,
    unless :func:`explain_stall` explains it) and ``idle-after`` (a leak is named with its gauge
    and blocks). ``required``: the checks that must have been checked (default: the kind's,
    rig.judge.verdict.REQUIRED). A ``known_issue`` is honoured like on any kind.

    When ``sections`` is given, the wave's markdown section (:func:`wave_section`) is appended
    to it (the runner passes ``RunResult.extra_sections``).
    """
    if wave is None or (wave.error and not wave.records) or obs.error:
        reason = obs.error or (wave.error if wave else "the wave did not run")
        v = decide(sc.name, [], expectation_of(sc, obs), error=reason)
    else:
        checks = wave_checks(sc, obs, wave)
        if wave.error:
            checks.append(Check("metrics", False, wave.error))
        v = judge(sc, obs, checks=checks, reqs=facts_of_wave(wave.records), required=required)
    if sections is not None and wave is not None:
        sections.append(wave_section(wave, v))
    return v


# ------------------------------------------------------------------------------------ report


def _f(v: float | None, unit: str = "", scale: float = 1.0, digits: int = 0) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}{unit}"


def wave_section(wave: WaveResult, verdict: ScenarioVerdict | None = None, link_base: str | Path | None = None) -> str:
    """The wave's markdown section for summary.md: parameters, outcome counts, throughput and
    latency, per-instance peaks and counter deltas, checks, and the timeline plot.

    Paths are written relative to ``link_base`` (default: the directory above ``waves/``, i.e.
    the run directory where summary.md lives).
    """
    s = wave.summary()
    pr = wave.params
    # The heading names the scenario; its kind only when the name does not already say it.
    title = wave.scenario if wave.kind in wave.scenario else f"{wave.kind} `{wave.scenario}`"
    lines = [f"## {title}" + (f": {verdict.verdict}" if verdict else ""), ""]
    desc = (f"{pr.get('groups')} groups x {pr.get('per_group')} requests sharing a "
            f"{pr.get('prefix_tokens')}-token prefix"
            if wave.kind == "prefix-wave" else f"{pr.get('requests')} requests")
    lines.append(f"- {desc}; prompts {pr.get('prompt_tokens')} tokens, max_tokens {pr.get('max_tokens')}, "
                 f"concurrency {pr.get('concurrency')}, cancel fraction {pr.get('cancel_fraction')}, "
                 f"stream {pr.get('stream')}, client {wave.client}, seed {pr.get('seed')}")
    errs = ", ".join(f"{k} {v}" for k, v in s["errors"].items()) or "none"
    cps = ", ".join(f"{k} {v}" for k, v in s["cancel_points"].items()) or "none"
    lines.append(f"- outcome: {s['ok']} ok, {s['cancelled']} cancelled on purpose ({cps}), errors: {errs}, "
                 f"empty: {s['empty']}")
    lat, ttft = s["latency_s"], s["ttft_s"]
    lines.append(f"- wave {s['wall_s']:.1f} s; throughput {s['throughput_req_s']} req/s, "
                 f"{s['throughput_tok_s']} generated tok/s; latency p50/p95/p99 "
                 f"{_f(lat['p50'], '', 1000)}/{_f(lat['p95'], '', 1000)}/{_f(lat['p99'], ' ms', 1000)}; "
                 f"TTFT p50/p95 {_f(ttft['p50'], '', 1000)}/{_f(ttft['p95'], ' ms', 1000)}; "
                 f"rig client CPU {s['client_cpu_s']:.1f} s ({_f(s['client_cpu_share'], ' %', 100)} of one core: "
                 "near 100 % means the client, not the servers, set the pace)")
    if wave.kind == "prefix-wave":
        lines.append(f"- prefix cache: expected P hits {wave.expected_prefix_hits} tokens ({wave.prefix_note})")
    for st in wave.stalls:
        lines.append(f"- stall on {st['instance']} at {st['start_s']:g} s for {st['duration_s']:g} s: "
                     f"{st['diagnosis']}" + (f" (explained: {st['explained']})" if st["explained"] else
                                             " (**unexplained**)"))
    if wave.parity:
        lines.append(f"- parity sample: {wave.parity.get('equal', 0)}/{wave.parity.get('compared', 0)} equal"
                     + (f", {wave.parity['failed']} references failed" if wave.parity.get("failed") else ""))
    lines += ["", "| instance | role | peak running | peak waiting | peak KV | preemptions | prefix hits | "
                  "external hits | finished | usable blocks |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, role in wave.instances.items():
        pk, dl = wave.peaks.get(name, {}), wave.deltas.get(name, {})
        lines.append(f"| {name} | {role} | {pk.get('running', 0):g} | {pk.get('waiting', 0):g} | "
                     f"{100 * pk.get('kv_usage', 0):.0f}% | {dl.get('preemptions', 0):g} | "
                     f"{dl.get('prefix_hits', 0):g} | "
                     f"{dl.get('external_prefix_hits', 0):g} | {dl.get('request_success', 0):g} | "
                     f"{wave.usable_blocks.get(name) if wave.usable_blocks.get(name) is not None else '?'} |")
    if verdict is not None and verdict.checks:
        lines += ["", "| check | ok | detail |", "|---|---|---|"]
        for c in verdict.checks:
            lines.append(f"| {c.name} | {'yes' if c.ok else '**NO**'} | {c.detail.replace('|', '/')} |")
    base = Path(link_base) if link_base is not None else None
    for label, p in (("records", wave.records_path), ("timeline", wave.timeline_png)):
        if p:
            rel = Path(p)
            with contextlib.suppress(ValueError):
                rel = rel.relative_to(base if base is not None else Path(p).parent.parent)
            lines.append("")
            lines.append(f"![{wave.scenario} timeline]({rel.as_posix()})" if label == "timeline"
                         else f"- records: [{rel.as_posix()}]({rel.as_posix()})")
    return "\n".join(lines) + "\n"

"""Step 5 of the rig's flow: observations, the facts a verdict is drawn from.

A :class:`ScenarioObservation` gathers, for one scenario: every request's record, the parity
results, the decode instance's metric deltas (did D really pull the KV over NIXL?), fatal log
lines written during the scenario, processes that died, and whether the instances drained back
to idle afterwards. Nothing here decides pass or fail; :mod:`rig.judge.verdict` does.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rig.config.timeouts import TimeoutsConfig
from rig.observe import metrics as m
from rig.observe.parity import ParityResult
from rig.transport.records import PDRecord


@dataclass
class DrainResult:
    """Whether an instance returned to idle (waiting 0, running 0, KV usage <= baseline + eps)
    within ``timeout_s``; ``final`` holds the last gauges seen, ``after_s`` the time it took.

    ``idle`` is tri-state like :class:`rig.judge.verdict.Check`: None when it could not be told (a
    gauge the instance does not expose; ``error`` names it), which is never idle. ``samples``: the
    ``/metrics`` snapshots of the instance it was judged from (0: none answered)."""

    instance: str
    idle: bool | None
    after_s: float
    baseline_kv: float
    final: dict[str, float | None]
    error: str = ""
    samples: int = 0

    def describe(self) -> str:
        """'idle after 0.4 s' or a leak statement naming the gauge."""
        if self.idle:
            return f"{self.instance} idle after {self.after_s:.1f} s"
        if self.idle is None:
            return f"{self.instance} idle not checked: {self.error}"
        if self.error:
            return f"{self.instance} not observed idle: {self.error}"
        waiting, running, kv = (self.final.get(k) or 0.0 for k in ("waiting", "running", "kv_usage"))
        parts = []
        if waiting > 0:
            parts.append(f"waiting={waiting:g}")
        if running > 0:
            parts.append(f"running={running:g}")
        if kv > self.baseline_kv + KV_EPS:
            parts.append(f"kv_cache_usage_perc={kv * 100:.1f}% (baseline {self.baseline_kv * 100:.1f}%)")
        return f"{self.instance} not idle after {self.after_s:.1f} s: " + ", ".join(parts)


KV_EPS = 1e-6
IDLE_GAUGES = {"waiting": m.WAITING, "running": m.RUNNING, "kv_usage": m.KV_USAGE}


def idle_verdict(state: dict[str, float | None], baseline_kv: float) -> bool | None:
    """True when waiting == running == 0 and KV usage <= ``baseline_kv`` + eps (a 0..1
    fraction); None when a gauge is absent (``state`` value None): an absent gauge must not
    read as 0, which would be "idle"."""
    waiting, running, kv = state.get("waiting"), state.get("running"), state.get("kv_usage")
    if waiting is None or running is None or kv is None:
        return None
    return waiting == 0 and running == 0 and kv <= baseline_kv + KV_EPS


def absent_gauges(state: dict[str, float | None]) -> str:
    """'vllm:... absent from /metrics' for the idle gauges ``state`` lacks."""
    return ", ".join(IDLE_GAUGES[k] for k in IDLE_GAUGES if state.get(k) is None) + " absent from /metrics"


async def wait_idle(http: httpx.AsyncClient, instance: str, url: str, baseline_kv: float,
                    timeout_s: float, interval_s: float = 0.5) -> DrainResult:
    """Poll ``/metrics`` until waiting == running == 0 and KV usage <= ``baseline_kv``.

    ``baseline_kv`` is the 0..1 KV usage measured before the work started. Returns a
    DrainResult (never raises for HTTP errors: an unreachable instance is 'not idle').
    """
    t0 = time.monotonic()
    final: dict[str, float | None] = {}
    err: str  # set by every poll: "" after a sample, the error after a failed scrape
    n = 0  # snapshots read
    while True:
        try:
            snap = await m.scrape(http, url, instance)
            final, err, n = m.idle_state(snap), "", n + 1
            idle = idle_verdict(final, baseline_kv)
            if idle is None:  # the gauge will not appear by waiting: not checked, at once
                return DrainResult(instance, None, time.monotonic() - t0, baseline_kv, final, absent_gauges(final), n)
            if idle:
                return DrainResult(instance, True, time.monotonic() - t0, baseline_kv, final, samples=n)
        except (httpx.HTTPError, ValueError) as e:
            err = f"{type(e).__name__}: {e}"
        if time.monotonic() - t0 >= timeout_s:
            return DrainResult(instance, False, time.monotonic() - t0, baseline_kv, final, err, n)
        await asyncio.sleep(interval_s)


@dataclass
class TransferEvidence:
    """Decode-side proof that the KV came over NIXL: counter deltas over the scenario."""

    nixl_bytes: float = 0.0  # vllm:nixl_bytes_transferred_sum delta (bytes)
    nixl_transfers: float = 0.0  # vllm:nixl_bytes_transferred_count delta
    external_prompt_tokens: float = 0.0  # prompt_tokens_by_source{source=external_kv_transfer} delta
    cached_prompt_tokens: float = 0.0  # prompt_tokens_by_source{source=local_cache_hit} delta (D's prefix cache)
    computed_prompt_tokens: float = 0.0  # prompt_tokens_by_source{source=local_compute} delta (computed on D)
    failed_transfers: float = 0.0
    preemptions: float = 0.0
    spec_drafts: float = 0.0

    @classmethod
    def between(cls, before: m.MetricSnapshot, after: m.MetricSnapshot) -> TransferEvidence:
        """Deltas of the transfer counters from ``before`` to ``after`` (same instance)."""
        return cls(
            nixl_bytes=m.delta(before, after, m.NIXL_BYTES_SUM),
            nixl_transfers=m.delta(before, after, m.NIXL_XFER_COUNT),
            external_prompt_tokens=m.delta(before, after, m.PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer"),
            cached_prompt_tokens=m.delta(before, after, m.PROMPT_TOKENS_BY_SOURCE, source="local_cache_hit"),
            computed_prompt_tokens=m.delta(before, after, m.PROMPT_TOKENS_BY_SOURCE, source="local_compute"),
            failed_transfers=m.delta(before, after, m.NIXL_FAILED_TRANSFERS),
            preemptions=m.delta(before, after, m.PREEMPTIONS),
            spec_drafts=m.delta(before, after, m.SPEC_DRAFTS),
        )


@dataclass
class ScenarioObservation:
    """What one scenario produced. Times are seconds; ``records`` in request order."""

    scenario: str
    decode: str
    prefill: str
    records: list[PDRecord] = field(default_factory=list)
    parity: list[ParityResult | None] = field(default_factory=list)
    evidence: TransferEvidence | None = None  # decode's counter deltas over the scenario
    prefill_evidence: TransferEvidence | None = None  # prefill's (its preemptions: expect.min_preemptions_on)
    fatal_lines: dict[str, list[str]] = field(default_factory=dict)
    kv_integrity_lines: dict[str, list[str]] = field(default_factory=dict)  # lease expiry (cluster.py)
    dead: dict[str, int] = field(default_factory=dict)
    drains: list[DrainResult] = field(default_factory=list)
    stall_diagnosis: str = ""
    vllm_version: str = ""
    wall_s: float = 0.0
    error: str = ""  # the rig itself could not run the scenario
    # Evidence the rig could NOT gather: the checks that needed it are "not checked", never ok.
    unscanned_logs: dict[str, str] = field(default_factory=dict)  # instance -> why its log was not scanned
    missing_metrics: dict[str, list[str]] = field(default_factory=dict)  # instance -> metrics it lacks
    death_lines: dict[str, str] = field(default_factory=dict)  # dead instance -> its first fatal log line
    # Instance found gone that its owner stopped (attach / `pdrig wave` against `pdrig up`): not a
    # death. -> the owner's stop line in its log (rig.cluster.logs.owner_stop_line).
    stopped: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)  # instance -> vLLM version from its /version
    # This scenario's metrics timeline rows (SnapshotStore.rows_of; already in
    # metrics/timeline.jsonl, so not repeated in report.json): what counters-monotonic reads.
    timeline: list[dict[str, Any]] = field(default_factory=list)
    # Decode's KV block as NIXL moves it (RigConfig.kv_bytes_per_block; None: geometry unknown) and
    # its block size in tokens: what makes kv-pulled's NIXL bytes exact.
    kv_bytes_per_block: int | None = None
    block_size: int | None = None
    # The deployment's measured per-request time in seconds: the median P/D round trip to this
    # decode after its warm-up (rig.workload.baseline, set by the runner; None: not measured, a
    # round trip failed or nothing measured it): the judging windows that follow the deployment's
    # speed derive from it (rig.judge.windows), and fall back to their absolute caps without it.
    baseline_request_s: float | None = None
    # The rig host's 1-minute load average when that baseline was measured, the highest read at the
    # start and end of the scenario's requests, and the host's CPUs (rig.cluster.proctree; None:
    # unknown): the latency check's guard against a host that starved the scenario
    # (rig.judge.windows.load_slowdown).
    baseline_host_load_1m: float | None = None
    host_load_1m: float | None = None
    host_cpus: int | None = None
    # The waits the scenario ran with (the config's; the defaults when nothing gave them): the
    # checks whose bounds end at one of the rig's timeouts read them here.
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)


class SnapshotStore:
    """Writes metric snapshots into the run directory as they are taken (nothing is lost if the
    run dies later): raw exposition text for named snapshots, and one JSON line per timeline
    sample with the gauges the rig reads, every monotonic sample under ``counters``
    (:func:`rig.observe.metrics.counter_values`) and the process's ``life``
    (``process_start_time_seconds``, absent when not exposed). The rows are also kept in memory
    per scenario (:meth:`rows_of`)."""

    TIMELINE_KEYS = (m.RUNNING, m.WAITING, m.KV_USAGE, m.PREEMPTIONS, m.GENERATION_TOKENS,
                     m.NIXL_BYTES_SUM, m.REQUEST_SUCCESS)

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir) / "metrics"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._timeline = open(self.dir / "timeline.jsonl", "a")  # noqa: SIM115 - appended to until close()
        self._rows: dict[str, list[dict[str, Any]]] = {}

    def save(self, label: str, snap: m.MetricSnapshot) -> None:
        """Write ``snap``'s raw text as ``metrics/<label>-<instance>.prom``."""
        (self.dir / f"{label}-{snap.instance}.prom").write_text(snap.text)

    def sample(self, scenario: str, snap: m.MetricSnapshot) -> None:
        """Append one timeline line ``{t, wall, scenario, instance, <gauges>}``."""
        row = {"wall": round(snap.wall, 3), "t": round(snap.t, 3), "scenario": scenario,
               "instance": snap.instance}
        # An absent metric is left out of the row (never 0): readers then see it missing.
        row.update({k.removeprefix("vllm:"): v for k in self.TIMELINE_KEYS if (v := snap.get(k)) is not None})
        row.update({f"waiting_{k}": v for k, v in snap.by_label(m.WAITING_BY_REASON, "reason").items()})
        if (life := snap.get(m.PROCESS_START)) is not None:
            row["life"] = life
        row["counters"] = m.counter_values(snap)
        self._rows.setdefault(scenario, []).append(row)
        self._timeline.write(json.dumps(row) + "\n")
        self._timeline.flush()

    def rows_of(self, scenario: str) -> list[dict[str, Any]]:
        """The timeline rows sampled for ``scenario`` so far, in sampling order (a copy)."""
        return list(self._rows.get(scenario, []))

    def close(self) -> None:
        """Close the timeline file."""
        self._timeline.close()

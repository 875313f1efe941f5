"""What one wave produced (:class:`WaveResult`): its records, counters, peaks, drains, stalls
and parity counts, with the summary the report and the checks read (counts by outcome, errors by
class, throughput and latency percentiles). Filled by :func:`rig.workload.waves.run_wave`.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rig.observe.observations import DrainResult
from rig.transport.records import WaveRecord

ERRORS = ("timeout", "http_error", "connection_error")  # and unplanned cancels ("aborted")


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
    # /metrics snapshots read per instance during the wave (TimelineSampler.samples): an instance
    # with 0 was never looked at, so "no instance froze" cannot be said of it.
    samples: dict[str, int] = field(default_factory=dict)
    plot_error: str = ""
    error: str = ""
    # Stall episodes seen in the timeline (instance, start s after the wave began, duration s,
    # diagnosis, and ``explained``: why the pool was legitimately full, or "" = unexplained).
    stalls: list[dict[str, Any]] = field(default_factory=list)
    kv_lease_s: float = 30.0  # the NIXL lease P keeps unread blocks for (explains P stalls), s

    def counts(self) -> Counter:
        """Records per status, with intentional cancels as ``cancelled`` and unplanned ones as
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

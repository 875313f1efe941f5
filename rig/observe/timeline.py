"""The metrics timeline of a wave: every instance's ``/metrics`` sampled about once a second.

Each sample goes to the run directory as it is taken (``metrics/timeline.jsonl`` through
:class:`~rig.observe.observations.SnapshotStore`, so nothing is lost if the run dies) and into memory,
where the wave reads peaks (running, waiting, KV usage per instance) and the progress display
the latest gauges. :func:`plot_timeline` draws running, waiting, KV usage, preemptions and
throughput per instance into a PNG (matplotlib, Agg backend: no display needed).

Rows use the keys of ``timeline.jsonl`` (metric names without ``vllm:``), plus ``rel_t``
(seconds since the sampler started), so a plot can be redrawn from the file with
:func:`load_rows`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import httpx

from rig.observe import metrics as m
from rig.observe.events import SampleTrigger
from rig.observe.observations import SnapshotStore
from rig.observe.stall import StallWatcher
from rig.transport.endpoint import Endpoint

RUNNING = m.RUNNING.removeprefix("vllm:")
WAITING = m.WAITING.removeprefix("vllm:")
KV = m.KV_USAGE.removeprefix("vllm:")
PREEMPT = m.PREEMPTIONS.removeprefix("vllm:")
SUCCESS = m.REQUEST_SUCCESS.removeprefix("vllm:")
GEN = m.GENERATION_TOKENS.removeprefix("vllm:")


def row_of(snap: m.MetricSnapshot, scenario: str, t0: float) -> dict[str, Any]:
    """The timeline row of one snapshot (same keys as SnapshotStore writes, plus ``rel_t``)."""
    row: dict[str, Any] = {"wall": round(snap.wall, 3), "t": round(snap.t, 3), "rel_t": round(snap.t - t0, 3),
                           "scenario": scenario, "instance": snap.instance}
    row.update({k.removeprefix("vllm:"): v for k in SnapshotStore.TIMELINE_KEYS if (v := snap.get(k)) is not None})
    return row


class TimelineSampler:
    """Scrapes ``endpoints`` every ``interval_s`` seconds between :meth:`start` and :meth:`stop`.

    ``rows`` holds every sample, ``latest`` the last row per instance, ``peaks`` the maxima of
    running / waiting / KV usage per instance, ``scrape_errors`` the failed scrapes, ``samples``
    the snapshots read per instance (0 for one never read: its no-stall cannot be judged); ``stalls``
    (optional, :class:`rig.observe.stall.StallWatcher`) is fed every snapshot. ``trigger`` (optional,
    rig.observe.events) wakes the sampler early at a request event of one of its instances.
    """

    def __init__(self, http: httpx.AsyncClient, endpoints: list[Endpoint], store: SnapshotStore | None,
                 scenario: str, interval_s: float = 1.0, stalls: StallWatcher | None = None,
                 trigger: SampleTrigger | None = None):
        self.http, self.endpoints, self.store = http, endpoints, store
        self.trigger = trigger
        self.stalls = stalls  # fed every snapshot: stall episodes of every instance
        self.scenario, self.interval_s = scenario, interval_s
        self.rows: list[dict[str, Any]] = []
        self.latest: dict[str, dict[str, Any]] = {}
        self.peaks: dict[str, dict[str, float]] = {e.name: {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}
                                                   for e in endpoints}
        self.scrape_errors = 0
        self.samples: dict[str, int] = {e.name: 0 for e in endpoints}
        self.t0 = time.monotonic()
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def sample_once(self) -> None:
        """Scrape every endpoint once (concurrently) and record the rows."""
        snaps = await asyncio.gather(*(m.scrape(self.http, e.url, e.name) for e in self.endpoints),
                                     return_exceptions=True)
        for snap in snaps:
            if isinstance(snap, BaseException):
                if isinstance(snap, (httpx.HTTPError, ValueError)):
                    self.scrape_errors += 1
                    continue
                raise snap
            self.samples[snap.instance] = self.samples.get(snap.instance, 0) + 1
            if self.store is not None:
                self.store.sample(self.scenario, snap)
            if self.stalls is not None:
                self.stalls.feed(snap)
            row = row_of(snap, self.scenario, self.t0)
            self.rows.append(row)
            self.latest[snap.instance] = row
            pk = self.peaks.setdefault(snap.instance, {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0})
            pk["running"] = max(pk["running"], row.get(RUNNING, 0.0))
            pk["waiting"] = max(pk["waiting"], row.get(WAITING, 0.0))
            pk["kv_usage"] = max(pk["kv_usage"], row.get(KV, 0.0))  # peaks are display: absent = 0

    async def _loop(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            await self.sample_once()
            left = max(0.0, self.interval_s - (time.monotonic() - t))
            if self.trigger is not None:
                await self.trigger.wait(left, self._stop)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), left)

    def start(self) -> None:
        """Start sampling in the background (the first sample is taken at once)."""
        self.t0 = time.monotonic()
        self._stop.clear()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Stop sampling after one last round (so the end of the wave is in the timeline)."""
        self._stop.set()
        if self._task is not None:
            try:
                await self._task
            finally:
                self._task = None
        await self.sample_once()


def load_rows(path: str | Path, scenario: str | None = None) -> list[dict[str, Any]]:
    """Rows of a ``timeline.jsonl`` (optionally one scenario's), with ``rel_t`` from its first row."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if scenario is None or r.get("scenario") == scenario:
                rows.append(r)
    if rows:
        t0 = min(r["t"] for r in rows)
        for r in rows:
            r.setdefault("rel_t", r["t"] - t0)
    return rows


def series(rows: list[dict[str, Any]], min_dt: float = 0.5) -> dict[str, dict[str, list[float]]]:
    """``{instance: {rel_t, running, waiting, kv_pct, preemptions, req_per_s, tok_per_s}}``.

    Preemptions are counted from the instance's first sample; the rates are the deltas of
    ``request_success_total`` and ``generation_tokens_total`` since the latest earlier sample at
    least ``min_dt`` seconds back (so a closely following last sample does not spike).
    """
    out: dict[str, dict[str, list[float]]] = {}
    hist: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["rel_t"]):
        inst = r["instance"]
        s = out.setdefault(inst, {k: [] for k in ("rel_t", "running", "waiting", "kv_pct", "preemptions",
                                                  "req_per_s", "tok_per_s")})
        h = hist.setdefault(inst, [])
        f = h[0] if h else r
        p = next((x for x in reversed(h) if r["rel_t"] - x["rel_t"] >= min_dt), h[0] if h else None)
        h.append(r)
        dt = (r["rel_t"] - p["rel_t"]) if p else 0.0
        s["rel_t"].append(r["rel_t"])
        s["running"].append(r.get(RUNNING, 0.0))
        s["waiting"].append(r.get(WAITING, 0.0))
        s["kv_pct"].append(100.0 * r.get(KV, 0.0))
        s["preemptions"].append(r.get(PREEMPT, 0.0) - f.get(PREEMPT, 0.0))
        s["req_per_s"].append((r.get(SUCCESS, 0.0) - p.get(SUCCESS, 0.0)) / dt if p and dt > 0 else 0.0)
        s["tok_per_s"].append((r.get(GEN, 0.0) - p.get(GEN, 0.0)) / dt if p and dt > 0 else 0.0)
    return out


def timeline_figure(rows: list[dict[str, Any]], title: str = "", marks: dict[str, float] | None = None) -> Any:
    """The timeline as a matplotlib Figure (5 panels sharing the time axis, one line per instance;
    ``marks`` are labelled vertical lines at ``rel_t`` seconds), None without rows. The caller
    closes it (``matplotlib.pyplot.close``)."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = series(rows)
    panels = (("running", "running"), ("waiting", "waiting"), ("kv_pct", "KV usage %"),
              ("preemptions", "preemptions (cumulative)"), ("req_per_s", "finished req/s"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 11), sharex=True)
    for ax, (key, label) in zip(axes, panels, strict=True):
        for inst, s in data.items():
            ax.plot(s["rel_t"], s[key], marker=".", markersize=3, linewidth=1.2, label=inst)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        for x in (marks or {}).values():
            ax.axvline(x, color="grey", linestyle="--", linewidth=0.8)
    for name, x in (marks or {}).items():
        axes[0].annotate(name, (x, 1.0), xycoords=("data", "axes fraction"), fontsize=8,
                         rotation=90, va="top", ha="right", color="grey")
    axes[0].legend(loc="upper left", fontsize=8, framealpha=0.8)
    axes[-1].set_xlabel("seconds since the wave started")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_timeline(rows: list[dict[str, Any]], path: str | Path, title: str = "",
                  marks: dict[str, float] | None = None) -> Path | None:
    """Draw the timeline PNG (:func:`timeline_figure`) to ``path`` (its folder made as needed).
    Returns the path, or None without rows."""
    fig = timeline_figure(rows, title, marks)
    if fig is None:
        return None
    import matplotlib.pyplot as plt

    try:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=90)
    finally:
        plt.close(fig)
    return path

"""The wave's metrics timeline (rig.observe.timeline): rows, peaks, scrape errors, the series a
plot draws and the file it is redrawn from. In-process: /metrics is an httpx.MockTransport."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from types import SimpleNamespace

import httpx
import pytest

from rig.observe import timeline as tl
from rig.observe.metrics import parse_metrics
from rig.observe.observations import SnapshotStore
from rig.observe.timeline import TimelineSampler, load_rows, plot_timeline, row_of, series, timeline_figure
from rig.transport.endpoint import Endpoint

PROM = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0"}} {waiting}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0"}} {kv}
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{engine="0"}} 2
"""


def test_row_keys_drop_the_vllm_prefix_and_leave_absent_metrics_out():
    s = replace(parse_metrics(PROM.format(running=1, waiting=2, kv=0.5), "decode", t=12.3456), wall=1000.12345)
    row = row_of(s, "wave-1", 10.0)
    assert row["t"] == 12.346 and row["rel_t"] == 2.346 and row["wall"] == 1000.123
    assert row["scenario"] == "wave-1" and row["instance"] == "decode"
    assert {k: row[k] for k in (tl.RUNNING, tl.WAITING, tl.KV, tl.PREEMPT)} == {
        "num_requests_running": 1.0, "num_requests_waiting": 2.0, "kv_cache_usage_perc": 0.5,
        "num_preemptions_total": 2.0}
    assert tl.SUCCESS not in row and tl.GEN not in row  # absent: left out, never 0
    assert tl.SUCCESS == "request_success_total" and tl.GEN == "generation_tokens_total"


def _transport(pages: dict[str, list], calls: list[str]) -> httpx.MockTransport:
    def handle(req: httpx.Request) -> httpx.Response:
        host = req.url.host
        calls.append(host)
        page = pages[host].pop(0) if len(pages[host]) > 1 else pages[host][0]
        if isinstance(page, int):
            return httpx.Response(page)
        if isinstance(page, Exception):
            raise page
        return httpx.Response(200, text=page)
    return httpx.MockTransport(handle)


class _Watcher:
    def __init__(self) -> None:
        self.fed: list[str] = []

    def feed(self, snap, engine_cpu_s=None):
        self.fed.append(snap.instance)


def test_sample_once_records_rows_latest_peaks_store_and_stalls(tmp_path):
    pages = {"p": [PROM.format(running=3, waiting=0, kv=0.25), PROM.format(running=1, waiting=4, kv=0.75)],
             "d": [PROM.format(running=0, waiting=1, kv=1.0)], "x": [503]}
    calls: list[str] = []
    eps = [Endpoint("prefill", "http://p"), Endpoint("decode", "http://d"), Endpoint("extra", "http://x")]
    store = SnapshotStore(tmp_path)
    watcher = _Watcher()

    async def run() -> TimelineSampler:
        async with httpx.AsyncClient(transport=_transport(pages, calls)) as http:
            s = TimelineSampler(http, eps, store, "w1", interval_s=0.5, stalls=watcher)
            assert s.peaks == {n: {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0} for n in ("prefill", "decode",
                                                                                             "extra")}
            await s.sample_once()
            await s.sample_once()
            return s

    s = asyncio.run(run())
    assert s.interval_s == 0.5 and s.scenario == "w1"
    assert s.scrape_errors == 2  # x answered 503 twice
    assert [r["instance"] for r in s.rows] == ["prefill", "decode", "prefill", "decode"]
    assert all(r["scenario"] == "w1" for r in s.rows)
    assert s.latest["prefill"][tl.RUNNING] == 1.0 and s.latest["prefill"][tl.WAITING] == 4.0
    assert "extra" not in s.latest
    assert s.peaks["prefill"] == {"running": 3.0, "waiting": 4.0, "kv_usage": 0.75}
    assert s.peaks["decode"] == {"running": 0.0, "waiting": 1.0, "kv_usage": 1.0}
    assert s.peaks["extra"] == {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}
    assert watcher.fed == ["prefill", "decode", "prefill", "decode"]
    assert [r["instance"] for r in store.rows_of("w1")] == ["prefill", "decode", "prefill", "decode"]


def _unlisted(page: str) -> TimelineSampler:
    """A sampler built for no endpoint that then samples ``decode`` once (peaks start from its first row)."""

    async def run() -> TimelineSampler:
        async with httpx.AsyncClient(transport=_transport({"d": [page]}, [])) as http:
            s = TimelineSampler(http, [], None, "w")
            s.endpoints = [Endpoint("decode", "http://d")]
            await s.sample_once()
            return s

    return asyncio.run(run())


def test_sample_once_peaks_of_an_instance_not_in_endpoints_and_gauges_absent():
    s = _unlisted("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 2\n")
    assert s.peaks == {"decode": {"running": 0.0, "waiting": 2.0, "kv_usage": 0.0}}
    assert s.scrape_errors == 0 and s.interval_s == 1.0 and s.stalls is None
    assert s.samples["decode"] == 1  # counted from its first snapshot, though not listed


def test_sample_once_counts_a_page_that_is_not_metrics_and_raises_anything_else():
    pages = {"d": ["this is { not prometheus"]}

    async def run(p) -> TimelineSampler:
        async with httpx.AsyncClient(transport=_transport(p, [])) as http:
            s = TimelineSampler(http, [Endpoint("decode", "http://d")], None, "w")
            await s.sample_once()
            return s

    assert asyncio.run(run(pages)).scrape_errors == 1
    assert asyncio.run(run({"d": [httpx.ConnectError("refused")]})).scrape_errors == 1
    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(run({"d": [RuntimeError("boom")]}))


def test_start_samples_at_once_and_stop_takes_one_last_round():
    calls: list[str] = []
    pages = {"d": [PROM.format(running=0, waiting=0, kv=0.0)]}

    async def run() -> TimelineSampler:
        async with httpx.AsyncClient(transport=_transport(pages, calls)) as http:
            s = TimelineSampler(http, [Endpoint("decode", "http://d")], None, "w", interval_s=3600)
            s.start()
            for _ in range(20):
                await asyncio.sleep(0)
            assert len(calls) == 1  # the first sample at once, the next an hour later
            await s.stop()
            assert s._task is None
            return s

    s = asyncio.run(run())
    assert len(calls) == 2 and len(s.rows) == 2  # + the last round of stop()


def test_stop_without_start_still_samples_once():
    calls: list[str] = []

    async def run() -> None:
        async with httpx.AsyncClient(transport=_transport({"d": [PROM.format(running=0, waiting=0, kv=0)]},
                                                          calls)) as http:
            await TimelineSampler(http, [Endpoint("decode", "http://d")], None, "w").stop()

    asyncio.run(run())
    assert calls == ["d"]


def test_load_rows_filters_a_scenario_and_adds_rel_t(tmp_path):
    path = tmp_path / "timeline.jsonl"
    rows = [{"t": 105.0, "scenario": "a", "instance": "d"}, {"t": 100.0, "scenario": "b", "instance": "d"},
            {"t": 102.0, "scenario": "a", "instance": "p", "rel_t": 9.0}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    a = load_rows(path, "a")
    assert [(r["t"], r["rel_t"]) for r in a] == [(105.0, 3.0), (102.0, 9.0)]  # a kept rel_t stays
    every = load_rows(str(path))
    assert [r["rel_t"] for r in every] == [5.0, 0.0, 9.0]
    assert load_rows(path, "none") == []


def test_series_counts_preemptions_from_the_first_sample_and_rates_over_min_dt():
    rows = [
        {"rel_t": 0.0, "instance": "d", "num_preemptions_total": 2.0, "request_success_total": 10.0,
         "generation_tokens_total": 100.0, "num_requests_running": 1.0, "num_requests_waiting": 3.0,
         "kv_cache_usage_perc": 0.5},
        {"rel_t": 1.0, "instance": "d", "num_preemptions_total": 5.0, "request_success_total": 14.0,
         "generation_tokens_total": 180.0},
        {"rel_t": 1.2, "instance": "d", "num_preemptions_total": 5.0, "request_success_total": 15.0,
         "generation_tokens_total": 190.0},
        {"rel_t": 0.5, "instance": "p", "request_success_total": 1.0},
    ]
    out = series(rows)
    d = out["d"]
    assert d["rel_t"] == [0.0, 1.0, 1.2]
    assert d["running"] == [1.0, 0.0, 0.0] and d["waiting"] == [3.0, 0.0, 0.0]
    assert d["kv_pct"] == [50.0, 0.0, 0.0]
    assert d["preemptions"] == [0.0, 3.0, 3.0]
    # first sample: no earlier one; 1.0: 4 requests in 1 s; 1.2: back to 0.0 (>= 0.5 s): 5 in 1.2 s
    assert d["req_per_s"] == [0.0, 4.0, pytest.approx(5 / 1.2)]
    assert d["tok_per_s"] == [0.0, 80.0, pytest.approx(90 / 1.2)]
    assert out["p"]["req_per_s"] == [0.0] and out["p"]["preemptions"] == [0.0]
    assert set(d) == {"rel_t", "running", "waiting", "kv_pct", "preemptions", "req_per_s", "tok_per_s"}


def test_series_min_dt_and_a_sample_at_the_same_time():
    rows = [{"rel_t": 0.0, "instance": "d", "request_success_total": 0.0},
            {"rel_t": 0.5, "instance": "d", "request_success_total": 1.0},
            {"rel_t": 0.5, "instance": "d", "request_success_total": 1.0},
            {"rel_t": 0.7, "instance": "d", "request_success_total": 3.0}]
    d = series(rows)["d"]
    # exactly min_dt back counts; at 0.7 the latest sample >= 0.5 s back is the one at 0.0
    assert d["req_per_s"] == [0.0, 2.0, 2.0, pytest.approx(3 / 0.7)]
    d2 = series(rows, min_dt=5.0)["d"]  # nothing far enough back: the first sample
    assert d2["req_per_s"] == [0.0, 2.0, 2.0, pytest.approx(3 / 0.7)]
    same = series([{"rel_t": 1.0, "instance": "d", "request_success_total": 1.0},
                   {"rel_t": 1.0, "instance": "d", "request_success_total": 4.0}])["d"]
    assert same["req_per_s"] == [0.0, 0.0]  # dt 0: no rate


def test_plot_timeline_writes_a_png_and_nothing_without_rows(tmp_path):
    assert plot_timeline([], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
    rows = [{"rel_t": float(i), "instance": inst, "num_requests_running": float(i % 3)}
            for i in range(4) for inst in ("p", "d")]
    out = plot_timeline(rows, str(tmp_path / "sub" / "t.png"), title="wave", marks={"end": 2.0})
    assert out == tmp_path / "sub" / "t.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []  # the figure is closed: a long run of waves holds no figures


def test_series_rate_uses_the_latest_sample_exactly_min_dt_back():
    rows = [{"rel_t": 0.0, "instance": "d", "generation_tokens_total": 0.0},
            {"rel_t": 0.25, "instance": "d", "generation_tokens_total": 12.0},
            {"rel_t": 0.75, "instance": "d", "generation_tokens_total": 30.0}]
    d = series(rows)["d"]
    assert d["tok_per_s"][2] == 36.0  # (30 - 12) / 0.5: the sample at 0.25 is exactly 0.5 s back


def test_a_failed_scrape_does_not_stop_the_round():
    pages = {"x": [503], "d": [PROM.format(running=1, waiting=0, kv=0.0)]}

    async def run() -> TimelineSampler:
        async with httpx.AsyncClient(transport=_transport(pages, [])) as http:
            s = TimelineSampler(http, [Endpoint("extra", "http://x"), Endpoint("decode", "http://d")], None, "w")
            await s.sample_once()
            return s

    s = asyncio.run(run())
    assert s.scrape_errors == 1 and [r["instance"] for r in s.rows] == ["decode"]


def test_the_peak_of_a_gauge_an_instance_does_not_expose_stays_zero():
    s = _unlisted("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n")
    assert s.peaks == {"decode": {"running": 1.0, "waiting": 0.0, "kv_usage": 0.0}}


def test_the_loop_waits_what_is_left_of_the_interval_after_a_round(monkeypatch):
    """The clock reads 1 s later at every look: a round takes 1 s of a 1.5 s interval, 0.5 s is left."""
    now = [0.0]

    def monotonic() -> float:
        now[0] += 1.0
        return now[0]

    monkeypatch.setattr(tl, "time", SimpleNamespace(monotonic=monotonic))
    waits: list[float | None] = []
    real_wait_for = asyncio.wait_for

    async def wait_for(aw, timeout):
        waits.append(timeout)
        return await real_wait_for(aw, 0)  # times out at once (suppressed): the next round

    monkeypatch.setattr(asyncio, "wait_for", wait_for)
    pages = {"d": [PROM.format(running=0, waiting=0, kv=0.0)]}

    async def run() -> TimelineSampler:
        async with httpx.AsyncClient(transport=_transport(pages, [])) as http:
            s = TimelineSampler(http, [Endpoint("decode", "http://d")], None, "w", interval_s=1.5)
            s.start()
            for _ in range(50):
                await asyncio.sleep(0)
                if len(waits) >= 3:
                    break
            await s.stop()
            return s

    s = asyncio.run(run())
    assert len(waits) >= 3 and set(waits) == {0.5}
    assert len(s.rows) == len(waits) + 1  # a round per wait, + stop's last round


def test_the_timeline_figure_names_its_panels_instances_marks_and_title():
    import matplotlib.pyplot as plt

    assert timeline_figure([]) is None
    rows = [{"rel_t": float(i), "instance": inst, "num_requests_running": float(i)} for i in range(3)
            for inst in ("prefill", "decode")]
    fig = timeline_figure(rows, marks={"wave end": 2.0, "drained": 2.5})
    try:
        axes = fig.axes
        assert [ax.get_ylabel() for ax in axes] == ["running", "waiting", "KV usage %", "preemptions (cumulative)",
                                                    "finished req/s"]
        assert axes[-1].get_xlabel() == "seconds since the wave started"
        assert tuple(fig.get_size_inches()) == (9.0, 11.0)
        assert all(axes[0].get_shared_x_axes().joined(axes[0], ax) for ax in axes[1:])  # one time axis
        assert [t.get_text() for t in axes[0].get_legend().get_texts()] == ["prefill", "decode"]
        assert [list(line.get_ydata()) for line in axes[0].lines[:2]] == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]]
        assert [a.get_text() for a in axes[0].texts] == ["wave end", "drained"]
        assert all(sum(1 for line in ax.lines if line.get_linestyle() == "--") == 2 for ax in axes)
        assert fig._suptitle is None  # no title, no heading
    finally:
        plt.close(fig)
    fig = timeline_figure(rows, "pressure: 6 requests")
    try:
        assert fig._suptitle.get_text() == "pressure: 6 requests"
        assert all(len(ax.texts) == 0 for ax in fig.axes)  # no marks, no mark labels
    finally:
        plt.close(fig)


def test_the_timeline_figure_draws_each_series_over_time_in_its_style():
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    rows = [{"rel_t": 0.5 * i, "instance": "decode", "num_requests_running": float(3 - i)} for i in range(3)]
    fig = timeline_figure(rows, marks={"wave end": 0.75})
    try:
        ax = fig.axes[0]
        line = ax.lines[0]
        assert list(line.get_xdata()) == [0.0, 0.5, 1.0] and list(line.get_ydata()) == [3.0, 2.0, 1.0]
        assert (line.get_marker(), line.get_markersize(), line.get_linewidth()) == (".", 3, 1.2)
        grid = ax.xaxis.get_gridlines()[0]
        assert grid.get_visible() and grid.get_alpha() == 0.3
        mark = ax.lines[1]
        assert list(mark.get_xdata()) == [0.75, 0.75] and mark.get_linestyle() == "--"
        assert to_hex(mark.get_color()) == "#808080" and mark.get_linewidth() == 0.8
        (label,) = ax.texts
        assert label.get_text() == "wave end" and label.xy == (0.75, 1.0)
        assert label.xycoords == ("data", "axes fraction")
        assert (label.get_fontsize(), label.get_rotation(), label.get_va(), label.get_ha()) == (8, 90, "top", "right")
        assert to_hex(label.get_color()) == "#808080"
        legend = ax.get_legend()
        assert legend._loc == 2 and legend.get_frame().get_alpha() == 0.8  # upper left
        assert [t.get_fontsize() for t in legend.get_texts()] == [8]
    finally:
        plt.close(fig)


def test_plot_timeline_passes_title_and_marks_and_writes_at_90_dpi(tmp_path, monkeypatch):
    seen = []
    real = tl.timeline_figure

    def spy(rows, title="", marks=None):
        seen.append((title, marks))
        return real(rows, title, marks)

    monkeypatch.setattr(tl, "timeline_figure", spy)
    rows = [{"rel_t": 0.0, "instance": "d"}]
    out = plot_timeline(rows, tmp_path / "a" / "b" / "t.png", "wave", {"end": 1.0})
    assert seen == [("wave", {"end": 1.0})]
    png = out.read_bytes()
    assert int.from_bytes(png[16:20], "big") == 810 and int.from_bytes(png[20:24], "big") == 990  # 9 x 11 in at 90 dpi
    assert plot_timeline(rows, tmp_path / "a" / "b" / "u.png") == tmp_path / "a" / "b" / "u.png"  # folder exists
    assert seen[1] == ("", None)


def test_series_without_counters_has_no_rate():
    rows = [{"rel_t": 0.0, "instance": "d"}, {"rel_t": 1.0, "instance": "d"}]
    d = series(rows)["d"]
    assert d["req_per_s"] == [0.0, 0.0] and d["tok_per_s"] == [0.0, 0.0] and d["preemptions"] == [0.0, 0.0]

"""The live progress display of a wave (rig.observe.progress): the line a CI log shows, the panel
a terminal shows, and the modes. Pure: the clock is a stub, streams are StringIO."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace

import pytest

from rig.observe import progress
from rig.observe.progress import WaveProgress, resolve_mode, status_line


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_resolve_mode_auto_follows_the_stream_and_rejects_an_unknown_mode():
    assert resolve_mode("auto", _Tty()) == "rich"
    assert resolve_mode("auto", io.StringIO()) == "lines"
    assert resolve_mode("lines", _Tty()) == "lines"
    assert resolve_mode("off", _Tty()) == "off"
    assert resolve_mode("rich", io.StringIO()) == "rich"
    with pytest.raises(ValueError) as e:
        resolve_mode("fancy")
    assert str(e.value) == "progress mode 'fancy': choose one of ['auto', 'rich', 'lines', 'off']"


def test_resolve_mode_auto_defaults_to_stderr(monkeypatch):
    monkeypatch.setattr(progress.sys, "stderr", _Tty())
    assert resolve_mode("auto") == "rich"
    monkeypatch.setattr(progress.sys, "stderr", io.StringIO())
    assert resolve_mode("auto") == "lines"


def test_status_line_counts_every_outcome_and_each_instance():
    counts = {"ok": 3, "failed": 2, "cancelled": 1, "in_flight": 4}
    latest = {"prefill": {"num_requests_running": 2.0, "num_requests_waiting": 1.0, "kv_cache_usage_perc": 0.25},
              "decode": {"num_requests_running": 0.0, "num_requests_waiting": 5.0, "kv_cache_usage_perc": 1.0}}
    assert status_line("pressure", 12, counts, latest, 2.0) == (
        "pressure: 6/12 (50%) | ok 3 failed 2 cancelled 1 | in flight 4 | prefill run 2 wait 1 kv 25% | "
        "decode run 0 wait 5 kv 100% | 3.0 req/s, 2 s")


def test_status_line_reads_absent_counts_and_gauges_as_zero():
    assert status_line("w", 0, {}, {"d": {}}, 0.0) == (
        "w: 0/0 (0%) | ok 0 failed 0 cancelled 0 | in flight 0 | d run 0 wait 0 kv 0% | 0.0 req/s, 0 s")


def test_status_line_rate_has_one_decimal_below_ten_and_none_from_ten():
    assert status_line("w", 100, {"ok": 99}, {}, 10.0).endswith("| 9.9 req/s, 10 s")
    assert status_line("w", 100, {"ok": 100}, {}, 10.0).endswith("| 10 req/s, 10 s")
    assert status_line("w", 3, {"cancelled": 1}, {}, 4.0) == (
        "w: 1/3 (33%) | ok 0 failed 0 cancelled 1 | in flight 0 | 0.2 req/s, 4 s")


def _clock(monkeypatch, now: list[float]) -> None:
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: now[0]))


def test_line_measures_elapsed_time_from_start(monkeypatch):
    now = [100.0]
    _clock(monkeypatch, now)
    counts = {"ok": 4}
    p = WaveProgress("w", 8, counts, {}, mode="off", stream=io.StringIO())
    assert p.mode == "off"
    assert p.line_interval_s == 5.0
    now[0] = 102.0
    assert p.line() == "w: 4/8 (50%) | ok 4 failed 0 cancelled 0 | in flight 0 | 2.0 req/s, 2 s"
    p.start()  # off: shows nothing, restarts the clock
    now[0] = 110.0
    assert p.line().endswith("| 0.5 req/s, 8 s")
    assert p.stream.getvalue() == ""


def test_default_stream_is_stderr(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", err)
    assert WaveProgress("w", 1, {}, {}, mode="lines").stream is err


def test_lines_mode_prints_a_first_line_and_a_final_line(monkeypatch):
    now = [0.0]
    _clock(monkeypatch, now)
    out = io.StringIO()
    counts = {"ok": 0, "in_flight": 2}
    p = WaveProgress("w", 2, counts, {}, mode="lines", stream=out, line_interval_s=3600)

    async def run() -> None:
        p.start()
        counts.update(ok=2, in_flight=0)
        now[0] = 4.0
        await p.stop()
        await p.stop()  # a second stop prints nothing more

    asyncio.run(run())
    assert out.getvalue().splitlines() == [
        "w: 0/2 (0%) | ok 0 failed 0 cancelled 0 | in flight 2 | 0.0 req/s, 0 s",
        "w: 2/2 (100%) | ok 2 failed 0 cancelled 0 | in flight 0 | 0.5 req/s, 4 s"]
    assert p._task is None


def test_lines_mode_repeats_the_line_every_interval(monkeypatch):
    out = io.StringIO()
    p = WaveProgress("w", 2, {"ok": 1}, {}, mode="lines", stream=out, line_interval_s=0.0)

    async def run() -> None:
        p.start()
        for _ in range(5):
            await asyncio.sleep(0)
        await p.stop()

    asyncio.run(run())
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and all(ln.startswith("w: 1/2 (50%)") for ln in lines)


def test_rich_panel_shows_counts_rate_and_each_instance(monkeypatch):
    now = [50.0]
    _clock(monkeypatch, now)
    out = io.StringIO()
    counts = {"ok": 3, "failed": 1, "cancelled": 1, "in_flight": 2}
    latest = {"decode": {"num_requests_running": 2.0, "num_requests_waiting": 3.0, "kv_cache_usage_perc": 0.125},
              "prefill": {}}
    p = WaveProgress("pressure", 10, counts, latest, mode="rich", stream=out)
    assert p.mode == "rich"

    async def run() -> None:
        p.start()
        now[0] = 60.0
        await p.stop()

    asyncio.run(run())
    text = out.getvalue()
    assert p._live is None
    for part in ("pressure", "5/10", "0.5 req/s", "10 s", "ok 3", "failed 1", "cancelled 1", "in flight 2",
                 "instance", "running", "waiting", "KV usage", "12.5%", "0.0%"):
        assert part in text, part
    row = next(ln for ln in text.splitlines() if "decode" in ln).split()
    assert row == ["decode", "2", "3", "12.5%"]
    assert next(ln for ln in text.splitlines() if "prefill" in ln).split() == ["prefill", "0", "0", "0.0%"]


def test_rich_panel_progress_bar_and_zero_elapsed(monkeypatch):
    from rich.console import Console
    from rich.progress_bar import ProgressBar

    now = [5.0]
    _clock(monkeypatch, now)
    p = WaveProgress("w", 0, {}, {}, mode="rich", stream=io.StringIO())
    group = p._render()
    head = group.renderables[0]
    bar = next(c for c in head.columns[1].cells)
    assert isinstance(bar, ProgressBar) and bar.total == 1 and bar.completed == 0 and bar.width == 40
    cells = [next(iter(c.cells)) for c in head.columns]
    assert cells == ["[bold]w[/]", bar, "0/0", "0.0 req/s", "0 s"]
    second = [list(c.cells)[1] for c in head.columns]
    assert second == ["[green]ok 0[/]", "[red]failed 0[/]", "[yellow]cancelled 0[/]", "in flight 0", ""]
    p2 = WaveProgress("w", 4, {"ok": 1, "failed": 1, "cancelled": 1}, {}, mode="rich", stream=io.StringIO())
    bar2 = list(p2._render().renderables[0].columns[1].cells)[0]
    assert bar2.total == 4 and bar2.completed == 3
    inst = group.renderables[1]
    assert [c.header for c in inst.columns] == ["instance", "running", "waiting", "KV usage"]
    assert [c.justify for c in inst.columns] == ["left", "right", "right", "right"]
    buf = io.StringIO()
    Console(file=buf, width=120).print(group)
    assert "0/0" in buf.getvalue()


class _Flushes(io.StringIO):
    """A stream that counts flushes: a CI log shows a line only once it is flushed."""

    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_every_plain_line_is_flushed_at_once():
    out = _Flushes()
    p = WaveProgress("w", 1, {}, {}, mode="lines", stream=out, line_interval_s=0.0)

    async def run() -> None:
        p.start()
        assert out.flushes == 1 and out.getvalue().count("\n") == 1
        for _ in range(3):
            await asyncio.sleep(0)
        assert out.flushes == out.getvalue().count("\n") >= 2
        await p.stop()

    asyncio.run(run())
    assert out.flushes == out.getvalue().count("\n")


def test_the_rich_panel_redraws_four_times_a_second_and_stays_on_screen_at_the_end():
    p = WaveProgress("w", 1, {}, {}, mode="rich", stream=io.StringIO())

    async def run() -> None:
        p.start()
        live = p._live
        assert live.refresh_per_second == 4 and live.transient is False
        assert live.console.file is p.stream
        await p.stop()

    asyncio.run(run())


def test_the_rich_panel_layout():
    group = WaveProgress("w", 1, {}, {"d": {}}, mode="rich", stream=io.StringIO())._render()
    head, inst = group.renderables
    assert head.padding == (0, 2, 0, 2)
    assert inst.box is None and inst.padding == (0, 2, 0, 2) and inst.show_edge is False


def test_status_line_rate_within_the_first_second():
    assert status_line("w", 4, {"ok": 1}, {}, 0.5).endswith("| 2.0 req/s, 0 s")


def test_a_stream_without_isatty_gets_plain_lines():
    assert resolve_mode("auto", SimpleNamespace(write=lambda s: None)) == "lines"  # type: ignore[arg-type]


def test_the_mode_follows_the_given_stream_by_default(monkeypatch):
    monkeypatch.setattr(progress.sys, "stderr", io.StringIO())
    assert WaveProgress("w", 1, {}, {}, stream=_Tty()).mode == "rich"
    monkeypatch.setattr(progress.sys, "stderr", _Tty())
    assert WaveProgress("w", 1, {}, {}, stream=io.StringIO()).mode == "lines"


def test_the_panel_rate_within_the_first_second(monkeypatch):
    now = [0.0]
    _clock(monkeypatch, now)
    p = WaveProgress("w", 4, {"ok": 1}, {}, mode="rich", stream=io.StringIO())
    now[0] = 0.5
    head = p._render().renderables[0]
    assert [next(iter(c.cells)) for c in head.columns][3] == "2.0 req/s"

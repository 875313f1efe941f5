"""Prefix and pressure waves against the fake vLLM: prompts, prefix-cache expectations, the
pressure wave's verdict, drain checks (recorded samples and live against ``leak-kv``), the
timeline/summary outputs, the suite runner's dispatch and the suite files (``pdrig wave``'s
command line: tests/app/test_wave_cli.py)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
import yaml

from rig.config import ConfigError, ScenarioConfig, load_config
from rig.judge import wave_checks as wj
from rig.observe import drain
from rig.observe import metrics as m
from rig.observe.observations import SnapshotStore
from rig.observe.timeline import load_rows, plot_timeline
from rig.report.build import wave_report
from rig.workload import waves as wv
from tests.helpers.fake_pd import fake_pd, free_port
from tests.helpers.waves import (
    scenario,
    wave_and_drain,
)

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------ prompts


def test_prefix_wave_prompts_exact_lengths_and_shared_prefixes():
    sc = scenario("prefix-wave", groups=3, per_group=5, prefix_tokens=40, prompt_tokens=56, concurrency=4)
    rs = wv.wave_requests(sc, seed=11)
    assert len(rs) == 15 and all(len(r.prompt) == 56 for r in rs)
    groups = [[r for r in rs if r.group == g] for g in range(3)]
    for g in groups:
        assert len(g) == 5
        assert len({tuple(r.prompt[:40]) for r in g}) == 1  # one prefix per group
        assert len({tuple(r.prompt[40:]) for r in g}) == 5  # unique suffixes
    assert len({tuple(g[0].prompt[:40]) for g in groups}) == 3  # groups differ
    assert [r.index for r in rs] == list(range(15)) and rs[0].group == 0 and rs[-1].group == 2
    assert [tuple(r.prompt) for r in rs] == [tuple(r.prompt) for r in wv.wave_requests(sc, seed=11)]
    assert rs[0].prompt != wv.wave_requests(sc, seed=12)[0].prompt


def test_pressure_wave_prompts_cancels_streams_and_parity_sample():
    sc = scenario("pressure-wave", requests=200, cancel_fraction=0.1, prompt_tokens=48, parity_fraction=0.1)
    rs = wv.wave_requests(sc, seed=3)
    assert len(rs) == 200 and all(len(r.prompt) == 48 for r in rs)
    assert len({tuple(r.prompt) for r in rs}) == 200
    planned = [r for r in rs if r.cancel_at]
    assert len(planned) == 20
    assert {r.cancel_at for r in planned} == {"before-prefill", "between", "during-decode"}
    assert all(r.stream for r in planned if r.cancel_at == "during-decode")
    assert all(r.stream == (r.index % 2 == 1) for r in rs if r.cancel_at != "during-decode")  # mixed
    sample = [r for r in rs if r.keep_tokens]
    assert len(sample) == 18 and not any(r.cancel_at for r in sample)  # 10 % of the 180 completing


def test_wave_config_validation():
    assert scenario("pressure-wave").prompt_tokens == 48  # wave kinds default their token counts
    with pytest.raises(ValueError, match="prefix_tokens 56 must be below prompt_tokens 56"):
        scenario("prefix-wave", prefix_tokens=56, prompt_tokens=56)
    with pytest.raises(ValueError, match="during-decode, which needs max_tokens >= 2"):
        scenario("pressure-wave", cancel_fraction=0.5, max_tokens=1)
    with pytest.raises(ValueError, match="wave: not used by kind 'edge'"):
        ScenarioConfig.model_validate({"name": "e", "prompt_tokens": 8, "max_tokens": 2, "wave": {}})
    with pytest.raises(ValueError, match="prompt_tokens"):
        ScenarioConfig.model_validate({"name": "e", "kind": "edge"})  # edge still needs them


def test_expected_prefix_hits_and_fit():
    assert wv.expected_prefix_hits(8, 24, 40, 32) == 8 * 23 * 32
    assert wv.expected_prefix_hits(2, 5, 31, 32) == 0
    assert wv.expected_prefix_hits(1, 1, 64, 32) == 0
    assert wv.prefix_fits(8, 24, 8, 40, 56, 32, 63) == (True, "working set 24 of P's 63 usable blocks")
    fits, why = wv.prefix_fits(8, 24, 64, 40, 56, 32, 63)
    assert not fits and "evictions possible" in why
    assert not wv.prefix_fits(2, 2, 2, 20, 30, 32, 63)[0]


# ------------------------------------------------------------------------------------ waves


def test_prefix_wave_hits_match_expectation(healthy, tmp_path):
    p, d = healthy
    sc = scenario("prefix-wave", name="prefix-t", groups=4, per_group=6, prefix_tokens=40, prompt_tokens=56,
                  concurrency=6, seed=101)
    res, obs, v, sections = asyncio.run(wave_and_drain(sc, p, d, tmp_path))
    assert res.expected_prefix_hits == 4 * 5 * 32  # block size 16: floor(40/16) * 16 = 32
    assert res.deltas["prefill"]["prefix_hits"] == res.expected_prefix_hits
    checks = {c.name: c for c in v.checks}
    assert checks["prefix-hits"].ok, checks["prefix-hits"].detail
    assert "P hits 640 tokens, expected 640" in checks["prefix-hits"].detail
    assert "decode: local" in checks["prefix-hits"].detail
    assert v.verdict == "PASS", v.reason
    assert "prefix cache: expected P hits 640" in sections[0]


def test_prefix_wave_on_a_warm_cache_fails_the_hit_check(healthy, tmp_path):
    p, d = healthy
    sc = scenario("prefix-wave", name="prefix-warm", groups=2, per_group=3, prefix_tokens=32, prompt_tokens=40,
                  concurrency=2, seed=202, parity=False)
    asyncio.run(wave_and_drain(sc, p, d, tmp_path / "a"))
    _, _, v, _ = asyncio.run(wave_and_drain(sc, p, d, tmp_path / "b"))  # same prompts again
    hits = next(c for c in v.checks if c.name == "prefix-hits")
    assert not hits.ok and "P hits 192 tokens, expected 128" in hits.detail and v.verdict == "FAIL"


def test_small_pressure_wave_passes_against_healthy_fakes(healthy, tmp_path):
    p, d = healthy
    sc = scenario("pressure-wave", name="pressure-t", requests=200, concurrency=32, cancel_fraction=0.1,
                  sample_interval_s=0.1, seed=303)
    res, obs, v, sections = asyncio.run(wave_and_drain(sc, p, d, tmp_path))
    s = res.summary()
    assert v.verdict == "PASS", v.reason
    assert s["requests"] == 200 and s["ok"] == 180 and s["cancelled"] == 20
    assert s["errors"] == {} and s["empty"] == 0
    assert sum(s["cancel_points"].values()) == 20
    assert set(s["cancel_points"]) <= {"before-prefill", "between", "during-decode"}
    assert s["throughput_req_s"] > 0 and s["latency_s"]["p50"] > 0
    assert {c.name for c in v.checks} == {"completed", "no-errors", "no-empty", "token-counts", "kv-pulled",
                                          "parity", "alive", "no-fatal-log", "kv-integrity", "no-stall",
                                          "idle-after", "counters-monotonic", "nixl-failed-transfers"}
    assert all(c.ok for c in v.checks)
    assert res.parity["compared"] == 18 and res.parity["equal"] == 18
    # a stream cut after its first token may still finish on a zero-latency fake (a race)
    assert 180 <= res.deltas["decode"]["request_success"] <= 180 + s["cancel_points"].get("during-decode", 0)
    assert set(res.peaks) == {"prefill", "decode"}  # (a zero-latency fake may be sampled idle)
    # outputs: records, wave JSON, timeline (file + PNG), section linking the plot
    lines = Path(res.records_path).read_text().splitlines()
    assert len(lines) == 200 and json.loads(lines[0])["request_id"] == "pressure-t-0"
    assert wave_report(res).summary["ok"] == 180  # waves/pressure-t.json, written with the report
    png = Path(res.timeline_png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = load_rows(tmp_path / "metrics" / "timeline.jsonl", "pressure-t")
    assert {r["instance"] for r in rows} == {"prefill", "decode"} and len(rows) >= 4
    assert "![pressure-t timeline](waves/pressure-t-timeline.png)" in sections[0]
    assert "| decode | decode |" in sections[0] and "| idle-after | yes |" in sections[0]


def test_an_interrupted_wave_keeps_its_partial_records(tmp_path):
    # Ctrl-C mid-wave (the task is cancelled): the records of what was sent are written, the
    # unfinished ones as "cancelled: wave aborted", before the cancellation propagates.
    sc = scenario("pressure-wave", name="cut", requests=400, concurrency=4, cancel_fraction=0.0,
                  sample_interval_s=0.1, seed=5, parity_fraction=0.0)

    async def run_then_cancel(p, d):
        async with httpx.AsyncClient(timeout=5) as http:
            store = SnapshotStore(tmp_path)
            async def answered() -> float:
                return (await m.scrape(http, d.url, d.name)).value(m.REQUEST_SUCCESS) or 0.0

            try:
                before = await answered()
                task = asyncio.create_task(wv.run_wave(
                    sc, "tiny", [p], [d], http, store, tmp_path / "waves", deadline_s=10, block_size=16,
                    usable_blocks={"prefill": 999, "decode": 999}, max_model_len=2048, progress="off"))
                # D answered a 5th request: with 4 in flight at most, one answer reached the wave
                # before it was sent, so the cut comes after a recorded answer (was: a 1 s sleep)
                deadline = time.monotonic() + 30
                while await answered() - before < 5:
                    assert time.monotonic() < deadline and not task.done(), "the wave answered nothing"
                    await asyncio.sleep(0.02)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                store.close()

    with fake_pd(token_latency=0.02) as (p, d):
        asyncio.run(run_then_cancel(p, d))
    recs = [json.loads(ln) for ln in (tmp_path / "waves" / "cut-records.jsonl").read_text().splitlines()]
    assert len(recs) == 400
    outcome = [r["outcome"] for r in recs]
    assert outcome.count("ok") >= 1 and "pending" not in outcome
    assert all(r["diagnosis"] == "wave aborted" for r in recs if r["outcome"] == "cancelled")
    assert 0 < outcome.count("cancelled") < 400


def test_pressure_wave_with_http500_decode_fails_naming_the_class(tmp_path):
    with fake_pd(d_env={"FAKE_VLLM_FAULT": "http500"}) as (p, d):
        sc = scenario("pressure-wave", name="p500", requests=20, concurrency=4, cancel_fraction=0.0, seed=4)
        res, _, v, _ = asyncio.run(wave_and_drain(sc, p, d, tmp_path, drain_s=2))
    assert v.verdict == "FAIL"
    errs = next(c for c in v.checks if c.name == "no-errors")
    assert not errs.ok and errs.detail.startswith("http_error 20; first: p500-")


def test_pressure_wave_with_empty_streams_fails_no_empty(tmp_path):
    with fake_pd(d_env={"FAKE_VLLM_FAULT": "empty-stream"}) as (p, d):
        sc = scenario("pressure-wave", name="pempty", requests=10, concurrency=4, stream="always", seed=5)
        _, _, v, _ = asyncio.run(wave_and_drain(sc, p, d, tmp_path, drain_s=2))
    empty = next(c for c in v.checks if c.name == "no-empty")
    assert v.verdict == "FAIL" and not empty.ok and "10 empty answers" in empty.detail


# ------------------------------------------------------------------------------------ drain


def _snap(inst: str, t: float, waiting=0.0, running=0.0, kv=0.0) -> m.MetricSnapshot:
    return m.MetricSnapshot(inst, t, t, {(m.WAITING, ()): waiting, (m.RUNNING, ()): running,
                                         (m.KV_USAGE, ()): kv})


def test_drain_on_recorded_samples():
    ok = [_snap("d", 9.5, running=2, kv=0.8), _snap("d", 10.5, running=1, kv=0.4), _snap("d", 11.0)]
    dr = drain.drain_from_samples("d", ok, baseline_kv=0.0, t_end=10.0, drain_s=5)
    assert dr.idle and dr.after_s == pytest.approx(1.0)
    leak = [_snap("d", 10.5, running=1, kv=0.8), _snap("d", 12.0, kv=0.6), _snap("d", 16.0, kv=0.0)]
    dr = drain.drain_from_samples("d", leak, baseline_kv=0.0, t_end=10.0, drain_s=5)  # 16.0 is too late
    assert not dr.idle and dr.final["kv_usage"] == 0.6
    text = drain.describe_drain(dr, usable_blocks=5)
    assert "kv_cache_usage_perc=60.0% (baseline 0.0%)" in text
    assert "= 3.0 of 5 usable blocks held (3.0 blocks' worth above the baseline)" in text
    # timeline rows (as in timeline.jsonl) work too; other instances are ignored
    keys = ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc")
    rows = [{"t": 10.2, "instance": "p", **dict(zip(keys, (0, 0, 0.5), strict=True))},
            {"t": 10.4, "instance": "d", **dict(zip(keys, (3, 0, 0.0), strict=True))}]
    dr = drain.drain_from_samples("d", rows, 0.0, 10.0, 5)
    assert not dr.idle and "waiting=3" in dr.describe()
    assert drain.drain_from_samples("p", rows, 0.5, 10.0, 5).idle  # at its baseline
    none = drain.drain_from_samples("x", rows, 0.0, 10.0, 5)
    assert not none.idle and "no sample within 5 s" in none.describe()


def test_live_drain_against_leak_kv_names_the_gauge(tmp_path):
    with fake_pd(d_env={"FAKE_VLLM_FAULT": "leak-kv"}, d_blocks=101) as (p, d):
        sc = scenario("pressure-wave", name="leaky", requests=10, concurrency=2, seed=6, parity=False)
        res, obs, v, _ = asyncio.run(wave_and_drain(sc, p, d, tmp_path, drain_s=1.0,
                                                    usable={"prefill": 999, "decode": 100}))
    assert v.verdict == "FAIL"
    idle = next(c for c in v.checks if c.name == "idle-after")
    assert not idle.ok
    # 10 requests x cdiv(48 + 8, 16) = 4 blocks never freed: 40 of 100 usable blocks
    assert "decode not idle after" in idle.detail and "kv_cache_usage_perc=40.0% (baseline 0.0%)" in idle.detail
    assert "= 40.0 of 100 usable blocks held (40.0 blocks' worth above the baseline)" in idle.detail
    assert "prefill" not in idle.detail  # P drained
    assert [c.name for c in v.checks if not c.ok] == ["idle-after"]


# ------------------------------------------------------------------------------------ timeline


def test_timeline_plot_from_rows(tmp_path):
    rows = [{"t": t, "rel_t": t, "instance": inst, "num_requests_running": r, "num_requests_waiting": w,
             "kv_cache_usage_perc": kv, "num_preemptions_total": pre, "request_success_total": 10 * t,
             "generation_tokens_total": 80 * t}
            for t, r, w, kv, pre in ((0, 0, 0, 0.0, 0), (1, 2, 5, 0.6, 0), (2, 2, 1, 0.8, 1), (3, 0, 0, 0.0, 1))
            for inst in ("p", "d")]
    out = plot_timeline(rows, tmp_path / "t.png", "test", {"wave end": 2.5})
    assert out and out.stat().st_size > 10_000
    assert plot_timeline([], tmp_path / "none.png") is None


# ------------------------------------------------------------------------------------ suites


def _cpu_tiny_with(suite: str, tmp: Path, fake: bool = False) -> Path:
    data = yaml.safe_load((ROOT / "configs" / "cpu-tiny.yaml").read_text())
    data["suite"] = str(ROOT / "configs" / "suites" / suite)
    if fake:  # the same topology served by tests/fake_vllm.py on free ports
        data["model"] = {"source": "hub", "path": "fake", "served_name": "tiny"}
        data["launch"]["command"] = ["{python}", str(ROOT / "tests" / "fake_vllm.py")]
        data["launch"]["env"] = {"FAKE_VLLM_STARTUP_DELAY": "0",
                                  # ~0.3 s per request: D (2 requests at a time) queues visibly
                                  "FAKE_VLLM_TOKEN_LATENCY": "0.04"}
        data["launch"]["nice"] = 0
        data["nixl"]["side_channel_base_port"] = free_port()
        for inst in data["prefill"] + data["decode"]:
            inst["port"] = free_port()
        data["run_root"] = str(tmp / "runs")
        data["timeouts"]["drain_s"] = 5
    p = tmp / "cfg.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_suite_files_validate_against_cpu_tiny(tmp_path):
    cfg = load_config(_cpu_tiny_with("waves.yaml", tmp_path))
    names = {s.name: s for s in cfg.scenarios}
    assert set(names) == {"prefix-wave-ci", "pressure-wave-ci"}
    for s in cfg.scenarios:
        assert s.prefill == "prefill" and s.decode == "decode-6blk"
        assert s.prompt_tokens + s.max_tokens <= cfg.max_model_len and s.prompt_tokens <= 60
    pw = names["prefix-wave-ci"].wave
    assert wv.prefix_fits(pw.groups, pw.per_group, pw.concurrency, pw.prefix_tokens, 56, cfg.block_size, 63)[0]
    # CI-sized: ~0.2-0.5 P/D requests/s on a 2-core host (idle instances spin), so tens, not hundreds
    assert 20 <= pw.groups * pw.per_group <= 500 and 50 <= names["pressure-wave-ci"].wave.requests <= 500
    big = load_config(ROOT / "configs" / "cpu-tiny.yaml", ["suite=suites/pressure.yaml"])  # as `make pressure`
    assert [s.kind for s in big.scenarios] == ["prefix-wave", "pressure-wave"]
    assert big.scenarios[1].wave.requests == 2048 and big.timeouts.drain_s > 30
    w = big.scenarios[0].wave
    assert wv.prefix_fits(w.groups, w.per_group, w.concurrency, w.prefix_tokens, 56, big.block_size, 63)[0]
    with pytest.raises(ConfigError):
        load_config(_cpu_tiny_with("waves.yaml", tmp_path), ["scenarios.0.wave.prefix_tokens=56"])


def test_suite_runner_runs_the_waves_suite_on_fakes(tmp_path):
    """rig/run/runner.py's dispatch: configs/suites/waves.yaml end to end on fake servers."""
    from rig.run.runner import SuiteRunner, new_run_dir

    cfg = load_config(_cpu_tiny_with("waves.yaml", tmp_path, fake=True))
    run_dir = new_run_dir(cfg)
    runner = SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True)
    result = runner.run()
    verdicts = {v.scenario: v for v in result.verdicts}
    assert result.status == "passed", {k: v.reason for k, v in verdicts.items()}
    assert set(verdicts) == {"prefix-wave-ci", "pressure-wave-ci"}
    checks = {c.name for c in verdicts["pressure-wave-ci"].checks}
    assert {"alive", "no-fatal-log", "idle-after", "kv-pulled", "no-errors", "no-empty"} <= checks
    hits = next(c for c in verdicts["prefix-wave-ci"].checks if c.name == "prefix-hits")
    assert hits.ok and "P hits 896 tokens, expected 896" in hits.detail
    summary = (run_dir / "summary.md").read_text()
    assert "## prefix-wave-ci: PASS" in summary and "## pressure-wave-ci: PASS" in summary
    assert (run_dir / "waves" / "pressure-wave-ci-timeline.png").is_file()
    assert (run_dir / "metrics" / "timeline.jsonl").stat().st_size > 0
    # the lifecycle's drains, D first, in the wave's file as `pdrig wave` writes them
    drains = json.loads((run_dir / "waves" / "pressure-wave-ci.json").read_text())["drains"]
    assert [dr["instance"] for dr in drains] == ["decode-6blk", "prefill"] and all(dr["idle"] for dr in drains)
    # D has 5 usable blocks; the CI pressure wave keeps 3 one-block requests in flight (no queue)
    pressure = runner.result.kind_results["pressure-wave-ci"]
    assert pressure.usable_blocks == {"prefill": 63, "decode-6blk": 5}
    assert pressure.peaks["decode-6blk"]["running"] >= 1


# ------------------------------------------------------------------------------------ progress


def test_progress_lines_and_rich_panel():
    import io

    from rig.observe.progress import WaveProgress, resolve_mode, status_line

    counts = {"ok": 90, "failed": 2, "cancelled": 8, "in_flight": 16}
    latest = {"prefill": {"num_requests_running": 1.0, "num_requests_waiting": 0.0, "kv_cache_usage_perc": 0.05},
              "decode": {"num_requests_running": 2.0, "num_requests_waiting": 14.0, "kv_cache_usage_perc": 0.8}}
    line = status_line("pressure-wave", 200, counts, latest, 2.0)
    assert line == ("pressure-wave: 100/200 (50%) | ok 90 failed 2 cancelled 8 | in flight 16 | "
                    "prefill run 1 wait 0 kv 5% | decode run 2 wait 14 kv 80% | 50 req/s, 2 s")
    assert resolve_mode("auto", io.StringIO()) == "lines"
    with pytest.raises(ValueError, match="progress mode"):
        resolve_mode("fancy")

    async def show() -> dict[str, str]:
        """The three modes side by side, until the lines mode wrote two periodic lines and the
        panel showed the counts (10 s at most): "off" had the same time to write and did not."""
        outs = {mode: io.StringIO() for mode in ("lines", "rich", "off")}
        progs = [WaveProgress("pressure-wave", 200, counts, latest, mode=mode, stream=out, line_interval_s=0.05)
                 for mode, out in outs.items()]
        for prog in progs:
            prog.start()
        deadline = time.monotonic() + 10
        while (len(outs["lines"].getvalue().splitlines()) < 2 or "ok 90" not in outs["rich"].getvalue()) \
                and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for prog in progs:
            await prog.stop()
        return {mode: out.getvalue() for mode, out in outs.items()}

    out = asyncio.run(show())
    lines = out["lines"].splitlines()
    assert len(lines) >= 3 and all(ln.startswith("pressure-wave: 100/200") for ln in lines)
    panel = out["rich"]
    assert "ok 90" in panel and "cancelled 8" in panel and "decode" in panel and "80.0%" in panel
    assert out["off"] == ""


def test_timeline_rates_do_not_spike_on_a_close_last_sample():
    from rig.observe.timeline import series

    rows = [{"rel_t": t, "instance": "d", "request_success_total": n}
            for t, n in ((0.0, 0), (1.0, 10), (2.0, 20), (2.05, 21))]
    s = series(rows)["d"]
    assert s["req_per_s"] == [0.0, 10.0, 10.0, pytest.approx(11 / 1.05)]


def _stalled_wave(instance: str, role: str, between_at: list[float], usable: int = 63,
                  duration: float = 55.0) -> wv.WaveResult:
    from rig.transport.records import WaveRecord

    recs = []
    for i, t in enumerate(between_at):
        r = WaveRecord(request_id=f"r{i}", index=i, prompt_len=24, max_tokens=4, stream=False, planned_cancel="between",
                       outcome="cancelled", cancel_point="between", p_instance="prefill", t_end=t)
        recs.append(r)
    wave = wv.WaveResult("w", "pressure-wave", "aiohttp", {"prompt_tokens": 24, "concurrency": 12},
                         {"prefill": "prefill", "decode": "decode"}, records=recs,
                         usable_blocks={"prefill": usable, "decode": 5}, block_size=32, kv_lease_s=90)
    st = {"instance": instance, "start_s": 35.0, "duration_s": duration,
          "diagnosis": f"stall on {instance}: waiting=12 running=0 kv=100.0%, unchanged for 55.0 s"}
    st["explained"] = wj.explain_stall(st, wave)
    wave.stalls.append(st)
    return wave


def test_a_prefill_pool_full_of_abandoned_transfers_is_an_explained_stall():
    # make pressure, measured: P at kv 100 % with 12 waiting for 55 s while 10 % of 2,048 requests
    # were cancelled, a third of them between the hops (their blocks wait for the 90 s lease).
    wave = _stalled_wave("prefill", "prefill", [float(t) for t in range(0, 34, 1)] * 2)  # 68 one-block holders
    (st,) = wave.stalls
    assert st["explained"].startswith("68 requests abandoned between the hops in the 90 s before hold ~68 of P's 63")
    check = wj._stall_check(wave)
    assert check.ok and "explained" in check.detail


def test_stalls_nothing_explains_fail_the_wave():
    few = _stalled_wave("prefill", "prefill", [30.0])  # 1 block + 12 in flight < 63 usable
    on_d = _stalled_wave("decode", "decode", [float(t) for t in range(68)])  # D stalls are never explained
    for wave in (few, on_d):
        check = wj._stall_check(wave)
        assert not check.ok and "UNEXPLAINED: stall on" in check.detail
    old = _stalled_wave("prefill", "prefill", [-80.0] * 70)  # abandoned before the lease window
    assert old.stalls[0]["explained"] == ""
    # Frozen long after the first held lease (t_end 0 s + 90 s) ran out: not the leases' doing.
    late = _stalled_wave("prefill", "prefill", [float(t) for t in range(0, 34)] * 2, duration=80.0)
    assert late.stalls[0]["explained"] == "" and not wj._stall_check(late).ok

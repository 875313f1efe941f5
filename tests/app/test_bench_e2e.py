"""scripts/bench_e2e.py's analysis on a real report of a fake suite: time to verdict of XFAIL
scenarios, which evidence decided, false stalls of controls, spreads and the start-up floor.
(The benchmark's timings themselves are measured by the script, never asserted here.)"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rig.config import load_config
from rig.run.runner import SuiteRunner, new_run_dir
from tests.helpers.fake_rig import LIVELOCK, fake_config, scenario, write_config

SPEC = importlib.util.spec_from_file_location("bench_e2e", Path(__file__).resolve().parents[2] / "scripts"
                                              / "bench_e2e.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def test_analysis_of_a_fake_suite_counts_xfail_time_to_verdict_and_false_stalls(base):  # noqa: F811 - fixture
    stall = {"FAKE_VLLM_FAULT": "stall", "FAKE_VLLM_ENGINE_CORE": "1"}
    cfg = load_config(write_config(base, fake_config(
        base, decodes={"decode-stall": {"env": stall}, "decode": {}},
        scenarios=[scenario("livelock", "decode-stall", prompt_tokens=126, max_tokens=2, known_issue=LIVELOCK),
                   scenario("control-stalls", "decode-stall", prompt_tokens=126, max_tokens=2),
                   scenario("control", "decode")])))
    result = SuiteRunner(cfg, list(cfg.scenarios), new_run_dir(cfg), quiet=True).run()
    report = json.loads((Path(result.run_dir) / "report.json").read_text())
    a = bench.analyse_report(report)
    assert a["verdicts"] == {"livelock": "XFAIL", "control-stalls": "FAIL", "control": "PASS"}
    assert list(a["ttv"]) == ["livelock"] and len(a["ttv"]["livelock"]) == 1
    assert a["ttv"]["livelock"][0] == report["scenarios"][0]["observation"]["records"][0]["verdict_after_s"]
    assert a["decided"] == {"livelock": ["early"]}  # the fake's EngineCore spins while it waits
    assert a["false_stalls"] == ["control-stalls/control-stalls-0"]
    assert a["timings"]["total"] > 0 and a["status"] == "failed"


def test_summary_spreads_ratios_and_counts():
    bare = {"pair_ready_s": 50.0, "cpu_s": {"prefill": 40.0, "decode": 45.0}}
    reps = [{"wall_s": w, "status": st, "ttv": {"edge-126": [t]}, "decided": {"edge-126": [d]},
             "false_stalls": fs, "verdicts": {"edge-126": "XFAIL", "c": v}}
            for w, st, t, d, fs, v in [(100, "passed", 1.5, "early", [], "PASS"),
                                       (150, "passed", 2.5, "early", [], "PASS"),
                                       (125, "failed", 9.0, "window", ["c/c-0"], "FAIL")]]
    s = bench.summarise(bare, reps)
    assert s["ratio_wall_to_pair_startup"] == {"min": 2.0, "median": 2.5, "max": 3.0, "n": 3}
    assert s["ttv_s"]["edge-126"] == {"min": 1.5, "median": 2.5, "max": 9.0, "n": 3}
    assert s["decided"]["edge-126"] == {"early": 2, "window": 1}
    assert s["false_stalls"] == 1 and s["runs_not_passed"] == [2]
    assert s["verdicts"] == {"edge-126": ["XFAIL"], "c": ["FAIL", "PASS"]}
    assert bench.summarise(None, reps).get("ratio_wall_to_pair_startup") is None


def test_floor_is_cpu_seconds_of_every_instance_over_the_cpus():
    bare = {"pair_ready_s": 50.0, "cpu_s": {"prefill": 40.0, "decode": 45.0}}
    fl = bench.floor_of(bare, 1, 3, 2)
    assert fl["suite_startup_cpu_s"] == 175.0 and fl["parallel_floor_s"] == 87.5
    assert fl["floor_ratio"] == pytest.approx(1.75)
    assert bench.spread([]) is None


def test_batches_combine_with_each_ratio_to_its_own_bare_start_up(tmp_path, capsys):
    def rep(wall, ttv, timings):
        return {"wall_s": wall, "status": "passed", "ttv": {"edge-126": [ttv]}, "decided": {"edge-126": ["early"]},
                "false_stalls": [], "verdicts": {"edge-126": "XFAIL"}, "timings": timings}

    # Batch 1 predates per-repeat ratios (taken from its own bare start-up); batch 2 carries them.
    b1 = {"date": "d1", "bare": {"pair_ready_s": 50.0}, "repeats": [rep(150.0, 1.3, {"startup phase 1": 50.0,
                                                                                        "warm-up phase 1": 3.0})]}
    r2 = rep(75.0, 1.5, {"startup all at once": 45.0, "startup phase 1": 0.5})
    b2 = {"date": "d2", "bare": {"pair_ready_s": 25.0}, "repeats": [{**r2, "ratio_to_pair": 3.0}]}
    paths = []
    for i, b in enumerate((b1, b2)):
        paths.append(str(tmp_path / f"b{i}.json"))
        Path(paths[-1]).write_text(json.dumps(b))
    assert bench.main(["--combine", *paths, "--out", str(tmp_path / "all.json")]) == 0
    s = json.loads((tmp_path / "all.json").read_text())["summary"]
    assert s["ratio_wall_to_pair_startup"] == {"min": 3.0, "median": 3.0, "max": 3.0, "n": 2}
    assert s["ttv_s"]["edge-126"]["n"] == 2 and s["false_stalls"] == 0
    assert s["timings_s"]["startup all at once"]["n"] == 1 and s["timings_s"]["startup phase 1"]["n"] == 2
    assert s["beyond_startup_s"] == {"min": 29.5, "median": 64.75, "max": 100.0, "n": 2}
    assert "false stalls: 0 over 2 repeats" in capsys.readouterr().out


# Bare P+D start-ups measured on the 2-core box (2026-12-02 10:09-10:12 UTC, load 3.3 -> 6, other runs
# on it; scripts/bench_e2e.py's bare_startup once per layout), plus a second round invented around them.
LAYOUT_SAMPLES = [
    {"layout": "fast", "round": 1, "pair_ready_s": 75.43, "cpu_s": {"prefill": 30.57, "decode": 30.0},
     "load_before": 3.30, "load_after": 5.92},
    {"layout": "production", "round": 1, "pair_ready_s": 72.06, "cpu_s": {"prefill": 29.16, "decode": 27.21},
     "load_before": 5.92, "load_after": 6.10},
    {"layout": "production", "round": 2, "pair_ready_s": 80.0, "cpu_s": {"prefill": 30.0, "decode": 30.0},
     "load_before": 6.10, "load_after": 4.0},
    {"layout": "fast", "round": 2, "pair_ready_s": 40.0, "cpu_s": {"prefill": 20.0, "decode": 20.0},
     "load_before": 4.0, "load_after": 3.0},
]


def test_layout_summary_gives_medians_loads_and_the_ratio_to_the_last_layout():
    s = bench.summarise_layouts(LAYOUT_SAMPLES)
    assert s["fast"]["pair_ready_s"] == {"min": 40.0, "median": pytest.approx(57.715), "max": 75.43, "n": 2}
    assert s["production"]["pair_ready_s"]["median"] == pytest.approx(76.03)
    assert s["fast"]["load_before"]["min"] == 3.30 and s["production"]["load_before"]["min"] == 5.92
    assert s["production"]["cpu_s"]["min"] == pytest.approx(56.37)
    assert s["ratio_medians"] == {"fast": pytest.approx(57.715 / 76.03), "production": 1.0}


def test_one_layout_has_no_ratio():
    assert "ratio_medians" not in bench.summarise_layouts(LAYOUT_SAMPLES[:1])

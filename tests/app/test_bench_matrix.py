"""scripts/bench_matrix.py's per-build figure on a report's shape; the timings
themselves are measured by the script, never asserted here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
SPEC = importlib.util.spec_from_file_location("bench_matrix", SCRIPTS / "bench_matrix.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def test_per_build_ratio_is_the_run_over_one_pair_start_up_plus_its_scenarios():
    report = {"status": "passed",
              "timings": {"startup all at once": 50.0, "startup phase 1": 0.0, "warm-up phase 1": 3.0, "total": 80.0},
              "scenarios": [{"observation": {"wall_s": 2.0}}, {"observation": {"wall_s": 3.0}},
                            {"observation": None}]}
    f = bench.per_build(report, 27.0)
    assert f["run_s"] == 80.0 and f["scenarios_s"] == 5.0 and f["startup_s"] == 50.0
    assert f["ratio"] == pytest.approx(80.0 / 32.0) and f["status"] == "passed"
    assert bench.per_build({"status": "error", "timings": {}, "scenarios": []}, 0.0)["ratio"] is None

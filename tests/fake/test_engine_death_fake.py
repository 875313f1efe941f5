"""A planted engine death is FAIL "died" in both process layouts (launch.layout fast and production).

The fake server's engine-killed fault kills its EngineCore stand-in with SIGKILL mid-suite while its
API server lives on (HTTP 500, /health 503) and then exits 0, as vLLM's production layout does; the
layout reaches the fake only as its environment (VLLM_ENABLE_V1_MULTIPROCESSING), so this shows the
rig's judgement of a death does not depend on it. tests/live/test_engine_death_live.py kills a real
EngineCore."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.fake_rig import scenario
from tests.helpers.suites import run_fake_suite

# Completions 1 and 2 are the runner's warm-up (direct, then the P/D hop), 3-5 the baseline's timed
# round trips (rig.workload.baseline); the 6th is the scenario's.
KILLED = {"env": {"FAKE_VLLM_FAULT": "engine-killed", "FAKE_VLLM_FAULT_ARG": "6", "FAKE_VLLM_ENGINE_CORE": "1"}}


@pytest.mark.parametrize("layout", ["fast", "production"])
def test_engine_core_killed_mid_suite_is_fail_died(tmp_path: Path, layout: str, restore_signals):
    result, run_dir = run_fake_suite(
        tmp_path, [f"launch.layout={layout}"], decodes={"decode": KILLED},
        scenarios=[scenario("killed", "decode"), scenario("after", "decode")])
    plan_env = {p["name"]: p["env"] for p in result.plan["processes"]}
    assert (plan_env["decode"].get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0") == (layout == "fast")
    v = {x.scenario: x for x in result.verdicts}
    assert v["killed"].verdict == "FAIL"
    alive = {c.name: c for c in v["killed"].checks}["alive"]
    assert alive.ok is False and "decode died (exit 0)" in alive.detail
    assert v["after"].verdict in ("FAIL", "ERROR") and not v["after"].passed
    assert "EngineDeadError" in (run_dir / "logs" / "decode.log").read_text()

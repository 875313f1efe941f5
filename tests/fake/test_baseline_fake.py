"""The per-request baseline against fake vLLM servers: after each phase's warm-up the runner times
3 P/D round trips to the decode, the median reaches every observation of that decode, the judging
window of gauges-account derives from it, and the report shows it per decode with how it was
measured. A decode whose round trip fails has no baseline, and the report keeps why."""

from __future__ import annotations

import json

from rig.judge.windows import SHORTFALL_REQUESTS
from tests.helpers.suites import run_on_fakes

TOKEN_S = 0.05  # FAKE_VLLM_TOKEN_LATENCY: also the fake's KV pull (FAKE_VLLM_PULL_S defaults to it)
# One round trip on the fake: P generates 1 token, D pulls (one TOKEN_S) and generates 2 tokens.
ROUND_TRIP_S = TOKEN_S * (1 + 1 + 2)

SEQUENCE = {"name": "seq", "kind": "sequence", "require": ["gauges-account"], "sequence": {"steps": [
    {"id": "x", "route": "pd", "prompt_tokens": 40, "max_tokens": 4},
    {"id": "y", "route": "pd", "prompt_tokens": 40, "max_tokens": 4, "start": {"after": "x", "event": "answered"}},
]}}


def test_the_baseline_is_measured_and_reaches_the_gauges_account_bound(tmp_path):
    env = {"FAKE_VLLM_TOKEN_LATENCY": str(TOKEN_S)}
    scenarios = [{"name": "edge-40", "prompt_tokens": 40, "max_tokens": 4}, SEQUENCE]
    result, run_dir = run_on_fakes(tmp_path, scenarios, decodes={"decode": {"env": env}},
                                   prefill_env=env)
    assert [v.verdict for v in result.verdicts] == ["PASS", "PASS"], [v.reason for v in result.verdicts]
    b = result.baselines["decode"]
    assert b.error == "" and len(b.round_trips_s) == 3, b
    # about the fake's configured delay: at least what its sleeps add up to, little HTTP on top
    assert ROUND_TRIP_S <= b.seconds < ROUND_TRIP_S + 0.25, b.round_trips_s
    assert [o.baseline_request_s for o in result.observations] == [b.seconds, b.seconds]
    seq = next(v for v in result.verdicts if v.scenario == "seq")
    gauges = next(c for c in seq.checks if c.name == "gauges-account")
    assert gauges.ok is True, gauges.detail
    assert f"{SHORTFALL_REQUESTS} x the measured request {b.seconds:.3g} s" in gauges.detail, gauges.detail
    report = json.loads((run_dir / "report.json").read_text())
    assert report["baselines"]["decode"]["seconds"] == b.seconds
    assert report["baselines"]["decode"]["method"].startswith("median of 3 P/D round trips prefill -> decode")
    assert {s["observation"]["baseline_request_s"] for s in report["scenarios"]} == {b.seconds}
    md = (run_dir / "summary.md").read_text()
    assert f"- per-request baseline: decode {b.seconds:.3g} s (median of 3 P/D round trips" in md, md


def test_a_failing_baseline_round_trip_gives_no_baseline_with_the_reason(tmp_path):
    """D crashes at its third completion: the warm-up's direct request and P/D round trip are
    answered, the baseline's first timed round trip is not."""
    crash = {"FAKE_VLLM_FAULT": "crash-mid-request", "FAKE_VLLM_FAULT_ARG": "3"}
    result, run_dir = run_on_fakes(tmp_path, [{"name": "edge-40", "prompt_tokens": 40, "max_tokens": 4}],
                                   decodes={"decode": {"env": crash}})
    b = result.baselines["decode"]
    assert b.seconds is None and b.round_trips_s == [], b
    assert b.error.startswith("round trip 1 of 3: decode: "), b.error
    assert "EngineCore encountered a fatal error" in (run_dir / "logs" / "decode.log").read_text()
    assert [o.baseline_request_s for o in result.observations] == [None]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["baselines"]["decode"] == {**report["baselines"]["decode"], "seconds": None, "error": b.error}
    md = (run_dir / "summary.md").read_text()
    assert f"- per-request baseline: decode none (median of 3 P/D round trips prefill -> decode after the warm-up " \
           f"(8-token prompt, 2 tokens each)): {b.error}" in md, md


def test_a_failing_warm_up_round_trip_gives_no_baseline_with_the_reason(tmp_path):
    """D answers HTTP 500 to everything: the warm-up's own P/D round trip fails, so no round trip is
    timed (it would meet the same failure, and wait for it)."""
    scenarios = [{"name": "edge-40", "prompt_tokens": 40, "max_tokens": 4}, SEQUENCE]
    result, run_dir = run_on_fakes(tmp_path, scenarios, decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "http500"}}})
    b = result.baselines["decode"]
    assert b.seconds is None and b.round_trips_s == []
    assert b.error.startswith("not measured: the warm-up's P/D round trip failed (decode: HTTP 500"), b.error
    assert [o.baseline_request_s for o in result.observations] == [None, None]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["baselines"]["decode"]["seconds"] is None
    assert report["baselines"]["decode"]["error"] == b.error
    md = (run_dir / "summary.md").read_text()
    assert "- per-request baseline: decode none (median of 3 P/D round trips" in md
    assert "not measured: the warm-up's P/D round trip failed (decode: HTTP 500" in md

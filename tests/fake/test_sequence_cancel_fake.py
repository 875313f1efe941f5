"""A sequence step's cancel sweep (``cancel_after_ms``) against fake vLLM servers: request k is cut
at lo + k (hi - lo) / (count - 1) ms, on whatever hop is in flight then, and ends cancelled on purpose
(not a failure); P and D must be idle within the lease bound."""

from __future__ import annotations

import json

import pytest

from rig.config.sequence import Step
from tests.helpers.suites import run_on_fakes

SWEEP = {"name": "sweep", "kind": "sequence", "decode": "decode-slow", "sequence": {"idle_margin_s": 1, "steps": [
    {"id": "cut", "route": "pd", "prompt_tokens": 40, "max_tokens": 16, "count": 3, "cancel_after_ms": [0, 2000]},
    {"id": "control", "route": "pd", "prompt_tokens": 40, "max_tokens": 4}]}}


def test_the_sweep_points_and_the_route_rule():
    step = Step(id="s", prompt_tokens=8, max_tokens=2, count=5, cancel_after_ms=(60, 260))
    assert [step.cancel_at_ms(k) for k in range(5)] == [60, 110, 160, 210, 260]
    assert Step(id="s", prompt_tokens=8, max_tokens=2, cancel_after_ms=(60, 260)).cancel_at_ms(0) == 60
    with pytest.raises(ValueError, match="cancel_after_ms cancels a P/D request; set route: pd"):
        Step(id="s", route="decode", prompt_tokens=8, max_tokens=2, cancel_after_ms=(0, 1))
    with pytest.raises(ValueError, match=r"cancel_after_ms \[5, 1\]"):
        Step(id="s", prompt_tokens=8, max_tokens=2, cancel_after_ms=(5, 1))


def test_requests_are_cut_on_the_hop_in_flight_and_count_as_intended(tmp_path):
    # 80 ms per token on D: a 16-token decode hop lasts ~1.3 s, so 1 s in it is still decoding
    # (cut on the decode hop), 0 ms is cut before P answers, 2 s lets it finish.
    result, run_dir = run_on_fakes(tmp_path, [SWEEP], {"decode-slow": {"env": {"FAKE_VLLM_TOKEN_LATENCY": "0.08"}}},
                                   ["nixl.kv_lease_duration=2"])
    v = result.verdicts[0]
    recs = {r.request_id: r for r in result.observations[0].records}
    assert recs["sweep-cut-0"].outcome == "cancelled" and "prefill hop closed 0 ms" in recs["sweep-cut-0"].diagnosis
    assert recs["sweep-cut-1"].outcome == "cancelled" and "decode hop closed 1000 ms" in recs["sweep-cut-1"].diagnosis
    assert recs["sweep-cut-2"].outcome == "ok" and recs["sweep-control-0"].outcome == "ok"
    checks = {c.name: c for c in v.checks}
    assert checks["completed"].ok and "2 answered, 2 cancelled on purpose" in checks["completed"].detail
    assert "kv_lease_duration + idle_margin_s" in checks["idle-after"].detail
    entries = {e["request_id"]: e for e in json.loads((run_dir / "sequence-sweep.json").read_text())["entries"]}
    assert "cut" in entries["sweep-cut-1"]["events_ms"] and "decode-sent" in entries["sweep-cut-1"]["events_ms"]
    cut0 = entries["sweep-cut-0"]["events_ms"]
    assert "cut" in cut0 and "prefill-answered" not in cut0
    assert "cut" not in entries["sweep-cut-2"]["events_ms"]
    assert v.verdict == "PASS", v.reason

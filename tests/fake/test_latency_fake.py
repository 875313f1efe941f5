"""The latency check end to end on fake vLLM servers (tests/fake_vllm.py): the ``slow-decode``
plant (D answers the right tokens, but only after waiting WAIT_S) is a FAIL of ``latency`` naming
the decode hop, the wait and its part and the bound; the same scenario on a healthy D passes it (ok,
not "not checked": the runner measured the baseline); a decode hop the scenario holds on purpose is
left out, its prefill hop still judged.

The plant spares prompts under 9 tokens, so the warm-up and the per-request baseline (8-token round
trips, rig.workload.baseline) measure the healthy deployment. The bound is then the floor
(``timeouts.latency_floor_s`` set to 1 s here) or 20 x a fake round trip of ~10-100 ms x 1.5 round
trips of work, 0.3-3 s: WAIT_S is well past it even with the fake's round trips ten times slower on
a loaded host.
"""

from __future__ import annotations

import json

from tests.helpers.fake_rig import scenario
from tests.helpers.suites import fake_suite_fixtures

WAIT_S = 8.0
DECODES = {"decode": {}, "decode-slow": {"env": {"FAKE_VLLM_FAULT": "slow-decode",
                                                 "FAKE_VLLM_FAULT_ARG": f"{WAIT_S}:9"}}}
SCENARIOS = [
    scenario("healthy", "decode", prompt_tokens=12, max_tokens=2),
    scenario("healthy-streamed", "decode", prompt_tokens=12, max_tokens=2, request={"decode": {"stream": True}}),
    scenario("slow", "decode-slow", prompt_tokens=12, max_tokens=2),
    scenario("slow-streamed", "decode-slow", prompt_tokens=12, max_tokens=2, request={"decode": {"stream": True}}),
    # the hold is the lease-hold motif's: the decode hop that follows it is left out
    scenario("slow-held", "decode-slow", prompt_tokens=12, max_tokens=2, hold_between_s=0.5),
]

base_dir, no_survivors, suite = fake_suite_fixtures(
    "fake-latency", decodes=DECODES, scenarios=SCENARIOS, overrides=["timeouts.latency_floor_s=1"],
    timeouts={"request_s": 30})


def _verdict(suite, name):
    result, _ = suite
    return next(v for v in result.verdicts if v.scenario == name)


def _latency(suite, name):
    return next(c for c in _verdict(suite, name).checks if c.name == "latency")


def test_the_slow_decode_plant_fails_latency_naming_the_decode_hop_and_its_wait(suite):
    v = _verdict(suite, "slow")
    assert v.verdict == "FAIL", v.reason
    c = _latency(suite, "slow")
    assert c.ok is False and c.requests == ("slow-0",)
    assert c.detail.startswith("slow-0: decode hop (decode-slow) waited ")
    wait = float(c.detail.split(" waited ", 1)[1].split(" s ", 1)[0])
    assert WAIT_S <= wait < WAIT_S + 3
    assert " s in total; bound " in c.detail and "x the measured request" in c.detail
    assert v.reason.startswith("latency: slow-0: decode hop (decode-slow)")  # the one failed check
    # the answer itself was right: only the wait is the finding
    assert all(c.ok is not False for c in v.checks if c.name != "latency")


def test_a_streamed_slow_decode_names_the_wait_before_its_first_token(suite):
    c = _latency(suite, "slow-streamed")
    assert c.ok is False
    assert c.detail.startswith("slow-streamed-0: decode hop (decode-slow) waited ")
    assert "to its first token; bound " in c.detail


def test_the_same_scenarios_on_a_healthy_decode_pass_latency_judged_not_skipped(suite):
    result, run_dir = suite
    for name in ("healthy", "healthy-streamed"):
        v = _verdict(suite, name)
        assert v.verdict == "PASS", v.reason
        c = _latency(suite, name)
        assert c.ok is True, c.detail
        assert c.detail.startswith("1 request(s) within ") and "longest " in c.detail
    assert result.baselines["decode"].seconds is not None and result.baselines["decode-slow"].seconds is not None
    # the baseline of the planted decode is its healthy one: 8-token round trips are not slowed
    assert result.baselines["decode-slow"].seconds < 1.0
    assert result.baselines["decode"].host_load_1m is not None
    report = json.loads((run_dir / "report.json").read_text())
    states = {s["verdict"]["scenario"]: next(c["state"] for c in s["verdict"]["checks"] if c["name"] == "latency")
              for s in report["scenarios"]}
    assert states == {"healthy": "ok", "healthy-streamed": "ok", "slow": "failed", "slow-streamed": "failed",
                      "slow-held": "ok"}


def test_a_decode_hop_held_on_purpose_is_left_out_and_its_prefill_hop_judged(suite):
    v = _verdict(suite, "slow-held")
    assert v.verdict == "PASS", v.reason
    c = _latency(suite, "slow-held")
    assert c.ok is True
    assert "prefill hop (prefill)" in c.detail
    assert c.detail.endswith("left out: 1 decode hop(s) held 0.5 s on purpose (hold_between_s)")

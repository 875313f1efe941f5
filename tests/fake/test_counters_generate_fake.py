"""bug record R19 and R21 end to end against fake vLLM servers (tests/fake_vllm.py): counter rules that
hold, that see a counter move wrongly or not at all, or that find it absent; the healthy-run rule
catching a decode that counts every pull as a failed transfer (#58038's symptom); the two hops
through /inference/v1/generate, and a prefill whose generate answer drops kv_transfer_params."""

from __future__ import annotations

from pathlib import Path

from rig.observe import metrics as m
from tests.helpers.fake_rig import scenario
from tests.helpers.suites import fake_suite_fixtures, run_fake_suite

FAILED = {"instance": "decode", "metric": m.NIXL_FAILED_TRANSFERS, "delta": 0}
GENERATE = {"endpoint": "generate", "all": {"sampling_params": {"seed": 3}}}


def by_scenario(result, _run_dir=None):
    """``({scenario: verdict}, {scenario: observation})`` of a run."""
    return {v.scenario: v for v in result.verdicts}, {o.scenario: o for o in result.observations}


def run(tmp: Path, **cfg_kw):
    return by_scenario(*run_fake_suite(tmp, **cfg_kw))


def with_counters(name: str, decode: str, rules: list[dict], **extra) -> dict:
    sc = scenario(name, decode, **extra)
    sc["expect"]["counters"] = rules
    return sc


DECODES = {"decode": {},
           "decode-failcount": {"env": {"FAKE_VLLM_FAULT": "failed-transfer-count"}},
           "decode-omit": {"env": {"FAKE_VLLM_OMIT_METRICS": "vllm:nixl_num_kv_expired_reqs"}}}
SCENARIOS = [
    with_counters("split-holds", "decode", [FAILED, {"instance": "prefill", "metric": m.NIXL_EXPIRED, "max": 0}]),
    # the fake keeps no lease, so P's expiry counter never rises: the rule sees +0
    with_counters("expiry-not-counted", "decode", [{"instance": "prefill", "metric": m.NIXL_EXPIRED, "delta": 1},
                                                   FAILED]),
    scenario("generate-pd", "decode", request=GENERATE),
    scenario("healthy-failcount", "decode-failcount"),
    with_counters("absent", "decode-omit", [{"instance": "decode", "metric": m.NIXL_EXPIRED, "delta": 0}]),
]
# suite: ({scenario: verdict}, {scenario: observation}) of one run of SCENARIOS
base_dir, no_survivors, suite = fake_suite_fixtures("fake-r19-r21", suite_of=by_scenario, decodes=DECODES,
                                                    scenarios=SCENARIOS)


def checks(v) -> dict[str, tuple[bool | None, str]]:
    return {c.name: (c.ok, c.detail) for c in v.checks}


def test_counter_rules_that_hold_pass(suite):
    v = suite[0]["split-holds"]
    assert v.verdict == "PASS", v.reason
    ok, detail = checks(v)["counters"]
    assert ok is True and f"decode {m.NIXL_FAILED_TRANSFERS} +0 (expected +0)" in detail
    assert f"prefill {m.NIXL_EXPIRED} +0 (expected <= +0)" in detail


def test_a_counter_that_does_not_move_fails(suite):
    v = suite[0]["expiry-not-counted"]
    assert v.verdict == "FAIL" and "counters:" in v.reason
    assert f"prefill {m.NIXL_EXPIRED} +0 (expected +1)" in v.reason


def test_an_absent_counter_is_error_naming_it(suite):
    v = suite[0]["absent"]
    assert v.verdict == "ERROR", v.reason
    assert "inconclusive" in v.reason and f"decode-omit lacks {m.NIXL_EXPIRED}" in v.reason


def test_decode_counting_pulls_as_failures_fails_the_healthy_rule(suite):
    v = suite[0]["healthy-failcount"]
    assert v.verdict == "FAIL" and "nixl-failed-transfers" in v.reason
    ok, detail = checks(v)["nixl-failed-transfers"]
    assert ok is False and f"decode-failcount {m.NIXL_FAILED_TRANSFERS} +1 (expected +0" in detail
    assert checks(v)["kv-pulled"][0] is True  # the transfer itself happened: only the counter is wrong


def test_generate_endpoint_through_both_hops(suite):
    v, obs = suite[0]["generate-pd"], suite[1]["generate-pd"]
    assert v.verdict == "PASS", v.reason
    c = checks(v)
    assert c["kv-pulled"][0] is True and c["parity"][0] is True and c["nixl-failed-transfers"][0] is True
    rec = obs.records[0]
    assert rec.endpoint == "generate" and rec.prefill.kv_transfer_params["do_remote_prefill"] is True
    assert len(rec.decode.token_ids) == 4 and rec.decode.usage["completion_tokens"] == 4


def test_generate_answer_without_kv_transfer_params_is_diagnosed(base_dir):
    verdicts, obs = run(base_dir / "drops", prefill_env={"FAKE_VLLM_FAULT": "generate-drops-ktp"},
                        scenarios=[scenario("generate-null", "decode", request=GENERATE)])
    v = verdicts["generate-null"]
    assert v.verdict == "FAIL"
    assert "prefill answered HTTP 200 without kv_transfer_params (null)" in v.reason and "R21" in v.reason
    assert obs["generate-null"].records[0].decode is None  # D never got a hop to re-prefill

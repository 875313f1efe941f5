"""``expect.min_preemptions`` and the ``preempted`` check (bug record R11): a tight decode
pool must really preempt (decode's ``vllm:num_preemptions_total`` rose), every request must still
finish with parity, and a decode without the metric is "not checked", never ok.
``expect.min_preemptions_on: prefill`` reads the prefill's counter instead (R11's P side, vllm PR
#50297)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rig.config import ScenarioConfig
from rig.judge.checks import preemption_check
from rig.judge.verdict import judge, required_checks
from rig.observe.metrics import PREEMPTIONS
from rig.observe.observations import TransferEvidence
from rig.observe.parity import ParityResult
from tests.helpers.verdict_records import obs_of, ok_record, sc

PREEMPT = {"completion_tokens": 2, "total_tokens": 128, "min_preemptions": 1}


def preempt_sc(**kw) -> ScenarioConfig:
    return sc(expect=PREEMPT, **kw)


def preempt_obs(preemptions: float, **kw):
    obs = obs_of([ok_record(0), ok_record(1)], **kw)
    obs.evidence.preemptions = preemptions
    return obs


def checks(v) -> dict[str, bool | None]:
    return {c.name: c.ok for c in v.checks}


def test_a_pool_that_preempted_and_finished_with_parity_passes():
    v = judge(preempt_sc(), preempt_obs(2))
    assert v.verdict == "PASS", v.reason
    c = next(c for c in v.checks if c.name == "preempted")
    assert c.ok is True and c.detail == "decode: vllm:num_preemptions_total +2 over the scenario (expected >= 1)"


def test_no_preemption_fails_the_scenario():
    v = judge(preempt_sc(), preempt_obs(0))
    assert v.verdict == "FAIL" and checks(v)["preempted"] is False and "preempted" in v.reason


def test_preemption_does_not_excuse_a_divergence():
    v = judge(preempt_sc(), preempt_obs(3, parity=[ParityResult("equal"), ParityResult("diverged", 40, 7, 9)]))
    assert v.verdict == "FAIL" and checks(v)["preempted"] is True and checks(v)["parity"] is False


def test_a_decode_without_the_counter_is_not_checked_and_the_scenario_inconclusive():
    obs = preempt_obs(0, missing_metrics={"decode": [PREEMPTIONS]})
    c = preemption_check(obs, 1)
    assert c.ok is None and c.detail == f"not checked: decode lacks {PREEMPTIONS}"
    v = judge(preempt_sc(), obs)
    assert v.verdict == "ERROR" and "preempted" in v.reason
    no_metrics = preempt_obs(0)
    no_metrics.evidence = None
    assert preemption_check(no_metrics, 1).ok is None


def test_preempted_is_required_only_when_asked_for():
    assert "preempted" in required_checks(preempt_sc())
    assert "preempted" not in required_checks(sc())
    assert "preempted" not in {c.name for c in judge(sc(), preempt_obs(0)).checks}


@pytest.mark.parametrize("data, words", [
    ({"expect": {"http_status": 400, "min_preemptions": 1}}, "min_preemptions needs answered requests"),
    ({"expect": {"min_preemptions": 0}}, "greater than or equal to 1"),
    ({"kind": "fault", "fault": {"faults": [{"trigger": {"event": "prefill-answered"}, "target": "request",
                                             "action": "abandon"}]},
      "expect": {"min_preemptions": 1}}, "expect.min_preemptions: only for kind edge"),
])
def test_bad_min_preemptions_is_named(data, words):
    base = dict(name="p", decode="decode", prompt_tokens=32, max_tokens=90)
    with pytest.raises(ValidationError) as e:
        ScenarioConfig.model_validate({**base, **data})
    assert words in str(e.value)


def test_spec_drafted_needs_decodes_draft_counter_to_rise():
    s = sc(expect={"completion_tokens": 2, "total_tokens": 128, "min_spec_drafts": 1})
    assert "spec-drafted" in required_checks(s) and "preempted" not in required_checks(s)
    obs = preempt_obs(0)
    obs.evidence.spec_drafts = 5
    v = judge(s, obs)
    assert v.verdict == "PASS" and checks(v)["spec-drafted"] is True
    obs.evidence.spec_drafts = 0
    assert judge(s, obs).verdict == "FAIL"
    obs.missing_metrics = {"decode": ["vllm:spec_decode_num_drafts_total"]}
    assert judge(s, obs).verdict == "ERROR"


# ------------------------------------------------------------- expect.min_preemptions_on: prefill

P_PREEMPT = {**PREEMPT, "min_preemptions_on": "prefill"}


def test_prefill_preemptions_are_read_from_the_prefill_not_the_decode():
    obs = preempt_obs(0, prefill_evidence=TransferEvidence(preemptions=2))
    v = judge(sc(expect=P_PREEMPT), obs)
    assert v.verdict == "PASS", v.reason
    c = next(c for c in v.checks if c.name == "preempted")
    assert c.detail == "prefill: vllm:num_preemptions_total +2 over the scenario (expected >= 1)"
    # The decode preempting does not stand in for the prefill.
    obs = preempt_obs(5, prefill_evidence=TransferEvidence(preemptions=0))
    v = judge(sc(expect=P_PREEMPT), obs)
    assert v.verdict == "FAIL" and checks(v)["preempted"] is False
    # ... and the old form still reads the decode.
    assert judge(sc(expect=PREEMPT), obs).verdict == "PASS"


def test_prefill_without_metrics_or_the_counter_is_not_checked():
    obs = preempt_obs(0)  # no prefill_evidence: P's metrics were not taken (e.g. a fault killed it)
    assert preemption_check(obs, 1, "prefill").ok is None
    assert judge(sc(expect=P_PREEMPT), obs).verdict == "ERROR"
    obs = preempt_obs(0, prefill_evidence=TransferEvidence(), missing_metrics={"prefill": [PREEMPTIONS]})
    c = preemption_check(obs, 1, "prefill")
    assert c.ok is None and c.detail == f"not checked: prefill lacks {PREEMPTIONS}"


def test_min_preemptions_on_per_version_outcome():
    s = sc(expect={**PREEMPT, "by_version": [{"vllm": "<0.30", "completion_tokens": 2, "total_tokens": 128,
                                               "min_preemptions": 1, "min_preemptions_on": "prefill"}]})
    obs = preempt_obs(1, prefill_evidence=TransferEvidence(preemptions=0), version="0.27.1")
    obs.versions = {"prefill": "0.27.1", "decode": "0.27.1"}
    assert judge(s, obs).verdict == "FAIL"  # 0.27.1 asks the prefill, which did not preempt
    obs = preempt_obs(1, prefill_evidence=TransferEvidence(preemptions=0))
    assert judge(s, obs).verdict == "PASS"  # 0.32.0 keeps the decode form


@pytest.mark.parametrize("expect, words", [
    ({"completion_tokens": 2, "min_preemptions_on": "prefill"}, "min_preemptions_on: prefill needs min_preemptions"),
    ({"min_preemptions": 1, "min_preemptions_on": "router"}, "'prefill' or 'decode'"),
])
def test_bad_min_preemptions_on_is_named(expect, words):
    with pytest.raises(ValidationError) as e:
        ScenarioConfig.model_validate(dict(name="p", decode="decode", prompt_tokens=32, max_tokens=8, expect=expect))
    assert words in str(e.value)

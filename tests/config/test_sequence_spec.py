"""Validation of sequence scenarios (rig/config/sequence.py, bug record R02/R06): a sound order loads;
each fault in the data (duplicate or unknown step id, a cycle, an event the route cannot produce,
a step over max_model_len, the kind/field mismatch) is one error naming the field and the fix.
Plus the sequence checks on hand-built results (rig/judge/sequence_checks.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rig.config import ConfigError, ScenarioConfig, load_config
from rig.config.sequence import SequenceConfig
from rig.judge.sequence_checks import (
    completed_check,
    lease_reaped_check,
    no_stall_check,
    sequence_required,
    token_counts_check,
)
from rig.observe.observations import ScenarioObservation
from rig.transport.records import Hop, PDRecord
from rig.workload.sequence import ABANDONED, LeaseReap, SequenceEntry, SequenceResult
from tests.helpers.fake_rig import fake_config, write_config


def steps(*specs: dict) -> dict:
    return {"steps": list(specs)}


LOAD = {"id": "load", "route": "pd", "prompt_tokens": 64, "max_tokens": 8}


def test_a_sound_order_loads_with_defaults():
    sc = ScenarioConfig.model_validate({"name": "s", "kind": "sequence", "sequence": steps(
        LOAD, {"id": "head", "route": "decode", "prompt_tokens": 120, "max_tokens": 8,
               "start": {"after": "load", "event": "decode-sent", "after_ms": 5}})})
    assert sc.sequence is not None and [s.id for s in sc.sequence.steps] == ["load", "head"]
    # prompt_tokens / max_tokens of the scenario default to the longest step's
    assert (sc.prompt_tokens, sc.max_tokens) == (120, 8)
    assert sc.sequence.steps[0].start is None and sc.sequence.steps[1].start.event == "decode-sent"
    assert sequence_required(sc)[-1] == "kv-pulled"


@pytest.mark.parametrize("spec, words", [
    (steps(LOAD, {**LOAD}), "id 'load' is used twice"),
    (steps(LOAD, {"id": "b", "prompt_tokens": 8, "max_tokens": 8, "start": {"after": "nope"}}),
     "start.after: no step 'nope'; name one of ['load', 'b']"),
    (steps(LOAD, {"id": "b", "prompt_tokens": 8, "max_tokens": 8, "start": {"after": "b"}}),
     "cannot start after itself"),
    (steps({"id": "a", "prompt_tokens": 8, "max_tokens": 8, "start": {"after": "b"}},
           {"id": "b", "prompt_tokens": 8, "max_tokens": 8, "start": {"after": "a"}}),
     "cycle (a -> b -> a); start one of them at the scenario's start"),
    (steps({"id": "d", "route": "decode", "prompt_tokens": 8, "max_tokens": 8},
           {"id": "b", "prompt_tokens": 8, "max_tokens": 8, "start": {"after": "d", "event": "decode-sent"}}),
     "step 'd' (route decode) produces only ['sent', 'answered']; use 'sent'"),
    (steps({"id": "gone", "route": "pd-abandon", "prompt_tokens": 8, "max_tokens": 8},
           {"id": "b", "prompt_tokens": 8, "max_tokens": 8, "start": {"after": "gone", "event": "answered"}}),
     "use 'prefill-answered' (its decode hop is never sent)"),
    (steps({"id": "p", "route": "prefill", "prompt_tokens": 8, "max_tokens": 8},
           {"id": "b", "prompt_tokens": 8, "max_tokens": 8, "start": {"after": "p", "event": "prefill-answered"}}),
     "use 'sent' or 'answered'"),
    (steps({"id": "x", "route": "sideways", "prompt_tokens": 8, "max_tokens": 8}), "route"),
    (steps({"id": "x", "prompt_tokens": 8, "max_tokens": 8, "count": 0}), "count"),
    ({"steps": []}, "steps"),
])
def test_bad_orders_are_refused_with_the_field_and_the_fix(spec, words):
    with pytest.raises(ValidationError) as e:
        SequenceConfig.model_validate(spec)
    assert words in str(e.value)


def test_kind_and_field_must_agree():
    with pytest.raises(ValidationError, match="kind sequence needs a `sequence:` block"):
        ScenarioConfig.model_validate({"name": "s", "kind": "sequence", "prompt_tokens": 8, "max_tokens": 8})
    with pytest.raises(ValidationError, match="sequence: not used by kind 'edge'"):
        ScenarioConfig.model_validate({"name": "s", "prompt_tokens": 8, "max_tokens": 8,
                                       "sequence": steps(LOAD)})


def test_a_step_over_max_model_len_names_the_step_and_the_fix(tmp_path):
    sc = {"name": "s", "kind": "sequence", "sequence": steps(
        LOAD, {"id": "head", "route": "decode", "prompt_tokens": 120, "max_tokens": 9})}
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=[sc])))
    msg = str(e.value)
    assert "sequence.steps[1] (head): prompt_tokens 120 + max_tokens 9 = 129 exceeds max_model_len 128" in msg
    assert "shorten the prompt or lower max_tokens" in msg


# -- the checks on hand-built results ---------------------------------------------------------

def _rec(rid: str, outcome: str, usage: tuple[int, int] | None = None, diagnosis: str = "") -> PDRecord:
    r = PDRecord(request_id=rid, prompt_len=usage[0] if usage else 8, max_tokens=8, outcome=outcome,
                 diagnosis=diagnosis)
    if usage:
        r.decode = Hop(instance="decode", status=200, token_ids=[1] * usage[1],
                       usage={"prompt_tokens": usage[0], "completion_tokens": usage[1]})
    return r


def _result(*entries: tuple[str, str, str]) -> SequenceResult:
    return SequenceResult(entries=[SequenceEntry(rid, step, route) for rid, step, route in entries])


def test_completed_accepts_a_planned_abandon_and_fails_a_stalled_request_naming_its_step():
    res = _result(("s-a-0", "a", "pd"), ("s-g-0", "g", "pd-abandon"), ("s-h-0", "h", "decode"))
    obs = ScenarioObservation(scenario="s", decode="decode", prefill="prefill")
    obs.records = [_rec("s-a-0", "ok", (8, 8)), _rec("s-g-0", "cancelled", diagnosis=ABANDONED),
                   _rec("s-h-0", "stalled", diagnosis="stall on decode ...")]
    c = completed_check(obs, res)
    assert c.ok is False and c.requests == ("s-h-0",) and "s-h-0 (step h): stalled" in c.detail
    obs.records[2] = _rec("s-h-0", "ok", (8, 8))
    c = completed_check(obs, res)
    assert c.ok is True and "1 abandoned after P answered" in c.detail
    # an abandon for another reason (e.g. the rig cancelled it) is not the planned one
    obs.records[1] = _rec("s-g-0", "cancelled", diagnosis="cancelled by the rig")
    assert completed_check(obs, res).ok is False


def test_token_counts_are_per_step():
    sc = ScenarioConfig.model_validate({"name": "s", "kind": "sequence", "sequence": steps(
        LOAD, {"id": "h", "route": "decode", "prompt_tokens": 16, "max_tokens": 4})})
    res = _result(("s-load-0", "load", "pd"), ("s-h-0", "h", "decode"))
    obs = ScenarioObservation(scenario="s", decode="decode", prefill="prefill")
    obs.records = [_rec("s-load-0", "ok", (64, 8)), _rec("s-h-0", "ok", (16, 3))]
    c = token_counts_check(sc.sequence, obs, res)
    assert c.ok is False and c.requests == ("s-h-0",) and "expected 16/4" in c.detail


def test_no_stall_and_lease_reaped_are_tri_state():
    # no sample of D judged: not checked, never ok; with samples and no freeze: ok, the count shown
    unseen = no_stall_check(SequenceResult())
    assert unseen.ok is None and unseen.samples == 0
    seen = no_stall_check(SequenceResult(stall_samples=4))
    assert seen.ok is True and seen.samples == 4
    bad = no_stall_check(SequenceResult(stall="stall on decode: waiting=1; outstanding: head (1 of 1, route decode)"))
    assert bad.ok is False and "outstanding: head" in bad.detail
    res = SequenceResult(reap=LeaseReap(expired_before=None, want=3))
    assert lease_reaped_check(res, 5, 5).ok is None  # P lacks the counter: not checked, never ok
    res.reap = LeaseReap(expired_before=2, want=3, last_abandoned_ms=500, rose=1, samples=6)
    c = lease_reaped_check(res, 5, 5)
    assert c.ok is False and "rose by 1 of 3" in c.detail
    res.reap = LeaseReap(expired_before=2, want=3, last_abandoned_ms=500, reaped_ms=5800, rose=3, samples=6,
                         outstanding_then=["head (1 of 1, route pd)"])
    c = lease_reaped_check(res, 5, 5)
    assert c.ok is True and "5.3 s after" in c.detail and "outstanding: head" in c.detail
    # reap_while: the timely reap counts only with that step still outstanding then
    assert lease_reaped_check(res, 5, 5, reap_while="head").ok is True
    res.reap.outstanding_then = []
    c = lease_reaped_check(res, 5, 5, reap_while="head")
    assert c.ok is None and "step 'head' had ended before P reaped" in c.detail
    res.reap.reaped_ms = 12000
    assert lease_reaped_check(res, 5, 5).ok is False  # later than the lease + margin


def test_reap_while_names_a_step_and_needs_an_abandon():
    gone = {"id": "gone", "route": "pd-abandon", "prompt_tokens": 8, "max_tokens": 8}
    assert SequenceConfig.model_validate({**steps(LOAD, gone), "reap_while": "load"}).reap_while == "load"
    with pytest.raises(ValidationError, match="sequence.reap_while: no step 'x'"):
        SequenceConfig.model_validate({**steps(LOAD, gone), "reap_while": "x"})
    with pytest.raises(ValidationError, match="needs a step with route pd-abandon"):
        SequenceConfig.model_validate({**steps(LOAD), "reap_while": "load"})


def test_review_findings_are_one_clear_error_each():
    """Fresh-clone review (2026-12-01): kind sequence without its block, a counter rule on an
    instance outside the scenario's pair, and --set of an env value given as a number."""
    from rig.config import load_config
    from rig.config.base import ConfigError

    with pytest.raises(Exception, match="kind sequence needs a `sequence:` block"):
        ScenarioConfig.model_validate({"name": "s", "kind": "sequence", "decode": "decode"})
    with pytest.raises(ConfigError, match=r"expect.counters instance 'decode-draft'.*this scenario's pair"):
        load_config("configs/cpu-regressions.yaml", [
            "scenarios.r19-expiry-not-transfer-failure.expect.counters.0.instance=decode-draft"])
    cfg = load_config("configs/cpu-regressions.yaml", ["launch.env.VLLM_SERVER_DEV_MODE=1"])
    assert cfg.launch.env["VLLM_SERVER_DEV_MODE"] == "1"


def test_more_review_findings_are_refused_with_the_fix():
    """Accepted before, then silently ignored or inconclusive at run time (fresh-clone review)."""
    from rig.config.scenarios import StoreScenarioConfig

    with pytest.raises(ValidationError, match="request.prefill fields are never sent on a one-hop route"):
        SequenceConfig.model_validate({"steps": [{"id": "a", "route": "decode", "prompt_tokens": 8, "max_tokens": 2,
                                                  "request": {"prefill": {"temperature": 0.5}}}]})
    with pytest.raises(ValidationError, match="is an abandoning step itself"):
        SequenceConfig.model_validate({"reap_while": "gone", "steps": [
            {"id": "gone", "route": "pd-abandon", "prompt_tokens": 8, "max_tokens": 2}]})
    with pytest.raises(ValidationError, match="finite"):
        StoreScenarioConfig.model_validate({"cancel_fraction": 0.3, "cancel_after_ms": [0, float("inf")]})
    with pytest.raises(ValidationError, match="without store.cancel_fraction"):
        StoreScenarioConfig.model_validate({"cancel_after_ms": [0, 300], "cancel_hop": "decode"})
    StoreScenarioConfig.model_validate({"cancel_fraction": 0.3, "cancel_after_ms": [0, 300]})  # the right form

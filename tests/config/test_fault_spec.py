"""Validation of fault scenarios (rig/config/faults.py): every action and trigger accepts
what it needs and refuses the rest with one error naming the field and the fix; the checks of
rig/workload/faults.py on hand-built results."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rig.config import ConfigError, load_config
from rig.config.faults import Fault, FaultScenarioConfig, Trigger
from rig.judge.checks import Check
from rig.judge.fault_checks import fault_fired_check, fault_outcome_check, recovery_serves_check
from rig.observe.observations import ScenarioObservation
from rig.transport.records import Hop, PDRecord
from rig.workload.faults import FaultEvent, FaultResult
from tests.helpers.fake_rig import fake_config, write_config


def fault(**kw) -> Fault:
    return Fault.model_validate(kw)


@pytest.mark.parametrize("spec", [
    {"trigger": {"event": "prefill-answered"}, "target": "prefill", "action": "sigkill"},
    {"trigger": {"event": "prefill-answered"}, "target": "decode", "action": "sigterm", "restart": False},
    {"trigger": {"event": "decode-sent", "after_ms": 50}, "target": "decode", "action": "sigstop", "stop_s": 8},
    {"trigger": {"event": "after-requests", "k": 2}, "target": "prefill", "action": "restart"},
    {"trigger": {"event": "kv-fetch-in-progress"}, "target": "request", "action": "cancel-decode"},
    {"trigger": {"event": "decode-sent", "after_ms": 0}, "target": "request", "action": "cancel-decode"},
    {"trigger": {"event": "prefill-answered"}, "target": "request", "action": "abandon"},
    {"trigger": {"event": "prefill-answered"}, "target": "request", "action": "delay-decode", "delay_s": 8},
])
def test_every_action_accepts_its_fields(spec):
    f = fault(**spec)
    assert f.action == spec["action"] and f.action in f.describe()


@pytest.mark.parametrize("spec, words", [
    ({"trigger": {"event": "prefill-answered"}, "target": "request", "action": "sigkill"}, "acts on an instance"),
    ({"trigger": {"event": "prefill-answered"}, "target": "prefill", "action": "abandon"}, "set target: request"),
    ({"trigger": {"event": "prefill-answered"}, "target": "decode", "action": "sigstop"}, "stop_s"),
    ({"trigger": {"event": "prefill-answered"}, "target": "decode", "action": "sigkill", "stop_s": 3}, "stop_s"),
    ({"trigger": {"event": "prefill-answered"}, "target": "request", "action": "delay-decode"}, "delay_s"),
    ({"trigger": {"event": "decode-sent"}, "target": "request", "action": "abandon"}, "prefill-answered"),
    ({"trigger": {"event": "decode-sent"}, "target": "request", "action": "delay-decode", "delay_s": 1},
     "prefill-answered"),
    ({"trigger": {"event": "prefill-answered"}, "target": "request", "action": "cancel-decode"},
     "decode hop in flight"),
    ({"trigger": {"event": "after-requests", "k": 1}, "target": "request", "action": "cancel-decode"},
     "decode hop in flight"),
    ({"trigger": {"event": "prefill-answered"}, "target": "prefill", "action": "explode"}, "action"),
])
def test_wrong_combinations_name_the_field(spec, words):
    with pytest.raises(ValidationError) as e:
        fault(**spec)
    assert words in str(e.value)


@pytest.mark.parametrize("trigger, words", [
    ({"event": "after-requests"}, "trigger.k: required"),
    ({"event": "prefill-answered", "k": 2}, "trigger.k: only for event after-requests"),
    ({"event": "prefill-answered", "after_ms": 5}, "after_ms: only for event decode-sent"),
    ({"event": "decode-sent", "after_ms": -1}, "greater than or equal to 0"),
])
def test_trigger_fields(trigger, words):
    with pytest.raises(ValidationError) as e:
        Trigger.model_validate(trigger)
    assert words in str(e.value)


def test_faulted_index_and_k_must_leave_a_request():
    kill = {"trigger": {"event": "after-requests", "k": 2}, "target": "prefill", "action": "sigkill"}
    with pytest.raises(ValidationError, match="must be below requests 2"):
        FaultScenarioConfig.model_validate({"requests": 2, "faults": [kill]})
    with pytest.raises(ValidationError, match="faulted 1: must be below requests 1"):
        FaultScenarioConfig.model_validate({"faulted": 1,
                                            "faults": [kill | {"trigger": {"event": "prefill-answered"}}]})
    with pytest.raises(ValidationError, match="at least 1"):
        FaultScenarioConfig.model_validate({"faults": []})


def _cfg(tmp_path, sc: dict):
    return load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=[sc])))


BASE = {"name": "f", "kind": "fault", "prompt_tokens": 40, "max_tokens": 4}
KILL_P = {"faults": [{"trigger": {"event": "prefill-answered"}, "target": "prefill", "action": "sigkill"}]}


def test_config_accepts_a_fault_scenario_and_refuses_mismatches(tmp_path):
    cfg = _cfg(tmp_path, {**BASE, "fault": KILL_P})
    assert cfg.scenarios[0].fault.faults[0].action == "sigkill"
    with pytest.raises(ConfigError, match="fault: give it exactly when kind is 'fault'"):
        _cfg(tmp_path, {**BASE, "kind": "fault"})
    with pytest.raises(ConfigError, match="fault: not used by kind 'edge'"):
        _cfg(tmp_path, {**BASE, "kind": "edge", "fault": KILL_P})
    bad_target = {"faults": [{**KILL_P["faults"][0], "target": "prefil"}]}
    with pytest.raises(ConfigError, match="fault target 'prefil': give prefill, decode, request or an instance name"):
        _cfg(tmp_path, {**BASE, "fault": bad_target})


def _obs(*recs: PDRecord) -> ScenarioObservation:
    return ScenarioObservation(scenario="f", decode="decode", prefill="prefill", records=list(recs))


def test_fault_fired_is_not_checked_when_the_event_never_came_and_times_are_reported():
    unfired = FaultResult(events=[FaultEvent("cancel-decode request on kv-fetch-in-progress", "request",
                                             detail="not seen within 5 s")])
    c = fault_fired_check(unfired)
    assert c.ok is None and "not seen within 5 s" in c.detail
    fired = FaultResult(events=[FaultEvent("sigkill prefill on prefill-answered", "prefill", event_at=10.0,
                                           fired_at=10.004, detail="SIGKILL to prefill")])
    c = fault_fired_check(fired)
    assert c.ok is True and "fired 4 ms after its event" in c.detail
    broken = FaultResult(events=[FaultEvent("sigkill x", "x", event_at=1.0, error="cannot signal x")])
    assert fault_fired_check(broken).ok is False


def test_fault_outcome_fails_only_a_bare_timeout():
    ok = PDRecord("f-0", 4, 2, outcome="http_error", diagnosis="decode: HTTP 500: boom")
    hang = PDRecord("f-1", 4, 2, outcome="timeout", diagnosis="no answer within the 60 s deadline")
    rec = PDRecord("f-recovery", 4, 2, outcome="ok")
    res = FaultResult(recovery_id="f-recovery")
    c = fault_outcome_check(_obs(ok, rec), res)
    assert c.ok is True and "HTTP 500" in c.detail
    c = fault_outcome_check(_obs(ok, hang, rec), res)
    assert c == Check("fault-outcome", False, c.detail, ("f-1",))


def test_recovery_serves_needs_pulled_kv_and_the_token_count():
    rec = PDRecord("f-recovery", 4, 2, prompt=[1, 2, 3, 4], outcome="ok",
                   decode=Hop("decode", status=200, usage={"completion_tokens": 2}, token_ids=[5, 6]))
    res = FaultResult(recovery_id="f-recovery", recovery_pulled=4.0, restarted={"prefill": 31.5})
    c = recovery_serves_check(_obs(rec), res, 2)
    assert c.ok is True and "prefill restarted on its ports (ready after 31.5 s)" in c.detail
    assert recovery_serves_check(_obs(rec), FaultResult(recovery_id="f-recovery", recovery_pulled=0.0), 2).ok is False
    assert recovery_serves_check(_obs(rec), res, 3).ok is False
    assert recovery_serves_check(_obs(rec), FaultResult(recovery_id="f-recovery"), 2).ok is None
    assert recovery_serves_check(_obs(rec), FaultResult(), 2).ok is None

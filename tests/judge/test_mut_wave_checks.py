"""Wave verdicts where `make mutation` found the evidence unpinned (rig/judge/wave_checks.py): a
stall is explained only when the in-flight requests' blocks really fill P's pool (one-token
blocks, no prompt length given); a wave that did not run is ERROR with no check and its
expectation still read; a caller's own required list holds when checks are dropped; an
unwatched wave's XFAIL and XPASS say which checks were not looked at."""

from __future__ import annotations

import pytest

from rig.judge.wave_checks import UNWATCHED, UNWATCHED_WHY, explain_stall, judge_wave, wave_checks
from rig.observe.observations import TransferEvidence
from test_wave_checks import HELD, full_obs, healthy_wave, obs, rec, sc, stall, wave

KI = {"id": "wrong", "title": "t", "affects": ">=0.32", "symptom": {"kind": "wrong-output"}}
NOTE = f"; {', '.join(UNWATCHED)} not checked, {UNWATCHED_WHY}"


def test_without_a_prompt_length_each_in_flight_request_holds_its_first_tokens_block():
    # 1-token blocks: 6 held requests x (31 + 1) = 192 blocks; 3 in flight x 1 block (its first token) = 3
    params = {"concurrency": 3}
    assert explain_stall(stall(), wave(HELD, block_size=1, usable_blocks={"prefill": 196}, params=params)) == ""
    text = explain_stall(stall(), wave(HELD, block_size=1, usable_blocks={"prefill": 195}, params=params))
    assert text.startswith("6 requests abandoned between the hops in the 30 s before hold ~192 of P's 195 usable")


def test_a_wave_that_did_not_run_is_error_with_no_check_and_the_scenarios_expectation():
    v = judge_wave(sc(known_issue=KI), full_obs(), None)
    assert (v.verdict, v.reason, v.checks) == ("ERROR", "the wave did not run", [])
    assert v.expectation == "xfail: wrong (wrong-output) on vLLM >=0.32"


def test_a_callers_required_list_holds_when_unwatched_checks_are_dropped():
    never_compared = healthy_wave(parity={"compared": 0})  # parity not checked: the kind requires it
    v = judge_wave(sc(), full_obs(), never_compared, unwatched=True)
    assert v.verdict == "ERROR" and "parity not checked" in v.reason
    v = judge_wave(sc(), full_obs(), never_compared, required=("completed", "no-errors"), unwatched=True)
    assert v.verdict == "PASS" and v.reason.endswith(NOTE)


def test_an_unwatched_xfail_and_xpass_say_which_checks_were_not_looked_at():
    shown = healthy_wave(records=[rec(0), rec(1, outcome="parity_mismatch", parity="diverged at 0")],
                         parity={"compared": 2, "equal": 1})
    two_pulled = full_obs(evidence=TransferEvidence(nixl_bytes=2048.0, nixl_transfers=2, external_prompt_tokens=62))
    v = judge_wave(sc(known_issue=KI), two_pulled, shown, unwatched=True)
    assert v.verdict == "XFAIL" and v.reason == "wrong: w-1 diverged from the reference" + NOTE
    v = judge_wave(sc(known_issue=KI), full_obs(), healthy_wave(), unwatched=True)
    assert v.verdict == "XPASS" and v.reason.endswith(NOTE)
    v = judge_wave(sc(known_issue=KI), two_pulled, shown)  # watched: nothing to add
    assert v.reason == "wrong: w-1 diverged from the reference"


def by_name(checks) -> dict:
    return {c.name: c for c in checks}


def test_completed_without_a_cancel_names_no_cancel_point():
    c = by_name(wave_checks(sc(), obs(), wave([rec(0), rec(1)], kind="pressure-wave")))["completed"]
    assert (c.ok, c.detail) == (True, "2/2 completed (2 requests, 0 cancelled on purpose)")


def test_token_counts_that_hold_name_no_request_even_beside_an_unanswered_one():
    cs = by_name(wave_checks(sc(), obs(), wave([rec(0), rec(1, outcome="timeout")], kind="pressure-wave")))
    assert cs["completed"].requests == ("w-1",)
    c = cs["token-counts"]
    assert (c.ok, c.detail, c.requests) == (True, "every answer has its expected token count", ())


@pytest.mark.parametrize("params", [{}, {"parity_fraction": 0}, {"parity_fraction": None}])
def test_a_wave_that_sampled_no_parity_has_no_parity_check(params):
    assert "parity" not in by_name(wave_checks(sc(), obs(), wave([rec(0)], kind="pressure-wave", params=params)))
    cut = wave([rec(0, outcome="cancelled", planned_cancel="between", cancel_point="between")],
               kind="pressure-wave", params=params)
    assert "parity" not in by_name(wave_checks(sc(), obs(), cut))
    assert by_name(wave_checks(sc(), obs(), cut))["token-counts"].ok is None  # the all-cancelled branch

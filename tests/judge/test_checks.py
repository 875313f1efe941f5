"""The named checks of rig/judge/checks.py, read the way a user reads them: the tri-state (a
check that could not look is "not checked", never ok), the requests a failure names, and the
detail text a user acts on. Pure unit tests: observations and records are built in memory.
"""

from __future__ import annotations

import pytest

from rig.config import Outcome
from rig.judge.checks import (
    Check,
    alive_check,
    completion_checks,
    counter_rose_check,
    fatal_log_check,
    idle_check,
    inconclusive_stall,
    kv_integrity_check,
    lease_release_check,
    lease_released_ids,
    missing,
    not_checked_for_metrics,
    parent_request_id,
    parity_check,
    preemption_check,
    prompt_index,
    retrieval_check,
    several_prompts_usage,
    stream_check,
    unsure_of_stalls,
)
from rig.observe.observations import DrainResult, ScenarioObservation, TransferEvidence
from rig.observe.parity import ParityResult
from rig.transport.records import Hop, PDRecord, StallEvidence, StallFacts
from rig.workload.retrieval import RetrievalResult

INVALID = ("ERROR [pull_worker.py:667] Potentially invalid KV blocks for unrecognized request {rid} were "
           "retrieved by a decode worker. They may have expired.")
RELEASED = ("WARNING [base_worker.py:3032] Releasing expired KV blocks for request {rid} which were retrieved "
            "by 0 remote worker(s) before lease expired.")


def obs(records: list[PDRecord] | None = None, **kw) -> ScenarioObservation:
    o = ScenarioObservation(scenario="s", decode="decode", prefill="prefill", records=records or [])
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def rec(i: int = 0, outcome: str = "ok", tokens: list[int] | None = None, usage: dict | None = None,
        rid: str | None = None, diagnosis: str = "") -> PDRecord:
    tokens = [5, 6] if tokens is None else tokens
    r = PDRecord(request_id=f"r{i}", prompt_len=4, max_tokens=2, outcome=outcome, prompt=[1, 2, 3, 4],
                 diagnosis=diagnosis)
    r.prefill = Hop("prefill", status=200, token_ids=[9],
                    kv_transfer_params={"remote_request_id": rid if rid is not None else f"cmpl-p{i}"})
    if outcome == "ok":
        r.decode = Hop("decode", status=200, token_ids=tokens,
                       usage=usage if usage is not None else {"prompt_tokens": 4, "completion_tokens": len(tokens),
                                                              "total_tokens": 4 + len(tokens)})
    return r


def evidence(finding: str) -> StallEvidence:
    return StallEvidence(frozen_s=8.0, finding=finding, engine_cpu_s=0.1, load_avg=(9.0, 8.0, 7.0), cpus=2)


def stalled(i: int, finding: str | None) -> PDRecord:
    r = rec(i, outcome="stalled", diagnosis="frozen")
    r.stall = StallFacts(instance="decode", waiting=1, running=0, kv_usage=0.0, waiting_reasons={},
                         kv_fetch_stages={}, duration_s=8.0, evidence=evidence(finding) if finding else None)
    return r


# ------------------------------------------------------------------------------ Check, metric gaps

def test_state_names_each_of_the_three_values():
    assert [Check("x", v, "").state for v in (True, False, None)] == ["ok", "failed", "not checked"]


def test_a_missing_metric_makes_the_check_not_checked_naming_instance_and_metric():
    o = obs(missing_metrics={"decode": ["vllm:a", "vllm:b"], "prefill": ["vllm:c"]})
    assert missing(o, "decode", ("vllm:b", "vllm:x", "vllm:a")) == ["vllm:b", "vllm:a"]
    assert missing(o, "other", ("vllm:a",)) == []
    gap = not_checked_for_metrics("kv-pulled", o, ["decode", "prefill"], ("vllm:a", "vllm:b", "vllm:c"))
    assert gap == Check("kv-pulled", None, "not checked: decode lacks vllm:a, vllm:b; prefill lacks vllm:c")
    assert not_checked_for_metrics("kv-pulled", o, ["decode"], ("vllm:z",)) is None


# ------------------------------------------------------------------------------ inconclusive stalls

def test_only_a_stall_on_a_starved_or_compiling_engine_is_inconclusive():
    assert inconclusive_stall(stalled(0, "starved")) and inconclusive_stall(stalled(0, "compiling"))
    assert not inconclusive_stall(stalled(0, "stepping"))
    assert not inconclusive_stall(stalled(0, None))  # no process evidence: the stall stands
    ok = rec(0)
    ok.stall = stalled(0, "starved").stall  # a stall the request recovered from is no stalled outcome
    assert not inconclusive_stall(ok)


def test_a_failure_only_on_inconclusive_stalls_is_not_checked_and_says_why():
    recs = [stalled(0, "starved"), stalled(1, "stepping"), rec(2)]
    only_unsure = Check("completed", False, "2/3 completed", ("r0",))
    with_real = Check("parity", False, "diverged", ("r0", "r1"))
    run_level = Check("alive", False, "decode died")
    held = Check("kv-pulled", True, "pulled")
    out = unsure_of_stalls([only_unsure, with_real, run_level, held], recs)
    assert out[0] == Check("completed", None, f"not checked: 2/3 completed (r0 stalled, "
                                              f"{recs[0].stall.evidence.text()})", ("r0",))
    assert out[1:] == [with_real, run_level, held]  # a real stall, a run-level failure, a held check stand
    assert unsure_of_stalls([only_unsure], [stalled(0, "stepping")]) == [only_unsure]


# ------------------------------------------------------------------------------ completion

def test_completed_names_the_first_failed_request_and_token_counts_skips_it():
    bad = rec(1, outcome="timeout", diagnosis="decode: no answer in 30 s")
    out = completion_checks(Outcome(completion_tokens=2, total_tokens=6), [rec(0), bad])
    assert out == [Check("completed", False, "1/2 completed; r1: timeout decode: no answer in 30 s", ("r1",)),
                   Check("token-counts", True, "as expected (2 + prompt = 6)")]
    only = completion_checks(Outcome(completion_tokens=2), [rec(0)])
    assert only == [Check("completed", True, "1/1 completed"),
                    Check("token-counts", True, "as expected (2 completion tokens)")]


def test_no_record_is_not_completed():
    assert completion_checks(Outcome(completion_tokens=2), [])[0] == Check("completed", False, "0/0 completed")


def test_no_answer_fails_token_counts_on_every_failed_request():
    out = completion_checks(Outcome(completion_tokens=2), [rec(0, outcome="timeout"), rec(1, outcome="empty")])
    assert out[1] == Check("token-counts", False, "no answer to count", ("r0", "r1"))


@pytest.mark.parametrize(("usage", "tokens", "why"), [
    ({"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}, [5, 6, 7], "completion_tokens 3 != 2, "
                                                                                "total_tokens 7 != 6"),
    ({"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 7}, [5, 6], "total_tokens 7 != 6"),
    ({"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}, [5], "1 token_ids but usage says 2"),
])
def test_token_counts_names_each_miscount(usage, tokens, why):
    out = completion_checks(Outcome(completion_tokens=2, total_tokens=6), [rec(0), rec(1, tokens=tokens, usage=usage)])
    assert out[1] == Check("token-counts", False, f"r1: {why}", ("r1",))


def test_an_answer_without_token_ids_or_usage_is_not_miscounted_by_the_id_count():
    r = rec(0)
    r.decode.token_ids = None
    assert completion_checks(Outcome(completion_tokens=2), [r])[1].ok is True
    r = rec(0, usage={})
    assert completion_checks(Outcome(), [r])[1].ok is True


def test_an_expected_refusal_is_completed_only_when_decode_answers_that_status_and_message():
    refused = rec(0, outcome="http_error", diagnosis="decode: HTTP 400")
    refused.decode = Hop("decode", status=400, error="HTTP 400: prompt too long")
    other = rec(1, outcome="http_error", diagnosis="decode: HTTP 500")
    other.decode = Hop("decode", status=500, error="HTTP 500: boom")
    want = Outcome(http_status=400, http_message="too long")
    assert completion_checks(want, [refused]) == [Check("completed", True, "1/1 refused by decode with HTTP 400")]
    assert completion_checks(want, [refused, other]) == [
        Check("completed", False, "1/2 refused by decode with HTTP 400; r1: http_error decode: HTTP 500", ("r1",))]
    worded = Outcome(http_status=400, http_message="context length")
    assert completion_checks(worded, [refused])[0].requests == ("r0",)
    assert completion_checks(Outcome(http_status=400), [refused])[0].ok is True
    assert completion_checks(Outcome(http_status=400), [])[0].ok is False
    no_decode = rec(2, outcome="http_error")
    assert completion_checks(Outcome(http_status=400), [no_decode])[0].requests == ("r2",)


def test_several_prompts_usage_sums_the_prompts_and_wants_a_choice_per_prompt():
    r = rec(0)
    r.prompt = [[1, 2, 3], [4, 5]]
    r.decode.usage = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    r.decode.choices = [[5, 6], [7, 8]]
    assert several_prompts_usage(r) == []
    r.decode.usage = {"prompt_tokens": 3}
    r.decode.choices = [[5, 6], [7, 8], [9, 9]]
    assert several_prompts_usage(r) == ["usage.prompt_tokens 3 != 5 (2 prompts)", "3 choices for 2 prompts"]
    r.decode.usage, r.decode.choices = None, None
    assert several_prompts_usage(r) == ["1 choices for 2 prompts"]  # one token list: one choice
    assert several_prompts_usage(rec(1)) == []  # one prompt
    r.decode = None
    assert several_prompts_usage(r) == []


# ------------------------------------------------------------------------------ parity

def test_parity_fails_when_nothing_answered_naming_every_request():
    assert parity_check([rec(0, outcome="timeout"), rec(1, outcome="empty")], []) == \
        Check("parity", False, "no answer to compare", ("r0", "r1"))


def test_parity_names_the_first_divergence_and_every_diverged_request():
    d1 = ParityResult("diverged", position=1, pd_token=7, ref_token=6)
    out = parity_check([rec(0), rec(1), rec(2)], [ParityResult("equal"), d1, ParityResult("refused", reason="x")])
    assert out == Check("parity", False, "1/3 equal; r1: diverged at 1: 7 != 6", ("r1", "r2"))


def test_a_missing_reference_is_not_checked_and_names_the_request():
    out = parity_check([rec(0), rec(1, diagnosis="reference: HTTP 500")], [ParityResult("equal")], what="same")
    assert out == Check("parity", None, "not checked: 1/2 same; no reference for r1 (reference: HTTP 500)")
    assert parity_check([rec(0)], [None]) == Check("parity", None, "not checked: 0/1 equal; no reference for r0")


def test_parity_states_the_float_margin_and_the_fields_not_compared():
    fields = tuple(f"f{i}" for i in range(8))
    eq = [ParityResult("equal", max_float_diff=d, tolerance=0.01, not_compared=fields[:7] if i else fields[5:])
          for i, d in enumerate((0.002, 0.004))]
    out = parity_check([rec(0), rec(1), rec(2, outcome="timeout")], eq + [None])
    assert out == Check("parity", True, "2/2 equal (floats within 0.004 of the reference, tolerance 0.01); "
                                        "not compared: f5, f6, f7, f0, f1, f2 and 2 more")
    six = [ParityResult("equal", not_compared=fields[:6])]
    assert parity_check([rec(0)], six).detail == "1/1 equal; not compared: f0, f1, f2, f3, f4, f5"


# ------------------------------------------------------------------------------ rising counters

def test_a_rising_counter_reads_the_instance_it_is_asked_about():
    o = obs(evidence=TransferEvidence(preemptions=2.0, spec_drafts=5.0), prefill_evidence=TransferEvidence())
    assert preemption_check(o, 2) == Check("preempted", True,
                                           "decode: vllm:num_preemptions_total +2 over the scenario (expected >= 2)")
    assert preemption_check(o, 3).ok is False
    assert preemption_check(o, 1, on="prefill") == Check(
        "preempted", False, "prefill: vllm:num_preemptions_total +0 over the scenario (expected >= 1)")
    assert counter_rose_check(o, "min_spec_drafts", 5).detail.startswith("decode: vllm:spec_decode_num_drafts")


def test_a_rising_counter_without_its_metric_or_metrics_is_not_checked():
    assert preemption_check(obs(), 1) == Check("preempted", None, "not checked: no decode metrics")
    assert preemption_check(obs(evidence=TransferEvidence()), 1, on="prefill") == \
        Check("preempted", None, "not checked: no prefill metrics")
    gap = obs(evidence=TransferEvidence(preemptions=9), missing_metrics={"decode": ["vllm:num_preemptions_total"]})
    assert preemption_check(gap, 1) == Check("preempted", None,
                                             "not checked: decode lacks vllm:num_preemptions_total")


# ------------------------------------------------------------------------------ alive, fatal log

def test_alive_names_each_death_with_its_fatal_line_and_skips_those_judged_elsewhere():
    o = obs(dead={"decode": 1, "prefill": -9}, death_lines={"decode": "RuntimeError: x" * 30})
    assert alive_check(o) == Check("alive", False, "decode died (exit 1): " + ("RuntimeError: x" * 30)[:200]
                                   + "; prefill died (exit -9)")
    assert alive_check(o, skip=("decode", "prefill")) == Check("alive", True, "all processes alive")


def test_an_instance_stopped_by_its_owner_is_no_death_and_alone_is_not_checked():
    o = obs(stopped={"prefill": "stopped by pdrig up"})
    assert alive_check(o) == Check("alive", None, "not checked: prefill stopped by its owner, not a death "
                                                  "(stopped by pdrig up)")
    assert alive_check(o, skip=("prefill",)).ok is True
    o.dead = {"decode": 1}
    assert alive_check(o) == Check("alive", False, "decode died (exit 1); prefill stopped by its owner, not a "
                                                   "death (stopped by pdrig up)")


def test_no_fatal_log_is_not_checked_when_no_log_was_scanned():
    assert fatal_log_check(obs()) == Check("no-fatal-log", None, "not checked: no log was scanned")


def test_no_fatal_log_holds_only_over_scanned_logs():
    assert fatal_log_check(obs(fatal_lines={"decode": [], "prefill": []})) == \
        Check("no-fatal-log", True, "no fatal log lines")
    gap = obs(fatal_lines={"decode": []}, unscanned_logs={"prefill": "log file gone"})
    assert fatal_log_check(gap) == Check("no-fatal-log", None, "not checked: prefill: log file gone")


def test_a_fatal_line_fails_showing_the_exception_that_ended_the_traceback():
    o = obs(fatal_lines={"decode": ["Traceback -> ValueError: bad block", "ERROR x"], "prefill": ["RuntimeError: y"]},
            unscanned_logs={"router": "gone"})
    assert fatal_log_check(o) == Check("no-fatal-log", False,
                                       "decode: ValueError: bad block (+1 more); prefill: RuntimeError: y")


# ------------------------------------------------------------------------------ kv-integrity

def test_kv_integrity_is_not_checked_without_prefills_log():
    assert kv_integrity_check(obs(unscanned_logs={"prefill": "no such file"})) == \
        Check("kv-integrity", None, "not checked: prefill: no such file")
    assert kv_integrity_check(obs(kv_integrity_lines={"decode": []})) == \
        Check("kv-integrity", None, "not checked: prefill's log was not scanned")


def test_stale_kv_on_an_answered_request_fails_it_and_abandoned_ones_are_housekeeping():
    recs = [rec(0), rec(1, outcome="timeout"), rec(2), rec(3, rid="")]
    lines = [INVALID.format(rid="cmpl-p0"), INVALID.format(rid="cmpl-p1"), INVALID.format(rid="cmpl-p0"),
             "ERROR unrelated"]
    out = kv_integrity_check(obs(recs, kv_integrity_lines={"prefill": ["noise " + lines[0]] + lines[1:]}))
    # one request, two lines: the count is of requests, the lines are counted beside it
    assert out == Check("kv-integrity", False, "1 answered request(s) read KV blocks prefill had released (2 "
                        "line(s); its lease expired, or an earlier read of the same params freed them): r0: "
                        + lines[0][lines[0].find("Potentially"):][:160]
                        + "; 1 line(s) for requests abandoned by the rig (r1): lease housekeeping", ("r0",))


def test_a_line_naming_no_request_of_the_scenario_is_counted_not_failed():
    old = [INVALID.format(rid="cmpl-old"), INVALID.format(rid="cmpl-older")]
    o = obs([rec(0), rec(1, outcome="cancelled")],
            kv_integrity_lines={"prefill": old, "decode": [INVALID.format(rid="cmpl-p1")]})
    assert kv_integrity_check(o) == Check(
        "kv-integrity", True, "no answered request read released KV blocks; 1 line(s) for requests abandoned by the "
        "rig (r1): lease housekeeping; 2 line(s) naming no request of this scenario (an earlier scenario's "
        "abandoned transfer expiring): lease housekeeping")
    assert kv_integrity_check(obs([rec(0)], kv_integrity_lines={"prefill": []})) == \
        Check("kv-integrity", True, "no answered request read released KV blocks")


def test_kv_integrity_takes_the_callers_id_maps():
    o = obs([rec(0)], kv_integrity_lines={"prefill": [INVALID.format(rid="X-1")]})
    assert kv_integrity_check(o, answered={"X-1": "w7"}, abandoned={}).requests == ("w7",)
    assert kv_integrity_check(o, answered={}, abandoned={"X-1": "w7"}).ok is True


# ------------------------------------------------------------------------------ idle-after

def test_idle_after_needs_a_drain_and_every_gauge():
    d = [DrainResult("decode", True, 0.3, 0.0, {}, samples=2), DrainResult("prefill", True, 0.1, 0.0, {}, samples=1)]
    assert idle_check(obs(drains=d)) == Check("idle-after", True, "decode idle after 0.3 s; prefill idle after 0.1 s",
                                              samples=3)
    assert idle_check(obs()) == Check("idle-after", None, "not checked: no drain was observed")
    gap = obs(drains=d, missing_metrics={"prefill": ["vllm:kv_cache_usage_perc"]})
    assert idle_check(gap) == Check("idle-after", None, "not checked: prefill lacks vllm:kv_cache_usage_perc")


def test_idle_after_fails_naming_only_the_instances_that_did_not_drain():
    d = [DrainResult("decode", False, 5.0, 0.0, {"kv_usage": 0.5}, samples=4),
         DrainResult("prefill", True, 0.1, 0.0, {}, samples=1)]
    out = idle_check(obs(), drains=d, describe=lambda x: f"<{x.instance}>")
    assert out == Check("idle-after", False, "<decode>", samples=5)
    undecided = [DrainResult("decode", None, 5.0, 0.0, {}, error="no gauge")]
    assert idle_check(obs(), drains=undecided).ok is False  # never idle when it could not be told


def test_idle_after_leaves_out_an_instance_dead_at_the_end_and_judges_the_living():
    err = "ConnectError: All connection attempts failed"
    d = [DrainResult("prefill", False, 0.0, 0.0, {}, error=err), DrainResult("decode", True, 0.2, 0.0, {}, samples=2)]
    out = idle_check(obs(drains=d, dead={"prefill": 0}))
    assert out == Check("idle-after", True,
                        "decode idle after 0.2 s; left out: prefill died in the scenario (judged by alive)", samples=2)
    busy = [d[0], DrainResult("decode", False, 5.0, 0.0, {"running": 1.0}, samples=3)]
    assert idle_check(obs(drains=busy, dead={"prefill": 0})).ok is False  # the living one is still judged
    only_dead = idle_check(obs(drains=d[:1], dead={"prefill": 0}))
    assert only_dead == Check("idle-after", None, "not checked: prefill died in the scenario (judged by alive)")
    assert idle_check(obs(drains=d)).ok is False  # alive but unreachable: not idle


# ------------------------------------------------------------------------------ streams

def test_stream_complete_judges_only_streamed_answers():
    plain = rec(0)
    assert stream_check([plain]) is None
    s1, s2 = rec(1), rec(2)
    s1.decode.ttft_s = s2.decode.ttft_s = 0.1
    assert stream_check([plain, s1, s2]) == Check("stream-complete", True, "2 streamed answer(s) complete and in order")
    s2.decode.stream_problem = "token after finish_reason"
    assert stream_check([plain, s1, s2]) == Check("stream-complete", False, "r2: token after finish_reason", ("r2",))
    gone = rec(3, outcome="timeout")
    gone.decode = Hop("decode", ttft_s=0.1, stream_problem="cut")
    assert stream_check([gone]) is None


# ------------------------------------------------------------------------------ request ids, leases

@pytest.mark.parametrize(("rid", "parent", "index"), [
    ("cmpl-abc-1-0123abcd", "cmpl-abc", 1),
    ("2_cmpl-abc-12-0123abcd", "cmpl-abc", 12),
    ("cmpl-abc", "cmpl-abc", None),
    ("chatcmpl-abc-1-0123abcd", "chatcmpl-abc-1-0123abcd", None),  # only completions ids carry the prompt
    ("x_cmpl-abc-1-0123abcd", "x_cmpl-abc-1-0123abcd", None),  # not a sampling child's prefix
    ("3_", "3_", None),
    ("cmpl-abc-1-0123abcdX", "cmpl-abc-1-0123abcdX", None),
    ("1_cmpl-my_req-0-0123abcd", "cmpl-my_req", 0),  # a client's X-Request-Id may carry "_" itself
])
def test_parent_and_prompt_of_a_vllm_request_id(rid, parent, index):
    assert parent_request_id(rid) == parent
    assert prompt_index(rid) == index


def test_lease_release_lines_give_the_id_and_the_line_from_the_phrase_on():
    line = RELEASED.format(rid="cmpl-a-0-0123abcd")
    assert lease_released_ids(["noise", line, "x Releasing expired KV blocks for request "]) == \
        [("cmpl-a-0-0123abcd", line[line.find("Releasing"):][:200])]


def test_released_by_d_fails_on_the_answered_request_whose_family_the_reaper_freed():
    recs = [rec(0, rid="cmpl-a-0-0123abcd"), rec(1, outcome="timeout", rid="cmpl-b-0-0123abcd"), rec(2, rid="")]
    lines = [RELEASED.format(rid="cmpl-b-0-0123abcd"), RELEASED.format(rid="1_cmpl-a-1-89abcdef")]
    out = lease_release_check(obs(recs, kv_integrity_lines={"prefill": lines}))
    text = lines[1][lines[1].find("Releasing"):]
    assert out == Check("released-by-d", False, f"1 block set(s) of answered requests held until the lease expired: "
                        f"r0: {text}", ("r0",))
    assert lease_release_check(obs(recs, kv_integrity_lines={"prefill": lines[:1]})) == \
        Check("released-by-d", True, "no answered request's blocks (or a sibling's) waited for the lease")


def test_released_by_d_is_not_checked_without_prefills_log():
    want = Check("released-by-d", None, "not checked: prefill's log was not scanned")
    assert lease_release_check(obs([rec(0)])) == want
    assert lease_release_check(obs([rec(0)], kv_integrity_lines={"prefill": []}, unscanned_logs={"prefill": "x"})) \
        == want


# ------------------------------------------------------------------------------ retrieval

def test_retrieval_is_not_checked_when_it_did_not_run_or_the_reference_found_nothing():
    assert retrieval_check(None) == Check("retrieval", None, "not checked: the retrieval workload did not run")
    assert retrieval_check(RetrievalResult(pd_hits=0, ref_hits=0, compared=4)) == Check(
        "retrieval", None, "not checked: the reference retrieved nothing to compare with; "
                           "P/D 0/4 (0%), reference 0/4 (0%)")
    assert retrieval_check(RetrievalResult(pd_hits=0, ref_hits=1, compared=0)).ok is None


def test_retrieval_fails_when_pd_retrieves_less_than_the_reference():
    recs = [rec(0), rec(1)]
    assert retrieval_check(RetrievalResult(records=recs, pd_hits=1, ref_hits=2, compared=4)) == Check(
        "retrieval", False, "P/D 1/4 (25%), reference 2/4 (50%)", ("r0", "r1"))
    assert retrieval_check(RetrievalResult(records=recs, pd_hits=2, ref_hits=2, compared=4)) == Check(
        "retrieval", True, "P/D 2/4 (50%), reference 2/4 (50%)")


# ------------------------------------------------------------------------------ the text of each detail

def test_two_stopped_instances_are_each_named_with_their_stop_line_cut_at_160():
    o = obs(stopped={"prefill": "s" * 170, "decode": "stopped"})
    assert alive_check(o).detail == ("not checked: prefill stopped by its owner, not a death (" + "s" * 160 + "); "
                                     "decode stopped by its owner, not a death (stopped)")


def test_every_miscounted_request_is_named_and_a_failed_request_before_it_does_not_hide_it():
    short = {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}
    out = completion_checks(Outcome(completion_tokens=2), [rec(0, outcome="timeout"), rec(1, tokens=[5], usage=short),
                                                           rec(2, tokens=[5], usage=short)])
    assert out == [Check("completed", False, "2/3 completed; r0: timeout", ("r0",)),
                   Check("token-counts", False, "r1: completion_tokens 1 != 2; r2: completion_tokens 1 != 2",
                         ("r1", "r2"))]


def test_a_refusal_without_a_message_fails_a_message_the_scenario_wants():
    silent = rec(0, outcome="http_error")
    silent.decode = Hop("decode", status=400, error=None)
    assert completion_checks(Outcome(http_status=400, http_message=".+"), [silent]) == [
        Check("completed", False, "0/1 refused by decode with HTTP 400; r0: http_error", ("r0",))]


def test_a_fatal_line_keeps_the_whole_exception_cut_at_200():
    o = obs(fatal_lines={"decode": ["Traceback (most recent call last): -> ValueError: shape a -> b"],
                         "prefill": ["RuntimeError: " + "y" * 300]})
    prefill = ("RuntimeError: " + "y" * 300)[:200]
    assert fatal_log_check(o).detail == f"decode: ValueError: shape a -> b; prefill: {prefill}"


def test_every_unscanned_log_is_named():
    o = obs(fatal_lines={}, unscanned_logs={"prefill": "gone", "decode": "unreadable"})
    assert fatal_log_check(o) == Check("no-fatal-log", None, "not checked: prefill: gone; decode: unreadable")


def test_kv_integrity_reads_the_records_when_a_caller_gives_one_map_only():
    o = obs([rec(0)], kv_integrity_lines={"prefill": [INVALID.format(rid="cmpl-p0"), INVALID.format(rid="X-9")]})
    assert kv_integrity_check(o, answered={"X-9": "w9"}).requests == ("r0",)
    assert kv_integrity_check(o, abandoned={"cmpl-p0": "w0"}).requests == ("r0",)


def test_kv_integrity_and_released_by_d_skip_a_request_prefill_never_answered():
    never = rec(1, outcome="connection_error")
    never.prefill = None
    o = obs([rec(0), never], kv_integrity_lines={"prefill": [INVALID.format(rid="cmpl-p0")]})
    assert kv_integrity_check(o).requests == ("r0",)
    assert lease_release_check(o).ok is True


def test_kv_integrity_names_every_abandoned_request_and_cuts_the_line_at_160():
    recs = [rec(0), rec(1, outcome="timeout"), rec(2, outcome="cancelled")]
    long = INVALID.format(rid="cmpl-p0") + " " + "z" * 100
    o = obs(recs, kv_integrity_lines={"prefill": [long, INVALID.format(rid="cmpl-p2"), INVALID.format(rid="cmpl-p1")]})
    assert kv_integrity_check(o).detail == (
        "1 answered request(s) read KV blocks prefill had released (1 line(s); its lease expired, or an earlier read "
        "of the same params freed them): r0: "
        + long[long.find("Potentially"):][:160] + "; 2 line(s) for requests abandoned by the rig (r1, r2): "
        "lease housekeeping")


def test_parity_states_one_compared_results_tolerance_and_seven_fields_not_compared():
    seven = tuple(f"f{i}" for i in range(7))
    out = parity_check([rec(0)], [ParityResult("equal", max_float_diff=0.0, tolerance=0.5, not_compared=seven)])
    assert out.detail == ("1/1 equal (floats within 0 of the reference, tolerance 0.5); not compared: "
                          "f0, f1, f2, f3, f4, f5 and 1 more")


def test_a_release_line_is_read_from_its_first_character_and_cut_at_200():
    bare = RELEASED.format(rid="cmpl-a")[RELEASED.find("Releasing"):] + " " + "w" * 200
    assert lease_released_ids([bare]) == [("cmpl-a", bare[:200])]

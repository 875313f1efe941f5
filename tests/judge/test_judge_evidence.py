"""Missing or wrong evidence never reads green (rig/judge/verdict.py, rig/judge/checks.py).

Each test builds an observation where one piece of evidence is absent or contradicts the answer,
and asserts the verdict is FAIL or ERROR (never PASS / XFAIL). These were written against the
survivors of `make mutation` (docs/howto/mutation.md): each kills the mutants that would let a scenario
go green without the evidence, by asserting the behaviour, not the line.
"""

from __future__ import annotations

import pytest

from rig.config import CounterRule, Outcome, ScenarioConfig
from rig.judge import checks as ck
from rig.judge import verdict as engine
from rig.judge.verdict import canary_match, decide, judge, required_checks
from rig.observe.observations import TransferEvidence
from rig.observe.parity import ParityResult
from rig.transport.records import Hop, PDRecord
from rig.workload.retrieval import RetrievalResult
from tests.helpers.verdict_records import (
    BLOCKS,
    LIVELOCK,
    checks_of,
    drains,
    error_record,
    obs_of,
    ok_record,
    sc,
    stalled_record,
)

DIVERGED = ParityResult("diverged", 0, 966, 336)


def canary(obs, **kw):
    return judge(sc(tamper="swap-prompt", **kw), obs)


# ------------------------------------------------------------------------- canary

def test_a_canary_caught_but_missing_a_required_check_is_error_not_pass():
    obs = obs_of([ok_record()], parity=[DIVERGED], drains=[])
    v = canary(obs)
    assert v.verdict == "ERROR", (v.verdict, v.reason)
    assert v.reason.startswith("inconclusive: idle-after not checked"), v.reason


def test_a_canary_not_caught_and_missing_a_required_check_is_error_not_pass():
    v = canary(obs_of([ok_record()], drains=[]))
    assert v.verdict == "ERROR" and v.reason.startswith("inconclusive: idle-after not checked"), v.reason


def test_a_canary_catch_does_not_excuse_a_check_the_kind_did_not_produce():
    obs = obs_of([ok_record()], parity=[DIVERGED])
    checks = [c for c in engine.edge_checks(sc(tamper="swap-prompt"), obs) if c.name != "idle-after"]
    exp = engine.expectation_of(sc(tamper="swap-prompt"), obs)
    v = decide("c", checks, exp, canary_match(obs, checks))
    assert v.verdict == "ERROR" and "idle-after not checked: the kind produced no such check" in v.reason


def _rec(outcome: str, hop: str, status: int | None, error: str) -> PDRecord:
    rec = ok_record()
    h = Hop(hop, status=status, error=error)
    if hop == "decode":
        rec.decode = h
    else:
        rec.prefill, rec.decode = h, None
    rec.outcome, rec.diagnosis = outcome, f"{hop}: {error}"
    return rec


@pytest.mark.parametrize("rec", [
    _rec("timeout", "decode", None, "no answer within 20 s"),       # a decode timeout
    _rec("http_error", "decode", None, "ConnectError: refused"),    # a connection error: no status
    _rec("http_error", "prefill", 500, "HTTP 500: boom"),           # an error from the prefill hop
    _rec("timeout", "decode", 504, "HTTP 504: gateway"),            # a status, but not an http_error
], ids=["decode-timeout", "decode-connect-error", "prefill-http-error", "timeout-with-status"])
def test_only_an_http_error_status_from_decode_is_a_canary_catch(rec):
    obs = obs_of([rec], parity=[None])
    m = canary_match(obs, engine.edge_checks(sc(tamper="swap-prompt"), obs))
    assert not m.matched and m.requests == frozenset()
    v = canary(obs)
    assert v.verdict == "FAIL" and v.reason.startswith("canary inconclusive: no real catch"), v.reason


def test_a_divergence_is_a_catch_only_when_answered_and_pulled():
    # answered, diverged, pulled: a catch
    obs = obs_of([ok_record()], parity=[DIVERGED])
    assert canary_match(obs, engine.edge_checks(sc(tamper="swap-prompt"), obs)).matched
    # kv-pulled not checked (D's metrics missing): no request counts as pulled
    obs.missing_metrics["decode"] = ["vllm:nixl_bytes_transferred_sum"]
    checks = engine.edge_checks(sc(tamper="swap-prompt"), obs)
    assert checks_of(type("V", (), {"checks": checks}))["kv-pulled"] is None
    m = canary_match(obs, checks)
    assert not m.matched and "KV not pulled" in m.seen
    assert canary(obs).verdict in ("FAIL", "ERROR")
    # a diverged record that was not answered: no catch
    rec = stalled_record()
    obs = obs_of([rec], parity=[DIVERGED])
    assert not canary_match(obs, engine.edge_checks(sc(tamper="swap-prompt"), obs)).matched


def test_a_canary_catch_on_one_request_does_not_excuse_another_requests_failure():
    obs = obs_of([ok_record(0), ok_record(1, tokens=[1])], parity=[DIVERGED, ParityResult("equal")])
    v = canary(obs)
    assert v.verdict == "FAIL" and v.reason.startswith("token-counts: edge-126-1"), v.reason


# ------------------------------------------------------------------------- the required list

def test_parity_false_drops_only_parity_from_the_required_checks():
    req = required_checks(sc(parity=False))
    assert "parity" not in req
    assert set(req) == set(engine.REQUIRED["edge"]) - {"parity"}
    assert "parity" in required_checks(sc())


def test_parity_false_still_errors_on_missing_evidence():
    v = judge(sc(parity=False), obs_of([ok_record()], drains=[]))
    assert v.verdict == "ERROR" and "idle-after not checked" in v.reason, (v.verdict, v.reason)
    v = judge(sc(parity=False), obs_of([ok_record()]))
    assert v.verdict == "PASS" and "parity" not in checks_of(v)


def test_a_refusal_requires_the_refusal_checks_and_asked_for_ones():
    req = required_checks(sc(require=["counters-monotonic"]), refusal=True)
    assert req == engine.REFUSAL_REQUIRED + ("counters-monotonic",)
    # min_preemptions adds `preempted` only to an answered outcome
    s = sc(expect={"completion_tokens": 2, "total_tokens": 128, "min_preemptions": 1})
    assert "preempted" in required_checks(s) and "preempted" not in required_checks(s, refusal=True)


def test_counter_rules_make_counters_required():
    rule = {"instance": "prefill", "metric": "vllm:nixl_num_kv_expired_reqs_total", "delta": 0}
    s = sc(expect={"completion_tokens": 2, "total_tokens": 128, "counters": [rule]})
    assert "counters" in required_checks(s)
    v = judge(s, obs_of([ok_record()]))  # no timeline: counters not checked, and required
    assert v.verdict == "ERROR" and v.reason.startswith("inconclusive: counters ") and "not checked" in v.reason


# ------------------------------------------------------------------------- kv-pulled

def _ev(**kw) -> TransferEvidence:
    base = dict(nixl_bytes=65536.0, nixl_transfers=1, external_prompt_tokens=126)
    base.update(kw)
    return TransferEvidence(**base)


@pytest.mark.parametrize("ev,ok", [
    (_ev(), True),
    (_ev(nixl_bytes=0), False),  # tokens counted as external but no NIXL byte moved
    (_ev(external_prompt_tokens=125), False),  # one prompt token short: recomputed on D
    (_ev(nixl_transfers=0), False),  # fewer transfers than prompts
    (_ev(external_prompt_tokens=100, cached_prompt_tokens=26), True),  # D's own prefix cache counts
    (_ev(external_prompt_tokens=100, cached_prompt_tokens=25), False),
], ids=["exact", "no-bytes", "token-short", "no-transfer", "cache-exact", "cache-short"])
def test_kv_pulled_needs_bytes_tokens_and_transfers(ev, ok):
    v = judge(sc(), obs_of([ok_record()], evidence=ev))
    assert checks_of(v)["kv-pulled"] is ok
    assert (v.verdict == "PASS") is ok, (v.verdict, v.reason)
    kv = next(c for c in v.checks if c.name == "kv-pulled")
    assert kv.requests == (() if ok else ("edge-126-0",))


def test_kv_pulled_counts_every_prompt_and_every_request():
    recs = [ok_record(0), ok_record(1)]
    assert judge(sc(), obs_of(recs, evidence=_ev(nixl_transfers=2, external_prompt_tokens=252))).verdict == "PASS"
    assert checks_of(judge(sc(), obs_of(recs, evidence=_ev(nixl_transfers=1, external_prompt_tokens=252))))[
        "kv-pulled"] is False
    assert checks_of(judge(sc(), obs_of(recs, evidence=_ev(nixl_transfers=2, external_prompt_tokens=251))))[
        "kv-pulled"] is False


def test_kv_pulled_without_decode_evidence_is_not_checked():
    v = judge(sc(), obs_of([ok_record()], evidence=None))
    kv = next(c for c in v.checks if c.name == "kv-pulled")
    assert kv.ok is None and kv.detail == "not checked: no decode metrics"
    assert v.verdict == "ERROR"


# ------------------------------------------------------------------------- nothing answered

@pytest.mark.parametrize("outcome", ["timeout", "stalled", "http_error", "cancelled"])
def test_nothing_answered_fails_token_counts_parity_and_kv_pulled(outcome):
    rec = PDRecord("edge-126-0", 126, 2, outcome=outcome, diagnosis="no answer")
    v = judge(sc(), obs_of([rec], parity=[None]))
    got = checks_of(v)
    assert got["completed"] is False and got["token-counts"] is False
    assert got["parity"] is False and got["kv-pulled"] is False
    for name in ("token-counts", "parity", "kv-pulled", "completed"):
        c = next(c for c in v.checks if c.name == name)
        assert c.requests == ("edge-126-0",), (name, c)
    assert v.verdict == "FAIL"


def test_no_records_at_all_fails_every_answer_check():
    got = checks_of(judge(sc(), obs_of([])))
    assert got["completed"] is False and got["token-counts"] is False
    assert got["parity"] is False and got["kv-pulled"] is False


# ------------------------------------------------------------------------- token-counts

def _counted(completion: int | None = 2, total: int | None = 128, ids: list[int] | None = None) -> PDRecord:
    rec = ok_record(tokens=ids if ids is not None else [517, 12])
    rec.decode.usage = {"prompt_tokens": 126, "completion_tokens": completion, "total_tokens": total}
    return rec


@pytest.mark.parametrize("rec,why", [
    (_counted(completion=3, ids=[1, 2, 3]), "completion_tokens 3 != 2"),
    (_counted(total=129), "total_tokens 129 != 128"),
    (_counted(ids=[1]), "1 token_ids but usage says 2"),
    (_counted(ids=[1, 2, 3]), "3 token_ids but usage says 2"),
], ids=["completion", "total", "fewer-ids", "more-ids"])
def test_each_token_count_condition_fails_alone(rec, why):
    c = next(c for c in ck.completion_checks(sc().expect, [rec]) if c.name == "token-counts")
    assert c.ok is False and c.detail == f"edge-126-0: {why}" and c.requests == ("edge-126-0",)


def test_token_counts_unset_bounds_are_not_compared_and_a_good_answer_holds():
    out = Outcome(completion_tokens=None, total_tokens=None)
    c = next(c for c in ck.completion_checks(out, [_counted(completion=7, total=300, ids=list(range(7)))])
             if c.name == "token-counts")
    assert c.ok is True
    c = next(c for c in ck.completion_checks(sc().expect, [_counted()]) if c.name == "token-counts")
    assert c.ok is True and c.detail == "as expected (2 + prompt = 128)"
    only = Outcome(completion_tokens=2)
    c = next(c for c in ck.completion_checks(only, [_counted()]) if c.name == "token-counts")
    assert c.ok is True and c.detail == "as expected (2 completion tokens)"


def test_token_counts_fail_names_only_the_miscounted_request_and_skips_unanswered():
    recs = [_counted(), stalled_record(1), _counted(total=129)]
    recs[2].request_id = "edge-126-2"
    c = next(c for c in ck.completion_checks(sc().expect, recs) if c.name == "token-counts")
    assert c.ok is False and c.requests == ("edge-126-2",)


def test_several_prompts_usage_is_compared_per_prompt():
    rec = _counted()
    rec.prompt = [[1] * 60, [2] * 66]
    rec.decode.usage = {"prompt_tokens": 126, "completion_tokens": 2, "total_tokens": 128}
    rec.decode.choices = [{"token_ids": [1]}, {"token_ids": [2]}]
    assert ck.several_prompts_usage(rec) == []
    rec.decode.usage = {"prompt_tokens": 60, "completion_tokens": 2, "total_tokens": 62}
    assert ck.several_prompts_usage(rec) == ["usage.prompt_tokens 60 != 126 (2 prompts)"]
    rec.decode.usage = {"prompt_tokens": 126}
    rec.decode.choices = [{"token_ids": [1]}, {"token_ids": [2]}, {"token_ids": [3]}]
    assert ck.several_prompts_usage(rec) == ["3 choices for 2 prompts"]
    rec.decode.usage = {}
    assert ck.several_prompts_usage(rec) == ["3 choices for 2 prompts"]  # no usage: no usage line


def test_a_refusal_expected_needs_the_status_and_the_message_on_decode():
    out = Outcome(http_status=400, http_message="maximum context length")
    good = error_record(status=400, msg="This model's maximum context length is 128 tokens")
    assert ck.completion_checks(out, [good])[0].ok is True
    for bad in (error_record(status=500, msg="maximum context length"), error_record(status=400, msg="other"),
                error_record(status=400, msg="maximum context length", hop="prefill"), ok_record()):
        c = ck.completion_checks(out, [bad])[0]
        assert c.ok is False and c.requests == (bad.request_id,), bad
    assert ck.completion_checks(out, [])[0].ok is False  # no request: nothing was refused
    assert ck.completion_checks(Outcome(http_status=400), [error_record(status=400, msg="any")])[0].ok is True


# ------------------------------------------------------------------------- parity

def test_parity_missing_reference_is_not_checked_and_a_divergence_wins():
    recs = [ok_record(0), ok_record(1)]
    c = ck.parity_check(recs, [ParityResult("equal"), None])
    assert c.ok is None and c.detail.startswith("not checked: 1/2 equal; no reference for edge-126-1")
    c = ck.parity_check(recs, [DIVERGED, None])
    assert c.ok is False and c.requests == ("edge-126-0",)
    c = ck.parity_check(recs, [ParityResult("equal")])  # a shorter parity list: the rest unreferenced
    assert c.ok is None
    assert ck.parity_check(recs, [ParityResult("equal")] * 2).ok is True


# ------------------------------------------------------------------------- log checks

def test_no_fatal_log_with_no_log_scanned_is_not_checked():
    obs = obs_of([ok_record()], fatal_lines={})
    c = ck.fatal_log_check(obs)
    assert c.ok is None and c.detail == "not checked: no log was scanned"
    v = judge(sc(), obs)
    assert v.verdict == "ERROR" and "no-fatal-log not checked" in v.reason


def test_no_fatal_log_holds_only_when_every_log_was_scanned_clean():
    obs = obs_of([ok_record()])
    assert ck.fatal_log_check(obs).ok is True
    obs.unscanned_logs["decode"] = "log file missing"
    assert ck.fatal_log_check(obs).ok is None
    obs.fatal_lines["prefill"] = ["a -> RuntimeError: x", "b"]
    c = ck.fatal_log_check(obs)  # a fatal line found elsewhere still fails
    assert c.ok is False and c.detail == "prefill: RuntimeError: x (+1 more)"


def test_kv_integrity_without_ps_log_is_not_checked():
    obs = obs_of([ok_record()], kv_integrity_lines={"decode": []})
    c = ck.kv_integrity_check(obs)
    assert c.ok is None and "prefill's log was not scanned" in c.detail
    assert judge(sc(), obs).verdict == "ERROR"


def test_released_by_d_without_ps_log_is_not_checked():
    obs = obs_of([ok_record()], kv_integrity_lines={"decode": []})
    assert ck.lease_release_check(obs).ok is None
    obs = obs_of([ok_record()])
    obs.unscanned_logs["prefill"] = "gone"
    assert ck.lease_release_check(obs).ok is None


def test_idle_after_not_checked_without_gauges_and_failed_when_one_instance_is_busy():
    obs = obs_of([ok_record()])
    obs.missing_metrics["prefill"] = ["vllm:num_requests_running"]
    assert ck.idle_check(obs).ok is None
    obs = obs_of([ok_record()], drains=drains(idle=False))
    c = ck.idle_check(obs)
    assert c.ok is False and c.detail.startswith("decode")


# ------------------------------------------------------------------------- counter_rose / retrieval

def test_a_rising_counter_that_did_not_reach_its_minimum_fails():
    obs = obs_of([ok_record()], evidence=_ev(preemptions=1))
    assert ck.counter_rose_check(obs, "min_preemptions", 1).ok is True
    assert ck.counter_rose_check(obs, "min_preemptions", 2).ok is False
    assert ck.counter_rose_check(obs, "min_preemptions", 1, on="prefill").ok is None  # no prefill evidence
    obs.prefill_evidence = _ev(preemptions=3)
    c = ck.counter_rose_check(obs, "min_preemptions", 2, on="prefill")
    assert c.ok is True and c.detail.startswith("prefill:")
    obs.missing_metrics["decode"] = ["vllm:num_preemptions_total"]
    assert ck.counter_rose_check(obs, "min_preemptions", 1).ok is None


def test_retrieval_check():
    assert ck.retrieval_check(None).ok is None
    assert ck.retrieval_check(RetrievalResult(compared=0)).ok is None
    assert ck.retrieval_check(RetrievalResult(compared=4, pd_hits=3, ref_hits=0)).ok is None  # 3 >= 0 says nothing
    recs = [ok_record(0), ok_record(1)]
    c = ck.retrieval_check(RetrievalResult(records=recs, compared=4, pd_hits=2, ref_hits=3))
    assert c.ok is False and c.requests == ("edge-126-0", "edge-126-1")
    assert c.detail == "P/D 2/4 (50%), reference 3/4 (75%)"
    c = ck.retrieval_check(RetrievalResult(records=recs, compared=4, pd_hits=3, ref_hits=3))
    assert c.ok is True and c.requests == ()


# ------------------------------------------------------------------------- healthy-run counter rule

def _timeline(failed_before: float, failed_after: float) -> list[dict]:
    key = "vllm:nixl_num_failed_transfers_total"
    other = "vllm:nixl_num_kv_expired_reqs_total"
    return [{"instance": i, "life": 1.0, "counters": {key: a, other: 0.0}}
            for i, a in (("prefill", 0.0), ("decode", failed_before), ("prefill", 0.0), ("decode", failed_after))]


def test_healthy_run_with_failed_transfers_fails():
    v = judge(sc(), obs_of([ok_record()], timeline=_timeline(0, 1)))
    assert v.verdict == "FAIL" and v.reason.startswith("nixl-failed-transfers:"), v.reason
    assert judge(sc(), obs_of([ok_record()], timeline=_timeline(0, 0))).verdict == "PASS"


@pytest.mark.parametrize("rule", [
    {"instance": "decode", "metric": "vllm:nixl_num_kv_expired_reqs_total", "delta": 0},  # other metric on D
    {"instance": "prefill", "metric": "vllm:nixl_num_failed_transfers_total", "delta": 0},  # same metric on P
])
def test_a_counter_rule_of_another_metric_or_instance_keeps_the_healthy_rule(rule):
    s = sc(expect={"completion_tokens": 2, "total_tokens": 128, "counters": [rule]})
    v = judge(s, obs_of([ok_record()], timeline=_timeline(0, 2)))
    assert checks_of(v)["nixl-failed-transfers"] is False
    assert v.verdict == "FAIL"


def test_a_rule_of_its_own_on_ds_failed_transfers_replaces_the_healthy_rule():
    rule = {"instance": "decode", "metric": "vllm:nixl_num_failed_transfers_total", "min": 1}
    s = sc(expect={"completion_tokens": 2, "total_tokens": 128, "counters": [rule]})
    v = judge(s, obs_of([ok_record()], timeline=_timeline(0, 2)))
    assert "nixl-failed-transfers" not in checks_of(v) and checks_of(v)["counters"] is True


def test_the_healthy_rule_applies_to_healthy_runs_only():
    obs = obs_of([ok_record()])
    assert engine.healthy_run(sc(), engine.expectation_of(sc(), obs), False)
    assert not engine.healthy_run(sc(), engine.expectation_of(sc(), obs), True)
    t = sc(tamper="swap-prompt")
    assert not engine.healthy_run(t, engine.expectation_of(t, obs), False)
    k = sc(LIVELOCK)
    assert not engine.healthy_run(k, engine.expectation_of(k, obs), False)
    assert "nixl-failed-transfers" not in checks_of(judge(k, obs_of([stalled_record()]), BLOCKS))


def test_counter_rules_check_names_the_rule():
    rule = CounterRule(instance="decode", metric="vllm:nixl_num_failed_transfers_total", delta=0)
    c = engine.counter_checks(sc(), obs_of([ok_record()], timeline=_timeline(0, 0)), sc().expect,
                              engine.expectation_of(sc(), obs_of([ok_record()])), False)
    assert [x.name for x in c] == ["nixl-failed-transfers"] and c[0].ok is True
    assert rule.holds(0) and not rule.holds(1)


def test_a_fault_scenario_is_not_a_healthy_run():
    f = ScenarioConfig(name="f", kind="fault", prompt_tokens=4, max_tokens=2, fault={"faults": [
        {"trigger": {"event": "prefill-answered"}, "target": "prefill", "action": "sigkill"}]})
    obs = obs_of([ok_record()])
    assert not engine.healthy_run(f, engine.expectation_of(f, obs), False)
    assert engine.counter_checks(f, obs, f.expect, engine.expectation_of(f, obs), False) == []


def test_a_run_passes_only_when_every_scenario_passes():
    ok = judge(sc(), obs_of([ok_record()]))
    bad = judge(sc(), obs_of([ok_record()], drains=[]))
    xfail = judge(sc(LIVELOCK), obs_of([stalled_record()]), BLOCKS)
    assert (ok.verdict, bad.verdict, xfail.verdict) == ("PASS", "ERROR", "XFAIL")
    assert engine.run_passed([ok, xfail]) and not engine.run_passed([ok, bad]) and not engine.run_passed([bad, ok])
    assert not engine.run_passed([])


def test_different_versions_on_p_and_d_are_error_for_a_known_issue_and_a_death_still_fails():
    obs = obs_of([stalled_record()], versions={"prefill": "0.31.0", "decode": "0.32.0"})
    v = judge(sc(LIVELOCK), obs, BLOCKS)
    assert v.verdict == "ERROR" and "prefill runs 0.31.0 and decode 0.32.0" in v.reason
    obs = obs_of([stalled_record()], versions={"prefill": "0.32.0+cpu", "decode": "0.32.0"})
    assert judge(sc(LIVELOCK), obs, BLOCKS).verdict == "XFAIL"  # a local part is the same version
    obs = obs_of([stalled_record()], versions={"prefill": "unknown", "decode": "0.32.0"})
    v = judge(sc(LIVELOCK), obs, BLOCKS)
    assert v.verdict == "ERROR" and "the version of prefill is unknown" in v.reason
    obs.dead = {"decode": 1}
    assert judge(sc(LIVELOCK), obs, BLOCKS).verdict == "FAIL"


def test_retrieval_check_names_and_boundaries():
    recs = [ok_record(0)]
    c = ck.retrieval_check(None)
    assert (c.name, c.detail) == ("retrieval", "not checked: the retrieval workload did not run")
    c = ck.retrieval_check(RetrievalResult(records=recs, compared=1, pd_hits=0, ref_hits=1))
    assert (c.name, c.ok) == ("retrieval", False)  # one compared request is enough to judge
    c = ck.retrieval_check(RetrievalResult(records=recs, compared=2, pd_hits=0, ref_hits=0))
    assert c.name == "retrieval" and c.detail == ("not checked: the reference retrieved nothing to compare with; "
                                                  "P/D 0/2 (0%), reference 0/2 (0%)")


RELEASE = "Releasing expired KV blocks for request {rid} which were retrieved by 0 remote worker(s)"


def test_a_lease_release_line_is_found_wherever_the_phrase_starts():
    assert ck.lease_released_ids([RELEASE.format(rid="cmpl-p-0")]) == [("cmpl-p-0", RELEASE.format(rid="cmpl-p-0"))]
    assert ck.lease_released_ids(["W 12-01 " + RELEASE.format(rid="x")])[0][0] == "x"
    assert ck.lease_released_ids(["unrelated", "Releasing expired KV blocks for request "]) == []


def test_released_by_d_fails_on_an_answered_request_and_skips_a_record_without_prefill_hop():
    obs = obs_of([ok_record(0)])
    obs.kv_integrity_lines["prefill"] = [RELEASE.format(rid="cmpl-p-0")]
    c = ck.lease_release_check(obs)
    assert (c.name, c.ok, c.requests) == ("released-by-d", False, ("edge-126-0",))
    assert c.detail.startswith("1 block set(s) of answered requests held until the lease expired: edge-126-0: "
                               "Releasing expired KV blocks for request cmpl-p-0")
    no_hop = PDRecord("edge-126-1", 126, 2, outcome="ok")
    obs = obs_of([no_hop, ok_record(0)])
    obs.kv_integrity_lines["prefill"] = []
    c = ck.lease_release_check(obs)
    assert (c.name, c.ok) == ("released-by-d", True)
    assert c.detail == "no answered request's blocks (or a sibling's) waited for the lease"
    obs.unscanned_logs["prefill"] = "gone"
    c = ck.lease_release_check(obs)
    assert (c.name, c.ok, c.detail) == ("released-by-d", None, "not checked: prefill's log was not scanned")


@pytest.mark.parametrize("rid,parent,index", [
    ("0_cmpl-aa07-1-9dd92fdc", "cmpl-aa07", 1),
    ("cmpl-aa07-0-9dd92fdc", "cmpl-aa07", 0),
    ("req_with_underscores", "req_with_underscores", None),  # not a parallel-sampling child
    ("0_req_x", "req_x", None),
    ("12_", "12_", None),
    ("chatcmpl-aa07-0-9dd92fdc", "chatcmpl-aa07-0-9dd92fdc", None),  # only completions ids carry the suffix
])
def test_parent_request_id_and_prompt_index(rid, parent, index):
    assert ck.parent_request_id(rid) == parent
    assert ck.prompt_index(rid) == index


def test_preemption_check_is_the_min_preemptions_counter():
    obs = obs_of([ok_record()], evidence=_ev(preemptions=2))
    c = ck.preemption_check(obs, 2)
    assert (c.name, c.ok) == ("preempted", True) and c.detail.startswith("decode: vllm:num_preemptions_total +2")
    assert ck.preemption_check(obs, 3).ok is False


def test_canary_match_without_a_kv_pulled_check_and_with_given_requests():
    from rig.judge.signatures import RequestFacts
    obs = obs_of([ok_record()], parity=[DIVERGED])
    m = canary_match(obs, [])  # no kv-pulled check at all: nothing is known unpulled
    assert m.matched and m.seen == "parity"
    given = [RequestFacts("other-0", "http_error", 126, hop="decode", status=400, error="HTTP 400: bad")]
    m = canary_match(obs, [], given)
    assert m.requests == frozenset({"other-0"}) and m.seen == "decode HTTP 400: HTTP 400: bad"
    m = canary_match(obs_of([stalled_record()], parity=[DIVERGED]), [])
    assert not m.matched and m.seen == "edge-126-0: stalled, parity diverged"
    assert m.expected == "a divergence on an answered request whose KV was pulled, or an HTTP error from D"


def test_a_canary_catch_explains_the_kv_integrity_line_of_the_caught_request():
    from tests.helpers.verdict_records import EXPIRED
    obs = obs_of([ok_record()], parity=[DIVERGED])
    obs.kv_integrity_lines["prefill"] = [EXPIRED.format(rid="cmpl-p-0")]
    v = canary(obs)
    assert checks_of(v)["kv-integrity"] is False and v.verdict == "PASS", v.reason


def test_spec_drafted_reads_decode_even_when_preemptions_are_read_on_prefill():
    s = sc(expect={"completion_tokens": 2, "total_tokens": 128, "min_preemptions": 1, "min_preemptions_on": "prefill",
                   "min_spec_drafts": 1})
    obs = obs_of([ok_record()], evidence=_ev(spec_drafts=3), prefill_evidence=_ev(preemptions=2))
    got = {c.name: c for c in engine.edge_checks(s, obs)}
    assert got["spec-drafted"].ok is True and got["spec-drafted"].detail.startswith("decode:")
    assert got["preempted"].ok is True and got["preempted"].detail.startswith("prefill:")


def test_an_uncaught_canary_says_what_each_request_showed():
    obs = obs_of([ok_record(0), stalled_record(1)], parity=[ParityResult("equal"), None],
                 evidence=TransferEvidence(nixl_bytes=0, nixl_transfers=0, external_prompt_tokens=0))
    m = canary_match(obs, engine.edge_checks(sc(tamper="swap-prompt"), obs))
    assert m.seen == "edge-126-0: ok, KV not pulled, parity equal; edge-126-1: stalled"
    v = judge(sc(), obs_of([], evidence=_ev(nixl_bytes=0)))
    assert v.reason.startswith("completed: 0/0 completed; token-counts: no answer to count; kv-pulled: no answered "
                               "request to show where its prompt came from")


def test_a_versioned_outcome_with_ds_version_unknown_is_error_and_a_death_still_fails():
    s = sc(expect={"completion_tokens": 1, "total_tokens": 128, "by_version": [
        {"vllm": "<0.31", "http_status": 400, "note": "older decodes refuse"}]})
    obs = obs_of([ok_record()], versions={"prefill": "0.32.0"}, vllm_version="unknown")
    v = judge(s, obs)
    assert (v.verdict, v.scenario) == ("ERROR", "edge-126")
    assert v.reason == ("the expected outcome depends on the vLLM version (<0.31) and decode's version is unknown")
    assert v.expectation == "pass" and v.checks == []
    obs.error = "rig: metrics unavailable"
    assert judge(s, obs).reason == "rig: metrics unavailable"
    obs.error, obs.dead = "", {"decode": 1}
    assert judge(s, obs).verdict == "FAIL"

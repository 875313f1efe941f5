"""cached-tokens (bug record R15) and ``require``: D reporting a pulled prompt as cached fails on that
request; P's real hits and D's own local hits are allowed; no details is "not checked", which
fails a scenario that requires the check."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rig.config import ScenarioConfig
from rig.judge.cached_tokens import NAME, cached_of, cached_tokens_check, cached_tokens_seen
from rig.judge.verdict import judge, required_checks
from rig.observe.observations import ScenarioObservation
from rig.observe.parity import ParityResult
from rig.run.kinds import KINDS
from rig.transport.records import PDRecord
from tests.helpers.cached_tokens import obs96, with_cached
from tests.helpers.verdict_records import ok_record


def test_cached_of_reads_prompt_tokens_details():
    assert cached_of({"prompt_tokens": 96, "prompt_tokens_details": {"cached_tokens": 64}}) == 64
    assert cached_of({"prompt_tokens": 96}) is None and cached_of(None) is None
    assert cached_of({"prompt_tokens_details": None}) is None


def test_d_claiming_the_pulled_prompt_as_cached_fails_on_that_request():
    good = with_cached(ok_record(0, n=96), 0, 0)
    bad = with_cached(ok_record(1, n=96), 0, 95)
    c = cached_tokens_check(obs96(good, bad))
    assert c.ok is False and c.requests == ("edge-126-1",)
    assert "edge-126-1: P 0, D 95 of 96" in c.detail


def test_p_hits_and_d_local_hits_bound_what_d_may_report():
    assert cached_tokens_check(obs96(with_cached(ok_record(0, n=96), 64, 64))).ok is True
    # D's own prefix cache: 32 local hits allow P's 0 + 32
    assert cached_tokens_check(obs96(with_cached(ok_record(0, n=96), 0, 32), local_hits=32)).ok is True
    assert cached_tokens_check(obs96(with_cached(ok_record(0, n=96), 0, 33), local_hits=32)).ok is False


def test_no_details_or_no_evidence_is_not_checked():
    c = cached_tokens_check(obs96(with_cached(ok_record(0, n=96), None, 95)))
    assert c.ok is None and "--enable-prompt-tokens-details" in c.detail
    obs = obs96(with_cached(ok_record(0, n=96), 0, 0))
    obs.evidence = None
    assert cached_tokens_check(obs).ok is None
    assert cached_tokens_check(ScenarioObservation("s", "decode", "prefill")).ok is None


def edge96(**kw) -> ScenarioConfig:
    return ScenarioConfig(name="edge-126", decode="decode", prompt_tokens=96, max_tokens=2,
                          expect={"completion_tokens": 2, "total_tokens": 98}, **kw)


def test_require_makes_the_check_required_and_a_gap_is_error():
    sc = edge96(require=["cached-tokens"])
    assert "cached-tokens" in required_checks(sc) and "cached-tokens" not in required_checks(edge96())
    judge_edge = KINDS["edge"].judge
    v = judge_edge(sc, obs96(ok_record(0, n=96)), None)  # no details on either hop
    assert v.verdict == "ERROR" and "cached-tokens not checked" in v.reason
    v = judge_edge(sc, obs96(with_cached(ok_record(0, n=96), 0, 0)), None)
    assert v.verdict == "PASS", v.reason
    v = judge_edge(sc, obs96(with_cached(ok_record(0, n=96), 0, 96)), None)
    assert v.verdict == "FAIL" and "cached-tokens" in v.reason
    # without require the check does not run, even where a hop reports details: bug record R15 asks for an
    # informational verdict, and on 0.28.0 every P/D answer over-reports (docs/howto/regressions.md)
    v = judge_edge(edge96(), obs96(with_cached(ok_record(0, n=96), 0, 96)), None)
    assert v.verdict == "PASS" and all(c.name != "cached-tokens" for c in v.checks)


def test_require_validation_names_the_field():
    with pytest.raises(ValidationError, match="require: cached-tokens is judged by kind edge only"):
        ScenarioConfig(name="w", kind="pressure-wave", prompt_tokens=8, max_tokens=2,
                       wave={"requests": 2, "concurrency": 1}, require=["cached-tokens"])
    with pytest.raises(ValidationError):
        edge96(require=["no-such-check"])
    assert "counters-monotonic" in required_checks(edge96(require=["counters-monotonic"]))
    assert judge(edge96(require=["counters-monotonic"]), obs96(ok_record(0, n=96))).verdict == "ERROR"


def r15_issue(**sig) -> dict:
    return {"id": "d-counts-pulled-as-cached", "title": "D reports the pulled prompt as cached",
            "affects": ">=0.28.0,<0.29", "symptom": {"kind": "wrong-metrics", "check": "cached-tokens", **sig}}


def test_wrong_metrics_known_issue_excuses_the_overcount_on_the_requests_that_show_it():
    judge_edge = KINDS["edge"].judge
    sc = edge96(require=["cached-tokens"], known_issue=r15_issue())
    # the 0.28.0 symptom: D 96 of 96 cached while P hit 0 -> XFAIL naming the request
    v = judge_edge(sc, obs96(with_cached(ok_record(0, n=96), 0, 96), version="0.28.0"), None)
    assert v.verdict == "XFAIL" and "edge-126-0: D cached_tokens 96 of 96" in v.reason, v.reason
    # a small overcount is another bug: the signature (>= 90 % of the prompt) does not match
    v = judge_edge(sc, obs96(with_cached(ok_record(0, n=96), 0, 40), version="0.28.0"), None)
    assert v.verdict == "FAIL" and "not known issue d-counts-pulled-as-cached" in v.reason, v.reason
    # the symptom excuses cached-tokens only: a divergence on the same request stays FAIL
    bad = with_cached(ok_record(0, n=96), 0, 96)
    v = judge_edge(sc, obs96(bad, version="0.28.0", parity=[ParityResult("diverged", 0, 7, 517)]), None)
    assert v.verdict == "FAIL", v.reason
    # a build where D reports honestly: XPASS (strict), so the range gets updated
    v = judge_edge(sc, obs96(with_cached(ok_record(0, n=96), 0, 0), version="0.28.0"), None)
    assert v.verdict == "XPASS", v.reason
    # outside affects: a plain FAIL that names the known issue as a candidate
    v = judge_edge(sc, obs96(with_cached(ok_record(0, n=96), 0, 96), version="0.32.0"), None)
    assert v.verdict == "FAIL" and "outside its declared range" in v.reason, v.reason


def test_wrong_metrics_signature_validation():
    with pytest.raises(ValidationError, match="check"):
        edge96(known_issue=r15_issue(check="no-such-check"))
    with pytest.raises(ValidationError, match="min_cached_share"):
        edge96(known_issue=r15_issue(min_cached_share=1.5))


# -------------------------------------------------------------------------------------------------
# cached-tokens details as the user reads them (rig/judge/cached_tokens.py): the check keeps its
# name when it cannot look, and the detail lists the first three requests it judged, '; '-separated.
# Written against `make mutation` survivors (docs/howto/mutation.md).

def test_not_checked_without_details_keeps_the_checks_name():
    c = cached_tokens_check(obs96(with_cached(ok_record(0, n=96), None, None)))
    assert (c.name, c.ok) == (NAME, None) == ("cached-tokens", None)


def test_an_overcount_names_the_first_three_overcounted_requests_and_flags_all():
    recs = [with_cached(ok_record(i, n=96), 0, 90 + i) for i in range(4)]
    c = cached_tokens_check(obs96(*recs))
    assert c.ok is False and c.requests == ("edge-126-0", "edge-126-1", "edge-126-2", "edge-126-3")
    assert c.detail == ("D reports more cached prompt tokens than P's hits + D's 0 local hit(s): "
                        "edge-126-0: P 0, D 90 of 96; edge-126-1: P 0, D 91 of 96; edge-126-2: P 0, D 92 of 96")


def test_a_holding_check_shows_the_first_three_requests_it_judged():
    recs = [with_cached(ok_record(i, n=96), 10 + i, 10 + i) for i in range(4)]
    c = cached_tokens_check(obs96(*recs))
    assert c.ok is True
    assert c.detail == ("D's cached_tokens within P's hits + D's 0 local hit(s): "
                        "edge-126-0: P 10, D 10 of 96; edge-126-1: P 11, D 11 of 96; edge-126-2: P 12, D 12 of 96")


# -------------------------------------------------------------------------------------------------
# cached-tokens over every answered request, whatever comes first (rig/judge/cached_tokens.py):
# an unanswered request or one without a prefill hop is skipped, not the end of the look; the share
# is of D's usage.prompt_tokens. Written against `make mutation` survivors (docs/howto/mutation.md).

def test_an_unanswered_request_first_does_not_hide_a_later_overcount():
    first = with_cached(ok_record(0, n=96), 0, 0)
    first.outcome, first.diagnosis = "timeout", "no answer"
    over = with_cached(ok_record(1, n=96), 0, 95)
    c = cached_tokens_check(obs96(first, over))
    assert c.ok is False and c.requests == ("edge-126-1",)
    assert c.detail == ("D reports more cached prompt tokens than P's hits + D's 0 local hit(s): "
                        "edge-126-1: P 0, D 95 of 96")


def test_records_without_a_hop_are_skipped():
    no_p = with_cached(ok_record(0, n=96), None, 95)
    no_p.prefill = None
    no_d = PDRecord("edge-126-1", 96, 2, outcome="ok", prefill=ok_record(1, n=96).prefill)
    good = with_cached(ok_record(2, n=96), 10, 10)
    assert [c.record.request_id for c in cached_tokens_seen(obs96(no_p, no_d, good))] == ["edge-126-2"]
    c = cached_tokens_check(obs96(no_p, no_d, good))
    assert c.ok is True
    assert c.detail == "D's cached_tokens within P's hits + D's 0 local hit(s): edge-126-2: P 10, D 10 of 96"


def test_the_prompt_is_ds_usage_prompt_tokens_else_the_prompt_length():
    rec = with_cached(ok_record(0, n=96), 0, 0)
    rec.decode.usage["prompt_tokens"] = 110  # a chat template's tokens
    assert cached_tokens_seen(obs96(rec))[0].prompt == 110
    del rec.decode.usage["prompt_tokens"]
    assert cached_tokens_seen(obs96(rec))[0].prompt == 96


def test_no_measurement_of_ds_local_hits_is_not_checked():
    obs = obs96(with_cached(ok_record(0, n=96), 0, 95))
    obs.evidence = None
    c = cached_tokens_check(obs)
    assert (c.name, c.ok) == ("cached-tokens", None)
    assert c.detail == "not checked: D's prompt_tokens_by_source (local_cache_hit) was not measured"

"""cached-tokens over every answered request, whatever comes first (rig/judge/cached_tokens.py):
an unanswered request or one without a prefill hop is skipped, not the end of the look; the share
is of D's usage.prompt_tokens. Written against `make mutation` survivors (docs/howto/mutation.md)."""

from __future__ import annotations

from rig.judge.cached_tokens import cached_tokens_check, cached_tokens_seen
from rig.transport.records import PDRecord
from test_cached_tokens import obs96, with_cached
from test_verdict import ok_record


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

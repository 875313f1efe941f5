"""cached-tokens details as the user reads them (rig/judge/cached_tokens.py): the check keeps its
name when it cannot look, and the detail lists the first three requests it judged, '; '-separated.
Written against `make mutation` survivors (docs/howto/mutation.md)."""

from __future__ import annotations

from rig.judge.cached_tokens import NAME, cached_tokens_check
from test_cached_tokens import obs96, with_cached
from test_verdict import ok_record


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

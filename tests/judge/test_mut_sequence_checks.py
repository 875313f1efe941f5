"""Sequence checks where `make mutation` found the evidence unpinned (rig/judge/sequence_checks.py):
the token-counts detail a user reads lists the first six miscounted requests, each with its counts,
separated, and says how many more there were."""

from __future__ import annotations

from rig.judge.sequence_checks import token_counts_check
from test_sequence_checks import HEAD, answered, run, scen


def test_the_token_counts_detail_lists_the_first_six_miscounted_requests_apart():
    recs = [answered(f"h{i}", 31, 4) for i in range(8)]
    obs, res = run(recs, {f"h{i}": ("head", "decode") for i in range(8)})
    c = token_counts_check(scen(HEAD).sequence, obs, res)
    assert c.ok is False and c.requests == tuple(f"h{i}" for i in range(8))
    six = "; ".join(f"h{i}: usage prompt/completion 31/4, expected 32/4" for i in range(6))
    assert c.detail == six + "; and 2 more"
    obs, res = run(recs[:6], {f"h{i}": ("head", "decode") for i in range(6)})
    assert not token_counts_check(scen(HEAD).sequence, obs, res).detail.endswith("more")


def test_one_miscounted_request_beyond_the_six_is_counted():
    recs = [answered(f"h{i}", 31, 4) for i in range(7)]
    obs, res = run(recs, {f"h{i}": ("head", "decode") for i in range(7)})
    assert token_counts_check(scen(HEAD).sequence, obs, res).detail.endswith("expected 32/4; and 1 more")

"""Token-by-token parity of a P/D answer with its non-disaggregated reference."""

from __future__ import annotations

from rig.observe.parity import ParityResult, compare, summarize


def test_equal():
    r = compare([517, 12, 9], [517, 12, 9], 3, 3)
    assert r == ParityResult("equal")
    assert r.describe() == "equal" and r.position is None


def test_diverged_at_k_with_tokens():
    r = compare([517, 13, 9], [517, 12, 9], 3, 3)
    assert (r.status, r.position, r.pd_token, r.ref_token) == ("diverged", 1, 13, 12)
    assert r.describe() == "diverged at 1: 13 != 12"


def test_diverged_at_first_token():
    r = compare([1, 2], [3, 2], 2, 2)
    assert r.position == 0 and r.describe() == "diverged at 0: 1 != 3"


def test_only_first_divergence_is_reported():
    r = compare([1, 9, 9, 9], [1, 2, 3, 4], 4, 4)
    assert (r.position, r.pd_token, r.ref_token) == (1, 9, 2)


def test_length_mismatch_pd_shorter():
    r = compare([517], [517, 12], 2, 2)
    assert (r.status, r.position, r.pd_token, r.ref_token) == ("diverged", 1, None, 12)
    assert r.describe() == "diverged at 1: None != 12"


def test_length_mismatch_reference_shorter():
    r = compare([517, 12, 4], [517, 12], 3, 3)
    assert (r.status, r.position, r.pd_token, r.ref_token) == ("diverged", 2, 4, None)


def test_empty_against_tokens():
    assert compare([], [5], 1, 1).position == 0
    assert compare([], [], 1, 1).status == "equal"


def test_refused_for_different_max_tokens():
    r = compare([517, 12], [517, 12], 2, 3)
    assert r.status == "refused" and r.position is None
    assert r.reason == "max_tokens differ (P/D 2, reference 3)"
    assert r.describe() == "refused: max_tokens differ (P/D 2, reference 3)"
    # Refused even when the tokens differ: a comparison under different caps means nothing.
    assert compare([1], [2], 1, 2).status == "refused"


def test_to_json():
    assert compare([1, 2], [1, 3], 2, 2).to_json() == {
        "status": "diverged", "position": 1, "pd_token": 2, "ref_token": 3, "reason": "",
        "choice": None}


def test_summarize():
    results = [compare([1], [1], 1, 1), compare([1], [2], 1, 1), compare([1], [1], 1, 2), None,
               compare([4, 5], [4, 5], 2, 2)]
    assert summarize(results) == {"compared": 3, "equal": 2, "diverged": 1, "refused": 1}
    assert summarize([]) == {"compared": 0, "equal": 0, "diverged": 0, "refused": 0}

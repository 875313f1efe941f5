"""Parity without servers (rig/observe/parity.py): a reference that failed, answered without token
IDs or ran out of time is never a comparison; choices are compared one by one; a missing or extra
choice is a divergence. Written against `make mutation` survivors (docs/howto/mutation.md)."""

from __future__ import annotations

import asyncio

import pytest

from rig.observe.parity import (
    DEFAULT_TOLERANCE,
    ParityCase,
    ParityResult,
    compare,
    compare_choices,
    compare_hops,
    record_parity,
    run_parity,
    summarize,
)
from rig.transport.records import Hop, PDRecord

# What run_parity returns for equal answers without other fields: the tolerance it compared with.
EQUAL = ParityResult("equal", tolerance=DEFAULT_TOLERANCE)


def hop(tokens=None, choices=None, error="") -> Hop:
    return Hop("ref", status=200 if not error else 500, token_ids=tokens, choices=choices, error=error)


def ref_of(h: Hop, delay: float = 0.0):
    async def reference() -> Hop:
        await asyncio.sleep(delay)
        return h
    return reference


def test_compare_choices_per_choice_and_counts():
    assert compare_choices([[1, 2], [3, 4]], [[1, 2], [3, 4]], 2, 2) == ParityResult("equal")
    r = compare_choices([[1, 2], [3, 5]], [[1, 2], [3, 4]], 2, 2)
    assert (r.status, r.position, r.pd_token, r.ref_token, r.choice, r.reason) == ("diverged", 1, 5, 4, 1, "choice 1")
    assert r.describe() == "diverged at choice 1: 1: 5 != 4"
    r = compare_choices([[1, 2]], [[1, 2], [3, 4]], 2, 2)
    assert (r.status, r.reason, r.choice) == ("diverged", "1 choices, reference 2", None)
    assert r.describe() == "diverged: 1 choices, reference 2"
    r = compare_choices([[1]], [[1]], 2, 3)
    assert (r.status, r.reason, r.choice) == ("refused", "choice 0: max_tokens differ (P/D 2, reference 3)", 0)


def test_compare_hops_uses_choices_when_either_side_has_them():
    assert compare_hops(hop([1, 2]), hop([1, 2]), 2, 2).status == "equal"
    assert compare_hops(hop([1, 2]), hop([1, 3]), 2, 2).position == 1
    # one side with choices: the other's token_ids are its one choice
    r = compare_hops(hop([1, 2]), hop(choices=[[1, 2], [5, 6]]), 2, 2)
    assert r.status == "diverged" and r.reason == "1 choices, reference 2"
    assert compare_hops(hop(choices=[[1, 2]]), hop([1, 2]), 2, 2).status == "equal"
    assert compare_hops(hop(None), hop([1]), 1, 1).position == 0


def test_summarize_counts_refused_apart():
    s = summarize([ParityResult("equal"), ParityResult("diverged", 0), ParityResult("refused"), None])
    assert s == {"compared": 2, "equal": 1, "diverged": 1, "refused": 1}


def test_run_parity_never_compares_a_failed_reference():
    cases = [ParityCase(hop([1, 2]), 2, ref_of(hop([1, 2]))),
             ParityCase(hop([1, 2]), 2, ref_of(hop(error="HTTP 500: boom"))),
             ParityCase(hop([1, 2]), 2, ref_of(hop(None))),
             None,
             ParityCase(hop([1, 2]), 2, ref_of(hop([1, 2]), delay=5.0)),
             ParityCase(hop([1, 2]), 2, ref_of(hop([1, 3])))]
    out = asyncio.run(run_parity(cases, concurrency=2, timeout_s=0.5))
    assert out[0] is not None and out[0].result == EQUAL and out[0].hop is not None
    assert out[1] is not None and out[1].result is None and out[1].failure == "HTTP 500: boom"
    assert out[2] is not None and out[2].result is None and out[2].failure == "no token_ids"
    assert out[3] is None
    assert out[4] is not None and out[4].result is None and out[4].failure == "timeout: deadline" and out[4].hop is None
    assert out[5] is not None and out[5].result is not None and out[5].result.position == 1


def test_run_parity_concurrency():
    with pytest.raises(ValueError, match="parity concurrency must be >= 1 \\(got 0\\)"):
        asyncio.run(run_parity([], concurrency=0))
    running, peak = 0, 0

    def case():
        async def reference() -> Hop:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1
            return hop([1])
        return ParityCase(hop([1]), 1, reference)
    asyncio.run(run_parity([case() for _ in range(6)], concurrency=1))
    assert peak == 1
    asyncio.run(run_parity([case() for _ in range(6)], concurrency=3))
    assert peak == 3


def test_record_parity_compares_answered_records_and_names_a_failed_reference():
    ok = PDRecord("r0", 4, 2, outcome="ok", decode=Hop("decode", status=200, token_ids=[1, 2]))
    bad_ref = PDRecord("r1", 4, 2, outcome="ok", decode=Hop("decode", status=200, token_ids=[1, 2]))
    timeout = PDRecord("r2", 4, 2, outcome="timeout", decode=Hop("decode", status=200, token_ids=[1]))
    no_hop = PDRecord("r3", 4, 2, outcome="ok")

    async def reference(rec: PDRecord) -> Hop:
        return hop([1, 2]) if rec.request_id == "r0" else hop(error="ConnectError")
    out = asyncio.run(record_parity([ok, bad_ref, timeout, no_hop], reference))
    assert out == [EQUAL, None, None, None]
    assert bad_ref.diagnosis == "parity reference failed: ConnectError"
    assert ok.diagnosis == "" and timeout.diagnosis == ""


def test_compare_length_and_cap():
    assert compare([1], [1, 2], 2, 2) == ParityResult("diverged", 1, None, 2)
    assert compare([], [], 2, 2).status == "equal"
    assert ParityResult("refused", reason="x").describe() == "refused: x"
    assert ParityResult("equal").describe() == "equal"


def test_one_at_a_time_a_failed_reference_does_not_end_the_others():
    cases = [ParityCase(hop([1]), 1, ref_of(hop(error="boom"))), ParityCase(hop([1]), 1, ref_of(hop(None))),
             ParityCase(hop([1]), 1, ref_of(hop([1]), delay=1.0)), ParityCase(hop([1]), 1, ref_of(hop([1])))]
    out = asyncio.run(run_parity(cases, concurrency=1, timeout_s=0.2))
    assert [o.failure if o else None for o in out] == ["boom", "no token_ids", "timeout: deadline", ""]
    assert out[0] is not None and out[0].hop is not None and out[0].hop.error == "boom"
    assert out[3] is not None and out[3].result == EQUAL


def test_record_parity_asks_one_reference_at_a_time():
    running, peak = 0, 0

    async def reference(rec: PDRecord) -> Hop:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return hop([1, 2])
    recs = [PDRecord(f"r{i}", 4, 2, outcome="ok", decode=Hop("decode", status=200, token_ids=[1, 2]))
            for i in range(4)]
    assert asyncio.run(record_parity(recs, reference)) == [EQUAL] * 4 and peak == 1


def test_a_token_answer_against_one_reference_choice_is_compared():
    assert compare_hops(hop([1, 2]), hop(choices=[[1, 2]]), 2, 2).status == "equal"
    assert compare_hops(hop(choices=[[1, 2]]), hop([1, 3]), 2, 2).status == "diverged"

"""The per-request baseline (rig/workload/baseline.py): the median of timed P/D round trips, each
the prefill hop then the decode hop with P's kv_transfer_params; a failed round trip leaves None
with the reason. In-process: a stub transport whose hops sleep a given time."""

from __future__ import annotations

import asyncio

import pytest

from rig.transport.endpoint import Endpoint
from rig.transport.records import Hop, HopFailure
from rig.workload.baseline import MAX_TOKENS, PROMPT_TOKENS, measure_baseline

P, D = Endpoint("prefill", "http://p"), Endpoint("decode", "http://d")


class Stub:
    """Hops that take ``delays_s[k]`` seconds (prefill and decode half each) on round trip k;
    ``fail`` maps a round trip (0-based) to the hop that fails there."""

    def __init__(self, delays_s: list[float], fail: dict[int, str] | None = None):
        self.delays_s, self.fail = delays_s, fail or {}
        self.calls: list[tuple[str, int, int | None, dict | None]] = []
        self.k = 0

    async def prefill(self, ep, prompt, **kw):
        self.calls.append(("prefill", len(prompt), None, None))
        await asyncio.sleep(self.delays_s[self.k] / 2)
        if self.fail.get(self.k) == "prefill":
            return Hop(ep.name).fail(HopFailure.HTTP_ERROR, "HTTP 500: EngineCore encountered an issue")
        if self.fail.get(self.k) == "no-ktp":
            return Hop(ep.name, status=200, token_ids=[1])
        return Hop(ep.name, status=200, token_ids=[1], kv_transfer_params={"remote_block_ids": [self.k]})

    async def decode(self, ep, prompt, max_tokens, ktp, **kw):
        self.calls.append(("decode", len(prompt), max_tokens, ktp))
        await asyncio.sleep(self.delays_s[self.k] / 2)
        k, self.k = self.k, self.k + 1
        if self.fail.get(k) == "decode":
            return Hop(ep.name).fail(HopFailure.TIMEOUT, "timeout after 20 s")
        return Hop(ep.name, status=200, token_ids=[5] * max_tokens)


def test_the_baseline_is_the_median_round_trip_through_both_hops():
    stub = Stub([0.05, 0.30, 0.10])
    b = asyncio.run(measure_baseline(stub, P, D))
    assert b.error == "" and len(b.round_trips_s) == 3
    # the median, not the mean: the one slow round trip (0.30 s) does not move it
    assert b.seconds == sorted(b.round_trips_s)[1]
    assert 0.10 <= b.seconds < 0.16, b.round_trips_s
    assert b.round_trips_s[1] >= 0.30
    # each round trip: a short prompt to P, then D with P's kv_transfer_params and max_tokens
    assert [c[0] for c in stub.calls] == ["prefill", "decode"] * 3
    assert {c[1] for c in stub.calls} == {PROMPT_TOKENS}
    assert [c[3] for c in stub.calls if c[0] == "decode"] == [{"remote_block_ids": [k]} for k in range(3)]
    assert {c[2] for c in stub.calls if c[0] == "decode"} == {MAX_TOKENS}
    assert "median of 3 P/D round trips prefill -> decode" in b.method


@pytest.mark.parametrize(("hop", "error"), [
    ("decode", "round trip 2 of 3: decode: timeout after 20 s"),
    ("prefill", "round trip 2 of 3: prefill: HTTP 500: EngineCore encountered an issue"),
    ("no-ktp", "round trip 2 of 3: prefill answered HTTP 200 without kv_transfer_params"),
])
def test_a_failed_round_trip_leaves_no_baseline_and_says_why(hop, error):
    stub = Stub([0.02, 0.02, 0.02], fail={1: hop})
    b = asyncio.run(measure_baseline(stub, P, D))
    assert b.seconds is None
    assert b.error.startswith(error), b.error
    assert len(b.round_trips_s) == 1  # the one before the failure; the third is never sent
    assert len([c for c in stub.calls if c[0] == "prefill"]) == 2


def test_no_round_trips_is_refused():
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        asyncio.run(measure_baseline(Stub([]), P, D, rounds=0))

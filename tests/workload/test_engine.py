"""The wave engine against the fake vLLM (tests/fake_vllm.py): error classes, cancellation
points and their timing, deadlines, parity, the two HTTP clients."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from rig.observe import metrics as m
from rig.transport.client import CLIENTS, make_transport
from rig.transport.endpoint import Endpoint
from rig.transport.records import WaveRecordLine
from rig.workload.engine import CANCEL_POINTS, WaveEngine, WaveRequest, plan_cancels
from rig.workload.prompts import make_prompt
from tests.helpers.fake_pd import MODEL, fake_pd, free_port


def reqs(n: int, prompt_tokens: int = 24, max_tokens: int = 4, stream: bool = False, cancel_at=None,
         keep_tokens: bool = False, seed: int = 0) -> list[WaveRequest]:
    return [WaveRequest(i, f"r{i}", make_prompt(prompt_tokens, seed * 100003 + i), max_tokens, stream=stream,
                        cancel_at=cancel_at, keep_tokens=keep_tokens) for i in range(n)]


async def run(p: Endpoint, d: Endpoint, requests: list[WaveRequest], client: str = "aiohttp", concurrency: int = 8,
              deadline_s: float = 10.0, cancel_after_s: float = 0.005, parity: bool = False):
    tr = make_transport(client, MODEL, deadline_s, 2 * concurrency)
    eng = WaveEngine(tr, [p], [d], concurrency, deadline_s, cancel_after_s)
    try:
        recs = await eng.run(requests)
        par = await eng.parity(recs, requests) if parity else None
    finally:
        await tr.aclose()
    return recs, eng, par


async def scrape(ep: Endpoint) -> m.MetricSnapshot:
    async with httpx.AsyncClient() as http:
        return await m.scrape(http, ep.url, ep.name)


IDLE = {"waiting": 0.0, "running": 0.0, "kv_usage": 0.0}


def settled(ep: Endpoint, within_s: float = 10.0) -> m.MetricSnapshot:
    """``ep``'s /metrics once it holds no request (waiting, running and KV usage 0), or the last
    scrape after ``within_s``. The fake counts a request's success and tokens before it releases
    the request (tests/fake_vllm.py), so the counters of a settled instance are final: a cancelled
    request that was going to finish would show here."""
    deadline = time.monotonic() + within_s
    while m.idle_state(snap := asyncio.run(scrape(ep))) != IDLE and time.monotonic() < deadline:
        time.sleep(0.05)
    return snap


@pytest.fixture(scope="module")
def slow():
    """Tokens take 30 ms each: cancel points can be hit on purpose."""
    with fake_pd(token_latency=0.03) as eps:
        yield eps


# --------------------------------------------------------------------------------- happy path


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("stream", [False, True])
def test_all_clients_complete_with_exact_tokens_and_parity(healthy, client, stream):
    p, d = healthy
    rs = reqs(24, max_tokens=5, stream=stream, keep_tokens=True, seed=hash((client, stream)) % 1000)
    recs, eng, par = asyncio.run(run(p, d, rs, client=client, parity=True))
    assert [r.outcome for r in recs] == ["ok"] * 24, recs[0]
    for r in recs:
        assert r.tokens == 5 and r.usage_tokens == 5
        assert r.prompt_len == 24 and r.hops == 2
        assert r.p_instance == "prefill" and r.d_instance == "decode" and r.p_status == r.d_status == 200
        assert r.latency_s > 0 and r.t_end >= r.t_start
        assert (r.ttft_s is not None) == stream
        assert r.parity == "equal"
    assert par == {"compared": 24, "equal": 24, "diverged": 0, "refused": 0, "failed": 0}
    assert eng.counts["ok"] == 24 and eng.counts["in_flight"] == 0
    line = WaveRecordLine.of(recs[0]).model_dump()
    assert [h["instance"] for h in line["hops"]] == ["prefill", "decode"] and "token_ids" not in line


def test_concurrency_is_bounded(healthy):
    p, d = healthy
    seen = []

    class Spy:
        def __init__(self, inner):
            self.inner, self.now, self.name = inner, 0, "spy"

        async def prefill(self, ep, prompt):
            self.now += 1
            seen.append(self.now)
            try:
                await asyncio.sleep(0.002)
                return await self.inner.prefill(ep, prompt)
            finally:
                self.now -= 1

        def __getattr__(self, k):
            return getattr(self.inner, k)

    async def go():
        tr = Spy(make_transport("aiohttp", MODEL, 10, 16))
        eng = WaveEngine(tr, [p], [d], 5, 10)
        recs = await eng.run(reqs(40))
        await tr.inner.aclose()
        return recs

    recs = asyncio.run(go())
    assert all(r.outcome == "ok" for r in recs)
    assert max(seen) == 5


# --------------------------------------------------------------------------------- error classes


@pytest.mark.parametrize("client", CLIENTS)
def test_http500_is_http_error(client):
    with fake_pd(d_env={"FAKE_VLLM_FAULT": "http500"}) as (p, d):
        recs, eng, _ = asyncio.run(run(p, d, reqs(6, stream=True) + reqs(6, seed=1), client=client))
    assert {r.outcome for r in recs} == {"http_error"}
    assert all(r.d_status == 500 and "HTTP 500: EngineCore encountered an issue" in r.diagnosis for r in recs)
    assert eng.counts["failed"] == 12


@pytest.mark.parametrize("client", CLIENTS)
def test_empty_stream_is_empty(client):
    with fake_pd(d_env={"FAKE_VLLM_FAULT": "empty-stream"}) as (p, d):
        recs, _, _ = asyncio.run(run(p, d, reqs(4, stream=True) + reqs(4, seed=1), client=client))
    assert {r.outcome for r in recs} == {"empty"}
    assert all(r.tokens == 0 and r.d_status == 200 for r in recs)


def test_prefill_without_kv_transfer_params_is_http_error(healthy):
    p, _ = healthy
    # D's URL as P: a consumer answers without kv_transfer_params
    recs, _, _ = asyncio.run(run(Endpoint("prefill", healthy[1].url), healthy[1], reqs(2)))
    assert {r.outcome for r in recs} == {"http_error"}
    assert "without kv_transfer_params" in recs[0].diagnosis


def test_connection_refused_is_connection_error():
    dead = Endpoint("prefill", f"http://127.0.0.1:{free_port()}")
    for client in CLIENTS:
        recs, _, _ = asyncio.run(run(dead, dead, reqs(2), client=client))
        assert {r.outcome for r in recs} == {"connection_error"}, client


def test_deadline_is_timeout():
    with fake_pd(d_env={"FAKE_VLLM_FAULT": "stall"}) as (p, d):
        t = time.monotonic()
        recs, eng, _ = asyncio.run(run(p, d, reqs(3, stream=True), deadline_s=0.5))
        assert time.monotonic() - t < 3
        assert {r.outcome for r in recs} == {"timeout"} and "0.5 s deadline" in recs[0].diagnosis
        # the stalled requests were dropped when the client gave up: D is idle again
        assert m.idle_state(settled(d)) == IDLE


def test_parity_mismatch_is_its_own_class():
    with fake_pd(d_env={"FAKE_VLLM_FAULT": "diverge-at", "FAKE_VLLM_FAULT_ARG": "2"}) as (p, d):
        recs, eng, par = asyncio.run(run(p, d, reqs(4, max_tokens=4, keep_tokens=True), parity=True))
    assert {r.outcome for r in recs} == {"parity_mismatch"}
    assert recs[0].parity.startswith("diverged at 2")
    assert par["diverged"] == 4 and eng.counts["failed"] == 4 and eng.counts["ok"] == 0


# --------------------------------------------------------------------------------- cancellation


def _success(snap: m.MetricSnapshot) -> float:
    return snap.value(m.REQUEST_SUCCESS)


@pytest.mark.parametrize("client", CLIENTS)
def test_cancel_during_decode_stream_after_first_token(slow, client):
    """The cancel comes after D's first token and before its last: D counts no success and
    the request's generated tokens stop early."""
    p, d = slow
    before = asyncio.run(scrape(d))
    recs, eng, _ = asyncio.run(run(p, d, reqs(3, max_tokens=20, cancel_at="during-decode", seed=7), client=client))
    after = settled(d)
    for r in recs:
        assert r.outcome == "cancelled" and r.cancel_point == "during-decode" and r.intentional
        assert r.tokens == 1 and r.ttft_s is not None
        assert r.d_latency_s < 20 * 0.03 / 2  # well before the stream would have ended
    assert m.delta(before, after, m.REQUEST_SUCCESS) == 0  # none finished on D
    assert m.delta(before, after, m.GENERATION_TOKENS) < 3 * 5  # generation stopped early
    assert m.idle_state(after) == IDLE
    assert eng.counts["cancelled"] == 3


def test_cancel_before_prefill_answers(slow):
    """P needs >= 30 ms for its one token; the cancel fires at 5 ms: P never finishes it."""
    p, d = slow
    before = {e.name: asyncio.run(scrape(e)) for e in (p, d)}
    recs, _, _ = asyncio.run(run(p, d, reqs(3, cancel_at="before-prefill", seed=8), cancel_after_s=0.005))
    after = {e.name: settled(e) for e in (p, d)}
    assert all(r.outcome == "cancelled" and r.cancel_point == "before-prefill" for r in recs)
    assert all(r.p_status is None and r.d_instance is None for r in recs)
    assert m.delta(before["prefill"], after["prefill"], m.REQUEST_SUCCESS) == 0
    assert m.delta(before["decode"], after["decode"], m.PROMPT_TOKENS) == 0  # D never asked
    assert m.idle_state(after["prefill"])["running"] == 0


def test_cancel_before_prefill_that_comes_too_late_is_recorded_between(healthy):
    p, d = healthy
    recs, _, _ = asyncio.run(run(p, d, reqs(2, cancel_at="before-prefill", seed=9), cancel_after_s=5.0))
    assert all(r.outcome == "cancelled" and r.cancel_point == "between" and r.p_status == 200 for r in recs)


def test_cancel_between_hops_never_asks_d(healthy):
    p, d = healthy
    before = asyncio.run(scrape(d))
    recs, _, _ = asyncio.run(run(p, d, reqs(4, cancel_at="between", seed=10)))
    after = asyncio.run(scrape(d))
    assert all(r.outcome == "cancelled" and r.cancel_point == "between" and r.hops == 1 for r in recs)
    assert m.delta(before, after, m.PROMPT_TOKENS) == 0


def test_plan_cancels():
    plan = plan_cancels(200, 0.1, CANCEL_POINTS, seed=1)
    assert sum(x is not None for x in plan) == 20
    assert {x for x in plan if x} == set(CANCEL_POINTS)
    assert plan == plan_cancels(200, 0.1, CANCEL_POINTS, seed=1)
    assert plan_cancels(10, 0.0, CANCEL_POINTS, 1) == [None] * 10
    with pytest.raises(ValueError, match="unknown cancel points"):
        plan_cancels(10, 0.5, ["later"], 1)


def test_the_rig_runs_its_event_loop_on_uvloop_when_installed():
    # rig/transport/aio.py: uvloop is a dependency of the rig (pyproject) and measurably cheaper per hop.
    import asyncio

    from rig.transport import aio

    async def loop_type() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert aio.loop_name() == "uvloop"
    assert aio.run(loop_type()).startswith("uvloop")

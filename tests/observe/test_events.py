"""Sampling at request events (rig.observe.events): which loops an event wakes, the coalescing bound
(a burst of N requests costs a bounded number of scrapes, whatever N), and the hops' events as the
transport reports them (rig.transport.hops)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from rig.observe.events import SampleEvents, SampleTrigger, trigger_of
from rig.observe.metrics import parse_metrics
from rig.observe.stall import StallWatcher, watch
from rig.transport.client import HttpxTransport
from rig.transport.endpoint import Endpoint

METRICS = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"


class Recorder:
    """A hop listener that keeps every event."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def hop_event(self, instance: str, event: str) -> None:
        self.events.append((instance, event))


def test_an_event_wakes_only_the_loops_that_watch_its_instance():
    async def go():
        events = SampleEvents(min_gap_s=0.0)
        d, p = events.trigger("decode"), events.trigger("prefill")
        events.hop_event("decode", "sent")
        assert d.pending and not p.pending
        assert await d.wait(30.0) is True  # woken at once, not after 30 s
        assert await p.wait(0.01) is False  # its period ended it
        events.phase("s1")
        assert d.pending and p.pending
        events.release(d)
        events.release(d)  # twice: ignored
        assert await d.wait(0.0) is True  # the event it had before release still counts
        events.hop_event("decode", "answered")
        assert not d.pending
        assert events.counts[("decode", "sent")] == 1 and events.counts[("*", "phase:s1")] == 1
        with events.watching("decode", "prefill") as both:
            events.hop_event("prefill", "first-byte")
            assert both.pending and both.fired == 1
        events.hop_event("prefill", "first-byte")
        assert both.fired == 1  # released at the end of the block
        with trigger_of(None, "decode") as none:
            assert none is None
    asyncio.run(go())


def test_the_trigger_refuses_a_negative_gap_and_a_stop_is_not_a_wake():
    with pytest.raises(ValueError, match="min_gap_s must be >= 0"):
        SampleTrigger(frozenset({"d"}), -1.0)

    async def go():
        t = SampleTrigger(frozenset({"d"}), 0.0)
        stop = asyncio.Event()
        stop.set()
        t.fire()
        assert await t.wait(30.0, stop) is False  # the loop ends; the event needs no early scrape
        assert not t.pending and t.woken == 0
    asyncio.run(go())


@pytest.mark.parametrize("n", [1, 16, 500])
def test_a_burst_during_one_scrape_costs_one_more_scrape_whatever_its_size(n):
    """N events while a scrape is in flight fold into exactly one further scrape."""
    async def go():
        events = SampleEvents(min_gap_s=0.0)
        release, scrapes, stop = asyncio.Event(), [], asyncio.Event()

        async def scrape():
            scrapes.append(len(scrapes))
            if len(scrapes) == 2:
                await release.wait()  # the second scrape is in flight while the burst arrives
            return parse_metrics(METRICS, "decode")

        with events.watching("decode") as trig:
            loop = asyncio.create_task(watch(StallWatcher(8.0), scrape, stop.is_set, 60.0, trigger=trig, wake=stop))
            await asyncio.sleep(0)
            events.hop_event("decode", "sent")  # wakes the loop from its 60 s period: scrape 2
            while len(scrapes) < 2:
                await asyncio.sleep(0.001)
            for _ in range(n):
                events.hop_event("decode", "answered")
            release.set()
            while len(scrapes) < 3:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.05)  # no further scrape comes: nothing happened since
            stop.set()
            await loop
        return len(scrapes), trig.woken

    count, woken = asyncio.run(go())
    assert (count, woken) == (3, 2)  # the first (at once), the one woken by "sent", one for the whole burst


def test_a_stream_of_events_is_sampled_at_most_once_per_gap():
    """Events every millisecond for a while: scrapes <= 1 + elapsed / min_gap_s (+1 for the edges)."""
    gap = 0.05

    async def go():
        events = SampleEvents(min_gap_s=gap)
        scrapes, stop = [], asyncio.Event()

        async def scrape():
            scrapes.append(asyncio.get_running_loop().time())
            return parse_metrics(METRICS, "decode")

        with events.watching("decode") as trig:
            loop = asyncio.create_task(watch(StallWatcher(8.0), scrape, stop.is_set, 60.0, trigger=trig, wake=stop))
            t0 = asyncio.get_running_loop().time()
            fired = 0
            while asyncio.get_running_loop().time() - t0 < 0.4:
                events.hop_event("decode", "sent")
                fired += 1
                await asyncio.sleep(0.001)
            elapsed = asyncio.get_running_loop().time() - t0
            stop.set()
            await loop
        return scrapes, fired, elapsed

    scrapes, fired, elapsed = asyncio.run(go())
    assert fired > len(scrapes) >= 2  # sampled during the stream, far fewer times than events came
    assert len(scrapes) <= 2 + elapsed / gap
    assert all(b - a >= gap * 0.9 for a, b in zip(scrapes[1:], scrapes[2:], strict=False))


def _sse(*payloads: str) -> bytes:
    return b"".join(f"data: {p}\n\n".encode() for p in payloads)


def test_every_hop_reports_sent_first_byte_answered_and_cancelled():
    chunk = ('{"id":"x","choices":[{"index":0,"text":"a","token_ids":[5],"finish_reason":"length"}],'
             '"usage":{"prompt_tokens":3,"completion_tokens":1}}')
    gate = asyncio.Event()

    async def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "hang":
            await gate.wait()
        if b'"stream": true' in req.content or b'"stream":true' in req.content:
            return httpx.Response(200, content=_sse(chunk, "[DONE]"), headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json={"choices": [{"index": 0, "text": "a", "token_ids": [5],
                                                      "finish_reason": "length"}],
                                         "usage": {"prompt_tokens": 3, "completion_tokens": 1},
                                         "kv_transfer_params": {"remote_block_ids": [1]}})

    async def go():
        rec = Recorder()
        t = HttpxTransport("m", 5.0, http=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
        t.listeners.append(rec)
        p, d = Endpoint("prefill", "http://p"), Endpoint("decode", "http://d")
        await t.prefill(p, [1, 2, 3])
        await t.decode(d, [1, 2, 3], 1, {"x": 1}, stream=True)
        await t.direct(d, [1, 2, 3], 1)
        hung = asyncio.create_task(t.direct(Endpoint("decode", "http://hang"), [1], 1))
        await asyncio.sleep(0.01)
        hung.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hung
        await t.aclose()
        return rec.events

    assert asyncio.run(go()) == [
        ("prefill", "sent"), ("prefill", "answered"),
        ("decode", "sent"), ("decode", "first-byte"), ("decode", "answered"),
        ("decode", "sent"), ("decode", "answered"),
        ("decode", "sent"), ("decode", "cancelled")]


def test_counts_and_gaps_are_kept_exactly():
    """Every event counts (twice is 2), a loop's own gap is never below the default (the longer wins),
    and a trigger keeps the events' clock (make mutation survivors on rig/observe/events.py)."""
    assert SampleEvents().min_gap_s == 0.05  # timeouts.sample_gap_s's default
    ticks = iter(range(100))
    events = SampleEvents(min_gap_s=0.05, clock=lambda: float(next(ticks)))
    t = events.trigger("decode")
    assert t.clock is events.clock and t.min_gap_s == 0.05
    assert events.trigger("decode", min_gap_s=0.5).min_gap_s == 0.5
    assert events.trigger("decode", min_gap_s=0.01).min_gap_s == 0.05
    for _ in range(2):
        events.hop_event("decode", "sent")
        events.phase("s1")
    assert events.counts[("decode", "sent")] == 2 and events.counts[("*", "phase:s1")] == 2
    assert t.fired == 4  # two hop events and two phase events


def test_a_period_already_over_waits_for_nothing(monkeypatch):
    """``wait`` with a period left of 0 or less asks asyncio for no wait at all (never a default one)."""
    from rig.observe import events as ev
    seen: list[float] = []
    real = asyncio.wait

    async def wait(aws, timeout=None, return_when=None):
        seen.append(timeout)
        return await real(aws, timeout=0, return_when=return_when)

    monkeypatch.setattr(ev.asyncio, "wait", wait)
    t = SampleTrigger(frozenset({"d"}), 0.0)
    assert asyncio.run(t.wait(-2.0)) is False and asyncio.run(t.wait(0.3)) is False
    assert seen == [0.0, 0.3]

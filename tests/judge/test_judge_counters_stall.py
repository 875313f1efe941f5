"""A counter rule or a stall watcher that saw nothing never reads ok (rig/judge/counter_rules.py,
rig/observe/stall.py's watch loop). Written against `make mutation` survivors (docs/howto/mutation.md)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from rig.config import CounterRule
from rig.judge.counter_rules import counter_rules_check, movement, rule_state
from rig.observe.stall import StallWatcher, watch
from test_stall import IDLE, snap

FAILED = "vllm:nixl_num_failed_transfers_total"


def row(inst: str, counters: dict[str, float] | None, life: float | None = 1.0) -> dict:
    return {"instance": inst, "life": life, "counters": counters}


def rule(**kw) -> CounterRule:
    return CounterRule(instance=kw.pop("instance", "decode"), metric=kw.pop("metric", FAILED), **kw)


@pytest.mark.parametrize("rows", [
    [],
    [row("decode", {FAILED: 0.0})],  # sampled once
    [row("decode", {FAILED: 0.0}), row("decode", {"vllm:other_total": 1.0})],  # the metric in one sample only
    [row("decode", {FAILED: 0.0}), row("decode", None)],  # a sample without counters does not count
    [row("decode", {FAILED: 0.0}, life=1.0), row("decode", {FAILED: 0.0}, life=2.0)],  # one sample per life
    [row("prefill", {FAILED: 0.0}), row("prefill", {FAILED: 0.0})],  # the other instance's samples
], ids=["none", "once", "one-with-metric", "no-counters", "one-per-life", "other-instance"])
def test_a_delta_0_rule_measured_on_fewer_than_two_samples_is_not_checked(rows):
    ok, detail = rule_state(rows, rule(delta=0), "prefill", "decode")
    assert ok is None and "not checked" in detail, detail
    c = counter_rules_check(rows, [rule(delta=0)], "prefill", "decode")
    assert c.ok is None


def test_the_rise_is_last_minus_first_of_each_life_summed():
    rows = [row("decode", {FAILED: 1.0}, 1.0), row("decode", {FAILED: 2.0}, 1.0), row("decode", {FAILED: 4.0}, 1.0),
            row("decode", {FAILED: 10.0}, 2.0), row("decode", {FAILED: 13.0}, 2.0)]
    assert movement(rows, "decode", rule(min=1)) == (6.0, 2, "")
    assert movement(rows[:3], "decode", rule(delta=3)) == (3.0, 1, "")
    assert rule_state(rows[:3], rule(delta=3), "prefill", "decode")[0] is True
    assert rule_state(rows[:3], rule(delta=2), "prefill", "decode")[0] is False


def test_over_several_lives_only_a_lower_bound_holds():
    rows = [row("decode", {FAILED: 0.0}, 1.0), row("decode", {FAILED: 2.0}, 1.0),
            row("decode", {FAILED: 0.0}, 2.0), row("decode", {FAILED: 1.0}, 2.0)]
    ok, detail = rule_state(rows, rule(min=3), "prefill", "decode")
    assert ok is True and "a lower bound" in detail
    assert rule_state(rows, rule(min=4), "prefill", "decode")[0] is False  # below the bound: failed
    for r in (rule(delta=3), rule(max=5), rule(min=1, max=5)):
        ok, detail = rule_state(rows, r, "prefill", "decode")
        assert ok is None and "restarted (2 process lives)" in detail, r


def test_a_failure_is_named_with_the_rules_that_held_and_a_gap_is_never_ok():
    rows = [row("decode", {FAILED: 0.0}), row("decode", {FAILED: 1.0})]
    c = counter_rules_check(rows, [rule(delta=0), rule(max=5)], "prefill", "decode")
    assert c.ok is False and c.detail.startswith("decode " + FAILED + " +1 (expected +0)")
    c = counter_rules_check(rows, [rule(max=5), rule(metric="vllm:absent_total", delta=0)], "prefill", "decode")
    assert c.ok is None and c.detail.startswith("decode vllm:absent_total not checked")
    c = counter_rules_check(rows, [rule(metric="vllm:absent_total", delta=0, if_present=True)], "prefill", "decode")
    assert c.ok is None and "(if_present: left out)" in c.detail
    c = counter_rules_check(rows, [], "prefill", "decode")
    assert c.ok is None


# ------------------------------------------------------------------------- stall.watch

def run(coro):
    return asyncio.run(coro)


def scraper(snaps):
    it = iter(snaps)

    async def scrape():
        s = next(it)
        if isinstance(s, Exception):
            raise s
        return s
    return scrape


def until(n: int):
    calls = {"n": 0}

    def done() -> bool:
        calls["n"] += 1
        return calls["n"] > n
    return done


def test_watch_feeds_every_sample_and_returns_the_stall():
    seen = []
    snaps = [snap(float(t)) for t in range(10)]
    stall = run(watch(StallWatcher(3.0), scraper(snaps), until(10), 0, on_sample=seen.append))
    assert stall is not None and stall.since == 0.0 and stall.duration_s == 3.0
    assert [s.t for s in seen] == [0.0, 1.0, 2.0, 3.0]  # stops at the stall


def test_watch_skips_a_failed_scrape_without_feeding_it():
    seen = []
    snaps = [httpx.ConnectError("refused"), ValueError("bad exposition"), snap(0.0), snap(1.0), snap(2.0)]
    w = StallWatcher(2.0)
    stall = run(watch(w, scraper(snaps), until(5), 0, on_sample=seen.append))
    assert stall is not None and [s.t for s in seen] == [0.0, 1.0, 2.0]
    assert len(w.episodes) == 1


def test_watch_returns_none_once_done_and_passes_engine_cpu():
    cpu = []
    w = StallWatcher(5.0)
    stall = run(watch(w, scraper([snap(0.0, **IDLE), snap(1.0, **IDLE)]), until(2), 0,
                      engine_cpu=lambda: cpu.append(1) or 1.0))
    assert stall is None and cpu == [1, 1] and w.episodes == []


def test_watch_waits_on_wake():
    async def go():
        wake = asyncio.Event()
        wake.set()
        return await watch(StallWatcher(2.0), scraper([snap(0.0), snap(1.0), snap(2.0)]), until(3), 30.0, wake=wake)
    assert run(asyncio.wait_for(go(), 10)) is not None


def test_the_details_say_what_was_measured_and_why_not():
    rows = [row("decode", {FAILED: 0.0}), row("decode", {FAILED: 0.0})]
    assert rule_state(rows, rule(delta=0, why="healthy run"), "prefill", "decode") == (
        True, f"decode {FAILED} +0 (expected +0: healthy run)")
    assert rule_state(rows, rule(delta=0), "prefill", "decode") == (True, f"decode {FAILED} +0 (expected +0)")
    assert rule_state(rows, rule(metric="vllm:x_total", delta=0), "prefill", "decode") == (
        None, "decode vllm:x_total not checked: decode lacks vllm:x_total")
    assert rule_state(rows, rule(labels={"engine": "0"}, delta=0), "prefill", "decode") == (
        None, f"decode {FAILED}{{'engine': '0'}} not checked: decode lacks {FAILED} with labels {{'engine': '0'}}")
    two = [row("decode", {FAILED: 0.0}, 1.0), row("decode", {FAILED: 0.0}, 1.0),
           row("decode", {FAILED: 0.0}, 2.0), row("decode", {FAILED: 0.0}, 2.0)]
    assert rule_state(two, rule(delta=0), "prefill", "decode") == (
        None, f"decode {FAILED} +0 (expected +0) not checked: decode restarted (2 process lives), so increments "
              "between a life's last sample and its end are not seen")


def test_a_rule_names_a_role_or_an_instance():
    rows = [row("d-1", {FAILED: 0.0}), row("d-1", {FAILED: 1.0}), row("p-1", {FAILED: 0.0}), row("p-1", {FAILED: 0.0})]
    assert rule_state(rows, rule(instance="decode", delta=1), "p-1", "d-1") == (True, f"d-1 {FAILED} +1 (expected +1)")
    assert rule_state(rows, rule(instance="prefill", delta=0), "p-1", "d-1")[0] is True
    assert rule_state(rows, rule(instance="d-1", delta=1), "p-1", "d-1")[0] is True
    ok, detail = rule_state(rows, rule(instance="d-2", delta=0), "p-1", "d-1")
    assert ok is None and detail == (f"d-2 {FAILED} not checked: d-2 is not this scenario's prefill (p-1) or "
                                     "decode (d-1)")


def test_counter_rules_check_details_in_every_state():
    rows = [row("decode", {FAILED: 0.0}), row("decode", {FAILED: 1.0})]
    held = f"decode {FAILED} +1 (expected <= +5)"
    c = counter_rules_check(rows, [rule(max=5), rule(max=6)], "prefill", "decode")
    assert (c.ok, c.detail) == (True, f"{held}; decode {FAILED} +1 (expected <= +6)")
    c = counter_rules_check(rows, [rule(delta=0), rule(max=5), rule(metric="vllm:gone_total", delta=0)],
                            "prefill", "decode")
    assert (c.ok, c.detail) == (False, f"decode {FAILED} +1 (expected +0); {held} ok; decode vllm:gone_total not "
                                       "checked: decode lacks vllm:gone_total")
    c = counter_rules_check(rows, [rule(metric="vllm:gone_total", delta=0), rule(max=5)], "prefill", "decode")
    assert (c.ok, c.detail) == (None, f"decode vllm:gone_total not checked: decode lacks vllm:gone_total; {held} ok")
    gone = [rule(metric="vllm:a_total", delta=0, if_present=True), rule(metric="vllm:b_total", delta=0,
                                                                           if_present=True)]
    c = counter_rules_check(rows, gone, "prefill", "decode")
    assert (c.ok, c.detail) == (None, "not checked: decode vllm:a_total not checked: decode lacks vllm:a_total "
                                      "(if_present: left out); decode vllm:b_total not checked: decode lacks "
                                      "vllm:b_total (if_present: left out)")
    c = counter_rules_check(rows, [], "prefill", "decode", name="nixl-failed-transfers")
    assert (c.name, c.detail) == ("nixl-failed-transfers", "not checked: no counter rule")
    assert counter_rules_check(rows, gone, "prefill", "decode", name="x").name == "x"


# ------------------------------------------------------------------------- StallWatcher passes its settings on

def test_the_watcher_refuses_bad_windows_at_construction():
    with pytest.raises(ValueError, match="stall windows must be > 0 s"):
        StallWatcher(8.0, transfer_window_s=0)


def test_the_watcher_gives_each_detector_its_transfer_window_gap_and_early_rule():
    reading = dict(wts=0, inprog=1, kv=0.8, capacity=0)
    w = StallWatcher(4.0, transfer_window_s=10.0)
    fired = [s.t for s in (snap(float(t), **reading) for t in range(12)) if w.feed(s) is not None]
    assert fired[0] == 10.0  # a read in flight waits the transfer window, not the 4 s window
    w = StallWatcher(4.0, max_gap_s=1.0)
    assert [w.feed(s) for s in (snap(0.0), snap(1.5), snap(3.0), snap(4.5), snap(6.0))] == [None] * 5
    w = StallWatcher(4.0, max_gap_s=2.0)
    assert w.feed(snap(0.0)) is None and w.feed(snap(1.5)) is None and w.feed(snap(3.0)) is None
    assert w.feed(snap(4.5)) is not None

    calls = []

    def early(facts, frozen_s, samples, cpu):
        calls.append(cpu)
        return "decided" if cpu is not None and cpu >= 1.0 else None
    w = StallWatcher(100.0, early=early)
    assert w.feed(snap(0.0), 10.0) is None
    st = w.feed(snap(1.0), 11.0)
    assert st is not None and st.decided_by == "decided" and calls == [1.0]


def test_an_episode_carries_the_stalls_duration_and_diagnosis_from_its_first_firing():
    w = StallWatcher(2.0)
    for t in (0.0, 1.0, 2.0):
        st = w.feed(snap(t))
    assert st is not None
    (ep,) = w.episodes
    assert (ep.instance, ep.since, ep.duration_s, ep.diagnosis) == ("decode", 0.0, 2.0, st.diagnosis)


def test_watch_waits_interval_when_wake_is_not_set():
    async def go():
        return await watch(StallWatcher(50.0), scraper([snap(0.0, **IDLE), snap(1.0, **IDLE)]), until(2), 0.01,
                           wake=asyncio.Event())
    assert run(asyncio.wait_for(go(), 10)) is None


def test_one_request_in_a_fetch_stage_is_held_back_and_the_diagnosis_names_the_kind():
    from rig.observe.stall import FULL_POOL, describe, is_blocked
    assert is_blocked(snap(0.0, waiting=0, capacity=0, wts=0, inprog=1, kv=0.2))
    assert not is_blocked(snap(0.0, waiting=0, capacity=0, wts=0, inprog=0, kv=0.2))
    assert describe(snap(0.0, kv=0.49), 3.0).startswith("admission livelock on decode")
    assert describe(snap(0.0, kv=0.5), 3.0).startswith("stall on decode")
    assert describe(snap(0.0, capacity=0, kv=FULL_POOL), 3.0).startswith("pool deadlock on decode")
    assert describe(snap(0.0, capacity=0, kv=FULL_POOL, running=1), 3.0).startswith("stall on decode")


def test_a_state_that_moves_only_between_fetch_stages_or_reasons_is_not_frozen():
    from rig.observe.stall import StallDetector
    det = StallDetector(2.0)
    stages = [dict(wts=1, inprog=0), dict(wts=0, inprog=1, capacity=0)]
    assert all(det.feed(snap(float(t), **stages[t % 2])) is None for t in range(8))
    det = StallDetector(2.0)
    reasons = [dict(capacity=1, deferred=0), dict(capacity=0, deferred=1)]
    assert all(det.feed(snap(float(t), **reasons[t % 2])) is None for t in range(8))

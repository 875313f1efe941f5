"""The stall detector and watcher (rig.observe.stall) where `make mutation` found them untested: a
watch that sampled nothing is "not checked", never "no stall"; diagnoses and evidence say the
frozen values the user acts on. Pure: recorded snapshots, stub scrapes, no sleeps."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from rig.cluster import proctree
from rig.cluster.proctree import ProcSample
from rig.judge.sequence_checks import no_stall_check
from rig.observe.metrics import parse_metrics
from rig.observe.stall import (
    FULL_POOL,
    STEPPING_CPU_S,
    StallDetector,
    StallWatcher,
    cache_info,
    delta,
    describe,
    evidence_of,
    facts_of,
    is_blocked,
    watch,
)
from rig.transport.records import StallEvidence, StallFacts
from rig.workload.sequence import SequenceResult
from test_judge_counters_stall import scraper as _scraper
from test_judge_counters_stall import until as _until
from test_stall import IDLE, snap


def test_a_watch_whose_every_scrape_failed_is_unwatched_naming_the_count_and_the_last_error():
    w = StallWatcher(2.0)
    stall = asyncio.run(watch(w, _scraper([httpx.ConnectError("refused"), ValueError("bad exposition")]),
                              _until(2), 0))
    assert stall is None and w.fed == 0 and w.scrape_failures == 2
    assert w.unwatched() == ("no /metrics sample was read while requests were outstanding: 2 scrape(s) failed, "
                             "the last with ValueError: bad exposition")


def test_a_watch_with_one_sample_or_none_tried_is_watched():
    w = StallWatcher(2.0)
    asyncio.run(watch(w, _scraper([httpx.ConnectError("refused"), snap(0.0, **IDLE)]), _until(2), 0))
    assert w.fed == 1 and w.scrape_failures == 1 and w.last_scrape_error == "ConnectError: refused"
    assert w.unwatched() == ""
    idle = StallWatcher(2.0)
    asyncio.run(watch(idle, _scraper([]), _until(0), 0))  # done at once: nothing was outstanding
    assert idle.unwatched() == "" and idle.fed == 0 and idle.scrape_failures == 0


def test_feed_counts_every_snapshot_of_every_instance():
    w = StallWatcher(2.0)
    w.feed(snap(0.0, **IDLE))
    w.feed(snap(0.0, instance="prefill", **IDLE))
    assert w.fed == 2 and w.unwatched() == ""


def test_no_stall_is_not_checked_when_d_was_never_sampled_and_a_stall_still_fails():
    why = "no /metrics sample was read while requests were outstanding: 3 scrape(s) failed, the last with X"
    c = no_stall_check(SequenceResult(stall_unwatched=why))
    assert (c.name, c.ok, c.detail) == ("no-stall", None, f"not checked: {why}")
    c = no_stall_check(SequenceResult(stall="stall on decode: waiting=1", stall_unwatched=why))
    assert (c.ok, c.detail) == (False, "stall on decode: waiting=1")
    assert no_stall_check(SequenceResult()).ok is True


# ------------------------------------------------------------------------- the watcher's episodes

LOADED = (9.0, 8.0, 7.0)  # starved on any host with fewer than 9 CPUs


def _frozen(watcher: StallWatcher, n: int, cpu_per_s: float = 0.0, instance: str = "decode", **values):
    """Feed ``n`` frozen livelock samples 1 s apart (EngineCore burning ``cpu_per_s``); the stalls."""
    return [watcher.feed(snap(100.0 + i, instance=instance, **values), ProcSample(50.0 + cpu_per_s * i))
            for i in range(n)]


def test_a_real_stalls_episode_is_not_inconclusive_and_an_inconclusive_one_is_from_its_first_firing(monkeypatch):
    monkeypatch.setattr(proctree, "host_load", lambda: LOADED)
    real = StallWatcher(4.0)
    _frozen(real, 6, cpu_per_s=0.1)  # stepping with nothing changing: a real stall
    (ep,) = real.episodes
    assert ep.inconclusive is False and ep.duration_s == 5.0
    unsure = StallWatcher(4.0)
    fired = _frozen(unsure, 5)  # starved: inconclusive, reported at the window (no wait by default)
    assert fired[4] is not None and fired[3] is None
    (ep,) = unsure.episodes
    assert ep.inconclusive is True and ep.duration_s == 4.0


def test_the_watcher_gives_its_detectors_the_inconclusive_wait(monkeypatch):
    monkeypatch.setattr(proctree, "host_load", lambda: LOADED)
    w = StallWatcher(4.0, inconclusive_s=3.0)
    fired = _frozen(w, 9)
    assert [i for i, st in enumerate(fired) if st is not None][0] == 7  # window 4 s + 3 s, not at the window


def test_a_negative_inconclusive_wait_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"inconclusive_s must be >= 0 s \(got -1\)"):
        StallWatcher(4.0, inconclusive_s=-1)


def test_probe_reads_the_blocked_instance_also_when_only_its_full_pool_blocks_it(monkeypatch):
    monkeypatch.setattr(proctree, "host_load", lambda: LOADED)
    probed: list[str] = []
    w = StallWatcher(4.0, full_pool=True, probe=lambda name: probed.append(name) or ProcSample(1.0))
    pool_full = {**IDLE, "kv": 1.0}  # R01: nothing waits, the pool is full, nothing runs
    for i in range(2):
        w.feed(snap(100.0 + i, instance="decode-1", **pool_full))
    assert probed == ["decode-1", "decode-1"]
    w.feed(snap(102.0, instance="decode-1", **IDLE))  # not blocked: no probe
    assert probed == ["decode-1", "decode-1"]


def test_describe_lists_every_waiting_reason_and_fetch_stage():
    s = snap(0.0, capacity=1, deferred=2, wts=1, cw=3, waiting=3, kv=0.0)
    assert describe(s, 8.0) == ("admission livelock on decode: waiting=3 (capacity, deferred) running=0 kv=0.0% "
                                "kv_fetch completed_waiting=3 kv_fetch waiting_to_start=1, unchanged for 8.0 s")


# ------------------------------------------------------------------------- the frozen facts

CACHE_INFO = ('# TYPE vllm:cache_config_info gauge\n'
              'vllm:cache_config_info{{block_size="{bs}",engine="0",num_gpu_blocks="{nb}"}} 1.0\n')


def test_cache_info_reads_blocks_and_block_size_and_skips_a_value_that_is_no_integer():
    assert cache_info(parse_metrics(CACHE_INFO.format(bs=16, nb=6), "decode", t=0)) == {
        "num_gpu_blocks": 6, "block_size": 16}
    assert cache_info(parse_metrics(CACHE_INFO.format(bs=16, nb="auto"), "decode", t=0)) == {"block_size": 16}
    assert cache_info(snap(0.0)) == {}  # not exposed (the fake)


def test_facts_carry_the_frozen_values_and_only_nonzero_reasons_and_stages():
    s = snap(3.0, waiting=2, capacity=2, deferred=0, wts=0, inprog=1, cw=0, kv=0.5)
    s = parse_metrics(s.text + CACHE_INFO.format(bs=16, nb=6), "decode", t=3.0)
    ev = StallEvidence(frozen_s=1.0, finding="hung")
    f = facts_of(s, 8.12345, ev)
    assert f == StallFacts(instance="decode", waiting=2.0, running=0.0, kv_usage=0.5,
                           waiting_reasons={"capacity": 2.0}, kv_fetch_stages={"in_progress": 1.0},
                           duration_s=8.123, num_gpu_blocks=6, block_size=16, evidence=ev)
    assert facts_of(snap(0.0), 1.0).evidence is None


def test_delta_is_none_when_a_reading_is_unknown_and_never_negative():
    assert delta(None, 1.0) is None and delta(1.0, None) is None
    assert delta(3.5, 1.0) == 2.5
    assert delta(1.0, 3.5) == 0.0  # a restarted process counts from 0 again


def test_evidence_fields_over_the_frozen_span():
    start = ProcSample(10.0, 4.0)
    now = ProcSample(10.5, 6.0, ("cc1plus (pid 7)",), 3.0)
    ev = evidence_of(start, now, 8.12345, (1.0, 2.0, 3.0), 2)
    assert ev == StallEvidence(frozen_s=8.123, finding="compiling", engine_cpu_s=0.5, worker_cpu_s=2.0,
                               load_avg=(1.0, 2.0, 3.0), cpus=2, compilers=("cc1plus (pid 7)",), compiler_cpu_s=3.0)
    quiet = evidence_of(start, ProcSample(10.0, 4.0, (), 3.0), 8.0, (1.0, 2.0, 3.0), 2)
    assert quiet.compiler_cpu_s is None and quiet.finding == "hung"  # no compiler: its CPU is not quoted
    assert evidence_of(None, None, 8.0, None, 2) == StallEvidence(frozen_s=8.0, finding="unknown", cpus=2)
    # exactly the stepping bound, and a load exactly the CPU count
    assert evidence_of(ProcSample(0.0), ProcSample(STEPPING_CPU_S), 8.0, (2.0, 0.0, 0.0), 2).finding == \
        "stepping"
    assert evidence_of(ProcSample(1.0), ProcSample(1.0), 8.0, (2.0, 0.0, 0.0), 2).finding == "starved"
    assert evidence_of(ProcSample(1.0), ProcSample(1.0), 8.0, (1.99, 0.0, 0.0), 2).finding == "hung"


def test_kinds_at_their_thresholds():
    # capacity waits with the cache below half full: the engine has room it will not use
    assert describe(snap(0.0, kv=0.49), 1.0).startswith("admission livelock on decode:")
    assert describe(snap(0.0, kv=0.5), 1.0).startswith("stall on decode: waiting=1 (capacity) running=0 kv=50.0%")
    full = {**IDLE, "kv": FULL_POOL}
    assert describe(snap(0.0, **full), 1.0).startswith("pool deadlock on decode: waiting=0 running=0 kv=99.0%")
    assert describe(snap(0.0, **{**full, "running": 1}), 1.0).startswith("stall on decode:")
    assert describe(snap(0.0, **{**IDLE, "kv": 0.98}), 2.25) == \
        "stall on decode: waiting=0 running=0 kv=98.0%, unchanged for 2.2 s"


def test_a_full_pool_blocks_from_full_pool_on():
    assert is_blocked(snap(0.0, **{**IDLE, "kv": FULL_POOL}), full_pool=True)
    assert not is_blocked(snap(0.0, **{**IDLE, "kv": 0.98}), full_pool=True)
    assert not is_blocked(snap(0.0, **{**IDLE, "kv": 1.0}))  # a prefill's pool holds others' blocks
    assert is_blocked(snap(0.0, **{**IDLE, "inprog": 1}))  # a KV load in flight holds a request back
    assert not is_blocked(snap(0.0, running=1))


def test_a_gap_of_exactly_max_gap_keeps_the_window(monkeypatch):
    monkeypatch.setattr(proctree, "host_load", lambda: (0.0, 0.0, 0.0))
    det = StallDetector(4.0, max_gap_s=2.0)
    fired = [det.feed(snap(t), ProcSample(50.0 + t)) for t in (0.0, 2.0, 4.0)]
    assert fired[2] is not None and fired[2].since == 0.0 and fired[2].decided_by == "window"
    det = StallDetector(4.0, max_gap_s=2.0)
    fired = [det.feed(snap(t), ProcSample(50.0 + t)) for t in (0.0, 2.5, 4.0, 6.5)]
    assert fired == [None, None, None, None]  # each gap over 2 s restarts it


def test_a_request_moving_only_between_fetch_stages_is_not_frozen():
    det = StallDetector(2.0)
    stages = [dict(wts=1, cw=0), dict(wts=0, cw=1)]  # the same waiting reason, another load stage
    assert all(det.feed(snap(float(t), **stages[t % 2])) is None for t in range(8))


def test_a_build_without_fetch_stages_has_no_read_in_flight(monkeypatch):
    """vLLM 0.30.0 has no vllm:num_requests_kv_fetch_by_stage: the stall window applies, not the transfer one."""
    monkeypatch.setattr(proctree, "host_load", lambda: (0.0, 0.0, 0.0))
    det = StallDetector(2.0, transfer_window_s=10.0)
    old = [parse_metrics("\n".join(ln for ln in snap(float(t)).text.splitlines() if "kv_fetch_by_stage" not in ln)
                         + "\n", "decode", t=float(t)) for t in range(4)]
    fired = [det.feed(s, ProcSample(50.0 + i)) for i, s in enumerate(old)]
    assert fired[:2] == [None, None] and fired[2] is not None and fired[2].duration_s == 2.0


def test_the_diagnosis_quotes_the_running_count():
    assert describe(snap(0.0, **{**IDLE, "kv": FULL_POOL, "running": 2}), 1.0) == \
        "stall on decode: waiting=0 running=2 kv=99.0%, unchanged for 1.0 s"


def test_a_stall_the_early_rule_decides_again_after_one_undecided_sample_is_one_episode(monkeypatch):
    monkeypatch.setattr(proctree, "host_load", lambda: (0.0, 0.0, 0.0))
    calls = []

    def early(facts, frozen_s, samples, engine_cpu_s):
        calls.append(samples)
        return None if samples == 3 else "the pool cannot fit it"

    w = StallWatcher(60.0, early=early)
    fired = _frozen(w, 4, cpu_per_s=1.0)
    assert [st is not None for st in fired] == [False, True, False, True] and calls == [2, 3, 4]
    (ep,) = w.episodes  # one freeze, one episode
    assert ep.since == 100.0 and ep.duration_s == 3.0
    for t in (104.0, 105.0):  # something moved (a token): the span restarts, a new freeze is a new episode
        w.feed(snap(t, gen=3), ProcSample(t))
    assert [(e.since, e.duration_s) for e in w.episodes] == [(100.0, 3.0), (104.0, 1.0)]


def test_the_default_sampling_gap_is_half_the_window_and_short_windows_are_valid(monkeypatch):
    monkeypatch.setattr(proctree, "host_load", lambda: (0.0, 0.0, 0.0))
    det = StallDetector(4.0)
    assert det.max_gap_s == 2.0
    assert [det.feed(snap(t), ProcSample(50.0 + t)) for t in (0.0, 3.0, 6.0)] == [None, None, None]  # 3 s gaps
    assert StallDetector(0.5, transfer_window_s=0.5).transfer_window_s == 0.5


@pytest.mark.parametrize("inprog,fires_at", [(1, 9), (0, 5)])
def test_the_inconclusive_wait_counts_from_the_window_that_applies(inprog, fires_at, monkeypatch):
    """A read in flight: from the transfer window (6 s) + 3 s; none: from the stall window (2 s) + 3 s."""
    monkeypatch.setattr(proctree, "host_load", lambda: LOADED)  # starved: inconclusive
    det = StallDetector(2.0, max_gap_s=2.0, transfer_window_s=6.0, inconclusive_s=3.0)
    fired = [det.feed(snap(float(t), inprog=inprog), ProcSample(50.0)) for t in range(12)]
    assert [t for t, st in enumerate(fired) if st is not None][0] == fires_at


def test_an_early_stall_carries_its_instance_and_evidence(monkeypatch):
    monkeypatch.setattr(proctree, "host_load", lambda: (0.0, 0.0, 0.0))
    seen = []

    def early(facts, frozen_s, samples, engine_cpu_s):
        seen.append(facts.evidence.finding)
        return "decided"

    det = StallDetector(60.0, early=early)
    fired = [det.feed(snap(float(t), instance="decode-2"), ProcSample(50.0 + t)) for t in range(2)]
    st = fired[1]
    assert st is not None and st.instance == "decode-2" and st.decided_by == "decided"
    assert seen == ["stepping"] and st.facts is not None and st.facts.evidence is not None
    assert st.facts.evidence.finding == "stepping" and st.facts.evidence.engine_cpu_s == 1.0


def test_cache_info_without_a_label_reads_the_other_and_facts_quote_running():
    text = 'vllm:cache_config_info{block_size="16",engine="0"} 1.0\n'
    assert cache_info(parse_metrics(text, "decode", t=0)) == {"block_size": 16}
    assert facts_of(snap(0.0, running=2), 1.0).running == 2.0

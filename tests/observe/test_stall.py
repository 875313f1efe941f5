"""The stall detector on recorded sequences of decode /metrics (templated vLLM 0.32.0 texts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rig.observe.metrics import parse_metrics
from rig.observe.stall import StallDetector, StallWatcher, describe, is_blocked

DATA = Path(__file__).resolve().parents[1] / "data"

TEMPLATE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="tiny"}} {waiting}
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{{engine="0",model_name="tiny",reason="capacity"}} {capacity}
vllm:num_requests_waiting_by_reason{{engine="0",model_name="tiny",reason="deferred"}} {deferred}
# HELP vllm:num_requests_kv_fetch_by_stage Number of waiting requests by async KV load stage.
# TYPE vllm:num_requests_kv_fetch_by_stage gauge
vllm:num_requests_kv_fetch_by_stage{{engine="0",model_name="tiny",stage="waiting_to_start"}} {wts}
vllm:num_requests_kv_fetch_by_stage{{engine="0",model_name="tiny",stage="in_progress"}} {inprog}
vllm:num_requests_kv_fetch_by_stage{{engine="0",model_name="tiny",stage="completed_waiting"}} {cw}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {kv}
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="tiny"}} {preempt}
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="tiny"}} {prompt}
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="tiny"}} {gen}
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="length",model_name="tiny"}} {success}
# HELP vllm:nixl_bytes_transferred Histogram of bytes transferred per NIXL KV Cache transfers.
# TYPE vllm:nixl_bytes_transferred histogram
vllm:nixl_bytes_transferred_count{{engine="0",model_name="tiny"}} {xfers}
vllm:nixl_bytes_transferred_sum{{engine="0",model_name="tiny"}} {xfer_bytes}
"""

# D stuck in the 0.32.0 admission livelock (as measured: docs/explanation/vllm-cpu-facts.md, tests/data/*stalled*).
LIVELOCK = dict(running=0, waiting=1, capacity=1, deferred=0, wts=1, inprog=0, cw=0, kv=0.0, preempt=0,
                prompt=8, gen=2, success=1, xfers=0, xfer_bytes=0)
IDLE = {**LIVELOCK, "waiting": 0, "capacity": 0, "wts": 0}


def snap(t: float, instance: str = "decode", **values):
    return parse_metrics(TEMPLATE.format(**{**LIVELOCK, **values}), instance, t=t)


def feed_all(det: StallDetector, snaps):
    """Feed in order; return [(t, Stall)] for every snapshot that fired."""
    return [(s.t, st) for s in snaps if (st := det.feed(s)) is not None]


def test_template_matches_the_recorded_livelock():
    recorded = parse_metrics((DATA / "vllm-0.32.0-decode-stalled-edge-126.prom").read_text(), "decode", t=0)
    templ = snap(0)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:generation_tokens_total", "vllm:prompt_tokens_total"):
        assert templ.value(name) == recorded.value(name), name
    for name, label in (("vllm:num_requests_waiting_by_reason", "reason"),
                        ("vllm:num_requests_kv_fetch_by_stage", "stage")):
        assert templ.by_label(name, label) == recorded.by_label(name, label)


def test_livelock_fires_at_exactly_the_window():
    det = StallDetector(8.0)
    fired = feed_all(det, [snap(100.0 + i) for i in range(8)])  # t = 100 .. 107
    assert fired == []
    stall = det.feed(snap(108.0))
    assert stall is not None
    assert stall.instance == "decode" and stall.since == 100.0 and stall.duration_s == 8.0
    assert stall.diagnosis.startswith("admission livelock on decode: waiting=1 (capacity) running=0 kv=0.0% "
                                      "kv_fetch waiting_to_start=1, unchanged for 8.0 s; no process evidence")
    assert stall.facts.evidence.finding == "unknown"  # no process sample fed: the window decides alone


def test_livelock_just_short_of_the_window_does_not_fire():
    det = StallDetector(8.0)
    assert feed_all(det, [snap(t) for t in (0.0, 2.0, 4.0, 6.0, 7.99)]) == []
    assert det.feed(snap(8.0)) is not None


def test_livelock_on_the_recorded_text_fires():
    text = (DATA / "vllm-0.32.0-decode-stalled-edge-126.prom").read_text()
    det = StallDetector(8.0)
    fired = feed_all(det, [parse_metrics(text, "decode", t=float(t)) for t in range(0, 10)])
    assert [t for t, _ in fired] == [8.0, 9.0]  # keeps reporting while it lasts
    assert fired[0][1].diagnosis.split("; ")[0] == (
        "admission livelock on decode: waiting=1 (capacity) running=0 kv=0.0% "
        "kv_fetch waiting_to_start=1, unchanged for 8.0 s")


def test_slow_but_progressing_request_never_fires():
    # Blocked-looking gauges (waiting 1, running 0) but a token comes out every 3 s.
    det = StallDetector(8.0)
    snaps = [snap(float(t), gen=2 + t // 3) for t in range(60)]
    assert feed_all(det, snaps) == []


def test_progress_in_prompt_tokens_or_transfers_never_fires():
    det = StallDetector(8.0)
    assert feed_all(det, [snap(float(t), prompt=8 + 32 * (t // 5)) for t in range(40)]) == []
    det = StallDetector(8.0)
    assert feed_all(det, [snap(float(t), xfers=t // 4, xfer_bytes=65536 * (t // 4)) for t in range(40)]) == []


def test_waiting_with_running_requests_never_fires():
    # A queue behind a running request that itself is frozen is not an admission stall.
    det = StallDetector(2.0)
    assert feed_all(det, [snap(float(t), running=1, kv=0.8) for t in range(30)]) == []


def test_idle_never_fires():
    det = StallDetector(2.0)
    assert feed_all(det, [parse_metrics(TEMPLATE.format(**IDLE), "decode", t=float(t)) for t in range(30)]) == []


def test_a_change_in_the_middle_restarts_the_window():
    det = StallDetector(8.0)
    snaps = [snap(float(t)) for t in range(5)]  # frozen t = 0..4
    snaps += [snap(float(t), kv=0.25, wts=0, inprog=1) for t in range(5, 20)]  # changed at t = 5
    fired = feed_all(det, snaps)
    assert fired[0][0] == 13.0  # 5 + 8, not 0 + 8
    assert fired[0][1].since == 5.0 and fired[0][1].duration_s == 8.0


def test_leaving_the_blocked_state_restarts_the_window():
    det = StallDetector(8.0)
    snaps = [snap(float(t)) for t in range(6)]
    snaps.append(snap(6.0, waiting=0, capacity=0, wts=0))  # briefly nothing waits
    snaps += [snap(float(t)) for t in range(7, 20)]  # the very same frozen values again
    fired = feed_all(det, snaps)
    assert fired[0][0] == 15.0  # 7 + 8


def test_stall_that_is_not_a_livelock():
    # KV nearly full and requests deferred: frozen, but not "room it will not use".
    s = snap(0.0, kv=0.9, capacity=0, deferred=1, wts=0, inprog=1)
    assert describe(s, 12.0) == ("stall on decode: waiting=1 (deferred) running=0 kv=90.0% "
                                 "kv_fetch in_progress=1, unchanged for 12.0 s")


def test_describe_without_reason_labels():
    s = parse_metrics('vllm:num_requests_waiting{engine="0"} 2\nvllm:num_requests_running{engine="0"} 0\n',
                      "d1", t=0.0)
    assert describe(s, 3.0) == "stall on d1: waiting=2 running=0 kv=0.0%, unchanged for 3.0 s"


@pytest.mark.parametrize("window", [0, -1.0])
def test_window_must_be_positive(window):
    with pytest.raises(ValueError, match="stall windows must be > 0 s"):
        StallDetector(window)


def test_a_sampling_gap_restarts_the_window():
    """Two samples 26 s apart prove nothing about the time between them (a starved observer):
    no stall may be declared from them; the window restarts at the sample after the gap."""
    det = StallDetector(8.0)
    assert det.feed(snap(0.0)) is None
    assert det.feed(snap(26.0)) is None  # the gap restarts the window
    assert feed_all(det, [snap(t) for t in (28.0, 30.0, 32.0)]) == []
    stall = det.feed(snap(34.0))
    assert stall is not None and stall.since == 26.0 and stall.duration_s == 8.0


def test_a_read_in_flight_gets_the_transfer_window_not_the_stall_window():
    # The CI host's shape: D holds 4 blocks for one request whose NIXL read is in flight
    # (kv_fetch in_progress=1) and nothing moves for more than 8 s; the read then completes.
    det = StallDetector(8.0, transfer_window_s=30.0)
    reading = [snap(float(t), wts=0, inprog=1, kv=0.8, capacity=0) for t in range(30)]
    assert feed_all(det, reading) == []
    stall = det.feed(snap(30.0, wts=0, inprog=1, kv=0.8, capacity=0))
    assert stall is not None and stall.duration_s == 30.0
    assert "stall on decode" in stall.diagnosis and "kv_fetch in_progress=1" in stall.diagnosis


def test_the_livelock_keeps_the_short_window_when_a_transfer_window_is_set():
    det = StallDetector(8.0, transfer_window_s=30.0)
    assert [t for t, _ in feed_all(det, [snap(float(t)) for t in range(10)])] == [8.0, 9.0]


def test_windows_must_be_positive():
    with pytest.raises(ValueError, match="> 0 s"):
        StallDetector(8.0, transfer_window_s=0)


def test_episodes_group_a_stall_per_instance_and_end_when_it_moves():
    from rig.observe.stall import StallWatcher

    eps = StallWatcher(4.0)
    frozen = [snap(float(t), instance="prefill") for t in range(10)]  # t = 0..9 frozen
    moving = [snap(10.0 + t, instance="prefill", gen=5 + t) for t in range(3)]
    idle = [parse_metrics(TEMPLATE.format(**IDLE), "decode", t=float(t)) for t in range(13)]
    for s in sorted(frozen + moving + idle, key=lambda s: s.t):
        eps.feed(s)
    (ep,) = eps.episodes
    assert ep.instance == "prefill" and ep.since == 0.0 and ep.duration_s == 9.0
    assert ep.diagnosis.startswith("admission livelock on prefill")
    assert ep.diagnosis.split("; ")[0].endswith("unchanged for 9.0 s")
    for t in range(20, 30):  # frozen again: a second episode
        eps.feed(snap(float(t), instance="prefill"))
    assert [e.since for e in eps.episodes] == [0.0, 20.0]


# bug record R01 (vllm PR #57104): two finished loads fill D's pool and block each other. Nothing runs,
# KV is full, generation is flat, and the requests need not count as waiting: here they sit in
# the KV fetch's completed_waiting stage (WAITING_FOR_REMOTE_KVS) with waiting 0.
R01_HANG = {**LIVELOCK, "waiting": 0, "capacity": 0, "wts": 0, "cw": 2, "kv": 1.0, "prompt": 128, "xfers": 2}
# The same full pool with no request visible at all (no waiting, no fetch stage): what a prefill
# holding finished requests' blocks for decode's pull looks like, and a decode's R01 on a build
# that counts neither.
FULL_NOTHING_VISIBLE = {**R01_HANG, "cw": 0}


def test_r01_hang_without_waiting_fires_as_a_pool_deadlock():
    for full_pool in (False, True):  # the fetch stage alone makes it blocked
        det = StallDetector(8.0, full_pool=full_pool)
        fired = feed_all(det, [snap(float(t), **R01_HANG) for t in range(10)])
        assert [t for t, _ in fired] == [8.0, 9.0]
        assert fired[0][1].diagnosis.split("; ")[0] == ("pool deadlock on decode: waiting=0 running=0 kv=100.0% "
                                         "kv_fetch completed_waiting=2, unchanged for 8.0 s")
        assert fired[0][1].facts.kv_fetch_stages == {"completed_waiting": 2.0}


def test_full_pool_with_nothing_visible_is_a_stall_only_where_the_pool_is_the_requests_own():
    snaps = [snap(float(t), **FULL_NOTHING_VISIBLE) for t in range(12)]
    assert feed_all(StallDetector(8.0), snaps) == []  # a prefill holding blocks for pulls: never
    fired = feed_all(StallDetector(8.0, full_pool=True), snaps)
    assert fired and fired[0][0] == 8.0
    assert fired[0][1].diagnosis.startswith("pool deadlock on decode: waiting=0 running=0 kv=100.0%")


def test_full_pool_rule_needs_the_pool_full_and_nothing_running():
    assert is_blocked(snap(0.0, **FULL_NOTHING_VISIBLE), full_pool=True)
    assert not is_blocked(snap(0.0, **{**FULL_NOTHING_VISIBLE, "kv": 0.75}), full_pool=True)
    assert not is_blocked(snap(0.0, **{**FULL_NOTHING_VISIBLE, "running": 1}), full_pool=True)
    assert not is_blocked(snap(0.0, **IDLE), full_pool=True)  # an idle decode: empty pool


def test_full_pool_that_progresses_or_runs_never_fires():
    det = StallDetector(8.0, full_pool=True)
    # Generation moving every 3 s (a slow but live engine) with the pool full.
    assert feed_all(det, [snap(float(t), **{**FULL_NOTHING_VISIBLE, "gen": 2 + t // 3}) for t in range(60)]) == []
    det = StallDetector(8.0, full_pool=True)
    # A full pool that decodes (running 1, frozen counters between scrapes) is not blocked.
    assert feed_all(det, [snap(float(t), **{**FULL_NOTHING_VISIBLE, "running": 1}) for t in range(30)]) == []


def test_full_pool_keeps_the_livelock_and_control_answers():
    # The recorded 0.32.0 livelock and the idle/running controls give the same answers with the
    # decode-only full_pool rule on.
    text = (DATA / "vllm-0.32.0-decode-stalled-edge-126.prom").read_text()
    for full_pool in (False, True):
        det = StallDetector(8.0, full_pool=full_pool)
        fired = feed_all(det, [parse_metrics(text, "decode", t=float(t)) for t in range(0, 10)])
        assert [t for t, _ in fired] == [8.0, 9.0]
        assert fired[0][1].diagnosis.startswith("admission livelock on decode")
        for name in ("vllm-0.32.0-decode-6blk-after-edge-126.prom", "vllm-0.32.0-decode-6blk-before-edge-126.prom"):
            rec = (DATA / name).read_text()
            det = StallDetector(2.0, full_pool=full_pool)
            assert feed_all(det, [parse_metrics(rec, "decode", t=float(t)) for t in range(20)]) == [], name
        det = StallDetector(2.0, full_pool=full_pool)
        assert feed_all(det, [snap(float(t), running=1, kv=0.8) for t in range(30)]) == []


def test_watcher_gives_full_pool_to_every_instance_it_feeds():
    w = StallWatcher(8.0, full_pool=True)
    fired = [st for t in range(10) if (st := w.feed(snap(float(t), **FULL_NOTHING_VISIBLE)))]
    assert fired and len(w.episodes) == 1
    w = StallWatcher(8.0)  # the timeline's watcher (it samples prefill too): off
    assert [st for t in range(10) if (st := w.feed(snap(float(t), instance="prefill", **FULL_NOTHING_VISIBLE)))] == []

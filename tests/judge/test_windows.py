"""The judging windows (rig.judge.windows): each bound follows the measured per-request baseline
between its floor and its cap, names where it came from, and refuses nonsense."""

from __future__ import annotations

import pytest

from rig.judge.windows import (
    LATENCY_REQUESTS,
    SHORTFALL_MIN_GAPS,
    SHORTFALL_REQUESTS,
    Bound,
    latency_bound,
    load_slowdown,
    round_trips,
    shortfall_bound,
)


def test_the_shortfall_bound_is_four_request_times_between_its_floor_and_its_cap():
    assert (SHORTFALL_REQUESTS, SHORTFALL_MIN_GAPS) == (4, 4)
    assert shortfall_bound(0.3, 0.05, 8.0) == Bound(1.2, "4 x the measured request 0.3 s")
    assert shortfall_bound(0.005, 0.05, 8.0) == Bound(0.2, "4 x timeouts.sample_gap_s, at least; 4 x the measured "
                                                           "request 0.005 s")
    assert shortfall_bound(3.0, 0.05, 8.0) == Bound(8.0, "timeouts.stall_window_s, at most; 4 x the measured "
                                                         "request 3 s")
    assert shortfall_bound(2.0, 0.05, 8.0).seconds == 8.0  # exactly at the cap: the cap's words
    assert shortfall_bound(0.05, 0.05, 8.0) == Bound(0.2, "4 x the measured request 0.05 s")  # floor == derived
    assert shortfall_bound(1.0, 1.0, 2.0).seconds == 2.0  # a floor above the cap: the cap wins
    assert shortfall_bound(None, 0.05, 8.0) == Bound(8.0, "timeouts.stall_window_s: no per-request baseline measured")
    assert shortfall_bound(0.3, 0.05, 8.0).text() == "1.2 s (4 x the measured request 0.3 s)"


@pytest.mark.parametrize("args", [(-0.1, 0.05, 8.0), (0.1, -0.05, 8.0), (0.1, 0.05, -1.0)])
def test_the_shortfall_bound_refuses_negative_seconds(args):
    with pytest.raises(ValueError, match="shortfall_bound: seconds must be >= 0"):
        shortfall_bound(*args)


def test_the_latency_bound_is_twenty_request_times_of_work_between_its_floor_and_its_cap():
    assert LATENCY_REQUESTS == 20
    # 20 x 0.1 s x 4 round trips of work = 8 s: between the 5 s floor and the 30 s cap
    assert latency_bound(0.1, 4.0, 5.0, 30.0) == Bound(8.0, "20 x the measured request 0.1 s x 4 round trips of work")
    assert latency_bound(0.01, 1.0, 5.0, 30.0) == Bound(5.0, "timeouts.latency_floor_s, at least; 20 x the measured "
                                                             "request 0.01 s x 1 round trips of work")
    assert latency_bound(1.0, 3.0, 5.0, 30.0) == Bound(30.0, "timeouts.kv_transfer_s, at most; 20 x the measured "
                                                             "request 1 s x 3 round trips of work")
    assert latency_bound(1.0, 1.0, 50.0, 30.0).seconds == 30.0  # a floor above the cap: the cap wins
    assert latency_bound(None, 4.0, 5.0, 30.0) is None  # no baseline: no bound, the check is not checked


def test_a_request_counts_as_the_larger_of_its_prompt_and_its_answer_in_baseline_round_trips():
    assert round_trips(8, 2) == 1.0  # the baseline's own 8-token prompt, 2 tokens
    assert round_trips(1, 1) == 1.0  # never less than one round trip
    assert round_trips(96, 2) == 12.0
    assert round_trips(8, 40) == 20.0


def test_the_host_slowdown_is_the_rise_in_load_per_cpu_since_the_baseline():
    assert load_slowdown(1.0, 20.0, 2) == 10.0  # a CPU to spare then, 10 runnable tasks per CPU now
    assert load_slowdown(20.0, 20.0, 2) == 1.0  # the baseline was measured on the same loaded host
    assert load_slowdown(30.0, 10.0, 2) == 1.0  # a host that got quieter makes nothing slower
    assert load_slowdown(0.5, 1.5, 2) == 1.0  # under one task per CPU: nobody waits for a CPU
    assert load_slowdown(None, 20.0, 2) == load_slowdown(1.0, None, 2) == load_slowdown(1.0, 20.0, None) == 1.0


@pytest.mark.parametrize("args", [(-0.1, 1.0, 5.0, 30.0), (0.1, -1.0, 5.0, 30.0), (0.1, 1.0, -5.0, 30.0),
                                  (0.1, 1.0, 5.0, -30.0)])
def test_the_latency_bound_refuses_negative_inputs(args):
    with pytest.raises(ValueError, match="latency_bound: seconds must be >= 0"):
        latency_bound(*args)

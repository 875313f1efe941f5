"""The judging windows (rig.judge.windows): each bound follows the measured per-request baseline
between its floor and its cap, names where it came from, and refuses nonsense."""

from __future__ import annotations

import pytest

from rig.judge.windows import SHORTFALL_MIN_GAPS, SHORTFALL_REQUESTS, Bound, shortfall_bound


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

"""The stall detector and watcher (rig.observe.stall) where `make mutation` found them untested: a
watch that sampled nothing is "not checked", never "no stall"; diagnoses and evidence say the
frozen values the user acts on. Pure: recorded snapshots, stub scrapes, no sleeps."""

from __future__ import annotations

import asyncio

import httpx

from rig.judge.sequence_checks import no_stall_check
from rig.observe.stall import StallWatcher, watch
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

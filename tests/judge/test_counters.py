"""counters-monotonic details as the user reads them (rig/judge/counters.py): each decrease names
its instance, series, values and its time from that instance's first sample; at most three are
listed; an instance without a process life is named once; the holding detail counts series, samples
and lives. Written against `make mutation` survivors (docs/howto/mutation.md)."""

from __future__ import annotations

from rig.judge.counters import NAME, counters_monotonic_check, decreases
from test_counters_monotonic import SRC, row

A, B, C, D = (f'vllm:c{i}_total{{engine="0"}}' for i in range(4))


def test_each_decrease_is_timed_from_its_own_instances_first_sample():
    rows = [row("prefill", 5.0, {A: 1.0}), row("decode", 10.0, {A: 4.0}), row("prefill", 6.5, {A: 0.5}),
            row("decode", 12.25, {A: 3.0})]
    assert decreases(rows) == ([f"prefill: {A} 1 -> 0.5 at +1.5 s", f"decode: {A} 4 -> 3 at +2.2 s"], [])


def test_a_row_without_time_or_instance_reads_zero_and_question_mark():
    rows = [{"counters": {A: 2.0}, "life": 1.0}, {"counters": {A: 1.0}, "life": 1.0, "t": 3.0}]
    assert decreases(rows) == ([f"?: {A} 2 -> 1 at +3.0 s"], [])


def test_at_most_three_decreases_are_listed_then_an_ellipsis():
    first = {A: 9.0, B: 9.0, C: 9.0, D: 9.0}
    c = counters_monotonic_check([row("decode", 0.0, first), row("decode", 1.0, dict.fromkeys(first, 8.0))])
    assert (c.name, c.ok) == (NAME, False)
    assert c.detail == (f"4 counter decrease(s) within one process life: decode: {A} 9 -> 8 at +1.0 s; "
                        f"decode: {B} 9 -> 8 at +1.0 s; decode: {C} 9 -> 8 at +1.0 s; ...")
    three = {A: 9.0, B: 9.0, C: 9.0}
    c = counters_monotonic_check([row("decode", 0.0, three), row("decode", 1.0, dict.fromkeys(three, 8.0))])
    assert c.detail == (f"3 counter decrease(s) within one process life: decode: {A} 9 -> 8 at +1.0 s; "
                        f"decode: {B} 9 -> 8 at +1.0 s; decode: {C} 9 -> 8 at +1.0 s")


def test_an_instance_without_life_is_named_once_and_a_real_decrease_still_fails():
    rows = [row("decode", 0.0, {A: 9.0, B: 9.0}, life=None), row("decode", 1.0, {A: 1.0, B: 1.0}, life=None),
            row("decode", 2.0, {A: 0.0}, life=None), row("prefill", 0.0, {A: 5.0}, life=None),
            row("prefill", 1.0, {A: 4.0}, life=None)]
    assert decreases(rows) == ([], ["decode", "prefill"])
    c = counters_monotonic_check(rows)
    assert (c.name, c.ok) == (NAME, None)
    assert c.detail == ("not checked: decode, prefill showed a counter drop but exposes no "
                        "process_start_time_seconds, so a restart cannot be told from a decrease")
    c = counters_monotonic_check(rows + [row("decode", 3.0, {SRC: 2.0}), row("decode", 4.0, {SRC: 1.0})])
    assert c.ok is False
    assert c.detail == f"1 counter decrease(s) within one process life: decode: {SRC} 2 -> 1 at +4.0 s"


def test_the_holding_detail_counts_series_samples_and_lives():
    rows = [row("decode", 0.0, {A: 1.0}), row("decode", 1.0, {A: 1.0, B: 2.0}), row("prefill", 0.0, {A: 0.0}),
            row("prefill", 1.0, {C: 3.0}, life=2.0), {"instance": "decode", "t": 2.0, "counters": {}, "life": 1.0}]
    c = counters_monotonic_check(rows)
    assert (c.name, c.ok) == (NAME, True)
    assert c.detail == "3 counter series never decreased over 4 samples in 3 process life(s)"


def test_not_checked_details_name_what_was_missing():
    c = counters_monotonic_check([{"instance": "decode", "t": 0.0, "counters": {}}])
    assert (c.name, c.ok, c.detail) == (NAME, None, "not checked: no metrics timeline with counters was sampled")
    c = counters_monotonic_check([row("decode", 0.0, {A: 1.0}), row("decode", 1.0, {A: 1.0}, life=2.0)])
    assert (c.name, c.ok, c.detail) == (NAME, None, "not checked: no process life sampled twice (2 sample(s))")


def test_a_series_that_appears_later_starts_its_own_comparison():
    rows = [row("decode", 0.0, {A: 5.0}), row("decode", 1.0, {A: 5.0, B: 1.0}), row("decode", 2.0, {A: 6.0, B: 2.0})]
    assert decreases(rows) == ([], [])
    assert counters_monotonic_check(rows).ok is True

"""counters-monotonic details as the user reads them (rig/judge/counters.py): each decrease names
its instance, series, values and its time from that instance's first sample; at most three are
listed; an instance without a process life is named once; the holding detail counts series, samples
and lives. Written against `make mutation` survivors (docs/howto/mutation.md)."""

from __future__ import annotations

import json
from pathlib import Path

from rig.config import ScenarioConfig
from rig.judge.counters import NAME, counters_monotonic_check, decreases
from rig.judge.verdict import judge
from rig.observe import metrics as m
from rig.observe.observations import ScenarioObservation, SnapshotStore

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
    assert (c.name, c.ok, c.samples) == (NAME, False, 2)
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
    assert (c.name, c.ok, c.samples) == (NAME, None, 5)
    assert c.detail == ("not checked: decode, prefill showed a counter drop but exposes no "
                        "process_start_time_seconds, so a restart cannot be told from a decrease")
    c = counters_monotonic_check(rows + [row("decode", 3.0, {SRC: 2.0}), row("decode", 4.0, {SRC: 1.0})])
    assert c.ok is False
    assert c.detail == f"1 counter decrease(s) within one process life: decode: {SRC} 2 -> 1 at +4.0 s"


def test_the_holding_detail_counts_series_samples_and_lives():
    rows = [row("decode", 0.0, {A: 1.0}), row("decode", 1.0, {A: 1.0, B: 2.0}), row("prefill", 0.0, {A: 0.0}),
            row("prefill", 1.0, {C: 3.0}, life=2.0), {"instance": "decode", "t": 2.0, "counters": {}, "life": 1.0}]
    c = counters_monotonic_check(rows)
    assert (c.name, c.ok, c.samples) == (NAME, True, 4)  # the row without counters is not one
    assert c.detail == "3 counter series never decreased over 4 samples in 3 process life(s)"


def test_not_checked_details_name_what_was_missing():
    c = counters_monotonic_check([{"instance": "decode", "t": 0.0, "counters": {}}])
    assert (c.name, c.ok, c.detail, c.samples) == (NAME, None, "not checked: no metrics timeline with counters was "
                                                              "sampled", 0)
    c = counters_monotonic_check([row("decode", 0.0, {A: 1.0}), row("decode", 1.0, {A: 1.0}, life=2.0)])
    assert (c.name, c.ok, c.detail, c.samples) == (NAME, None, "not checked: no process life sampled twice "
                                                              "(2 sample(s))", 2)


def test_a_series_that_appears_later_starts_its_own_comparison():
    rows = [row("decode", 0.0, {A: 5.0}), row("decode", 1.0, {A: 5.0, B: 1.0}), row("decode", 2.0, {A: 6.0, B: 2.0})]
    assert decreases(rows) == ([], [])
    assert counters_monotonic_check(rows).ok is True


# -------------------------------------------------------------------------------------------------
# counters-monotonic (bug record R12): the timeline rows carry every counter, and the check fails on a
# decrease within one process life, forgives a restart, and is "not checked" without a timeline.

DATA = Path(__file__).resolve().parents[1] / "data"
BEFORE = DATA / "vllm-0.32.0-decode-6blk-before-edge-126.prom"
AFTER = DATA / "vllm-0.32.0-decode-6blk-after-edge-126.prom"
SRC = 'vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="external_kv_transfer"}'


def row(inst: str, t: float, counters: dict[str, float], life: float | None = 1.0) -> dict:
    r = {"instance": inst, "t": t, "scenario": "s", "counters": counters}
    if life is not None:
        r["life"] = life
    return r


def test_parse_marks_counter_histogram_and_summary_samples_only():
    snap = m.parse_metrics(BEFORE.read_text(), "decode")
    assert m.PREEMPTIONS in snap.monotonic and m.NIXL_BYTES_SUM in snap.monotonic
    assert m.NIXL_XFER_COUNT in snap.monotonic
    assert m.KV_USAGE not in snap.monotonic and m.RUNNING not in snap.monotonic  # gauges
    assert not any(n.endswith(("_created", "_bucket")) for n in snap.monotonic)
    values = m.counter_values(snap)
    assert any(k.startswith(m.PROMPT_TOKENS_BY_SOURCE + "{") and 'source="external_kv_transfer"' in k for k in values)
    assert snap.get(m.PROCESS_START) is not None  # vLLM 0.32.0 exposes the process's life


def test_store_rows_carry_counters_and_life(tmp_path):
    store = SnapshotStore(tmp_path)
    store.sample("sc", m.parse_metrics(BEFORE.read_text(), "decode", t=1.0))
    store.sample("other", m.parse_metrics(AFTER.read_text(), "decode", t=2.0))
    store.close()
    rows = store.rows_of("sc")
    assert len(rows) == 1 and rows[0]["life"] > 0
    assert m.PREEMPTIONS + '{engine="0",model_name="tiny"}' in rows[0]["counters"]
    on_disk = [json.loads(ln) for ln in (tmp_path / "metrics" / "timeline.jsonl").read_text().splitlines()]
    assert [r["scenario"] for r in on_disk] == ["sc", "other"] and on_disk[0]["counters"] == rows[0]["counters"]


def test_real_before_after_pair_is_monotonic(tmp_path):
    store = SnapshotStore(tmp_path)
    for i, f in enumerate((BEFORE, AFTER)):
        store.sample("sc", m.parse_metrics(f.read_text(), "decode", t=float(i)))
    store.close()
    c = counters_monotonic_check(store.rows_of("sc"))
    assert c.ok is True, c.detail


def test_decreasing_counter_fails_naming_series_and_values():
    rows = [row("decode", 0.0, {SRC: 96.0}), row("prefill", 0.5, {SRC: 0.0}),
            row("decode", 1.0, {SRC: 192.0}), row("decode", 2.0, {SRC: 160.0})]
    c = counters_monotonic_check(rows)
    assert c.ok is False and c.requests == ()
    assert "decode: " + SRC + " 192 -> 160 at +2.0 s" in c.detail


def test_restart_starts_a_new_life():
    rows = [row("prefill", 0.0, {SRC: 500.0}, life=100.0), row("prefill", 1.0, {SRC: 3.0}, life=200.0),
            row("prefill", 2.0, {SRC: 7.0}, life=200.0)]
    assert counters_monotonic_check(rows).ok is True
    rows.append(row("prefill", 3.0, {SRC: 5.0}, life=200.0))
    assert counters_monotonic_check(rows).ok is False


def test_drop_without_life_is_not_checked_not_ok():
    rows = [row("decode", 0.0, {SRC: 9.0}, life=None), row("decode", 1.0, {SRC: 2.0}, life=None)]
    assert decreases(rows) == ([], ["decode"])
    c = counters_monotonic_check(rows)
    assert c.ok is None and "process_start_time_seconds" in c.detail


def test_no_timeline_is_not_checked():
    assert counters_monotonic_check([]).ok is None
    assert counters_monotonic_check([{"instance": "decode", "t": 0.0}]).ok is None
    # one sample per life compares nothing
    one_each = [row("decode", 0.0, {SRC: 1.0}), row("prefill", 0.0, {SRC: 1.0}),
                row("prefill", 1.0, {SRC: 0.0}, life=2.0)]
    c = counters_monotonic_check(one_each)
    assert c.ok is None and "no process life sampled twice" in c.detail


def test_judge_fails_a_scenario_on_a_decrease_and_keeps_it_out_of_required():
    sc = ScenarioConfig(name="s", prompt_tokens=8, max_tokens=2, parity=False)
    obs = ScenarioObservation(scenario="s", decode="decode", prefill="prefill",
                              timeline=[row("decode", 0.0, {SRC: 9.0}), row("decode", 1.0, {SRC: 2.0})])
    v = judge(sc, obs, checks=[])
    assert v.verdict == "FAIL" and "counters-monotonic" in v.reason
    obs.timeline = []
    v = judge(sc, obs, checks=[])
    assert [c.state for c in v.checks if c.name == "counters-monotonic"] == ["not checked"]
    assert "counters-monotonic" not in v.reason


def test_r12_log_lines_are_fatal():
    from rig.cluster.logs import FATAL_PATTERNS, matching_lines

    log = ("INFO 11-30 ok\n"
           "ERROR 11-30 [async_llm.py:906] AsyncLLM output_handler failed.\n"
           "ValueError: Counters can only be incremented by non-negative amounts.\n")
    assert len(matching_lines(log, FATAL_PATTERNS)) == 2


# -------------------------------------------------------------------------------------------------
# counters-monotonic says what it saw, in every state (rig/judge/counters.py): the decreases with
# their instance, series, values and time, the instances it could not attribute, the counts it
# held over. Written against `make mutation` survivors (docs/howto/mutation.md).

S = "vllm:x_total"


def srow(t: float, value: float, inst: str = "decode", life: float | None = 1.0, **more: float) -> dict:
    return {"t": t, "instance": inst, "life": life, "counters": {S: value, **more}}


def test_every_state_and_its_detail():
    c = counters_monotonic_check([])
    assert (c.name, c.ok, c.detail) == ("counters-monotonic", None,
                                        "not checked: no metrics timeline with counters was sampled")
    c = counters_monotonic_check([srow(10.0, 1.0)])
    assert (c.name, c.ok, c.detail) == ("counters-monotonic", None,
                                        "not checked: no process life sampled twice (1 sample(s))")
    c = counters_monotonic_check([srow(10.0, 1.0), srow(11.0, 2.0, **{"vllm:y_total": 0.0})])
    assert (c.name, c.ok, c.detail) == ("counters-monotonic", True,
                                        "2 counter series never decreased over 2 samples in 1 process life(s)")
    c = counters_monotonic_check([srow(10.0, 5.0, life=None), srow(11.0, 4.0, life=None)])
    assert (c.name, c.ok) == ("counters-monotonic", None)
    assert c.detail == ("not checked: decode showed a counter drop but exposes no process_start_time_seconds, so a "
                        "restart cannot be told from a decrease")


def test_decreases_name_instance_series_values_and_time():
    rows = [srow(10.0, 5.0), srow(12.5, 4.0), srow(20.0, 7.0, inst="prefill"), srow(21.0, 6.0, inst="prefill")]
    found, blind = decreases(rows)
    assert found == [f"decode: {S} 5 -> 4 at +2.5 s", f"prefill: {S} 7 -> 6 at +1.0 s"] and blind == []
    assert decreases([{"counters": {S: 2.0}, "life": 1}, {"counters": {S: 1.0}, "life": 1}])[0] == [
        f"?: {S} 2 -> 1 at +0.0 s"]
    assert decreases([srow(10.0, 2.0, life=None), srow(11.0, 1.0, life=None), srow(12.0, 0.0, life=None)]) == (
        [], ["decode"])


def test_more_than_three_decreases_are_cut_with_an_ellipsis():
    rows = [srow(float(t), 10.0 - t) for t in range(5)]
    c = counters_monotonic_check(rows)
    assert c.ok is False and c.detail.startswith("4 counter decrease(s) within one process life: decode: ")
    assert c.detail.endswith(f"decode: {S} 8 -> 7 at +3.0 s; ...") and c.detail.count("->") == 3
    c = counters_monotonic_check(rows[:4])
    assert c.detail.endswith(f"decode: {S} 8 -> 7 at +3.0 s")

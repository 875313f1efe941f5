"""counters-monotonic (bug record R12): the timeline rows carry every counter, and the check fails on a
decrease within one process life, forgives a restart, and is "not checked" without a timeline."""

from __future__ import annotations

import json
from pathlib import Path

from rig.config import ScenarioConfig
from rig.judge.counters import counters_monotonic_check, decreases
from rig.judge.verdict import judge
from rig.observe import metrics as m
from rig.observe.observations import ScenarioObservation, SnapshotStore

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

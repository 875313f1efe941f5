"""A sequence whose every request the rig cut on purpose (rig/judge/sequence_checks.py): its answer
checks are "not checked" saying why and not required, the run-level checks still judge it, a PASS
says "all N requests cancelled on purpose"; one request that failed brings the answer checks back."""

from __future__ import annotations

from rig.judge.sequence_checks import ANSWER_CHECKS, all_cut_on_purpose, judge_sequence, sequence_required
from rig.observe.observations import DrainResult, ScenarioObservation
from rig.transport.records import PDRecord
from rig.workload.sequence import ABANDONED, CANCELLED, SequenceEntry, SequenceResult
from test_sequence_checks import scen

CUT = {"id": "cut", "route": "pd", "prompt_tokens": 64, "max_tokens": 8, "cancel_after_ms": [5, 5]}


def _cut(rid: str) -> PDRecord:
    return PDRecord(rid, 64, 8, outcome="cancelled", diagnosis=f"{CANCELLED} after 5 ms")


def _observed(records: list[PDRecord]) -> tuple[ScenarioObservation, SequenceResult]:
    """An observation where everything the run-level checks look at was seen and healthy."""
    obs = ScenarioObservation(scenario="s", decode="decode", prefill="prefill", records=records,
                              fatal_lines={"prefill": [], "decode": []},
                              kv_integrity_lines={"prefill": []})
    drains = [DrainResult(n, True, 0.2, 0.0, {}) for n in ("prefill", "decode")]
    res = SequenceResult(entries=[SequenceEntry(r.request_id, "cut", "pd") for r in records], drains=drains,
                         idle_bound_s=15.0, lease_s=5.0)
    return obs, res


def test_every_request_cut_passes_on_the_run_checks_and_says_so():
    sc = scen(CUT)
    obs, res = _observed([_cut("c0"), _cut("c1")])
    assert all_cut_on_purpose(obs)
    v = judge_sequence(sc, obs, res)
    checks = {c.name: c for c in v.checks}
    for name in ("token-counts", "kv-pulled", "parity"):
        assert checks[name].ok is None
        assert checks[name].detail.startswith("not checked: all 2 requests were cancelled on purpose")
    assert v.verdict == "PASS", v.reason
    assert v.reason.startswith("all 2 requests cancelled on purpose: no answer to judge; ")
    assert "idle-after" in v.reason and "alive" in v.reason
    assert not set(ANSWER_CHECKS) & set(sequence_required(sc, obs))
    assert {"kv-pulled", "parity"} <= set(sequence_required(sc))  # without the observation: required


def test_a_failed_request_among_the_cut_ones_brings_the_answer_checks_back():
    sc = scen(CUT)
    obs, res = _observed([_cut("c0"), PDRecord("c1", 64, 8, outcome="http_error", diagnosis="HTTP 500")])
    assert not all_cut_on_purpose(obs)
    v = judge_sequence(sc, obs, res)
    assert v.verdict == "FAIL"
    assert {"kv-pulled", "parity"} <= set(sequence_required(sc, obs))
    assert not any(c.detail.startswith("not checked: all") for c in v.checks)


def test_a_cut_without_a_plan_is_not_on_purpose_and_an_abandon_is():
    stray = PDRecord("c0", 64, 8, outcome="cancelled", diagnosis="cancelled by the stall watcher")
    assert not all_cut_on_purpose(_observed([stray])[0])
    assert all_cut_on_purpose(_observed([PDRecord("a0", 8, 8, outcome="cancelled", diagnosis=ABANDONED)])[0])
    assert not all_cut_on_purpose(_observed([])[0])


def test_a_run_check_that_could_not_look_still_keeps_an_all_cut_sequence_from_pass():
    sc = scen(CUT)
    obs, res = _observed([_cut("c0")])
    obs.fatal_lines = {}  # no log was scanned
    v = judge_sequence(sc, obs, res)
    assert v.verdict == "ERROR"
    assert "cancelled on purpose: no answer to judge" not in v.reason


def test_the_not_checked_details_name_what_each_check_had_nothing_for():
    repeat = {"id": "again", "route": "pd", "prompt_tokens": 64, "max_tokens": 8, "repeat_of": "cut",
              "start": {"after": "cut", "event": "answered"},
              "cancel_after_ms": [5, 5]}
    sc = scen(CUT, repeat)
    obs, res = _observed([_cut("c0"), _cut("a0")])
    res.entries = [SequenceEntry("c0", "cut", "pd"), SequenceEntry("a0", "again", "pd")]
    v = judge_sequence(sc, obs, res)
    why = "not checked: all 2 requests were cancelled on purpose: no answer to "
    details = {c.name: c.detail for c in v.checks if c.name in ANSWER_CHECKS}
    assert details == {"token-counts": why + "count", "kv-pulled": why + "show a transfer for",
                       "parity": why + "compare", "repeat-equal": why + "compare"}
    assert v.verdict == "PASS"
    held = ", ".join(c.name for c in v.checks if c.ok)
    assert v.reason == f"all 2 requests cancelled on purpose: no answer to judge; {held} hold"


def test_an_all_abandoned_sequence_without_pd_steps_or_parity_adds_no_check_it_does_not_have():
    gone = {"id": "gone", "route": "pd-abandon", "prompt_tokens": 8, "max_tokens": 8}
    sc = scen(gone).model_copy(update={"parity": False})
    obs, res = _observed([PDRecord("a0", 8, 8, outcome="cancelled", diagnosis=ABANDONED)])
    res.entries = [SequenceEntry("a0", "gone", "pd-abandon")]
    names = [c.name for c in judge_sequence(sc, obs, res).checks]
    assert "token-counts" in names
    assert not {"kv-pulled", "parity", "repeat-equal"} & set(names)

"""The report model (rig/report/model.py): report.json is its dump, validates against the committed
schema/report.schema.json, reads back with Report.model_validate_json, refuses what it does not
declare, and carries each kind's own result, from which summary.md's kind sections are rendered."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError

from rig.cluster.startup_profile import profile_from_log
from rig.judge.verdict import Check, ScenarioVerdict
from rig.observe import metrics as m
from rig.observe.observations import DrainResult, ScenarioObservation, TransferEvidence
from rig.observe.parity import ParityResult, compare
from rig.observe.store_metrics import STORE_SOURCE, StoreObservation
from rig.report.build import RunResult, build_report, observation_report, store_report, write_report
from rig.report.model import REPORT_VERSION, FaultScenario, Report
from rig.report.render import render_summary_md
from rig.transport.records import PDRecord
from rig.workload.faults import FaultEvent, FaultResult
from tests.helpers.fake_rig import ROOT
from tests.helpers.report_obs import ok_obs, stalled_obs

SCHEMA = json.loads((ROOT / "schema" / "report.schema.json").read_text())


def fault_run(tmp_path: Path) -> RunResult:
    r = RunResult(name="cpu-tiny", run_dir=str(tmp_path / "run"),
                  config={"scenarios": [{"name": "edge-96", "kind": "edge"}, {"name": "kill-d", "kind": "fault"}]})
    r.add("edge", ok_obs("edge-96"), ScenarioVerdict("edge-96", "PASS", "pass", "all checks hold",
                                                     [Check("completed", True, "1/1 completed")]))
    fault = FaultResult(events=[FaultEvent("kill", "decode", event_at=10.0, fired_at=10.25, done_at=10.5,
                                           detail="SIGKILL to process group 42")], killed=["decode"])
    r.add("fault", stalled_obs("kill-d"), ScenarioVerdict("kill-d", "FAIL", "pass", "recovered: no",
                                                          [Check("recovered", False, "no answer after the kill")]),
          fault)
    r.finish_status()
    return r


def test_report_json_validates_against_the_committed_schema_and_reads_back(tmp_path):
    r = fault_run(tmp_path)
    text = (write_report(r) / "report.json").read_text()
    data = json.loads(text)
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    assert data["version"] == REPORT_VERSION
    back = Report.model_validate_json(text)
    assert back == build_report(r)
    assert [s.kind for s in back.scenarios] == ["edge", "fault"]
    fault = back.scenarios[1]
    assert isinstance(fault, FaultScenario) and fault.fault is not None
    assert fault.fault.killed == ["decode"] and fault.fault.events[0].fired_at == 10.25


def test_a_field_the_model_does_not_declare_is_refused_by_the_model_and_the_schema(tmp_path):
    data = json.loads((write_report(fault_run(tmp_path)) / "report.json").read_text())
    data["scenarios"][0]["verdict"]["checks"][0]["speed"] = 3
    with pytest.raises(ValidationError, match="speed"):
        Report.model_validate(data)
    assert list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(data))


def test_a_scenario_without_its_kind_or_with_a_kind_field_of_another_is_refused(tmp_path):
    data = json.loads((write_report(fault_run(tmp_path)) / "report.json").read_text())
    no_kind = json.loads(json.dumps(data))
    del no_kind["scenarios"][1]["kind"]
    with pytest.raises(ValidationError):
        Report.model_validate(no_kind)
    wrong = json.loads(json.dumps(data))
    wrong["scenarios"][1]["kind"] = "edge"  # an edge scenario has no "fault" field
    with pytest.raises(ValidationError, match="fault"):
        Report.model_validate(wrong)


def test_a_check_whose_state_contradicts_ok_is_refused(tmp_path):
    data = json.loads((write_report(fault_run(tmp_path)) / "report.json").read_text())
    data["scenarios"][1]["verdict"]["checks"][0]["state"] = "ok"  # ok is false
    with pytest.raises(ValidationError, match="does not say ok=False"):
        Report.model_validate(data)


def test_the_kind_section_is_rendered_from_the_reports_data(tmp_path):
    r = fault_run(tmp_path)
    md = render_summary_md(build_report(r))
    assert "### Faults `kill-d`" in md
    assert "| kill | decode | 0 | 250 | 500 | SIGKILL to process group 42 |" in md
    # the same text from the report read back from disk: nothing but the data is needed
    back = Report.model_validate_json((write_report(r) / "report.json").read_text())
    assert render_summary_md(back) == md


@dataclass(frozen=True)
class SampledCheck(Check):
    """A check that says how many /metrics samples it was judged from."""

    samples: int | None = None


def test_samples_and_startup_profiles_are_carried_when_given(tmp_path):
    r = fault_run(tmp_path)
    prof = profile_from_log("(APIServer pid=7) INFO 12-02 10:00:12 [api_utils.py:347] banner\n",
                            datetime(2026, 12, 2, 10, 0, 0).timestamp(), datetime(2026, 12, 2, 10, 0, 30).timestamp(),
                            "ready")
    r.startup_profiles = {"decode": prof}
    r.verdicts[0].checks.append(SampledCheck("released-by-d", True, "idle", samples=7))
    back = Report.model_validate_json((write_report(r) / "report.json").read_text())
    assert back.startup_profiles == {"decode": prof}
    assert back.startup_profiles["decode"].seconds()["import"] == 12.0
    assert back.scenarios[0].verdict.checks[-1].samples == 7
    assert back.scenarios[1].verdict.checks[0].samples is None  # not recorded: None, never 0


def test_an_observation_less_verdict_and_a_scenario_unknown_to_the_config_are_reported_as_edge(tmp_path):
    r = RunResult(name="x", run_dir=str(tmp_path / "r"), config={})
    r.verdicts.append(ScenarioVerdict("gone", "ERROR", "pass", "interrupted", []))
    (s,) = Report.model_validate_json((write_report(r) / "report.json").read_text()).scenarios
    assert s.kind == "edge" and s.observation is None and s.verdict.verdict == "ERROR"


def test_an_observation_is_reported_without_its_prompts():
    obs = ScenarioObservation("s", "decode", "prefill", records=ok_obs("s").records)
    obs.records[0].prompt = [1, 2, 3]
    r = RunResult(name="x", run_dir="/tmp/x", config={})
    r.add("edge", obs, ScenarioVerdict("s", "PASS", "pass", "ok", []))
    dumped = build_report(r).model_dump(mode="json")
    assert "prompt" not in dumped["scenarios"][0]["observation"]["records"][0]


def test_report_json_keeps_every_observed_fact():
    rec = PDRecord(request_id="r1", prompt_len=4, max_tokens=2, outcome="ok", prompt=[1, 2, 3, 4])
    obs = ScenarioObservation(
        "edge", "decode", "prefill", records=[rec], parity=[ParityResult("equal"), None],
        evidence=TransferEvidence(nixl_bytes=5.0), prefill_evidence=TransferEvidence(preemptions=1.0),
        fatal_lines={"decode": ["boom"]}, kv_integrity_lines={"prefill": ["expired"]}, dead={"decode": -9},
        drains=[DrainResult("decode", False, 1.0, 0.1, {"running": 1.0}, "e", 3)], stall_diagnosis="stall",
        vllm_version="0.32.0", wall_s=3.5, error="rig error", unscanned_logs={"prefill": "no log"},
        missing_metrics={"decode": [m.KV_USAGE]}, death_lines={"decode": "Killed"},
        stopped={"prefill": "stopped by owner"}, versions={"decode": "0.32.0"})
    j = observation_report(obs).model_dump(mode="json")
    record = {k: v for k, v in asdict(rec).items() if k != "prompt"}
    parity = {**asdict(ParityResult("equal")), "not_compared": []}
    assert j == {
        "scenario": "edge", "decode": "decode", "prefill": "prefill", "records": [record],
        "parity": [parity, None],
        "evidence": TransferEvidence(nixl_bytes=5.0).__dict__,
        "prefill_evidence": TransferEvidence(preemptions=1.0).__dict__,
        "fatal_lines": {"decode": ["boom"]}, "kv_integrity_lines": {"prefill": ["expired"]}, "dead": {"decode": -9},
        "drains": [{"instance": "decode", "idle": False, "after_s": 1.0, "baseline_kv": 0.1, "final": {"running": 1.0},
                    "error": "e", "samples": 3}],
        "stall_diagnosis": "stall", "vllm_version": "0.32.0", "wall_s": 3.5, "error": "rig error",
        "unscanned_logs": {"prefill": "no log"}, "missing_metrics": {"decode": [m.KV_USAGE]},
        "death_lines": {"decode": "Killed"}, "versions": {"decode": "0.32.0"},
        "stopped": {"prefill": "stopped by owner"}, "baseline_request_s": None}
    json.dumps(j)
    empty = observation_report(ScenarioObservation("s", "d", "p"))
    assert (empty.evidence, empty.prefill_evidence, empty.parity, empty.drains) == (None, None, [], [])
    diverged = observation_report(ScenarioObservation("s", "d", "p", parity=[compare([1, 2], [1, 3], 2, 2)]))
    assert diverged.parity[0] is not None and diverged.parity[0].model_dump() == {
        "status": "diverged", "position": 1, "pd_token": 2, "ref_token": 3, "reason": "",
        "choice": None, "field": None, "pd_value": None, "ref_value": None, "not_compared": [],
        "max_float_diff": None, "tolerance": None}


def test_a_store_report_carries_the_fields_and_every_derived_fact():
    o = StoreObservation(kind="store-roundtrip", block_size=16, p_ops={"save_put": {"ok_bytes": 8.0}},
                         d={"external_queries": 4.0, f"cached_{STORE_SOURCE}": 2.0}, notes=["n"])
    j = store_report(o, None).model_dump(mode="json")
    assert (j["kind"], j["block_size"], j["notes"], j["p_ops"]) == ("store-roundtrip", 16, ["n"],
                                                                     {"save_put": {"ok_bytes": 8.0}})
    assert {k: j[k] for k in ("bytes_put", "bytes_got", "d_bytes_got", "failed_load_keys", "failed_load_calls",
                              "rejected_put_keys", "d_store_tokens", "store_hit_ratio", "master_get_ratio")} == {
        "bytes_put": 8.0, "bytes_got": 0.0, "d_bytes_got": 0.0, "failed_load_keys": 0.0, "failed_load_calls": 0.0,
        "rejected_put_keys": 0.0, "d_store_tokens": 2.0, "store_hit_ratio": 0.5, "master_get_ratio": None}
    assert j["cancel_summary"] == ""  # no planned cancellation: nothing to say


def test_the_wave_and_store_parts_are_written_beside_the_report(tmp_path):
    r = RunResult(name="x", run_dir=str(tmp_path / "r"), config={})
    so = StoreObservation(kind="store-roundtrip", block_size=16, master_alive_end=True)
    r.add("store-roundtrip", ScenarioObservation("st", "decode", "prefill"),
          ScenarioVerdict("st", "PASS", "pass", "ok", []), so)
    d = write_report(r)
    saved = json.loads((d / "store" / "st.json").read_text())
    assert saved["master_alive_end"] is True and saved["block_size"] == 16
    assert json.loads((d / "report.json").read_text())["scenarios"][0]["store"] == saved


def test_data_the_model_refuses_still_leaves_a_report_that_says_so(tmp_path):
    r = fault_run(tmp_path)
    r.observations[0].records[0].outcome = object()  # a rig bug: no field takes it
    d = write_report(r)
    rep = Report.model_validate_json((d / "report.json").read_text())
    assert rep.status == "error" and rep.error.startswith("the report model refused the run's data")
    assert [v.verdict for v in rep.verdicts()] == ["PASS", "FAIL"]  # the verdicts are kept
    assert "writing the report" in (d / "rig-traceback.txt").read_text()


def test_a_scenario_run_twice_keeps_each_runs_own_observation(tmp_path):
    r = RunResult(name="x", run_dir=str(tmp_path / "r"), config={})
    first, again = ok_obs("edge-96"), stalled_obs("edge-96")
    r.add("edge", first, ScenarioVerdict("edge-96", "PASS", "pass", "ok", []))
    r.add("edge", again, ScenarioVerdict("edge-96", "XFAIL", "xfail: x", "stalled", []))
    a, b = build_report(r).scenarios
    assert a.observation is not None and a.observation.records[0].outcome == "ok"
    assert b.observation is not None and b.observation.records[0].outcome == "stalled"

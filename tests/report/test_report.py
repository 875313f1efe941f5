"""report.json, junit.xml and summary.md from a run with every kind of verdict."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

from rig.judge.verdict import Check, ScenarioVerdict
from rig.report.build import RunResult, build_report, write_report
from rig.report.render import render_summary_md
from tests.helpers.report_obs import DIAG, ok_obs, stalled_obs

XF = "xfail: spec-admission-livelock (stall) on vLLM >=0.32.0,<0.33"


@pytest.fixture()
def result(tmp_path) -> RunResult:
    r = RunResult(name="cpu-tiny", run_dir=str(tmp_path / "20261129-180247-cpu-tiny"),
                  config={"name": "cpu-tiny"}, plan={"processes": []}, vllm_version="0.32.0",
                  timings={"startup phase 1": 30.0, "total": 60.0})
    r.observations = [ok_obs("edge-96"), stalled_obs("edge-126"), ok_obs("edge-126-6blk", "decode-6blk"),
                      ok_obs("edge-fixed"), ok_obs("edge-broken")]
    fail_checks = [Check("completed", True, "1/1 completed"),
                   Check("parity", False, "0/1 equal; diverged at 1: 13 != 12")]
    r.verdicts = [
        ScenarioVerdict("edge-96", "PASS", "pass", "all checks hold", [Check("completed", True, "1/1 completed")]),
        ScenarioVerdict("edge-126", "XFAIL", XF, f"spec-admission-livelock: {DIAG}",
                        [Check("completed", False, f"0/1 completed; edge-126-0: stalled {DIAG}")]),
        ScenarioVerdict("edge-126-6blk", "FAIL", "pass", "parity: 0/1 equal; diverged at 1: 13 != 12", fail_checks),
        ScenarioVerdict("edge-fixed", "XPASS", XF, "known issue fixed: update the expectation", []),
        ScenarioVerdict("edge-broken", "ERROR", "pass", "metrics unavailable: ConnectError | x",
                        [Check("completed", True, "1/1 completed"),
                         Check("no-fatal-log", None, "not checked: decode: log file missing")]),
    ]
    return r


def test_files_written(result, tmp_path):
    d = write_report(result)
    assert d == tmp_path / "20261129-180247-cpu-tiny"
    assert sorted(p.name for p in d.iterdir()) == ["junit.xml", "report.json", "summary.md"]


def test_finish_status(result):
    assert result.finish_status() == "failed"  # FAIL, XPASS and ERROR
    ok = RunResult(name="x", run_dir="/tmp/x", config={})
    ok.verdicts = result.verdicts[:2]  # PASS + XFAIL
    assert ok.finish_status() == "passed"
    stopped = RunResult(name="x", run_dir="/tmp/x", config={}, status="interrupted")
    stopped.verdicts = result.verdicts[:2]
    assert stopped.finish_status() == "interrupted"  # not overwritten


def test_report_json(result):
    result.finish_status()
    data = json.loads((write_report(result) / "report.json").read_text())
    assert data["status"] == "failed" and data["vllm_version"] == "0.32.0" and data["name"] == "cpu-tiny"
    assert data["timings"] == {"startup phase 1": 30.0, "total": 60.0}
    assert [s["verdict"]["verdict"] for s in data["scenarios"]] == ["PASS", "XFAIL", "FAIL", "XPASS", "ERROR"]
    xfail = data["scenarios"][1]
    assert xfail["observation"]["stall_diagnosis"] == DIAG
    assert xfail["observation"]["records"][0]["outcome"] == "stalled"
    assert "prompt" not in xfail["observation"]["records"][0]
    assert data["scenarios"][2]["verdict"]["checks"][1] == {
        "name": "parity", "ok": False, "state": "failed", "detail": "0/1 equal; diverged at 1: 13 != 12",
        "requests": [], "samples": None}
    assert data["scenarios"][4]["verdict"]["checks"][1]["ok"] is None  # not checked stays null, not false


def test_junit(result):
    result.finish_status()
    root = ET.parse(write_report(result) / "junit.xml").getroot()
    assert root.tag == "testsuite" and root.get("name") == "pdrig.cpu-tiny"
    # tests counts the scenarios; a check that was not checked is a property of its scenario's case
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("5", "2", "1", "1")
    cases = {c.get("name"): c for c in root.findall("testcase")}
    assert list(cases) == ["edge-96", "edge-126", "edge-126-6blk", "edge-fixed", "edge-broken"]
    assert all(c.get("classname") == "pdrig.cpu-tiny" for c in cases.values())
    checks = {p.get("name"): p.get("value") for p in cases["edge-broken"].find("properties")}
    assert checks["check.no-fatal-log"] == "not checked: decode: log file missing"  # said once
    assert {p.get("name"): p.get("value") for p in root.find("properties")}["pdrig_run_status"] == result.status
    assert cases["edge-126"].get("time") == "11.000"

    def outcome(case):
        return [e.tag for e in case if e.tag not in ("system-out", "properties")]

    assert outcome(cases["edge-96"]) == []
    assert outcome(cases["edge-126"]) == ["skipped"]
    assert outcome(cases["edge-126-6blk"]) == ["failure"]
    assert outcome(cases["edge-fixed"]) == ["failure"]
    assert outcome(cases["edge-broken"]) == ["error"]
    skipped = cases["edge-126"].find("skipped")
    assert skipped.get("message") == f"xfail: spec-admission-livelock: {DIAG}"
    assert "completed: failed" in skipped.text
    failure = cases["edge-126-6blk"].find("failure")
    assert failure.get("message") == "FAIL: parity: 0/1 equal; diverged at 1: 13 != 12"
    assert "parity: failed - 0/1 equal" in failure.text and "completed: ok - 1/1 completed" in failure.text
    broken_text = cases["edge-broken"].find("error").text
    assert "no-fatal-log: not checked - not checked: decode: log file missing" in broken_text
    assert cases["edge-fixed"].find("failure").get("message").startswith("XPASS: known issue fixed")
    assert cases["edge-broken"].find("error").get("message") == "metrics unavailable: ConnectError | x"
    assert cases["edge-126"].find("system-out").text == XF


def test_junit_without_scenarios(tmp_path):
    r = RunResult(name="cpu-tiny", run_dir=str(tmp_path / "r"), config={}, status="error",
                  error="prefill exited with code 1 before it was ready")
    root = ET.parse(write_report(r) / "junit.xml").getroot()
    # A run that died before any scenario must not look green: one synthetic error testcase.
    (case,) = root.findall("testcase")
    assert root.get("tests") == "1" and root.get("errors") == "1"
    assert case.get("name") == "pdrig-run"
    assert "prefill exited with code 1" in case.find("error").get("message")


def test_summary_md(result):
    result.finish_status()
    md = (write_report(result) / "summary.md").read_text()
    lines = md.splitlines()
    assert lines[0] == "# pdrig run `20261129-180247-cpu-tiny`: FAILED"
    assert "- config: `cpu-tiny`; vLLM 0.32.0" in lines
    assert "- timings: startup phase 1 30.0 s, total 60.0 s" in lines
    assert "- verdicts: ERROR 1, FAIL 1, PASS 1, XFAIL 1, XPASS 1" in lines
    header = next(ln for ln in lines if ln.startswith("| scenario"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols == ["scenario", "decode", "expectation", "verdict", "tokens (completion/total)", "P ms",
                    "D ms", "time to verdict s", "parity", "checks", "diagnosis"]
    start = lines.index(header) + 2
    rows = lines[start:lines.index("", start)]
    assert len(rows) == 5
    by_name = {r.split("|")[1].strip(): r for r in rows}
    assert list(by_name) == ["edge-96", "edge-126", "edge-126-6blk", "edge-fixed", "edge-broken"]

    def cells(name):
        # Split on unescaped pipes only.
        return [c.strip() for c in re.split(r"(?<!\\)\|", by_name[name])[1:-1]]

    c = dict(zip(cols, cells("edge-96"), strict=True))
    assert c["verdict"] == "PASS" and c["tokens (completion/total)"] == "2/98"
    assert c["P ms"] == "105" and c["D ms"] == "2153" and c["time to verdict s"] == "2.2"
    assert c["parity"] == "1/1 equal" and c["diagnosis"] == "all checks hold"
    c = dict(zip(cols, cells("edge-126"), strict=True))
    assert c["verdict"] == "XFAIL" and c["expectation"] == XF
    assert c["diagnosis"] == f"spec-admission-livelock: {DIAG}"
    assert c["tokens (completion/total)"] == "-" and c["D ms"] == "-" and c["time to verdict s"] == "10.3"
    assert c["parity"] == "-"
    assert dict(zip(cols, cells("edge-126-6blk"), strict=True))["verdict"] == "FAIL"
    assert dict(zip(cols, cells("edge-126-6blk"), strict=True))["decode"] == "decode-6blk"
    assert dict(zip(cols, cells("edge-fixed"), strict=True))["verdict"] == "XPASS"
    broken = dict(zip(cols, cells("edge-broken"), strict=True))
    assert broken["verdict"] == "ERROR" and broken["diagnosis"] == "metrics unavailable: ConnectError \\| x"
    assert broken["checks"] == "1 ok, 1 not checked" and c["checks"] == "1 failed"
    # Every check that is not ok is listed with its state and why.
    assert "### Checks not ok" in lines
    assert "| edge-broken | no-fatal-log | not checked | not checked: decode: log file missing |" in lines
    assert "| edge-126-6blk | parity | failed | 0/1 equal; diverged at 1: 13 != 12 |" in lines


def test_summary_md_error(tmp_path):
    r = RunResult(name="cpu-tiny", run_dir=str(tmp_path / "r"), config={}, status="error",
                  error="prefill exited with code 1 before it was ready")
    md = render_summary_md(build_report(r))
    assert "# pdrig run `r`: ERROR" in md
    assert "- error: prefill exited with code 1 before it was ready" in md
    assert "- verdicts: none" in md and "| scenario" not in md


def test_rewritten_report_reflects_latest_state(result):
    result.verdicts = result.verdicts[:1]
    result.observations = result.observations[:1]
    write_report(result)
    result.verdicts.append(ScenarioVerdict("edge-126", "XFAIL", XF, "r", []))
    result.status = "interrupted"
    d = write_report(result)
    assert json.loads((d / "report.json").read_text())["status"] == "interrupted"
    root = ET.parse(d / "junit.xml").getroot()
    assert root.get("tests") == "2" and root.get("errors") == "0"  # the two scenarios judged so far
    assert {p.get("name"): p.get("value") for p in root.find("properties")}["pdrig_run_status"] == "interrupted"


def test_reference_of_reads_the_bug_record_reference_of_a_description():
    from rig.report.render import reference_of

    assert reference_of("R11 (vllm PRs #50297, #48245): 3 concurrent prompts") == "R11 (vllm PRs #50297, #48245)"
    assert reference_of("bug record R14 (vllm #46240,\n  #43226; PRs #46304): cancel waves") == \
        "R14 (vllm #46240, #43226; PRs #46304)"
    assert reference_of("R11 P side (vllm PR #50297): 3 prompts") == "R11 P side (vllm PR #50297)"
    assert reference_of("Chat endpoint: through P and D") == ""
    assert reference_of("P computes 2 fresh prompts: then D loads") == ""
    assert reference_of(None) == ""


def test_the_run_table_carries_each_regression_scenarios_reference():
    """`make regressions` gives a verdict for every entry WITH its upstream reference in
    the table (summary.md, terminal, junit); a suite without references keeps its columns."""
    from rig.config import ScenarioConfig
    from rig.judge.verdict import judge
    from rig.report.junit import render_junit
    from rig.report.render import junit_suite, scenario_rows
    from tests.helpers.verdict_records import obs_of, ok_record

    sc = ScenarioConfig(name="edge-126", decode="decode", prompt_tokens=126, max_tokens=2,
                        description="R05 (vllm PR #32255): cancel the decode hop",
                        expect={"completion_tokens": 2, "total_tokens": 128})
    obs = obs_of([ok_record(0), ok_record(1)])
    v = judge(sc, obs)
    res = RunResult(name="r", run_dir="/tmp/x", config={"scenarios": [sc.model_dump(mode="json")]},
                    observations=[obs], verdicts=[v])
    (row,) = scenario_rows(build_report(res))
    assert list(row)[:2] == ["scenario", "reference"] and row["reference"] == "R05 (vllm PR #32255)"
    assert row["tokens (completion/total)"] == "2/128 x2"  # equal values once, with their count
    assert "| R05 (vllm PR #32255) |" in render_summary_md(build_report(res))
    assert "reference: R05 (vllm PR #32255)" in render_junit(junit_suite(build_report(res)))
    plain = RunResult(name="r", run_dir="/tmp/x", config={"scenarios": [{"name": "edge-126"}]},
                      observations=[obs], verdicts=[v])
    assert "reference" not in scenario_rows(build_report(plain))[0]

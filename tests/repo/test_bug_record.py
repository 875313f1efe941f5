"""docs/bug-record.md is generated from docs/data/bug-record.yaml and agrees with the suites.

The record cites scenarios by name and the suites cite the record by entry id (R01 ...): both
directions are checked, so a scenario added to a regression suite without its entry, or an entry
naming a scenario that was renamed, fails here.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

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
    assert (ROOT / "docs" / "bug-record.md").read_text() == mod.render(mod.load()), \
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

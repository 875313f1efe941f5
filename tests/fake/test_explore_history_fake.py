"""The whole-history checks (rig/explore/whole_history.py) in an exploration of fake vLLM servers:

- planted: D under ``crossed-kv`` (tests/fake_vllm.py) answers one request with the tokens of the
  prompt it served before (another action's): the crossed-answers check finds it as
  ``history:crossed-answer`` naming both actions and requests, the finding reaches explore.md's
  "Whole-history checks" table and its findings, unshrunk and saying so;
- precision: on a fake with no plant, an exploration of ~20 actions reports no whole-history
  finding, and the counter checks really judged (not "not checked").
"""

from __future__ import annotations

import json

from tests.helpers.explore_plants import explore_fake
from tests.helpers.suites import fake_suite_fixtures

base_dir, no_survivors, _suite = fake_suite_fixtures("fake-history")
SETTINGS = {"resource_share": 0, "sample_share": 0, "background_share": 0, "stop_at_first": False}


def _dir(base, name):
    (base / name).mkdir(exist_ok=True)
    return base / name


def _history(run_dir):
    lines = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    return [x for x in lines if x["phase"] in ("explore", "nemesis")]


def test_the_whole_history_check_finds_a_crossed_answer_across_actions(base_dir):
    report, run_dir = explore_fake(_dir(base_dir, "planted"), {"seed": 3, "actions": 10, "routes": ["pd"], **SETTINGS},
                                   decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "crossed-kv"}}})
    assert report.status == "done", report.error
    crossed = [f for f in report.findings if f.mechanism.key == "history:crossed-answer"]
    assert len(crossed) == 1, [(f.mechanism.key, f.reason[:200]) for f in report.findings]
    f = crossed[0]
    assert f.scope == "whole-history" and f.known_issue == "new" and "not replayed or shrunk" in f.note
    assert len(f.requests) == 2 and len(f.actions) == 2, f
    # the two requests are in two different actions of one life, and the first answered its own reference
    entries = {e["index"]: e for e in _history(run_dir)}
    served, other = f.requests
    rec = {r["request_id"]: (i, r) for i, e in entries.items() for r in e["records"]}
    (i_served, r_served), (i_other, r_other) = rec[served], rec[other]
    assert i_served != i_other and entries[i_served]["life"] == entries[i_other]["life"]
    assert r_served["prompt_key"] != r_other["prompt_key"]
    n = min(len(r_served["decode"]["token_ids"]), len(r_other["reference"]["token_ids"]))
    assert n >= 4 and r_served["decode"]["token_ids"][:n] == r_other["reference"]["token_ids"][:n]
    checks = {c.check: c for c in report.history_checks}
    assert checks["crossed-answers"].state == "failed" and checks["crossed-answers"].samples >= 2
    md = (run_dir / "explore.md").read_text()
    assert "## Whole-history checks" in md and "| crossed-answers | failed |" in md
    assert "`history:crossed-answer`" in md and "unshrunk (actions" in md


def test_an_exploration_of_a_correct_fake_reports_no_whole_history_finding(base_dir):
    report, run_dir = explore_fake(_dir(base_dir, "clean"), {"seed": 7, "actions": 20, **SETTINGS})
    assert report.status == "done" and report.actions == 20, report.error
    history = [f for f in report.findings if f.get("scope") == "whole-history"]
    assert history == [], [(f.mechanism.key, f.reason) for f in history]
    states = {c.check: c.state for c in report.history_checks}
    assert states == {"crossed-answers": "ok", "transfers-conserved": "ok", "counters-quiet": "ok",
                      "every-request-ended": "ok"}, report.history_checks
    checks = {c.check: c for c in report.history_checks}
    assert checks["counters-quiet"].samples >= 15 and checks["transfers-conserved"].samples == 20
    entries = _history(run_dir)
    assert all(e["life_known"] and e["counters"] for e in entries)
    assert len({e["life"] for e in entries}) == 1  # one deployment, no restart

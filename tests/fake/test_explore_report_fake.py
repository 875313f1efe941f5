"""An exploration of fake vLLM servers writes its report as the model (rig.report.explore_model):
explore.json validates against the committed schema and reads back equal to the report the explorer
returned; explore.md and explore-junit.xml are what the read-back report renders; the finding is named
by its emitted scenario, and every action of history.jsonl is counted in the report."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema

from rig.explore.grammar import Action
from rig.report.explore_model import EXPLORE_REPORT_VERSION, ExploreReport
from rig.report.explore_render import junit_suite, render_md
from rig.report.junit import render_junit
from tests.helpers.explore_plants import explore_fake
from tests.helpers.fake_rig import ROOT

SCHEMA = json.loads((ROOT / "schema" / "explore-report.schema.json").read_text())


def test_a_fake_explorations_report_reads_back_and_renders_the_same(base):
    # D answers every request with a wrong token at position 0: the first action is a finding; every
    # second action is a nemesis phase (a row of its own in the report)
    report, run_dir = explore_fake(base, {"seed": 0, "actions": 3, "routes": ["pd"], "shrink_runs": 2,
                                          "nemesis_every": 1, "nemesis": ["sigstop-decode"]},
                                   decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "diverge-at",
                                                               "FAKE_VLLM_FAULT_ARG": "0"}}})
    text = (run_dir / "explore.json").read_text()
    jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(text))
    back = ExploreReport.model_validate_json(text)
    assert back == report and back.version == EXPLORE_REPORT_VERSION
    assert render_md(back) == (run_dir / "explore.md").read_text()
    assert render_junit(junit_suite(back)) == (run_dir / "explore-junit.xml").read_text()

    history = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    acted = [x for x in history if x["phase"] in ("explore", "nemesis")]
    assert back.status == "done" and back.actions == len(acted) == back.settings.actions == 3
    assert [n.index for n in back.nemeses] == [x["index"] for x in acted if x["phase"] == "nemesis"] == [1]
    assert back.runs >= len(history) - len(acted) and back.actions_per_min > 0
    (f,) = back.findings
    assert f.id == "explore-0-1" == Path(f.yaml).stem and f.first_action == 0
    assert f.mechanism.key.startswith("divergence:decode:pos=0") and f.mechanism.evidence["hop"] == "decode"
    assert f.mechanism.key in {x["mechanism"]["key"] for x in acted if x["mechanism"]}
    assert f.stability == "stable" and f.known_issue == "new" and f.shrink_runs <= 2
    assert f.minimal is not None
    minimal, first = Action.model_validate(f.minimal), Action.model_validate(f.action)
    assert f.minimal_requests == minimal.requests() <= first.requests()
    root = ET.fromstring((run_dir / "explore-junit.xml").read_text())
    (case,) = root.findall("testcase")
    assert case.get("name") == f"finding-1: {f.mechanism.key}" and case.find("failure").get("message") == "stable"

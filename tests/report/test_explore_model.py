"""The explorer's report model (rig/report/explore_model.py): explore.json is its dump, validates
against the committed schema/explore-report.schema.json, reads back with
ExploreReport.model_validate_json, refuses what it does not declare; explore.md and
explore-junit.xml are rendered from it alone (rig/report/explore_render.py)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import jsonschema
import pytest
from pydantic import ValidationError

from rig.cli import all_schemas
from rig.report.explore_model import EXPLORE_REPORT_VERSION, ExploreReport, stability_of
from rig.report.explore_render import junit_suite, render_md
from rig.report.junit import render_junit
from tests.helpers.explore_report import finding_report, write_exploration
from tests.helpers.fake_rig import ROOT

SCHEMA = json.loads((ROOT / "schema" / "explore-report.schema.json").read_text())


def written(tmp_path) -> tuple[ExploreReport, str]:
    """A report with a new finding and a known one, as written; explore.json's text."""
    y = tmp_path / "findings" / "explore-1-1.yaml"
    y.parent.mkdir(parents=True)
    y.write_text("- name: explore-1-1\n  prompt_tokens: 31\n")
    r = write_exploration(tmp_path, "0.32.0", [finding_report(1, "FAIL parity", str(y)),
                                               finding_report(2, "FAIL no-stall | stalled", known_issue="livelock",
                                                              replays=3, shown=2)])
    return r, (tmp_path / "explore.json").read_text()


def test_the_committed_schema_is_the_models():
    assert all_schemas()["explore-report.schema.json"] == SCHEMA
    assert SCHEMA["additionalProperties"] is False and "version" in SCHEMA["properties"]


def test_explore_json_validates_against_the_schema_and_reads_back_equal(tmp_path):
    r, text = written(tmp_path)
    data = json.loads(text)
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    assert data["version"] == EXPLORE_REPORT_VERSION == "1.0"
    assert ExploreReport.model_validate_json(text) == r
    assert data["settings"]["seed"] == 1 and data["settings"]["replays"] == 3  # ExploreSettings' defaults
    assert [f["stability"] for f in data["findings"]] == ["stable", "flaky 2/3"]
    assert data["findings"][1]["known_why"].startswith("matched by mechanism")


def test_the_files_are_rendered_from_the_json_alone(tmp_path):
    _, text = written(tmp_path)
    back = ExploreReport.model_validate_json(text)
    md = (tmp_path / "explore.md").read_text()
    assert render_md(back) == md
    assert "| 2 | prefill+decode | `checks:FAIL no-stall | stalled` |" in md and "| flaky 2/3 |" in md
    assert "```yaml\n- name: explore-1-1\n  prompt_tokens: 31\n```" in md  # the YAML the report points to
    assert render_junit(junit_suite(back)) == (tmp_path / "explore-junit.xml").read_text()


def test_junit_fails_a_new_finding_and_skips_a_known_one(tmp_path):
    _, text = written(tmp_path)
    root = ET.fromstring(render_junit(junit_suite(ExploreReport.model_validate_json(text))))
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("2", "1", "1")
    new, known = root.findall("testcase")
    assert new.get("name") == "finding-1: checks:FAIL parity" and new.get("classname") == "explore.fake"
    assert new.find("failure").get("message") == "stable"
    assert new.find("failure").text == "FAIL parity: FAIL parity: as planted"
    assert known.find("skipped").get("message").startswith("known issue livelock: matched by mechanism")


@pytest.mark.parametrize(("path", "field"), [((), "speed"), (("findings", 0), "speed"),
                                             (("findings", 0, "mechanism"), "line"), (("settings",), "budget")])
def test_a_field_the_model_does_not_declare_is_refused_by_the_model_and_the_schema(tmp_path, path, field):
    _, text = written(tmp_path)
    data = json.loads(text)
    at = data
    for p in path:
        at = at[p]
    at[field] = 3
    with pytest.raises(ValidationError, match=f"{field}\n  Extra inputs are not permitted"):
        ExploreReport.model_validate(data)
    assert list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(data))


def test_another_version_or_none_is_refused(tmp_path):
    _, text = written(tmp_path)
    data = json.loads(text)
    with pytest.raises(ValidationError, match="version"):
        ExploreReport.model_validate({**data, "version": "0.9"})
    assert ExploreReport.model_validate({k: v for k, v in data.items() if k != "version"}).version == "1.0"


def test_a_stability_its_replays_do_not_say_is_refused(tmp_path):
    _, text = written(tmp_path)
    data = json.loads(text)
    data["findings"][1]["stability"] = "stable"  # 2 of its 3 replays showed it
    with pytest.raises(ValidationError, match="replays say 'flaky 2/3'"):
        ExploreReport.model_validate(data)


def test_stability_in_words():
    assert stability_of("k", []) == "not replayed"
    assert stability_of("k", ["k", "k"]) == "stable"
    assert stability_of("k", ["k", None, "other"]) == "flaky 1/3"
    assert stability_of("k", [None]) == "flaky 0/1"


def test_a_nan_in_the_evidence_is_written_as_json_dumps_wrote_it_and_reads_back(tmp_path):
    f = finding_report(1, "FAIL x")
    f.mechanism.evidence = {"wait_s": float("nan"), "pair": (1, 2), "obj": object}
    r = write_exploration(tmp_path, "0.32.0", [f])
    text = (tmp_path / "explore.json").read_text()
    assert '"wait_s": NaN' in text
    ev = r.findings[0].mechanism.evidence
    assert ev["wait_s"] != ev["wait_s"] and ev["pair"] == [1, 2] and ev["obj"] == str(object)

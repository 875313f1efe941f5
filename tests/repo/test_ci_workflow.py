"""The CI workflow runs the README's commands: `make setup`, then `make e2e`, on CPU and GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "edge.yml"


@pytest.fixture(scope="module")
def wf() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(doc, dict)
    if True in doc:  # YAML 1.1 reads the key `on` as the boolean true
        doc["on"] = doc.pop(True)
    return doc


def runs(job: dict) -> list[str]:
    return [s["run"] for s in job["steps"] if "run" in s]


def uses(job: dict, action: str) -> list[dict]:
    return [s for s in job["steps"] if s.get("uses", "").startswith(action + "@")]


def test_triggers(wf):
    assert {"push", "pull_request"} <= set(wf["on"])
    assert set(wf["jobs"]) == {"cpu", "gpu"}


def test_cpu_job(wf):
    job = wf["jobs"]["cpu"]
    assert job["runs-on"] == "ubuntu-latest"
    assert uses(job, "actions/checkout")
    cmds = runs(job)
    assert "make setup" in cmds and "make e2e" in cmds
    assert cmds.index("make setup") < cmds.index("make e2e")


def test_gpu_job_matrix(wf):
    job = wf["jobs"]["gpu"]
    include = job["strategy"]["matrix"]["include"]
    runners = {tuple(m["runner"]) for m in include}
    assert runners == {("self-hosted", "gpu", "l4x2"), ("self-hosted", "gpu", "h200")}
    assert job["runs-on"] == "${{ matrix.runner }}"
    for m in include:
        assert (ROOT / "configs" / f"{m['profile']}.yaml").is_file(), m["profile"]
    assert {"l4x2", "h200"} <= {m["profile"] for m in include}
    cmds = runs(job)
    assert "make setup PROFILE=gpu" in cmds
    assert "make e2e CONFIG=configs/${{ matrix.profile }}.yaml" in cmds
    assert "pull_request.head.repo.full_name == github.repository" in job["if"]  # no fork code on our GPUs


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_reports_are_kept_even_on_failure(wf, name):
    job = wf["jobs"][name]
    upload = uses(job, "actions/upload-artifact")
    assert len(upload) == 1 and upload[0]["if"] == "always()" and upload[0]["with"]["path"] == "runs/"
    junit = uses(job, "mikepenz/action-junit-report")
    assert len(junit) == 1 and junit[0]["if"] == "always()"
    assert junit[0]["with"]["report_paths"] == "runs/*/junit.xml"
    assert wf["permissions"]["checks"] == "write"
    summary = [s for s in job["steps"] if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
    assert len(summary) == 1 and summary[0]["if"] == "always()"
    assert "runs/*/summary.md" in summary[0]["run"]


def test_make_targets_exist():
    """Every `make X` the workflow runs is a target of the Makefile (once the Makefile exists)."""
    makefile = ROOT / "Makefile"
    if not makefile.is_file():
        pytest.fail("no Makefile: the README's commands need one")
    heads = re.findall(r"^([A-Za-z0-9_.\- ]+):(?![=:])", makefile.read_text(), re.M)
    targets = {t for head in heads for t in head.split()}  # `a b: deps` defines a and b
    used = set(re.findall(r"\bmake ([a-z0-9-]+)", WORKFLOW.read_text()))
    assert used and used <= targets, used - targets


def test_readme_commands_are_the_ci_commands():
    """The README's quick-start commands are the ones CI runs (once the README has them)."""
    readme = ROOT / "README.md"
    text = readme.read_text() if readme.is_file() else ""
    if "make e2e" not in text:
        pytest.fail("the README's first screen has no make commands")
    assert "make setup" in text

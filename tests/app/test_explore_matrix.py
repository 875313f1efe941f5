"""rig/run/explore_matrix.py without servers: reading explorations, naming, the holds cells; and
``--build`` of ``pdrig e2e`` / ``pdrig explore`` refusing what it cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rig.cli import main
from rig.config import ConfigError
from rig.explore.report import write_explore_report
from rig.report.explore_model import ExploreReport
from rig.run.explore_matrix import collect_findings, holds, read_exploration, write_suites
from tests.helpers.explore_report import finding_report, write_exploration


def _exploration(root: Path, name: str, version: str, lease: float | None, stems: list[str]) -> Path:
    d = root / name
    (d / "findings").mkdir(parents=True)
    findings = []
    for n, stem in enumerate(stems, 1):
        p = d / "findings" / f"{stem}.yaml"
        p.write_text(yaml.safe_dump([{"name": stem, "decode": "decode", "prompt_tokens": 31, "max_tokens": 1}]))
        findings.append(finding_report(n, "FAIL parity", str(p)))
    findings.append(finding_report(len(stems) + 1, "ERROR x", shown=0))  # not reproduced: no YAML
    write_exploration(d, version, findings)
    (d / "config.yaml").write_text(yaml.safe_dump({"nixl": {"kv_lease_duration": lease}}))
    return d


def test_two_explorations_findings_keep_apart_and_share_a_suite_per_lease(tmp_path):
    a = _exploration(tmp_path, "a", "0.32.0", 5, ["explore-1-1", "explore-1-2"])
    b = _exploration(tmp_path, "b", "0.27.1", 5, ["explore-1-1"])
    c = _exploration(tmp_path, "c", "0.27.1", None, ["explore-1-1"])
    found = collect_findings([a, b, c])
    names = [f.scenario for f, _ in found]
    # the finding without a YAML (not replayed) is left out; equal stems stay apart
    assert names == ["0-32-0-explore-1-1", "0-32-0-explore-1-2", "0-27-1-explore-1-1", "0-27-1-explore-1-1-2"]
    assert [sc["name"] for _, sc in found] == names
    specs = write_suites(found, tmp_path / "out")
    assert list(specs) == ["explore", "explore-2"]
    assert specs["explore"].set == ["nixl.kv_lease_duration=5"] and specs["explore-2"].set == []
    first = yaml.safe_load(Path(specs["explore"].file).read_text())
    assert [s["name"] for s in first] == names[:3]


def test_a_finding_on_a_drawn_topology_replays_with_its_sets_in_a_suite_of_its_own(tmp_path):
    d = _exploration(tmp_path, "a", "0.32.0", 5, ["explore-1-1", "explore-1-2"])
    rep = read_exploration(d)
    rep.findings[1].topology.sets = ["decode.0.num_gpu_blocks_override=8", "nixl.kv_lease_duration=10"]
    write_explore_report(rep, d)
    found = collect_findings([d])
    assert [f.overrides for f, _ in found] == [["nixl.kv_lease_duration=5"],
                                               ["decode.0.num_gpu_blocks_override=8", "nixl.kv_lease_duration=10"]]
    specs = write_suites(found, tmp_path / "out")
    assert [s.set for s in specs.values()] == [f.overrides for f, _ in found]


def test_a_moved_run_directory_still_finds_its_findings(tmp_path):
    d = _exploration(tmp_path, "a", "0.32.0", 5, ["explore-1-1"])
    moved = tmp_path / "moved"
    d.rename(moved)
    assert [f.source for f, _ in collect_findings([moved])] == [str(moved / "findings" / "explore-1-1.yaml")]


def test_an_exploration_without_findings_is_refused(tmp_path):
    d = _exploration(tmp_path, "a", "0.32.0", 5, [])
    with pytest.raises(ConfigError, match="nothing to replay"):
        collect_findings([d])


def test_the_reader_reads_the_report_the_explorer_writes(tmp_path):
    d = _exploration(tmp_path, "a", "0.32.0", 5, ["explore-1-1"])
    text = (d / "explore.json").read_text()
    rep = read_exploration(d)
    assert rep == ExploreReport.model_validate_json(text) and rep.version == "1.0"
    assert [(f.id, f.stability, bool(f.yaml)) for f in rep.findings] == [("explore-1-1", "stable", True),
                                                                         ("explore-1-2", "flaky 0/1", False)]
    (f, sc), = collect_findings([d])
    assert (f.signature, f.known_issue, f.stability, f.found_on) == ("FAIL parity", "new", "stable", "0.32.0")


@pytest.mark.parametrize(("edit", "named"), [
    (lambda rep: [rep.pop("version"), rep.pop("settings")], "settings"),  # an explore.json an older pdrig wrote
    (lambda rep: rep["findings"][0].update(speed=3), "findings.0.speed"),
    (lambda rep: rep["findings"][0].update(stability="stable", replays=[None]), "stability 'stable' but its replays"),
])
def test_an_explore_json_that_is_not_this_report_model_is_refused_naming_the_field(tmp_path, edit, named):
    d = _exploration(tmp_path, "a", "0.32.0", 5, ["explore-1-1"])
    rep = json.loads((d / "explore.json").read_text())
    edit(rep)
    (d / "explore.json").write_text(json.dumps(rep))
    with pytest.raises(ConfigError, match="not an explore report of version 1.0") as e:
        collect_findings([d])
    assert named in str(e.value) and "run pdrig explore again" in str(e.value)


@pytest.mark.parametrize(("verdict", "reason", "known", "cell"), [
    ("XFAIL", "", True, "holds (XFAIL)"),
    ("FAIL", "parity: tokens differ", False, "holds (FAIL)"),
    ("FAIL", "matches known issue x, outside its declared range >=0.31", True, "holds (FAIL)"),
    ("FAIL", "no-stall: stalled", True, "other failure (FAIL: no-stall: stalled)"),
    ("PASS", "", False, "does not hold (PASS)"),
    ("XPASS", "known issue fixed", True, "does not hold (XPASS)"),
    ("BROKEN", "decode died", True, "error (BROKEN: decode died)"),
    ("NOT RUN", "interrupted", False, "not run (NOT RUN: interrupted)"),
])
def test_holds_reads_a_verdict_as_the_finding_showing_or_not(verdict, reason, known, cell):
    assert holds(verdict, reason, known) == cell


def test_build_flag_refuses_an_unknown_build_before_anything_starts(capsys):
    assert main(["e2e", "--build", "0.99.9", "--scenario", "x"]) == 2
    assert "0.99.9" in capsys.readouterr().err
    assert main(["explore", "--builds-dir", "/tmp/x"]) == 2
    assert "add --build NAME" in capsys.readouterr().err

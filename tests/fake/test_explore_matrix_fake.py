"""``pdrig matrix --explore RUN_DIR`` against fake vLLM servers: an exploration's minimal failures
replayed on several builds, one deployment per build.

The "builds" are wrapper interpreters that start tests/fake_vllm.py with a planted bug of their
own (``FAKE_VLLM_FAULT``), so each finding holds on some builds and not on others:

- ``good``: no bug;
- ``diverge``: every decode-side request's first token is wrong (``diverge-at 0``);
- ``stall``: a decode-side request of >= 97 prompt tokens is never admitted (the admission
  livelock's shape);
- ``gone``: its env cannot be created (a build error): every cell is an error.

The exploration directory is written as ``pdrig explore`` writes one (explore.json, config.yaml
with the lease, findings/*.yaml): finding 1 a new wrong-token failure at 40 tokens, finding 2 the
stall at 97 tokens carrying the livelock's known issue.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from rig.cli import main
from rig.cluster.builds import BuildError
from rig.run import matrix as matrix_mod
from tests.helpers.explore_report import finding_report, write_exploration
from tests.helpers.fake_rig import LIVELOCK, fake_config, write_config
from tests.helpers.survivors import kill_pids, wait_no_survivors

BUILDS = {"good": {}, "diverge": {"FAKE_VLLM_FAULT": "diverge-at", "FAKE_VLLM_FAULT_ARG": "0"},
          "stall": {"FAKE_VLLM_FAULT": "stall", "FAKE_VLLM_FAULT_ARG": "97"}}


class WrapperBuilder:
    """Stands in for rig.cluster.builds.Builder: each build's interpreter is a shell wrapper that
    exports its fault and execs this interpreter; ``gone`` cannot be built."""

    def __init__(self, files, root, device="cpu", log=None):
        self.root = Path(root)

    def python(self, name: str) -> Path:
        if name not in BUILDS:
            raise BuildError(f"{name}: uv pip install failed (no such release)")
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        w = d / "python"
        env = "".join(f"export {k}={v}\n" for k, v in BUILDS[name].items())
        w.write_text(f"#!/bin/sh\n{env}exec {sys.executable} \"$@\"\n")
        w.chmod(0o755)
        return w

    def stamp(self, name: str) -> dict | None:
        return None

    def checked(self, name: str, model, log_file: Path) -> None:  # no overlay here: nothing to check
        return None


@pytest.fixture
def base(tmp_path, monkeypatch):
    monkeypatch.setattr(matrix_mod, "Builder", WrapperBuilder)
    yield tmp_path
    left = wait_no_survivors(str(tmp_path), within_s=10)
    kill_pids(left)
    assert left == {}, f"fake servers survived: {left}"


def exploration(base: Path) -> Path:
    """An exploration run directory as pdrig explore leaves it (two findings, a 5 s lease)."""
    d = base / "runs" / "20261201-120000-fake-explore"
    (d / "findings").mkdir(parents=True)
    new = {"name": "explore-1-1", "description": "explore seed 1: FAIL parity", "prefill": "prefill",
           "decode": "decode", "prompt_tokens": 40, "max_tokens": 4, "seed": 11}
    known = {"name": "explore-1-2", "description": "explore seed 1: FAIL no-stall | stalled", "prefill": "prefill",
             "decode": "decode", "prompt_tokens": 97, "max_tokens": 1, "seed": 12, "known_issue": LIVELOCK}
    findings = []
    for n, (sc, sig, ki) in enumerate(((new, "FAIL parity", "new"), (known, "FAIL no-stall | stalled", LIVELOCK["id"])),
                                      1):
        path = d / "findings" / f"{sc['name']}.yaml"
        path.write_text("# pdrig explore finding\n" + yaml.safe_dump([sc], sort_keys=False))
        findings.append(finding_report(n, sig, str(path), ki))
    write_exploration(d, "0.32.0", findings)
    (d / "config.yaml").write_text(yaml.safe_dump({"name": "fake", "nixl": {"kv_lease_duration": 5}}))
    return d


def test_each_finding_holds_where_its_bug_is_and_not_elsewhere(base, capsys):
    cfg = write_config(base, fake_config(base, timeouts={"stall_window_s": 1.5, "drain_s": 4}), "profile.yaml")
    builds_file = base / "builds.yaml"
    builds_file.write_text(yaml.safe_dump({"builds": {n: {"python": f"/x/{n}/python"} for n in
                                                      ("good", "diverge", "stall", "gone")}}))
    out = base / "matrix"
    rc = main(["matrix", "--builds", "good,diverge,stall,gone", "--explore", str(exploration(base)),
               "--config", str(cfg), "--builds-file", str(builds_file), "--builds-dir", str(base / "envs"),
               "--out", str(out), "--quiet"])
    data = json.loads((out / "matrix.json").read_text())
    cells = {f["scenario"]: f["cells"] for f in data["findings"]}
    assert set(cells) == {"0-32-0-explore-1-1", "0-32-0-explore-1-2"}, cells
    new, known = cells["0-32-0-explore-1-1"], cells["0-32-0-explore-1-2"]
    assert new["good"].startswith("does not hold (PASS")
    assert new["diverge"].startswith("holds (FAIL")
    assert new["stall"].startswith("does not hold")  # 40 tokens are admitted there
    assert known["stall"] == "holds (XFAIL)"
    assert known["good"].startswith("does not hold")
    # the diverging build fails the 97-token request too, but not by stalling: not the finding
    assert known["diverge"].startswith("other failure (FAIL")
    assert new["gone"].startswith("error (BROKEN") and "no such release" in new["gone"]
    assert known["gone"].startswith("error (BROKEN")
    assert rc == 1  # a build could not say: the matrix is not clean
    md = (out / "matrix.md").read_text()
    assert "## Minimal failures of the exploration(s) on each build" in md
    row = next(line for line in md.splitlines() if line.startswith("| `0-32-0-explore-1-2`"))
    assert "spec-admission-livelock" in row and "holds (XFAIL)" in row and "other failure" in row
    # one deployment per build for both findings, with the exploration's lease
    rep = json.loads((out / "stall" / "explore" / "report.json").read_text())
    assert [s["name"] for s in rep["config"]["scenarios"]] == ["0-32-0-explore-1-1", "0-32-0-explore-1-2"]
    assert rep["config"]["nixl"]["kv_lease_duration"] == 5
    suite = yaml.safe_load((out / "explore-suites" / "explore.yaml").read_text())
    assert [s["name"] for s in suite] == ["0-32-0-explore-1-1", "0-32-0-explore-1-2"]
    assert os.path.isfile(out / "stall" / "explore" / "report.json")


def test_a_directory_that_is_not_an_exploration_is_refused_before_anything_runs(base, capsys):
    rc = main(["matrix", "--builds", "0.32.0", "--explore", str(base), "--out", str(base / "m")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no readable explore.json" in err and "pdrig explore" in err
    assert not (base / "m").exists()


def test_explore_and_suite_together_are_refused(base, capsys):
    rc = main(["matrix", "--builds", "0.32.0", "--explore", str(exploration(base)), "--suite", "edge",
               "--out", str(base / "m")])
    assert rc == 2 and "drop --suite" in capsys.readouterr().err

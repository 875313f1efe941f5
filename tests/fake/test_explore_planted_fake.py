"""pdrig explore finds, shrinks and emits two planted bugs it is not told about, against fake vLLM
servers (tests/fake_vllm.py):

- ``abort-lost`` on D: a decode-side request closed while D pulls its KV (0-300 ms after it
  reached D's engine; the pull takes 300 ms) is never released (it stays running with its blocks
  until the next request arrives): a hang only after a cancel in a narrow window. The cancel
  actions (cancel_after_ms at a drawn time) reach it; the oracle is idle-after.
- ``stale-after-cont`` on P: the first prefill P answers after a SIGCONT exports stale KV, and D
  answers wrong tokens from it: wrong output only under a nemesis that SIGSTOPs P and resumes it.
  The nemesis phases reach it; the oracle is parity (and the recovery request's).

One exploration (seed 1, BUDGET actions, a nemesis phase after every 3 actions, half the pd steps
cancelled: the stated budget) must find both, shrink each to <= 3 requests, and emit a suite YAML
that ``pdrig e2e`` turns into FAIL.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rig.cluster.processes import processes_of_run
from rig.config import load_config
from rig.explore.explorer import Explorer, ExploreSettings
from rig.report.explore_model import FindingReport
from rig.run.runner import new_run_dir
from tests.helpers.fake_rig import ROOT, fake_config, write_config
from tests.helpers.suites import fake_suite_fixtures

BUDGET = 24  # actions, nemesis phases included
# D's KV pull lasts 300 ms: a cut 20-200 ms after the request was sent lands in it (P answers first),
# a cut at 0-5 ms on P's hop, one at 500-1000 ms after the answer
DECODES = {"decode": {"env": {"FAKE_VLLM_FAULT": "abort-lost", "FAKE_VLLM_FAULT_ARG": "0:300",
                              "FAKE_VLLM_PULL_S": "0.3"}}}
PREFILL_ENV = {"FAKE_VLLM_FAULT": "stale-after-cont"}


# base_dir (module) holds every config and run of the module; no_survivors (autouse) fails a test
# after which a fake server it started is still alive (the suite fixture is not used here)
base_dir, no_survivors, _suite = fake_suite_fixtures("fake-planted")


def _config(base: Path) -> dict:
    cfg = fake_config(base, decodes=DECODES, prefill_env=PREFILL_ENV,
                      timeouts={"stall_window_s": 1.5, "drain_s": 4})
    return {**cfg, "nixl": {"kv_lease_duration": 2}}


@pytest.fixture(scope="module")
def explored(base_dir):
    cfg = load_config(write_config(base_dir, _config(base_dir)))
    run_dir = new_run_dir(cfg, "explore")
    # the fake's P reaps no lease: no pd-abandon; motifs off (the planted bugs are reached by the
    # cancels and the nemesis, not by a motif)
    settings = ExploreSettings(seed=1, actions=BUDGET, replays=2, shrink_runs=14, routes=["pd", "decode", "prefill"],
                               motifs=[], nemesis_every=3, nemesis=["sigstop-prefill", "sigstop-decode"],
                               cancel_share=0.5)
    report = Explorer(cfg, run_dir, settings, quiet=True).run()
    return report, run_dir


def e2e(base: Path, yaml_path: str) -> subprocess.CompletedProcess[str]:
    """``pdrig e2e --config <the profile> --set suite=<emitted file>``."""
    cfg = write_config(base, _config(base), "profile.yaml")
    pdrig = [sys.executable, "-c", "import sys; from rig.cli import main; sys.exit(main())"]
    return subprocess.run([*pdrig, "e2e", "--config", str(cfg), "--set", f"suite={yaml_path}", "--quiet"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def _finding(report, pred) -> FindingReport:
    got = [f for f in report.findings if pred(f)]
    assert got, f"not found within {BUDGET} actions: {[(f.signature, f.minimal) for f in report.findings]}"
    return got[0]


def test_nemesis_phases_are_recorded_and_reported(explored):
    report, run_dir = explored
    assert report.status == "done" and report.actions == BUDGET
    lines = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    phases = [x for x in lines if x["phase"] == "nemesis"]
    assert len(phases) == len(report.nemeses) >= 5
    assert all(x["scenario"]["kind"] == "fault" and x["action"]["nemesis"] for x in phases)
    assert all("recovery-serves" in n.liveness for n in report.nemeses)
    assert "## Nemesis phases" in (run_dir / "explore.md").read_text()
    assert processes_of_run(run_dir) == []


def test_finds_and_shrinks_the_hang_after_a_cancel_in_a_narrow_window(explored, base_dir):
    f = _finding(explored[0], lambda f: "idle-after" in f.signature and not f.action.get("nemesis"))
    assert f.minimal_requests <= 3
    assert any(s.get("cancel_after_ms") for s in f.minimal["steps"]), f.minimal
    emitted = yaml.safe_load(Path(f.yaml).read_text())
    assert emitted[0]["kind"] == "sequence"
    run = e2e(base_dir, f.yaml)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]


def test_finds_and_shrinks_wrong_output_after_p_was_stopped_and_resumed(explored, base_dir):
    f = _finding(explored[0], lambda f: bool(f.action.get("nemesis")))
    assert "parity" in f.signature or "recovery-serves" in f.signature
    assert f.minimal_requests <= 3
    nem = f.minimal["nemesis"]
    assert nem and nem["faults"][0]["action"] == "sigstop" and nem["faults"][0]["target"] == "prefill"
    emitted = yaml.safe_load(Path(f.yaml).read_text())
    assert emitted[0]["kind"] == "fault"
    run = e2e(base_dir, f.yaml)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]

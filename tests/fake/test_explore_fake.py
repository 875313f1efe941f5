"""pdrig explore against fake vLLM servers with planted bugs it is not told about.

Three decode instances, each with one planted bug (tests/fake_vllm.py):

- ``decode-edge`` (``diverge-edge``): wrong tokens only when the prompt is k*block_size + 1 tokens
  AND the request carries a field beyond the rig's base body;
- ``decode-stall`` (``stall`` from 97 tokens): a P/D request of >= 97 prompt tokens is never
  admitted (the shape of vLLM 0.32.0's admission livelock; the config declares that known issue on
  another scenario, which the explorer never runs but must match);
- ``decode-leak`` (``leak-several``): the blocks of a request with several prompts are never freed.

One exploration (seed 1, 36 actions: 12 per topology, the stated budget) must find each, shrink
it to a scenario of <= 3 requests that still shows the bug's shape, and emit a suite YAML that
``pdrig e2e`` turns into FAIL (XFAIL for the known issue). A replay of the history re-runs the same
actions.
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
from tests.helpers.fake_rig import LIVELOCK, ROOT, fake_config, scenario, write_config
from tests.helpers.survivors import kill_pids, wait_no_survivors

DECODES = {
    "decode-edge": {"env": {"FAKE_VLLM_FAULT": "diverge-edge"}},
    "decode-stall": {"env": {"FAKE_VLLM_FAULT": "stall", "FAKE_VLLM_FAULT_ARG": "97"}},
    # a pool large enough that the leaked blocks do not fill it within the exploration
    "decode-leak": {"env": {"FAKE_VLLM_FAULT": "leak-several"}, "num_gpu_blocks_override": 400},
}
BUDGET = 36  # actions, 12 per topology
# The fake's P reaps no lease (an abandoned request's lease-reaped check would wait out the lease and fail).
ROUTES = ["pd", "decode", "prefill"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fake-explore")


@pytest.fixture(autouse=True)
def no_survivors(base):
    yield
    left = wait_no_survivors(str(base), within_s=10)
    kill_pids(left)
    assert left == {}, f"fake servers survived: {left}"


def _config(base: Path, scenarios: list[dict]) -> dict:
    return fake_config(base, decodes=DECODES, scenarios=scenarios, timeouts={"stall_window_s": 1.5, "drain_s": 4})


@pytest.fixture(scope="module")
def explored(base):
    path = write_config(base, _config(base, [scenario("declares-livelock", "decode-stall", known_issue=LIVELOCK)]))
    cfg = load_config(path)
    run_dir = new_run_dir(cfg, "explore")
    # motifs=[]: the planted bugs are found by steps drawn part by part (the motifs, whose shapes are
    # the live P/D bugs', are covered by tests/explore/test_explore_unit.py and the live slice)
    report = Explorer(cfg, run_dir, ExploreSettings(seed=1, actions=BUDGET, replays=2, shrink_runs=16,
                                                                 routes=ROUTES, motifs=[]),
                      quiet=True).run()
    return report, run_dir


def finding(report, decode: str, shows: str = "") -> FindingReport:
    got = [f for f in report.findings if f.topology.decode == decode and shows in f.signature]
    assert got, f"no failure found on {decode} within {BUDGET} actions: {[f.signature for f in report.findings]}"
    return got[0]


def e2e(base: Path, yaml_path: str) -> subprocess.CompletedProcess[str]:
    """``pdrig e2e --config <profile without scenarios> --set suite=<emitted file>``."""
    cfg = write_config(base, _config(base, []), "profile.yaml")
    pdrig = [sys.executable, "-c", "import sys; from rig.cli import main; sys.exit(main())"]
    return subprocess.run([*pdrig, "e2e", "--config", str(cfg), "--set", f"suite={yaml_path}", "--quiet"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_history_and_report_written_and_nothing_left_running(explored):
    report, run_dir = explored
    assert report.status == "done" and report.actions == BUDGET
    lines = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    explore = [x for x in lines if x["phase"] == "explore"]
    assert len(explore) == BUDGET and {"records", "evidence", "action", "verdict", "signature"} <= set(explore[0])
    assert {x["phase"] for x in lines} >= {"explore", "replay", "shrink", "emit"}
    md = (run_dir / "explore.md").read_text()
    assert "## Coverage" in md and "| pd-answered | yes |" in md and "## Failures" in md
    assert json.loads((run_dir / "explore.json").read_text())["actions"] == BUDGET
    assert processes_of_run(run_dir) == []


def test_finds_and_shrinks_wrong_tokens_at_k_block_plus_one_with_a_field(explored, base):
    f = finding(explored[0], "decode-edge", "parity")
    assert "parity" in f.signature and f.stability == "stable"
    assert f.minimal_requests <= 3
    steps = f.minimal["steps"]
    assert any(s["prompt_tokens"] % 32 == 1 and (s.get("request") or {}).get("all") for s in steps)
    assert f.known_issue == "new"
    run = e2e(base, f.yaml)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]


def test_finds_the_admission_stall_and_matches_the_declared_known_issue(explored, base):
    f = finding(explored[0], "decode-stall", "stalled")
    assert "stalled" in f.signature and f.minimal_requests <= 3
    assert any(s["prompt_tokens"] >= 97 for s in f.minimal["steps"] if s["route"] == "pd"), f
    assert f.known_issue == "spec-admission-livelock"
    emitted = yaml.safe_load(Path(f.yaml).read_text())
    assert emitted[0]["known_issue"]["id"] == "spec-admission-livelock"
    run = e2e(base, f.yaml)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]  # XFAIL
    assert "XFAIL" in (Path(run.stderr.split("run directory: ")[1].split()[0]) / "summary.md").read_text()


def test_finds_and_shrinks_the_leak_with_two_prompts(explored, base):
    f = finding(explored[0], "decode-leak", "idle-after")
    assert "idle-after" in f.signature and f.minimal_requests <= 3
    assert any((s.get("request") or {}).get("prompts", 1) > 1 for s in f.minimal["steps"])
    run = e2e(base, f.yaml)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]


def test_replay_reruns_the_history(explored, base):
    _, run_dir = explored
    cfg = load_config(write_config(base, _config(base, []), "replay.yaml"))
    out = new_run_dir(cfg, "replay")
    hist = run_dir / "history.jsonl"
    first = [json.loads(x) for x in hist.read_text().splitlines() if '"phase": "explore"' in x][:6]
    short = base / "short-history.jsonl"
    short.write_text("".join(json.dumps(x) + "\n" for x in first))
    report = Explorer(cfg, out, ExploreSettings(seed=1, replay=str(short), replays=0, shrink_runs=0), quiet=True).run()
    again = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines() if '"phase": "explore"' in x]
    assert report.actions == 6
    assert [x["action"] for x in again] == [x["action"] for x in first]
    assert [x["scenario"]["prompt_tokens" if "prompt_tokens" in x["scenario"] else "sequence"] for x in again] == \
        [x["scenario"]["prompt_tokens" if "prompt_tokens" in x["scenario"] else "sequence"] for x in first]

"""pdrig explore over topologies drawn from vLLM's knobs, and prompt resources across actions,
against fake vLLM servers (tests/fake_vllm.py).

D answers a wrong token at position 0 of every decode-side request (``diverge-at 0``): every P/D
action fails parity, so a finding is made on the first drawn topology. Two variants drawn from the
pool and scheduler-cap knobs (seed 2) are each deployed once (their plan's argv carries the knobs);
the report lists them with their ``--set``s, the finding names its topology and its emitted YAML's
header carries the ``--set``s, with which ``pdrig e2e`` turns it into FAIL. Half of the actions
reuse an earlier action's prompt: at least one of them is served from D's prefix cache (a prefix
hit across actions), and every such action validates and ran beside the earlier scenario.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from rig.cluster.processes import processes_of_run
from rig.config import load_config
from rig.explore.explorer import Explorer, ExploreSettings
from rig.run.runner import new_run_dir
from tests.helpers.fake_rig import ROOT, fake_config, write_config
from tests.helpers.suites import fake_suite_fixtures

BUDGET = 10  # actions: 5 per drawn topology
base_dir, no_survivors, _suite = fake_suite_fixtures("fake-topologies")


def _config(base: Path) -> dict:
    cfg = fake_config(base, decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "diverge-at", "FAKE_VLLM_FAULT_ARG": "0"}}},
                      timeouts={"stall_window_s": 1.5, "drain_s": 4})
    return {**cfg, "nixl": {"kv_lease_duration": 2}}


def test_drawn_topologies_are_deployed_once_each_and_name_their_findings(base_dir):
    cfg = load_config(write_config(base_dir, _config(base_dir)))
    run_dir = new_run_dir(cfg, "explore")
    settings = ExploreSettings(seed=2, actions=BUDGET, replays=1, shrink_runs=3, routes=["pd", "decode"], motifs=[],
                               cancel_share=0, resource_share=0.5, draw_topologies=2,
                               knobs=["pool", "max_num_seqs", "prefix_caching"])
    report = Explorer(cfg, run_dir, settings, quiet=True).run()
    assert report.status == "done", report.error
    assert [t.name for t in report.topologies] == ["t0", "t1"]
    lines = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    explored = [x for x in lines if x["phase"] == "explore"]
    assert [x["topology"]["variant"] for x in explored] == ["t0"] * 5 + ["t1"] * 5
    for t in report.topologies:
        assert all(tuple(x["topology"]["sets"]) == tuple(t.sets) for x in explored
                   if x["topology"]["variant"] == t.name)
    # the last deployment is that of the last finding's topology (findings are replayed and shrunk on
    # theirs): its knobs are in D's argv
    last = next(t for t in report.topologies if t.name == report.findings[-1].topology.variant)
    argv = " ".join(p["argv"] if isinstance(p["argv"], str) else " ".join(p["argv"])
                    for p in json.loads((run_dir / "plan.json").read_text())["processes"] if p["name"] == "decode")
    if "pool" in last.knobs:
        assert f"--num-gpu-blocks-override {last.knobs['pool']}" in argv
    if "max_num_seqs" in last.knobs:
        assert f"--max-num-seqs {last.knobs['max_num_seqs']}" in argv
    md = (run_dir / "explore.md").read_text()
    assert "## Topologies drawn from vLLM's knobs" in md
    # prompt resources: reused across actions, at least once served from D's prefix cache
    reused = [x for x in explored if x["action"]["resources"]]
    assert reused, "no action reused an earlier prompt"
    assert any("d-prefix-hit" in x["goals"] for x in reused), [(x["action"]["steps"], x["goals"]) for x in reused]
    # the finding on t0: its topology named, the --sets in its YAML, pdrig e2e with them FAILs
    f = next(f for f in report.findings if f.topology.variant == "t0")
    assert "parity" in f.signature
    text = Path(f.yaml).read_text()
    assert "topology t0 drawn from vLLM's knobs" in text
    reproduce = next(ln for ln in text.splitlines() if ln.startswith("# reproduce:"))
    sets = shlex.split(reproduce.split("--set suite=<this file>", 1)[1])
    assert sets[1::2] == [*report.topologies[0].sets, "nixl.kv_lease_duration=2"][:len(sets) // 2]
    assert yaml.safe_load(text)[-1]["decode"] == "decode"
    profile = write_config(base_dir, _config(base_dir), "profile.yaml")
    pdrig = [sys.executable, "-c", "import sys; from rig.cli import main; sys.exit(main())"]
    run = subprocess.run([*pdrig, "e2e", "--config", str(profile), "--set", f"suite={f.yaml}", *sets, "--quiet"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert processes_of_run(run_dir) == []

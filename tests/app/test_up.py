"""`pdrig up`: its default topology is the pair a manual wave needs (and it says why), it warms
that pair up as `e2e` does before writing endpoints.json, and Ctrl-C stops everything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rig.config import ConfigError, load_config
from rig.observe.endpoint_watch import pid_alive
from rig.run.topology import default_instances, parse_instances, scenarios_on
from tests.helpers.fake_rig import LIVELOCK, ROOT, fake_config, scenario, write_config
from tests.helpers.survivors import kill_pids, wait_no_survivors

CPU_TINY = ROOT / "configs" / "cpu-tiny.yaml"


def test_cpu_tiny_default_is_the_wave_pair_not_the_livelock_reproducer():
    names, why = default_instances(load_config(CPU_TINY))
    assert names == ["prefill", "decode-6blk"]
    assert "decode reproduces spec-admission-livelock" in why


def test_the_first_wave_scenario_decides_when_there_is_one():
    cfg = load_config(CPU_TINY, ["suite=suites/waves.yaml"])
    names, why = default_instances(cfg)
    assert names == ["prefill", "decode-6blk"] and "prefix-wave-ci" in why


def test_without_known_issues_the_first_pair():
    cfg = load_config(CPU_TINY, ["suite=suites/lease.yaml", "nixl.kv_lease_duration=5"])
    # lease.yaml's known issue is on decode-nospec: the first other decode is `decode`
    assert default_instances(cfg)[0] == ["prefill", "decode"]
    cfg = load_config(CPU_TINY, ["suite=[]"])
    assert default_instances(cfg)[0] == ["prefill", "decode"]


def test_instances_are_checked_and_select_scenarios():
    cfg = load_config(CPU_TINY)
    with pytest.raises(ConfigError, match=r"no instance 'decode-6blck'; did you mean 'decode-6blk'\?"):
        parse_instances(cfg, "prefill,decode-6blck")
    with pytest.raises(ConfigError, match="at least one prefill and one decode"):
        parse_instances(cfg, "decode")
    chosen = scenarios_on(cfg, list(cfg.scenarios), parse_instances(cfg, "prefill,decode-6blk"))
    assert [s.name for s in chosen] == ["edge-126-6blk", "edge-127-6blk", "canary-swapped-prompt"]


def completions(log: Path) -> int:
    return log.read_text().count('"POST /v1/completions')


def test_up_starts_the_default_pair_warms_it_up_and_stops_on_ctrl_c(tmp_path: Path):
    decodes = {"decode": {}, "decode-6blk": {}}
    data = fake_config(tmp_path, decodes=decodes,
                       scenarios=[scenario("reproducer", "decode", known_issue=LIVELOCK),
                                  scenario("control", "decode-6blk")])
    path = write_config(tmp_path, data)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "rig.cli", "up", "--config", str(path)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        found: list[Path] = []
        while not found and time.monotonic() < deadline and proc.poll() is None:
            found = list((tmp_path / "runs").glob("*-up/endpoints.json"))
            time.sleep(0.2)
        assert found, proc.stdout.read() if proc.poll() is not None else "no endpoints.json in 60 s"
        endpoints = json.loads(found[0].read_text())
        assert {n: v["role"] for n, v in endpoints.items()} == {"prefill": "prefill", "decode-6blk": "decode"}
        logs = found[0].parent / "logs"
        # warm-up before endpoints.json: P got a direct request and the P hop, D a direct one and the D hop,
        # then each 3 more: the baseline's timed round trips (rig.workload.baseline)
        assert completions(logs / "prefill.log") == 5 and completions(logs / "decode-6blk.log") == 5
        assert not (logs / "decode.log").exists()
        # each instance's log and pid: a wave against it scans the logs and watches the processes
        assert {n: v["log"] for n, v in endpoints.items()} == {n: str((logs / f"{n}.log").resolve())
                                                               for n in endpoints}
        assert all(pid_alive(v["pid"]) for v in endpoints.values())
        from rig.cli import main as pdrig_main

        rc = pdrig_main(["wave", "pressure", "--endpoints", str(found[0]), "--requests", "4", "--concurrency", "1",
                         "--prompt-tokens", "24",
                         "--cancel-fraction", "0", "--run-dir", str(tmp_path / "wave"), "--drain", "5",
                         "--quiet", "--seed", "5"])
        wave = json.loads((tmp_path / "wave" / "report.json").read_text())["scenarios"][0]["verdict"]
        checks = {c["name"]: c for c in wave["checks"]}
        assert rc == 0 and wave["verdict"] == "PASS", wave["reason"]
        assert checks["alive"]["ok"] and checks["no-fatal-log"]["ok"] and checks["kv-integrity"]["ok"]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_pids(wait_no_survivors(str(tmp_path), within_s=10))
    assert proc.returncode == 130, out
    assert "starting prefill, decode-6blk: decode-6blk is the first decode no known issue is expected on" in out
    assert "warmed up in" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("per-request baseline of decode-6blk: "))
    seconds = float(line.split(": ", 1)[1].split(" s (", 1)[0])
    assert 0 < seconds < 5 and "(median of 3 P/D round trips prefill -> decode-6blk after the warm-up" in line, line
    assert "pdrig: stopping decode-6blk (SIGTERM) at" in (logs / "decode-6blk.log").read_text()

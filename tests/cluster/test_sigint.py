"""Ctrl-C and kill -9 of a running ``pdrig e2e``: nothing it started may outlive it.

The rig runs as a subprocess (its own session, as from a terminal) against fake vLLM servers
whose decode never admits the request (FAKE_VLLM_FAULT=stall) and a stall window far longer than
the test, so the signal arrives while a scenario is in flight.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.fake_rig import LIVELOCK, ROOT, fake_config, scenario, write_config
from tests.helpers.survivors import kill_pids, processes_mentioning, wait_no_survivors


def start_stalled_rig(tmp: Path) -> tuple[subprocess.Popen, dict]:
    """Start ``python -m rig.cli e2e`` on a stalled decode; return it once D holds the request."""
    # Only the scenario's 126-token prompt stalls (not the 8-token warm-up): the signal then
    # arrives while the scenario is in flight.
    cfg = fake_config(tmp, decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "stall", "FAKE_VLLM_FAULT_ARG": "100"}}},
                      scenarios=[scenario("stall", "decode", prompt_tokens=126, max_tokens=2,
                                          known_issue=LIVELOCK)],
                      timeouts={"stall_window_s": 300, "request_s": 600, "shutdown_grace_s": 3})
    path = write_config(tmp, cfg)
    out = open(tmp / "rig.out", "wb")  # noqa: SIM115 - the rig writes to it while the test signals it
    rig = subprocess.Popen([sys.executable, "-m", "rig.cli", "e2e", "--config", str(path)],
                           cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           start_new_session=True)
    out.close()
    d_url = f"http://127.0.0.1:{cfg['decode'][0]['port']}"
    deadline = time.monotonic() + 45
    waiting = 0.0
    with httpx.Client(timeout=2.0) as http:
        while waiting < 1:
            if rig.poll() is not None or time.monotonic() > deadline:
                rig.kill()
                rig.wait()
                pytest.fail(f"the rig never got a request stuck on D (rc {rig.returncode}):\n"
                            + (tmp / "rig.out").read_text(errors="replace")[-3000:])
            try:
                for line in http.get(d_url + "/metrics").text.splitlines():
                    if line.startswith("vllm:num_requests_waiting{"):
                        waiting = float(line.rsplit(" ", 1)[1])
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    return rig, cfg


def fake_pids(tmp: Path) -> dict[int, str]:
    """The live fake servers of this test (their --model path is under ``tmp``)."""
    return {pid: cmd for pid, cmd in processes_mentioning(str(tmp)).items() if "fake_vllm.py" in cmd}


def wait_exit(rig: subprocess.Popen, tmp: Path, within_s: float) -> int:
    try:
        return rig.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        rig.kill()
        rig.wait()
        pytest.fail(f"the rig did not exit within {within_s} s of the signal:\n"
                    + (tmp / "rig.out").read_text(errors="replace")[-3000:])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_sigint_interrupts_reports_and_stops_everything(tmp_path, sig):
    rig, _ = start_stalled_rig(tmp_path)
    servers = fake_pids(tmp_path)
    assert len(servers) == 2, servers  # prefill and decode are up
    os.kill(rig.pid, sig)
    rc = wait_exit(rig, tmp_path, 30)
    output = (tmp_path / "rig.out").read_text(errors="replace")
    assert rc == 130, output[-3000:]
    assert "interrupted; every server the rig started has been stopped" in output
    (run_dir,) = list((tmp_path / "runs").iterdir())
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "interrupted" and report["error"].startswith("interrupted")
    # The scenario in flight is kept: ERROR with its partial observation (P answered, D held it).
    (sc,) = report["scenarios"]
    assert sc["verdict"]["verdict"] == "ERROR", sc["verdict"]
    assert sc["verdict"]["reason"] == "interrupted mid-scenario: partial observation (0/1 requests answered)"
    assert sc["observation"]["wall_s"] > 0
    (rec,) = sc["observation"]["records"]
    assert rec["prefill"]["status"] == 200 and rec["prefill"]["kv_transfer_params"]["remote_request_id"]
    assert rec["decode_sent_at"] is not None  # the decode hop was out when the signal came
    assert (run_dir / "junit.xml").exists() and (run_dir / "summary.md").exists()
    assert "INTERRUPTED" in (run_dir / "summary.md").read_text().splitlines()[0]
    left = wait_no_survivors(str(tmp_path), within_s=15)
    assert left == {}, f"survived SIGINT: {left}"
    assert all(not Path(f"/proc/{pid}").exists() or _zombie(pid) for pid in servers)


def test_sigint_during_startup_does_not_wait_for_ready(tmp_path):
    # The decode would answer /health only after 120 s; Ctrl-C must not wait for that.
    cfg = fake_config(tmp_path, decodes={"decode": {"env": {"FAKE_VLLM_STARTUP_DELAY": "120"}}},
                      scenarios=[scenario("pass", "decode")],
                      timeouts={"startup_s": 300, "shutdown_grace_s": 3})
    path = write_config(tmp_path, cfg)
    with open(tmp_path / "rig.out", "wb") as out:
        rig = subprocess.Popen([sys.executable, "-m", "rig.cli", "e2e", "--config", str(path)], cwd=ROOT,
                               stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    ports = [cfg["prefill"][0]["port"], cfg["decode"][0]["port"]]
    deadline = time.monotonic() + 45
    while not all(_listening(p) for p in ports):
        if rig.poll() is not None or time.monotonic() > deadline:
            rig.kill()
            rig.wait()
            pytest.fail("fake servers never listened:\n" + (tmp_path / "rig.out").read_text()[-3000:])
        time.sleep(0.2)
    os.kill(rig.pid, signal.SIGINT)
    rc = wait_exit(rig, tmp_path, 20)
    assert rc == 130, (tmp_path / "rig.out").read_text()[-3000:]
    (run_dir,) = list((tmp_path / "runs").iterdir())
    assert json.loads((run_dir / "report.json").read_text())["status"] == "interrupted"
    assert wait_no_survivors(str(tmp_path), within_s=15) == {}


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def test_sigkill_leaves_the_servers_to_the_reaper(tmp_path):
    rig, _ = start_stalled_rig(tmp_path)
    servers = fake_pids(tmp_path)
    assert len(servers) == 2, servers
    os.kill(rig.pid, signal.SIGKILL)
    rig.wait(timeout=10)
    assert rig.returncode == -signal.SIGKILL
    left = wait_no_survivors(str(tmp_path), within_s=20)
    assert left == {}, f"the reaper did not stop the servers within 20 s: {left}"
    (run_dir,) = list((tmp_path / "runs").iterdir())
    # No Python code ran after SIGKILL: no final report, but the plan and logs are there.
    assert (run_dir / "plan.json").exists()
    assert "Shutting down" in (run_dir / "logs" / "decode.log").read_text()  # SIGTERM, not SIGKILL


@pytest.fixture(autouse=True)
def cleanup(tmp_path):
    """Whatever a failing test leaves behind is killed by PID, so later tests start clean."""
    yield
    kill_pids(processes_mentioning(str(tmp_path)))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True

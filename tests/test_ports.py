"""Host-wide port reservations (rig/cluster/ports.py): a second run on the same ports
refuses at once naming the first's run directory; the locks die with their holder, SIGKILL
included; ``ports.free`` takes other ports and the plan records them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, assert_no_survivors, fake_config, free_ports, scenario, wait_no_survivors, write_config
from rig import cli
from rig.cluster.ports import PortConflict, PortReservation, config_ports, reserve, shifted
from rig.config import load_config


@pytest.fixture()
def base(tmp_path):
    yield tmp_path
    assert_no_survivors(tmp_path, within_s=15)


HOLD = """
import sys, time
from rig.cluster.ports import PortReservation
r = PortReservation(sys.argv[1], sys.argv[2])
r.acquire({int(p): "test" for p in sys.argv[3:]})
print("held", flush=True)
time.sleep(120)
"""


def _holder(lock_dir: Path, run_dir: str, ports: list[int]) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(lock_dir), run_dir, *map(str, ports)],
                         stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_held_port_is_refused_naming_the_holder_and_freed_by_sigkill(tmp_path):
    port, other = free_ports(2)
    holder = _holder(tmp_path / "locks", "runs/first-run", [port])
    try:
        second = PortReservation(tmp_path / "locks", "runs/second-run")
        with pytest.raises(PortConflict) as e:
            second.acquire({other: "decode.port", port: "prefill.port"})
        assert e.value.port == port
        assert f"port {port} (prefill.port) is reserved by another run: run directory runs/first-run " \
               f"(pid {holder.pid})" in str(e.value)
        assert second.ports == []  # all or none: the free port was given back
        with PortReservation(tmp_path / "locks", "runs/third") as third:
            third.acquire({other: "decode.port"})  # really given back
    finally:
        holder.kill()  # SIGKILL: no Python code of the holder runs
        holder.wait()
    with PortReservation(tmp_path / "locks", "runs/after-kill") as after:
        after.acquire({port: "prefill.port"})
        assert after.ports == [port]
        assert "runs/after-kill" in (tmp_path / "locks" / f"{port}.lock").read_text()


def test_release_frees_the_ports_and_reservations_in_one_process_conflict(tmp_path):
    (port,) = free_ports(1)
    a = PortReservation(tmp_path, "runs/a")
    a.acquire({port: "x"})
    with pytest.raises(PortConflict, match="runs/a"):
        PortReservation(tmp_path, "runs/b").acquire({port: "x"})
    a.release()
    a.release()  # twice is fine
    with PortReservation(tmp_path, "runs/b") as b:
        b.acquire({port: "x"})


def test_config_ports_cover_http_side_channels_and_mooncake(tmp_path):
    cfg = load_config(ROOT / "configs" / "cpu-tiny-mooncake.yaml")
    ports = config_ports(cfg)
    for _, inst in cfg.instances():
        assert ports[inst.port] == f"{inst.name}.port"
    base = cfg.nixl.side_channel_base_port
    assert {base, base + 1} <= set(ports)  # NIXL side channels (base port + index)
    assert ports[cfg.mooncake.rpc_port] == "mooncake.rpc_port"
    assert any("store client port" in label for label in ports.values())
    moved = shifted(cfg, 7)
    assert sorted(config_ports(moved)) == [p + 7 for p in sorted(ports)]  # same layout, moved


def test_second_run_refuses_at_once_naming_the_first_and_runs_after_the_first_is_killed(base, restore_signals):
    """`pdrig up` holds the config's ports; `pdrig e2e` on the same config exits 3 before
    starting anything, naming up's run directory. After up is SIGKILLed the e2e runs."""
    data = fake_config(base, scenarios=[scenario("pass", "decode")])
    data["ports"] = {"lock_dir": str(base / "locks")}
    path = write_config(base, data)
    up = subprocess.Popen([sys.executable, "-m", "rig.cli", "up", "--config", str(path)], cwd=base,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list((base / "runs").glob("*-up/endpoints.json")):
            assert up.poll() is None, up.stdout.read()
            assert time.monotonic() < deadline, "pdrig up did not come up"
            time.sleep(0.2)
        (up_dir,) = [p.parent for p in (base / "runs").glob("*-up/endpoints.json")]
        code = cli.main(["e2e", "--config", str(path), "--quiet"])
        assert code == 3
        (e2e_dir,) = [d for d in (base / "runs").iterdir() if d != up_dir]
        report = json.loads((e2e_dir / "report.json").read_text())
        assert report["status"] == "error"
        assert "is reserved by another run: run directory " + str(up_dir.resolve()) in report["error"]
        assert list((e2e_dir / "logs").iterdir()) == []  # refused before any server started
    finally:
        up.kill()  # SIGKILL: its reaper stops the servers, the kernel drops the locks
        up.wait()
    assert wait_no_survivors(str(up_dir), within_s=15) == {}
    code = cli.main(["e2e", "--config", str(path), "--quiet"])
    assert code == 0


def test_free_ports_take_other_ports_while_the_configured_ones_are_held(base):
    data = fake_config(base, scenarios=[scenario("pass", "decode")])
    data["ports"] = {"lock_dir": str(base / "locks"), "free": True}
    cfg = load_config(write_config(base, data))
    wanted = config_ports(cfg)
    with PortReservation(base / "locks", "runs/holder") as held:
        held.acquire(wanted)
        from rig.run.runner import SuiteRunner, new_run_dir

        run_dir = new_run_dir(cfg)
        result = SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True).run()
    assert result.status == "passed", result.error or [v.reason for v in result.verdicts]
    plan = json.loads((run_dir / "plan.json").read_text())
    used = {p["port"] for p in plan["processes"]}
    assert used and not used & set(wanted)
    assert {i["port"] for i in result.config["prefill"] + result.config["decode"]} == used


def test_reserve_exact_ports_when_free_is_off(tmp_path):
    data = fake_config(tmp_path)
    data["ports"] = {"lock_dir": str(tmp_path / "locks")}
    cfg = load_config(write_config(tmp_path, data))
    same, res = reserve(cfg, "runs/me")
    with res:
        assert same is cfg and res.ports == sorted(config_ports(cfg))

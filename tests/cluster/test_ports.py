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

from rig import cli
from rig.cluster.ports import PortConflict, PortReservation, config_ports, reserve, shifted
from rig.config import load_config
from tests.helpers.fake_rig import ROOT, fake_config, free_ports, scenario, write_config
from tests.helpers.survivors import assert_no_survivors, wait_no_survivors


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


def test_second_run_refuses_at_once_naming_the_first_and_runs_after_the_first_is_killed(base, restore_signals,
                                                                                       capsys):
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
        capsys.readouterr()
        code = cli.main(["e2e", "--config", str(path)])
        assert code == 3
        # Refused before any server started: no run directory left, one line, no empty table.
        assert [d for d in (base / "runs").iterdir() if d != up_dir] == []
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if "] warning: " not in ln]  # the config's own warnings stay
        assert len(lines) == 1, err
        line = lines[0]
        assert line.startswith("pdrig: refused before any server started: port ")
        assert "is reserved by another run: run directory " + str(up_dir.resolve()) in line
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


CHOOSE = """
import json, os, sys, time
from rig.config import load_config
from rig.cluster.ports import config_ports, reserve
cfg = load_config(sys.argv[1])
print("ready", flush=True)  # imported and waiting at the start line
while not os.path.exists(sys.argv[2]):  # a start line: every chooser searches at the same moment
    time.sleep(0.001)
moved, res = reserve(cfg, sys.argv[3])
print(json.dumps(sorted(config_ports(moved))), flush=True)
sys.stdin.read()  # hold the ports until the test closes stdin (a run that binds late binds nothing yet)
"""


def test_concurrent_free_port_choosers_never_pick_the_same_ports(tmp_path):
    data = fake_config(tmp_path)
    data["ports"] = {"lock_dir": str(tmp_path / "locks"), "free": True}
    path = write_config(tmp_path, data)
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", CHOOSE, str(path), str(go), f"runs/chooser-{i}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for i in range(4)]
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 4  # all four at the start line
        go.touch()
        chosen = [set(json.loads(p.stdout.readline())) for p in procs]
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)
    assert all(chosen)
    for i, a in enumerate(chosen):
        for b in chosen[i + 1:]:
            assert not a & b, f"two runs chose the same ports: {sorted(a & b)}"


def test_free_ports_skip_a_port_bound_without_a_lock_and_leave_it_unlocked(tmp_path):
    import socket

    data = fake_config(tmp_path)
    data["ports"] = {"lock_dir": str(tmp_path / "locks"), "free": True}
    cfg = load_config(write_config(tmp_path, data))
    first = min(config_ports(cfg))
    with socket.socket() as squatter:  # a server of no run: bound, holds no lock
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", first))
        squatter.listen()
        moved, res = reserve(cfg, "runs/me")
        with res:
            assert first not in config_ports(moved)
            with PortReservation(tmp_path / "locks", "runs/other") as other:
                other.acquire({first: "probe"})  # the chooser dropped the lock of the port it could not bind

"""`pdrig ps` and `pdrig clean` (rig/run/hostruns.py): this host's live runs from the port lock files
and their run directories; stale lock files and empty run directories removed, never a live run's.
The live run is a `pdrig up` of fake vLLM servers (tests/fake_vllm.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from rig import cli
from rig.cluster.ports import PortReservation, lock_files
from rig.config import load_config
from rig.run.hostruns import RUN_MARKER_FILE, make_run_dir
from tests.helpers.fake_rig import ROOT, fake_config, scenario, write_config
from tests.helpers.survivors import assert_no_survivors


@pytest.fixture()
def base(tmp_path):
    yield tmp_path
    assert_no_survivors(tmp_path, within_s=15)


def test_ps_names_an_in_process_reservation_and_not_a_released_one(tmp_path, capsys):
    path = write_config(tmp_path, fake_config(tmp_path))
    cfg = load_config(path)
    with PortReservation(cfg.ports.lock_dir, "runs/holding") as held:
        held.acquire({40001: "a", 40002: "b"})
        assert cli.main(["ps", "--config", str(path)]) == 0
        out = capsys.readouterr().out
        assert f"pid {os.getpid()}" in out and "runs/holding" in out and "ports 40001,40002" in out
    assert cli.main(["ps", "--config", str(path)]) == 0
    assert capsys.readouterr().out.strip() == "no live pdrig run on this host"
    assert [lf.held_by for lf in lock_files(cfg.ports.lock_dir)] == [None, None]  # stale files stay


def test_ps_and_clean_with_a_live_fake_run(base, capsys, restore_signals):
    path = write_config(base, fake_config(base, scenarios=[scenario("pass", "decode")]))
    cfg = load_config(path)
    locks, runs = base / "port-locks", base / "runs"
    runs.mkdir()
    up = subprocess.Popen([sys.executable, "-m", "rig.cli", "up", "--config", str(path)], cwd=base,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(runs.glob("*-up/endpoints.json")):
            assert up.poll() is None, up.stdout.read()
            assert time.monotonic() < deadline, "pdrig up did not come up"
            time.sleep(0.2)
        (up_dir,) = [p.parent for p in runs.glob("*-up/endpoints.json")]
        # Left behind by dead runs: a lock file nobody holds, an old empty run directory; and a
        # fresh empty one (a run that has just created it). Not the rig's: an unheld lock file of
        # another tool, an old empty folder and a folder holding only a socket, without the marker.
        (locks / "1.lock").write_text("run directory runs/long-gone (pid 1)\n")
        (locks / "2.lock").write_text("held by some other tool\n")
        old_empty, fresh_empty = runs / "20261101-000000-dead", runs / "20261201-235959-starting"
        make_run_dir(old_empty)
        make_run_dir(fresh_empty)
        foreign, sockets = runs / "somebody-elses", runs / "sockets-only"
        (foreign / "sub").mkdir(parents=True)
        sockets.mkdir()
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(sockets / "s.sock"))
        for d in (old_empty, foreign, sockets):
            os.utime(d, (time.time() - 3600, time.time() - 3600))

        assert cli.main(["ps", "--config", str(path)]) == 0
        (line,) = capsys.readouterr().out.splitlines()
        assert f"pid {up.pid}" in line and str(up_dir.resolve()) in line
        assert f"prefill:{cfg.prefill[0].port}" in line and f"decode:{cfg.decode[0].port}" in line
        assert "long-gone" not in line

        assert cli.main(["clean", "--config", str(path)]) == 0
        out = capsys.readouterr().out
        assert "removed 1 stale lock files" in out and "(ports 1)" in out and "1 empty run directories" in out
        assert not (locks / "1.lock").exists() and not old_empty.exists()
        assert (locks / "2.lock").exists() and foreign.exists() and (sockets / "s.sock").exists()  # not the rig's
        assert f"kept {foreign}: no pdrig run marker" in out and f"kept {locks / '2.lock'}: not the rig's" in out
        assert f"kept {sockets}: no pdrig run marker" in out
        listener.close()
        assert fresh_empty.exists() and up_dir.exists()  # too young; live
        held = [lf for lf in lock_files(locks) if lf.held_by == up.pid]
        assert {lf.port for lf in held} >= {cfg.prefill[0].port, cfg.decode[0].port}
        assert up.poll() is None  # the live run is untouched
    finally:
        up.kill()
        up.wait()
    from tests.helpers.survivors import wait_no_survivors

    assert wait_no_survivors(str(up_dir), within_s=15) == {}
    assert cli.main(["ps", "--config", str(path)]) == 0
    assert capsys.readouterr().out.strip() == "no live pdrig run on this host"
    assert cli.main(["clean", "--config", str(path)]) == 0
    capsys.readouterr()
    # its locks were stale now; its files are kept; the other tool's lock file stays
    assert [lf.port for lf in lock_files(locks)] == [2] and up_dir.exists()


def test_every_run_directory_the_rig_creates_carries_its_marker(tmp_path):
    from rig.run.runner import new_run_dir

    cfg = load_config(write_config(tmp_path, fake_config(tmp_path)))
    d = new_run_dir(cfg, "marked")
    assert (d / RUN_MARKER_FILE).is_file() and (d / "logs").is_dir()


def test_a_run_root_that_is_a_file_is_refused_in_one_line_before_anything(tmp_path):
    from rig.config import ConfigError
    from rig.run.runner import new_run_dir

    (tmp_path / "afile").write_text("x")
    cfg = load_config(write_config(tmp_path, fake_config(tmp_path)), [f"run_root={tmp_path / 'afile'}"])
    with pytest.raises(ConfigError, match=r"run_root: cannot create the run directory .*--set run_root=DIR"):
        new_run_dir(cfg)

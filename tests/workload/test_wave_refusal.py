"""`pdrig wave` against a stopped topology: exit 2 with the reason, and no empty run directory."""

from __future__ import annotations

from pathlib import Path

from rig.cli import main as pdrig_main
from tests.helpers.fake_rig import ROOT, free_ports


def main(argv: list[str]) -> int:
    """`pdrig wave ARGV...` in this process."""
    return pdrig_main(["wave", *argv])


def test_unreachable_servers_leave_no_run_directory(tmp_path: Path, capsys):
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    runs = tmp_path / "runs"
    code = main(["pressure", "--prefill", dead, "--decode", dead, "--config", str(ROOT / "configs" / "cpu-tiny.yaml"),
                 "--set", f"run_root={runs}", "--requests", "10", "--quiet"])
    assert code == 2
    assert f"cannot reach {dead}" in capsys.readouterr().err
    assert not runs.exists() or list(runs.iterdir()) == []


def test_a_run_dir_that_existed_is_left_alone(tmp_path: Path, capsys):
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    (tmp_path / "mine").mkdir()
    assert main(["pressure", "--prefill", dead, "--decode", dead, "--run-dir", str(tmp_path / "mine"), "--quiet"]) == 2
    assert (tmp_path / "mine").is_dir()

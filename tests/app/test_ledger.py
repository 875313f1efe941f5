"""rig/run/ledger.py: how a run that stops maps to its status, and what it keeps of the scenario
in flight (the bookkeeping a suite and `pdrig wave` share); and that a caller-owned cluster's
scenarios run with the config the caller passes (SuiteRunner.run_in, the explorer's call), the
runner's own untouched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from rig.config import load_config
from rig.errors import ClusterError
from rig.judge.verdict import ScenarioVerdict
from rig.observe.observations import ScenarioObservation, SnapshotStore
from rig.plan.spec import Plan
from rig.report.build import RunResult
from rig.run.ledger import RunLedger
from rig.run.lifecycle import ScenarioSteps
from rig.run.runner import SuiteRunner
from tests.helpers.fake_rig import fake_config, scenario, write_config


class NoServers:
    """A deployment without instances: the lifecycle goes straight to the kind's requests."""

    prefills: list = []
    decodes: list = []

    async def deaths(self, http):
        return {}

    async def observe(self, http, obs):
        return None


def _stopped_in_flight(tmp_path: Path, error: BaseException, doing: str = "running the suite"):
    """A one-scenario run whose kind's requests raise ``error``; returns (ledger, what stopped()
    returned, the observations the judge was given)."""
    cfg = load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=[scenario("s", "decode")])))
    sc = cfg.scenarios[0]
    ledger = RunLedger(RunResult(name="t", run_dir=str(tmp_path), config={}), tmp_path)
    judged: list[ScenarioObservation] = []

    def judge(obs, result):
        judged.append(obs)
        return ScenarioVerdict(sc.name, "ERROR", "pass", obs.error)

    async def requests(obs):
        raise error

    async def go():
        store = SnapshotStore(tmp_path)
        try:
            async with httpx.AsyncClient() as http:
                steps = ScenarioSteps(ScenarioObservation("s", "decode", "prefill"), requests, judge, http, store,
                                      0.0, ledger.rig_exception)
                await ledger.run(sc, NoServers(), steps)
        finally:
            store.close()

    try:
        asyncio.run(go())
    except BaseException as e:  # what the run loop of a suite or `pdrig wave` catches
        assert ledger.in_flight == "s"
        return ledger, ledger.stopped(e, doing), judged
    return ledger, None, judged


def test_ctrl_c_in_flight_is_interrupted_and_keeps_the_scenario_as_error(tmp_path):
    ledger, back, judged = _stopped_in_flight(tmp_path, KeyboardInterrupt())
    assert isinstance(back, KeyboardInterrupt)  # re-raised by the caller once the report is written
    assert ledger.result.status == "interrupted" and ledger.result.error == "interrupted (SIGINT)"
    (v,) = ledger.result.verdicts
    assert v.verdict == "ERROR" and v.reason == "interrupted mid-scenario: partial observation (0/0 requests answered)"
    assert judged and judged[0].error == v.reason  # the kind's own judge saw the partial observation
    assert ledger.in_flight == "-"


def test_a_rig_exception_inside_the_scenario_is_its_error_and_the_run_goes_on(tmp_path):
    ledger, back, _ = _stopped_in_flight(tmp_path, RuntimeError("a bug"))
    assert back is None and ledger.result.status == "running"  # nothing stopped the run
    (v,) = ledger.result.verdicts
    assert v.reason == "rig error while running it: RuntimeError: a bug (traceback in rig-traceback.txt)"
    assert "scenario s: running it ===" in (tmp_path / "rig-traceback.txt").read_text()
    assert (tmp_path / "report.json").is_file()  # rewritten after the scenario


def test_a_cluster_error_stops_the_run_as_error_with_its_message(tmp_path):
    ledger = RunLedger(RunResult(name="t", run_dir=str(tmp_path), config={}), tmp_path)
    assert ledger.stopped(ClusterError("decode did not start"), "running the suite") is None
    assert (ledger.result.status, ledger.result.error) == ("error", "decode did not start")
    assert ledger.result.verdicts == [] and not (tmp_path / "rig-traceback.txt").exists()


def test_a_rig_exception_outside_a_scenario_is_error_with_its_traceback(tmp_path):
    ledger = RunLedger(RunResult(name="t", run_dir=str(tmp_path), config={}), tmp_path)
    try:
        raise KeyError("plan")
    except KeyError as e:
        assert ledger.stopped(e, "running the suite") is None
    assert (ledger.result.status, ledger.result.error) == ("error", "KeyError: 'plan'")
    assert "scenario -: running the suite ===" in (tmp_path / "rig-traceback.txt").read_text()


def test_system_exit_is_not_recorded_but_raised(tmp_path):
    ledger = RunLedger(RunResult(name="t", run_dir=str(tmp_path), config={}), tmp_path)
    with pytest.raises(SystemExit):
        ledger.stopped(SystemExit(3), "running the suite")
    assert ledger.result.status == "running"


def test_run_in_runs_with_the_callers_config_and_leaves_the_runners_alone(tmp_path, monkeypatch):
    own = load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=[scenario("a", "decode")])))
    theirs = load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=[scenario("b", "decode")]), "b.yaml"))
    runner = SuiteRunner(own, [], tmp_path, quiet=True)
    seen = []

    async def phases(cluster, plan, cfg, scenarios, upfront=False):
        seen.append((cfg, [s.name for s in scenarios]))
        for sc in scenarios:
            runner.ledger.add(sc, ScenarioObservation(sc.name, "decode", "prefill"),
                              ScenarioVerdict(sc.name, "PASS", "pass", "all checks hold"))

    monkeypatch.setattr(runner, "_run_phases", phases)

    class Cluster:
        plan = Plan("p", str(tmp_path), "m", ())

    out = runner.run_in(Cluster(), theirs, list(theirs.scenarios), keep=1)
    assert seen == [(theirs, ["b"])] and runner.cfg is own
    assert out.verdict.scenario == "b" and [v.scenario for v in runner.result.verdicts] == ["b"]
    runner.run_on(Cluster(), list(own.scenarios))  # without a config: the runner's own
    assert seen[-1] == (own, ["a"])

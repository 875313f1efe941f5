"""Start-up that waits for progress (rig/cluster/startup.py, Cluster._wait_ready), its display and
figures, and partial failures that stay partial (rig/run/runner.py), against fake vLLM servers
(tests/fake_vllm.py: FAKE_VLLM_PHASE_S, faults hang-in-startup, exit-in-startup,
crash-mid-request)."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from rig.cluster.processes import Cluster, ClusterError
from rig.cluster.startup import PHASE_NAMES, StartupDisplay, StartupWatch, phase_of
from rig.config import load_config
from rig.plan.processes import build_plan
from rig.run.runner import SuiteRunner, new_run_dir
from rig.transport.endpoint import Endpoint
from rig.transport.records import Hop, HopFailure
from rig.workload.warmup import WarmupWatch, warm_up
from tests.helpers.fake_rig import fake_config, scenario, write_config


def _cluster_cfg(tmp: Path, env: dict[str, str], **timeouts: float):
    cfg = load_config(write_config(tmp, fake_config(tmp, decodes={"decode": {"env": env}}, timeouts=timeouts)))
    return cfg, build_plan(cfg, tmp / "run", "model", sys.executable)


def test_phase_of_follows_vllm_0_32_markers_and_never_goes_back():
    assert phase_of("") == "imports"
    assert phase_of("(APIServer pid=1) INFO [api_utils.py:286] non-default args: {}") == "config"
    text = "(EngineCore pid=2) INFO 12-01 16:53:28 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with"
    assert phase_of(text) == "engine core"
    assert phase_of("nothing new", current="engine core") == "engine core"  # a phase is not undone
    # three processes' lines interleave: the furthest marker wins
    assert phase_of("non-default args: x\nStarting vLLM API server 0 on http://x") == "HTTP up"
    assert PHASE_NAMES[0] == "imports" and PHASE_NAMES[-1] == "HTTP up"


def test_a_slow_start_that_progresses_is_waited_for_and_its_phases_are_recorded(tmp_path):
    # Each phase spins 2.5 s without a log line: longer than the 1.5 s no-progress interval, so
    # only the CPU use keeps it alive.
    cfg, plan = _cluster_cfg(tmp_path, {"FAKE_VLLM_PHASE_S": "2.5"})
    with Cluster(plan, 120, 3, startup_stall_s=1.5) as cluster:
        ready = cluster.start(["decode"])
        w = cluster.startups["decode"]
    assert ready["decode"] >= 6 * 2.5
    assert w.outcome == "ready" and w.cpu_s is not None and w.cpu_s > 1  # a share of a busy host
    assert list(w.phase_s) == list(PHASE_NAMES)  # every phase seen, in order
    assert all(w.phase_s[p] >= 2 for p in PHASE_NAMES[1:])
    figures = w.figures()
    assert figures["ready_s"] == pytest.approx(ready["decode"], abs=0.2)
    assert figures["outcome"] == "ready" and figures["load_at_end"] is not None


def test_a_start_that_hangs_in_a_phase_fails_fast_naming_the_phase_the_load_and_the_fix(tmp_path):
    cfg, plan = _cluster_cfg(tmp_path, {"FAKE_VLLM_FAULT": "hang-in-startup", "FAKE_VLLM_FAULT_ARG": "2"})
    t = time.monotonic()
    with Cluster(plan, 600, 3, startup_stall_s=3) as cluster:
        outcome = cluster.start_each(["prefill", "decode"])
        assert "decode" not in cluster.procs  # a hung start is stopped, not left to take CPU
    assert time.monotonic() - t < 120  # the 600 s ceiling was not waited for
    assert isinstance(outcome["prefill"], float)  # the other instance started
    err = outcome["decode"]
    assert isinstance(err, ClusterError) and err.exit_code is None
    assert "decode made no progress for" in str(err) and "start-up phase 'model load'" in str(err)
    assert "host load" in str(err) and "--set timeouts.startup_stall_s=60" in str(err)
    assert "Starting to load model" in err.log_tail


def test_a_start_that_exits_fails_at_once_with_its_exit_code(tmp_path):
    cfg, plan = _cluster_cfg(tmp_path, {"FAKE_VLLM_FAULT": "exit-in-startup"})
    with Cluster(plan, 600, 3, startup_stall_s=300) as cluster, pytest.raises(ClusterError) as e:
        cluster.start(["decode"])
    assert e.value.exit_code == 3
    assert "decode exited with code 3 before it was ready (phase model load" in str(e.value)
    assert "RuntimeError: fake engine died in start-up" in e.value.log_tail


def test_the_ceiling_names_the_phase_and_the_setting_to_raise(tmp_path):
    cfg, plan = _cluster_cfg(tmp_path, {"FAKE_VLLM_PHASE_S": "30"})
    with Cluster(plan, 3, 3, startup_stall_s=60) as cluster, pytest.raises(ClusterError) as e:
        cluster.start(["decode"])
    assert "decode was not ready within 3 s (timeouts.startup_s, the ceiling), in start-up phase 'config'" \
        in str(e.value)
    assert "--set timeouts.startup_s=60" in str(e.value) and "host load" in str(e.value)


def test_display_lines_show_phase_seconds_and_cpu_per_instance():
    w = StartupWatch("prefill", None, None, vllm=True)
    w.cpu_s, w.phase = 12.5, "KV cache"
    m = StartupWatch("store-master", None, None, vllm=False)
    out = io.StringIO()
    d = StartupDisplay({"prefill": w, "store-master": m}, mode="lines", stream=out, line_interval_s=0.05).start()
    deadline = time.monotonic() + 10  # two periodic lines, then the final one at stop
    while len(out.getvalue().splitlines()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    d.stop()
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2
    assert "prefill: KV cache, 0 s, CPU 12.5 s" in lines[-1] and "store-master: starting" in lines[-1]
    assert "host load" in lines[-1]
    rich = io.StringIO()
    r = StartupDisplay({"prefill": w}, mode="rich", stream=rich).start()
    r.stop()
    assert "KV cache" in rich.getvalue() and "12.5" in rich.getvalue()
    with pytest.raises(ValueError, match="start-up display mode"):
        StartupDisplay({}, mode="fancy")


def test_one_instance_that_never_starts_leaves_the_others_scenarios_judged(tmp_path, restore_signals):
    data = fake_config(tmp_path, decodes={"decode": {}, "decode-hang": {"env": {"FAKE_VLLM_FAULT": "hang-in-startup"}}},
                       scenarios=[scenario("first", "decode"), scenario("on-hung", "decode-hang"),
                                  scenario("on-hung-2", "decode-hang"), scenario("last", "decode")],
                       timeouts={"startup_stall_s": 3})
    cfg = load_config(write_config(tmp_path, data))
    run_dir = new_run_dir(cfg)
    result = SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True).run()
    v = {x.scenario: x for x in result.verdicts}
    assert v["first"].verdict == "PASS" and v["last"].verdict == "PASS", v
    for name in ("on-hung", "on-hung-2"):
        assert v[name].verdict == "ERROR"
        assert v[name].reason.startswith("decode-hang did not start: decode-hang made no progress")
    assert result.status != "passed" and not result.not_run
    report = json.loads((run_dir / "report.json").read_text())
    assert report["startup"]["decode-hang"]["outcome"] == "stuck"
    assert report["startup"]["decode"]["outcome"] == "ready" and report["startup"]["decode"]["ready_s"] > 0
    assert "KV cache" in report["startup"]["decode-hang"]["phases_s"]  # the phase it hung in
    summary = (run_dir / "summary.md").read_text()
    assert "## Start-up" in summary and "| decode-hang | stuck |" in summary
    assert "- did not start: decode-hang made no progress for " in summary
    assert "decode-hang made no progress" in (run_dir / "startup-errors.txt").read_text()
    from rig import cli
    code = cli.main(["e2e", "--config", str(write_config(tmp_path, data, "again.yaml")),
                     "--scenario", "on-hung", "--scenario", "first", "--quiet"])
    assert code != 0  # the exit code still reports the failure


def test_an_instance_that_exits_in_start_up_is_a_death_on_every_scenario_that_needs_it(tmp_path):
    data = fake_config(tmp_path, decodes={"decode": {}, "decode-exit": {"env": {"FAKE_VLLM_FAULT": "exit-in-startup"}}},
                       scenarios=[scenario("on-exit", "decode-exit"), scenario("ok", "decode")])
    cfg = load_config(write_config(tmp_path, data))
    result = SuiteRunner(cfg, list(cfg.scenarios), new_run_dir(cfg), quiet=True).run()
    v = {x.scenario: x for x in result.verdicts}
    assert v["ok"].verdict == "PASS"
    assert v["on-exit"].verdict == "FAIL"
    assert "decode-exit died (exit 3): " in v["on-exit"].reason
    assert "RuntimeError: fake engine died in start-up" in v["on-exit"].reason
    assert result.status == "failed"


def test_a_decode_that_dies_at_its_warm_up_fails_every_scenario_that_needs_it_in_every_kind(tmp_path):
    crash = {"FAKE_VLLM_FAULT": "crash-mid-request", "FAKE_VLLM_FAULT_ARG": "1"}  # its first request
    wave = {"name": "wave", "kind": "pressure-wave", "decode": "decode-dies", "prompt_tokens": 24, "max_tokens": 4,
            "wave": {"requests": 4, "concurrency": 2}}
    seq = {"name": "seq", "kind": "sequence", "decode": "decode-dies",
           "sequence": {"steps": [{"id": "a", "route": "pd", "prompt_tokens": 40, "max_tokens": 4}]}}
    # a fault scenario whose fault never fired (its decode was already dead) is a death too
    fault = {"name": "fault", "kind": "fault", "decode": "decode-dies", "prompt_tokens": 40, "max_tokens": 4,
             "fault": {"requests": 1, "faults": [{"trigger": {"event": "prefill-answered"}, "target": "prefill",
                                                   "action": "sigkill"}]}}
    data = fake_config(tmp_path, decodes={"decode-dies": {"env": crash}, "decode": {}},
                       scenarios=[scenario("edge", "decode-dies"), wave, seq, fault, scenario("ok", "decode")])
    cfg = load_config(write_config(tmp_path, data))
    result = SuiteRunner(cfg, list(cfg.scenarios), new_run_dir(cfg), quiet=True).run()
    v = {x.scenario: x for x in result.verdicts}
    for name in ("edge", "wave", "seq", "fault"):
        assert v[name].verdict == "FAIL", (name, v[name].reason)
        assert "decode-dies died (exit 1): " in v[name].reason, (name, v[name].reason)
        assert "EngineCore encountered a fatal error" in v[name].reason
    assert v["ok"].verdict == "PASS"
    assert result.status == "failed"


class _Transport:
    """A stand-in Transport: each instance's direct requests answer from a list of Hops in turn."""

    def __init__(self, answers: dict[str, list[Hop]]):
        self.answers = answers
        self.sent: list[str] = []

    async def direct(self, ep, _prompt, _max_tokens):
        self.sent.append(ep.name)
        return self.answers[ep.name].pop(0)

    async def prefill(self, ep, _prompt):
        self.sent.append(f"{ep.name}/prefill")
        return Hop(ep.name, status=200)  # no kv_transfer_params: no decode hop


def _warm(answers: dict[str, list[Hop]], cpu: dict[str, list[float | None]], exits: dict[str, int | None],
          bound_s: float = 60) -> tuple[list[str], WarmupWatch, _Transport, list[str]]:
    client, logged = _Transport(answers), []
    watch = WarmupWatch(lambda n: cpu[n].pop(0) if len(cpu[n]) > 1 else cpu[n][0], exits.get, bound_s)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(404))) as http:
            return await warm_up(client, http, Endpoint("prefill", "http://p"), Endpoint("decode", "http://d"),
                                 logged.append, watch)

    _, failed = asyncio.run(go())
    return failed, watch, client, logged


def test_a_warm_up_timeout_while_the_engine_works_is_sent_again_not_called_a_failure():
    timeout = Hop("decode", error="timeout: SocketTimeoutError", failure=HopFailure.TIMEOUT)
    failed, watch, client, logged = _warm({"prefill": [Hop("prefill", status=200)],
                                           "decode": [timeout, timeout, Hop("decode", status=200)]},
                                          {"prefill": [1.0], "decode": [10.0, 14.0, 14.0, 20.0, 20.0]}, {})
    assert failed == [] and watch.retries == {"decode": 2} and client.sent.count("decode") == 3
    assert "warm-up request to decode timed out after 0 s while its processes used 4.0 CPU-s" in logged[0]


def test_a_warm_up_timeout_without_cpu_use_or_past_the_bound_is_a_failure():
    timeout = Hop("decode", error="timeout: SocketTimeoutError", failure=HopFailure.TIMEOUT)
    idle, _, client, logged = _warm({"prefill": [Hop("prefill", status=200)], "decode": [timeout]},
                                    {"prefill": [1.0], "decode": [10.0, 10.1]}, {})
    assert idle == ["decode"] and client.sent.count("decode") == 1 and "failed: timeout" in logged[-1]
    spent, _, client, _ = _warm({"prefill": [Hop("prefill", status=200)], "decode": [timeout]},
                                {"prefill": [1.0], "decode": [10.0, 30.0]}, {}, bound_s=0)
    assert spent == ["decode"] and client.sent.count("decode") == 1


def test_a_decode_that_exits_at_its_warm_up_is_named_a_death_and_sent_nothing_more():
    err = Hop("decode", error="connection_error: ServerDisconnectedError")
    failed, watch, client, logged = _warm({"prefill": [Hop("prefill", status=200)], "decode": [err]},
                                          {"prefill": [1.0], "decode": [10.0, None]}, {"decode": 1})
    assert failed == ["decode"] and watch.died == {"decode": 1}
    assert "warm-up request to decode died (exit 1)" in logged[-1]
    assert "prefill/prefill" not in client.sent  # no P/D round trip towards a dead decode

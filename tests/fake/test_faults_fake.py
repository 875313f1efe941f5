"""Fault scenarios against fake vLLM servers: each fault fires at its event and not
before, the recovery checks fail when the fake leaks or hangs, and no process outlives a run
whatever was killed or stopped.

One suite run covers the scenarios (the runner keeps P and swaps decodes between phases); the
timing assertions read the fault events the rig recorded (``faults-<scenario>.json``) against
the request records' own times (monotonic seconds of one process, so comparable).
"""

from __future__ import annotations

import json
import signal
import time

from rig.cluster.processes import Cluster, processes_of_run
from rig.config import load_config
from rig.plan.processes import build_plan
from rig.run.runner import new_run_dir
from tests.helpers.fake_rig import fake_config, write_config
from tests.helpers.suites import fake_suite_fixtures

DECODES = {
    "decode": {},
    # D spends 1.5 s in the KV fetch stage in_progress: a window the kv-fetch trigger can see.
    "decode-slowpull": {"env": {"FAKE_VLLM_PULL_S": "1.5"}},
    "decode-leak": {"env": {"FAKE_VLLM_FAULT": "leak-kv"}},
    "decode-stall": {"env": {"FAKE_VLLM_FAULT": "stall"}},
}


def fault_sc(name: str, decode: str, faults: list[dict], requests: int = 1, **extra) -> dict:
    return {"name": name, "kind": "fault", "decode": decode, "prompt_tokens": 40, "max_tokens": 4,
            "expect": {"completion_tokens": 4, "total_tokens": 44},
            "fault": {"requests": requests, "faults": faults, "idle_margin_s": 3, **extra}}


SCENARIOS = [
    fault_sc("kill-p-answered", "decode",
             [{"trigger": {"event": "prefill-answered"}, "target": "prefill", "action": "sigkill"}]),
    fault_sc("stop-d-sent-300", "decode-slowpull",
             [{"trigger": {"event": "decode-sent", "after_ms": 300}, "target": "decode", "action": "sigstop",
               "stop_s": 1.5}]),
    fault_sc("abandon", "decode", [{"trigger": {"event": "prefill-answered"}, "target": "request",
                                    "action": "abandon"}]),
    fault_sc("delay", "decode", [{"trigger": {"event": "prefill-answered"}, "target": "request",
                                  "action": "delay-decode", "delay_s": 0.6}]),
    fault_sc("kill-d-after-1", "decode", [{"trigger": {"event": "after-requests", "k": 1}, "target": "decode",
                                           "action": "sigkill"}], requests=3),
    fault_sc("cancel-in-fetch", "decode-slowpull",
             [{"trigger": {"event": "kv-fetch-in-progress", "poll_ms": 20}, "target": "request",
               "action": "cancel-decode"}]),
    fault_sc("cancel-leak", "decode-leak",
             [{"trigger": {"event": "decode-sent", "after_ms": 0}, "target": "request", "action": "cancel-decode"}]),
    fault_sc("kill-p-hang", "decode-stall",
             [{"trigger": {"event": "prefill-answered"}, "target": "prefill", "action": "sigkill"}]),
]


# suite: (RunResult, run_dir) of one run of SCENARIOS
base_dir, no_survivors, suite = fake_suite_fixtures(
    "fake-faults", decodes=DECODES, scenarios=SCENARIOS, timeouts={"stall_window_s": 1.5, "kv_transfer_s": 3},
    overrides=["nixl.kv_lease_duration=2"])


def verdict(suite, name):
    return next(v for v in suite[0].verdicts if v.scenario == name)


def records(suite, name) -> dict[str, dict]:
    obs = next(o for o in suite[0].observations if o.scenario == name)
    return {r.request_id: r for r in obs.records}


def events(suite, name) -> list[dict]:
    return json.loads((suite[1] / f"faults-{name}.json").read_text())["events"]


def checks(v) -> dict[str, tuple[bool | None, str]]:
    return {c.name: (c.ok, c.detail) for c in v.checks}


def test_every_scenario_judged(suite):
    result, run_dir = suite
    assert result.error == ""
    assert sorted(v.scenario for v in result.verdicts) == sorted(s["name"] for s in SCENARIOS)
    assert processes_of_run(run_dir) == []
    assert "### Faults `kill-p-answered`" in (run_dir / "summary.md").read_text()


def test_kill_prefill_fires_after_its_answer_and_before_the_decode_hop(suite, base_dir):
    (ev,) = events(suite, "kill-p-answered")
    rec = records(suite, "kill-p-answered")["kill-p-answered-0"]
    assert ev["fired_at"] >= ev["event_at"]
    assert rec.prefill.status == 200 and rec.prefill.kv_transfer_params  # P had answered
    assert ev["fired_at"] < rec.decode_sent_at  # killed before the decode hop went out
    assert "SIGKILL" in ev["detail"]
    v = verdict(suite, "kill-p-answered")
    c = checks(v)
    assert v.verdict == "PASS", v.reason
    assert c["recovery-serves"][0] is True and "prefill restarted on its ports" in c["recovery-serves"][1]
    # the restarted P appended to the same log: two server starts in it
    log = (suite[1] / "logs" / "prefill.log").read_text()
    assert log.count("Started server process") >= 2


def test_sigstop_fires_after_decode_sent_plus_n_ms_and_is_continued(suite):
    (ev,) = events(suite, "stop-d-sent-300")
    rec = records(suite, "stop-d-sent-300")["stop-d-sent-300-0"]
    assert ev["fired_at"] - rec.decode_sent_at >= 0.3
    assert ev["done_at"] - ev["fired_at"] >= 1.5  # SIGCONT only after stop_s
    assert rec.outcome == "ok" and rec.verdict_after_s >= 1.5  # D answered once continued
    assert verdict(suite, "stop-d-sent-300").verdict == "PASS"


def test_abandon_never_sends_the_decode_hop(suite):
    rec = records(suite, "abandon")["abandon-0"]
    assert rec.decode is None and rec.decode_sent_at is None and rec.outcome == "cancelled"
    assert "never sent" in rec.diagnosis
    assert verdict(suite, "abandon").verdict == "PASS"


def test_delay_holds_the_decode_hop(suite):
    (ev,) = events(suite, "delay")
    rec = records(suite, "delay")["delay-0"]
    assert rec.decode_sent_at - ev["fired_at"] >= 0.6
    assert rec.outcome == "ok" and verdict(suite, "delay").verdict == "PASS"


def test_after_k_requests_kills_between_requests_and_later_requests_get_a_diagnosis(suite):
    (ev,) = events(suite, "kill-d-after-1")
    recs = records(suite, "kill-d-after-1")
    first = recs["kill-d-after-1-0"]
    assert first.outcome == "ok"
    assert ev["fired_at"] > first.decode_sent_at + first.verdict_after_s  # after request 0 ended
    assert ev["fired_at"] < recs["kill-d-after-1-1"].prefill.latency_s + ev["fired_at"]  # sanity: ordered
    for rid in ("kill-d-after-1-1", "kill-d-after-1-2"):
        assert recs[rid].outcome == "connection_error", recs[rid]
    v = verdict(suite, "kill-d-after-1")
    assert v.verdict == "PASS", v.reason
    assert "decode restarted" in checks(v)["recovery-serves"][1]


def test_kv_fetch_trigger_fires_while_d_pulls_not_before(suite):
    (ev,) = events(suite, "cancel-in-fetch")
    rec = records(suite, "cancel-in-fetch")["cancel-in-fetch-0"]
    assert ev["event_at"] > rec.decode_sent_at
    assert ev["fired_at"] >= ev["event_at"]
    assert ev["fired_at"] - rec.decode_sent_at < 1.5  # inside the 1.5 s pull
    assert rec.outcome == "cancelled" and "cancelled by the fault" in rec.diagnosis
    v = verdict(suite, "cancel-in-fetch")
    assert v.verdict == "PASS", v.reason


def test_recovery_idle_check_fails_when_the_fake_leaks_and_names_the_bound(suite):
    v = verdict(suite, "cancel-leak")
    ok, detail = checks(v)["idle-after"]
    assert v.verdict == "FAIL" and ok is False
    assert "kv_cache_usage_perc" in detail and "within kv_lease_duration + idle_margin_s = 5 s" in detail


def test_recovery_fails_when_the_fake_hangs_and_the_hang_is_a_stall_not_a_timeout(suite):
    v = verdict(suite, "kill-p-hang")
    c = checks(v)
    rec = records(suite, "kill-p-hang")
    assert rec["kill-p-hang-0"].outcome == "stalled" and "waiting=1" in rec["kill-p-hang-0"].diagnosis
    assert c["fault-outcome"][0] is True  # a diagnosis, not a timeout
    assert c["recovery-serves"][0] is False and "stalled" in c["recovery-serves"][1]
    assert v.verdict == "FAIL"


def test_teardown_kills_a_stopped_and_a_killed_group(base_dir):
    """Whatever a fault did (P SIGKILLed, D SIGSTOPped), teardown leaves no process, and a
    stopped group does not cost the whole grace period."""
    tmp = base_dir / "teardown"
    tmp.mkdir()
    cfg = load_config(write_config(tmp, fake_config(tmp)))
    run_dir = new_run_dir(cfg)
    plan = build_plan(cfg, run_dir, "fake-model", "/work/main/.venv/bin/python")
    cluster = Cluster(plan, 30, grace_s=8)
    try:
        cluster.start(["prefill", "decode"])
        cluster.signal("decode", signal.SIGSTOP)
        cluster.signal("prefill", signal.SIGKILL)
        assert processes_of_run(run_dir)  # the stopped decode is still there
    finally:
        t = time.monotonic()
        cluster.stop_all()
        took = time.monotonic() - t
    assert processes_of_run(run_dir) == []
    assert took < 5, f"a stopped group waited out the grace period ({took:.1f} s)"

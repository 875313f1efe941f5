"""Verdicts from observations and expectations: PASS, FAIL, XFAIL, XPASS, ERROR."""

from __future__ import annotations

import pytest

from rig.client import Hop, PDRecord
from rig.config import ScenarioConfig
from rig.observations import DrainResult, ScenarioObservation, TransferEvidence
from rig.parity import ParityResult
from rig.verdict import judge, run_passed

LIVELOCK = {"id": "spec-admission-livelock", "title": "flat spec block reservation",
            "affects": ">=0.32.0,<0.33", "symptom": "stall"}
DIAG = ("admission livelock on decode: waiting=1 (capacity) running=0 kv=0.0% kv_fetch "
        "waiting_to_start=1, unchanged for 8.0 s")


def sc(known_issue: dict | None = None, **kw) -> ScenarioConfig:
    return ScenarioConfig(name="edge-126", decode="decode", prompt_tokens=126, max_tokens=2,
                          expect={"completion_tokens": 2, "total_tokens": 128},
                          known_issue=known_issue, **kw)


def ok_record(i: int = 0, tokens: list[int] | None = None) -> PDRecord:
    tokens = [517, 12] if tokens is None else tokens
    rec = PDRecord(request_id=f"edge-126-{i}", prompt_len=126, max_tokens=2, outcome="ok",
                   verdict_after_s=0.2)
    rec.prefill = Hop("prefill", status=200, latency_s=0.05, token_ids=[9],
                      usage={"prompt_tokens": 126, "completion_tokens": 1, "total_tokens": 127},
                      kv_transfer_params={"do_remote_prefill": True})
    rec.decode = Hop("decode", status=200, latency_s=0.04, token_ids=tokens,
                     usage={"prompt_tokens": 126, "completion_tokens": len(tokens),
                            "total_tokens": 126 + len(tokens)})
    return rec


def stalled_record() -> PDRecord:
    rec = PDRecord(request_id="edge-126-0", prompt_len=126, max_tokens=2, outcome="stalled",
                   diagnosis=DIAG, verdict_after_s=10.1)
    rec.prefill = Hop("prefill", status=200, latency_s=0.05, token_ids=[9])
    return rec


def drains(idle: bool = True) -> list[DrainResult]:
    final = {"waiting": 0.0, "running": 0.0, "kv_usage": 0.0 if idle else 0.5}
    return [DrainResult("decode", idle, 0.3, 0.0, final), DrainResult("prefill", True, 0.1, 0.0,
                                                                      {"waiting": 0, "running": 0, "kv_usage": 0})]


def passing_obs(version: str = "0.32.0", **kw) -> ScenarioObservation:
    obs = ScenarioObservation(scenario="edge-126", decode="decode", prefill="prefill",
                              records=[ok_record()], parity=[ParityResult("equal")],
                              evidence=TransferEvidence(nixl_bytes=65536, nixl_transfers=1,
                                                        external_prompt_tokens=126),
                              drains=drains(), vllm_version=version, wall_s=1.0)
    for k, v in kw.items():
        setattr(obs, k, v)
    return obs


def stalled_obs(version: str = "0.32.0", **kw) -> ScenarioObservation:
    obs = ScenarioObservation(scenario="edge-126", decode="decode", prefill="prefill",
                              records=[stalled_record()], parity=[None],
                              evidence=TransferEvidence(), drains=drains(), stall_diagnosis=DIAG,
                              vllm_version=version, wall_s=10.0)
    for k, v in kw.items():
        setattr(obs, k, v)
    return obs


def checks_of(v) -> dict[str, bool]:
    return {c.name: c.ok for c in v.checks}


def test_pass():
    v = judge(sc(), passing_obs())
    assert v.verdict == "PASS" and v.passed and v.expectation == "pass"
    assert v.reason == "all checks hold"
    assert checks_of(v) == {"completed": True, "token-counts": True, "kv-pulled": True, "parity": True,
                            "alive": True, "no-fatal-log": True, "kv-integrity": True, "idle-after": True}
    assert run_passed([v])


def test_fail_on_stall_without_known_issue():
    v = judge(sc(), stalled_obs())
    assert v.verdict == "FAIL" and not v.passed
    assert "completed: 0/1 completed; edge-126-0: stalled " + DIAG in v.reason
    assert not checks_of(v)["completed"] and not checks_of(v)["kv-pulled"]
    assert not run_passed([v])


def test_xfail_on_stall_on_affected_version():
    v = judge(sc(LIVELOCK), stalled_obs("0.32.0+cpu"))
    assert v.verdict == "XFAIL" and v.passed
    assert v.expectation == "xfail: spec-admission-livelock (stall) on vLLM >=0.32.0,<0.33"
    assert v.reason == f"spec-admission-livelock: {DIAG}"
    assert run_passed([v, judge(sc(), passing_obs())])


def test_xpass_on_affected_version_fails_the_run():
    v = judge(sc(LIVELOCK), passing_obs("0.32.0"))
    assert v.verdict == "XPASS" and not v.passed
    assert "known issue fixed: update the expectation" in v.reason
    assert "spec-admission-livelock no longer reproduces on vLLM 0.32.0" in v.reason
    assert not run_passed([v, judge(sc(), passing_obs())])


@pytest.mark.parametrize("collateral, check, detail", [
    ({"dead": {"prefill": -9}}, "alive", "died: prefill (exit -9)"),
    ({"fatal_lines": {"decode": ["ERROR Cannot get 3 free blocks from the pool"]}}, "no-fatal-log",
     "decode: ERROR Cannot get 3 free blocks from the pool"),
    ({"drains": drains(idle=False)}, "idle-after", "kv_cache_usage_perc=50.0%"),
])
def test_known_issue_with_collateral_damage_fails(collateral, check, detail):
    v = judge(sc(LIVELOCK), stalled_obs(**collateral))
    assert v.verdict == "FAIL" and not v.passed
    assert not checks_of(v)[check]
    assert v.reason.startswith(f"{check}: ") and detail in v.reason
    # The symptom checks are not what the reason blames.
    assert "completed:" not in v.reason


def test_known_issue_wrong_symptom_fails():
    # Expected a stall; got an HTTP error instead.
    rec = stalled_record()
    rec.outcome, rec.diagnosis = "http_error", "decode: HTTP 500: boom"
    v = judge(sc(LIVELOCK), stalled_obs(records=[rec], stall_diagnosis=""))
    assert v.verdict == "FAIL" and "HTTP 500: boom" in v.reason


def test_known_issue_error_symptom():
    ki = {**LIVELOCK, "symptom": "error"}
    rec = stalled_record()
    rec.outcome, rec.diagnosis = "http_error", "decode: HTTP 500: boom"
    v = judge(sc(ki), stalled_obs(records=[rec], stall_diagnosis=""))
    assert v.verdict == "XFAIL" and v.reason == "spec-admission-livelock: decode: HTTP 500: boom"
    assert judge(sc(ki), stalled_obs()).verdict == "FAIL"  # a stall is not that symptom


def test_known_issue_not_applying_to_version_is_a_plain_expectation():
    v = judge(sc(LIVELOCK), stalled_obs("0.33.0"))
    assert v.verdict == "FAIL" and v.expectation == "pass"
    assert judge(sc(LIVELOCK), passing_obs("0.33.0")).verdict == "PASS"


def test_unknown_version_is_a_plain_expectation():
    assert judge(sc(LIVELOCK), stalled_obs("")).verdict == "FAIL"


def test_error_when_the_rig_could_not_run():
    v = judge(sc(LIVELOCK), stalled_obs(error="metrics unavailable: ConnectError"))
    assert v.verdict == "ERROR" and v.reason == "metrics unavailable: ConnectError" and v.checks == []
    assert not run_passed([v])


def test_token_count_mismatch():
    rec = ok_record(tokens=[1])  # usage says 1 completion token
    v = judge(sc(), passing_obs(records=[rec]))
    assert v.verdict == "FAIL"
    assert "token-counts: edge-126-0: completion_tokens 1 != 2; edge-126-0: total_tokens 127 != 128" in v.reason


def test_token_ids_disagreeing_with_usage():
    rec = ok_record()
    rec.decode.token_ids = [5, 6, 7]
    v = judge(sc(), passing_obs(records=[rec]))
    assert v.verdict == "FAIL" and "3 token_ids but usage says 2" in v.reason


def test_no_kv_pulled_fails():
    v = judge(sc(), passing_obs(evidence=TransferEvidence(nixl_bytes=0, external_prompt_tokens=0)))
    assert v.verdict == "FAIL" and v.reason.startswith("kv-pulled: nixl 0 B in 0 transfers")
    v = judge(sc(), passing_obs(evidence=None))
    assert v.verdict == "FAIL" and "kv-pulled: no decode metrics" in v.reason


def test_parity_divergence_fails():
    v = judge(sc(), passing_obs(parity=[ParityResult("diverged", 1, 13, 12)]))
    assert v.verdict == "FAIL" and "parity: 0/1 equal; diverged at 1: 13 != 12" in v.reason


def test_parity_not_compared_fails_unless_disabled():
    assert judge(sc(), passing_obs(parity=[None])).verdict == "FAIL"
    v = judge(sc(parity=False), passing_obs(parity=[None]))
    assert v.verdict == "PASS" and "parity" not in checks_of(v)


def test_no_drain_observed_fails():
    v = judge(sc(), passing_obs(drains=[]))
    assert v.verdict == "FAIL" and "idle-after: not checked" in v.reason


def test_no_records_fails():
    v = judge(sc(), passing_obs(records=[], parity=[]))
    assert v.verdict == "FAIL" and "completed: 0/0 completed" in v.reason


def test_run_passed_needs_a_verdict():
    assert not run_passed([])


# ---------------------------------------------------------------- negative controls (tamper)

def test_tampered_prompt_caught_by_parity_passes():
    obs = passing_obs()
    obs.parity = [ParityResult("diverged", position=0, pd_token=966, ref_token=336)]
    v = judge(sc(tamper="swap-prompt"), obs)
    assert v.verdict == "PASS" and v.reason.startswith("tampering caught by parity")
    assert "diverged at 0: 966 != 336" in v.reason


def test_tampered_prompt_caught_by_error_passes():
    obs = passing_obs()
    obs.records[0].outcome, obs.records[0].diagnosis = "http_error", "decode: HTTP 400: bad transfer"
    obs.parity = [None]
    v = judge(sc(tamper="swap-prompt"), obs)
    assert v.verdict == "PASS" and "caught by" in v.reason


def test_tampered_prompt_passing_silently_fails():
    v = judge(sc(tamper="swap-prompt"), passing_obs())
    assert v.verdict == "FAIL" and "passed silently" in v.reason


def test_tampered_prompt_with_a_dead_instance_fails():
    obs = passing_obs()
    obs.parity = [ParityResult("diverged", position=2, pd_token=1, ref_token=2)]
    obs.dead = {"decode": 1}
    v = judge(sc(tamper="swap-prompt"), obs)
    assert v.verdict == "FAIL" and v.reason.startswith("alive:")


# ---------------------------------------------------------------- KV lease expiry (kv-integrity)

EXPIRED = ("(Worker pid=6561) ERROR 11-29 19:43:00 [pull_worker.py:667] Potentially invalid KV blocks for "
           "unrecognized request cmpl-bf31-0-a9a3 were retrieved by a decode worker. They may have expired.")
HOUSEKEEPING = ("(Worker pid=6561) WARNING 11-29 19:41:05 [base_worker.py:3032] Releasing expired KV blocks "
                "for request cmpl-bb0d-0-a89b which were retrieved by 0 remote worker(s) before lease expired.")


def test_answered_request_that_read_released_blocks_fails():
    obs = passing_obs()
    obs.records[0].prefill.kv_transfer_params = {"do_remote_prefill": True, "remote_request_id": "cmpl-bf31-0-a9a3"}
    obs.kv_integrity_lines = {"prefill": [EXPIRED]}
    v = judge(sc(), obs)
    assert v.verdict == "FAIL" and v.reason.startswith("kv-integrity: 1 answered request(s) read KV blocks")
    assert "Potentially invalid KV blocks" in v.reason


def test_lease_housekeeping_and_other_requests_do_not_fail():
    obs = passing_obs()
    obs.records[0].prefill.kv_transfer_params = {"do_remote_prefill": True, "remote_request_id": "cmpl-mine-0-1"}
    obs.kv_integrity_lines = {"prefill": [EXPIRED, HOUSEKEEPING]}  # an abandoned request's, and expiry bookkeeping
    v = judge(sc(), obs)
    assert v.verdict == "PASS", v.reason


def test_lease_expiry_after_an_abandoned_stall_is_explained_by_the_known_issue():
    obs = passing_obs(records=[stalled_record()], parity=[None], stall_diagnosis=DIAG)
    obs.kv_integrity_lines = {"prefill": [EXPIRED]}
    v = judge(sc(known_issue=LIVELOCK), obs)
    assert v.verdict == "XFAIL"


# ---------------------------------------------------------------- stale-kv known issue (suites/lease.yaml)

STALE = {"id": "nixl-expired-lease-read", "title": "D reads released blocks", "affects": ">=0.32.0,<0.33",
         "symptom": "stale-kv"}


def _stale_obs() -> ScenarioObservation:
    obs = passing_obs()
    obs.records[0].prefill.kv_transfer_params = {"do_remote_prefill": True, "remote_request_id": "cmpl-bf31-0-a9a3"}
    obs.parity = [ParityResult("diverged", position=0, pd_token=139, ref_token=133)]
    obs.kv_integrity_lines = {"prefill": [EXPIRED]}
    return obs


def test_an_answer_from_released_kv_is_the_stale_kv_known_issue():
    v = judge(sc(known_issue=STALE), _stale_obs())
    assert v.verdict == "XFAIL", v.reason
    assert v.reason.startswith("nixl-expired-lease-read: parity: 0/1 equal; diverged at 0: 139 != 133; "
                               "kv-integrity: 1 answered request(s) read KV blocks")


def test_stale_kv_seen_by_either_check_alone_and_a_clean_answer_is_xpass():
    only_log = _stale_obs()
    only_log.parity = [ParityResult("equal")]  # blocks not overwritten yet: same tokens, P still logged it
    assert judge(sc(known_issue=STALE), only_log).verdict == "XFAIL"
    assert judge(sc(known_issue=STALE), passing_obs()).verdict == "XPASS"
    broken = _stale_obs()
    broken.dead = {"decode": -9}  # collateral damage is never explained by the known issue
    assert judge(sc(known_issue=STALE), broken).verdict == "FAIL"


def test_stale_kv_scenarios_must_hold_past_the_lease():
    from rig.config import ConfigError, load_config

    base = ["suite=suites/lease.yaml"]
    with pytest.raises(ConfigError, match=r"lease-expired-read\).hold_between_s 8.0 must exceed nixl.kv_lease_duration 30"):
        load_config("configs/cpu-tiny.yaml", base)
    cfg = load_config("configs/cpu-tiny.yaml", base + ["nixl.kv_lease_duration=5"])
    assert [s.hold_between_s for s in cfg.scenarios] == [2.0, 8.0]
    with pytest.raises(Exception, match="flush_prefill needs hold_between_s"):
        ScenarioConfig(name="x", prompt_tokens=8, max_tokens=1, flush_prefill=True)
    with pytest.raises(Exception, match="only for kind edge"):
        ScenarioConfig(name="x", kind="pressure-wave", hold_between_s=3)

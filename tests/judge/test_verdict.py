"""The verdict engine: signatures, per-request attribution, canary, tri-state checks.

Observations are built in Python; stall facts come from the recorded 0.32.0 livelock
``/metrics`` (tests/data) and the crash from the recorded 0.30.0 ngram decode log.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rig.cluster.logs import FATAL_PATTERNS, matching_lines
from rig.config import KnownIssue
from rig.judge import verdict as engine
from rig.judge.checks import Check
from rig.judge.signatures import BlockFacts, Match, RequestFacts
from rig.judge.verdict import (
    Expectation,
    _kv_pulled,
    canary_match,
    decide,
    expectation_of,
    judge,
    required_checks,
    run_passed,
)
from rig.observe.observations import ScenarioObservation, TransferEvidence
from rig.observe.parity import ParityResult
from rig.observe.stall import StallFacts
from rig.transport.records import PDRecord
from tests.helpers.verdict_records import (
    BLOCKS,
    DATA,
    DIAG,
    EXPIRED,
    LIVELOCK,
    LIVELOCK_SIG,
    checks_of,
    drains,
    error_record,
    obs_of,
    ok_record,
    sc,
    stall_facts,
    stalled_record,
)

CRASH_LOG = DATA / "vllm-0.30.0-decode-ngram-crash.log"


HUNG_READ = {'reason="capacity"': "0.0", 'reason="deferred"': "1.0", 'stage="waiting_to_start"': "0.0",
             'stage="in_progress"': "1.0", "vllm:kv_cache_usage_perc{": "0.9"}


# ------------------------------------------------------------------------- plain expectations

def test_pass_needs_every_required_check_held():
    v = judge(sc(), obs_of([ok_record()]))
    assert v.verdict == "PASS" and v.reason == "all checks hold", v.reason
    assert checks_of(v) == {"completed": True, "token-counts": True, "kv-pulled": True, "parity": True,
                            "alive": True, "no-fatal-log": True, "kv-integrity": True, "idle-after": True,
                            "counters-monotonic": None,  # no timeline in obs_of: not checked, not required
                            "nixl-failed-transfers": None}  # the healthy-run rule (bug record R19), idem
    assert run_passed([v]) and not run_passed([])


# Each check: one observation where it fails, one where it could not look (not checked).
FAILS = {
    "completed": lambda o: setattr(o, "records", [stalled_record()]) or setattr(o, "parity", [None]),
    "token-counts": lambda o: setattr(o, "records", [ok_record(tokens=[1])]),
    "kv-pulled": lambda o: setattr(o, "evidence", TransferEvidence(nixl_bytes=0, external_prompt_tokens=0)),
    "parity": lambda o: setattr(o, "parity", [ParityResult("diverged", 1, 13, 12)]),
    "alive": lambda o: (setattr(o, "dead", {"decode": 1}), o.death_lines.update(decode="TypeError: boom")),
    "no-fatal-log": lambda o: o.fatal_lines.update(decode=["ERROR Cannot get 3 free blocks from the pool"]),
    "kv-integrity": lambda o: o.kv_integrity_lines.update(prefill=[EXPIRED.format(rid="cmpl-p-0")]),
    "idle-after": lambda o: setattr(o, "drains", drains(idle=False)),
}
NOT_CHECKED = {
    "kv-pulled": lambda o: o.missing_metrics.update(decode=["vllm:nixl_bytes_transferred_sum"]),
    "parity": lambda o: setattr(o, "parity", [None]),  # the reference request failed
    "no-fatal-log": lambda o: o.unscanned_logs.update(decode="log file missing (attach mode)"),
    "kv-integrity": lambda o: o.unscanned_logs.update(prefill="log file missing (attach mode)"),
    "idle-after": lambda o: setattr(o, "drains", []),
}


@pytest.mark.parametrize("check", sorted(FAILS))
def test_every_check_can_fail(check):
    obs = obs_of([ok_record()])
    FAILS[check](obs)
    v = judge(sc(), obs)
    assert v.verdict == "FAIL" and checks_of(v)[check] is False, (v.verdict, v.reason)
    assert f"{check}: " in v.reason


@pytest.mark.parametrize("check", sorted(NOT_CHECKED))
def test_a_required_check_not_checked_is_inconclusive_never_ok(check):
    obs = obs_of([ok_record()])
    NOT_CHECKED[check](obs)
    v = judge(sc(), obs)
    assert checks_of(v)[check] is None
    assert v.verdict == "ERROR" and v.reason.startswith("inconclusive: ") and f"{check} not checked" in v.reason
    # ... also where a known issue would otherwise be XFAIL
    obs.records, obs.parity = [stalled_record()], [None]
    if check not in ("kv-pulled", "parity"):  # those are explained on the stalled request
        assert judge(sc(LIVELOCK), obs, BLOCKS).verdict == "ERROR"


def test_removing_a_check_from_the_required_list_lets_the_gap_pass(monkeypatch):
    obs = obs_of([ok_record()], drains=[])
    assert judge(sc(), obs).verdict == "ERROR"
    monkeypatch.setitem(engine.REQUIRED, "edge", tuple(n for n in engine.REQUIRED["edge"] if n != "idle-after"))
    # The list is what stands between "could not look" and a green verdict.
    assert judge(sc(), obs).verdict == "PASS"


def test_no_records_fails_and_rig_error_is_error():
    assert judge(sc(), obs_of([])).verdict == "FAIL"
    v = judge(sc(LIVELOCK), obs_of([stalled_record()], error="metrics unavailable: ConnectError"))
    assert v.verdict == "ERROR" and v.reason == "metrics unavailable: ConnectError"


# ------------------------------------------------------------------------- stall signature

def test_the_livelock_signature_matches_field_by_field():
    v = judge(sc(LIVELOCK), obs_of([stalled_record()]), BLOCKS)
    assert v.verdict == "XFAIL", v.reason
    assert v.expectation == "xfail: spec-admission-livelock (stall) on vLLM >=0.32.0,<0.33"
    assert v.reason == (f"spec-admission-livelock: edge-126-0: {DIAG} "
                        "[n=126 k=1 block_size=32: needs 4 blocks, 4 of 4 usable free]")
    facts = stall_facts()
    assert (facts.waiting_reasons, facts.kv_fetch_stages, facts.kv_usage, facts.num_gpu_blocks) == (
        {"capacity": 1.0}, {"waiting_to_start": 1.0}, 0.0, 5)


def test_an_early_verdict_that_states_the_block_arithmetic_is_not_repeated():
    """The early rule's diagnosis already carries the arithmetic: the XFAIL reason says it once."""
    early = stalled_record()
    early.diagnosis += "; decided early: block arithmetic (n=126 k=1 block_size=32: needs 4 blocks, 4 of 4 usable free)"
    reason = judge(sc(LIVELOCK), obs_of([early]), BLOCKS).reason
    assert reason.count("needs 4 blocks, 4 of 4 usable free") == 1, reason


@pytest.mark.parametrize("case, rec, seen", [
    ("hung NIXL read", stalled_record(facts=stall_facts(**HUNG_READ)),
     "stalled with waiting reasons {'deferred': 1.0}, kv_fetch {'in_progress': 1.0}, kv 90.0%"),
    ("can never fit", stalled_record(n=200), "admission never-fits (n=200 k=1 block_size=32: needs 7 blocks"),
    ("stall on prefill", stalled_record(facts=StallFacts("prefill", 1, 0, 0.0, {"capacity": 1}, {}, 9.0)),
     "stalled with instance prefill"),
    ("HTTP error", error_record(), "edge-126-0: http_error"),
    ("timeout", PDRecord("edge-126-0", 126, 2, outcome="timeout", diagnosis="no answer within the 60 s deadline"),
     "edge-126-0: timeout"),
])
def test_any_other_symptom_is_fail_saying_what_was_expected_and_seen(case, rec, seen):
    blocks = BlockFacts(32, 4, 1, 256) if case == "can never fit" else BLOCKS
    v = judge(sc(LIVELOCK), obs_of([rec]), blocks)
    assert v.verdict == "FAIL", (case, v.reason)
    assert v.reason.startswith("not known issue spec-admission-livelock: expected stall with instance decode "
                               "(decode), waiting reason capacity, kv_fetch waiting_to_start, kv <= 5%, "
                               "admission fits-but-waits, seen "), v.reason
    assert seen in v.reason


def test_a_known_issue_excuses_only_the_requests_that_show_it():
    # concurrent 2: one request in the livelock, the other answered HTTP 200 with wrong tokens
    # read from released KV (parity diverged, P's line names it).
    recs = [stalled_record(0), ok_record(1, tokens=[3, 4])]
    obs = obs_of(recs, parity=[None, ParityResult("diverged", 0, 3, 517)])
    obs.kv_integrity_lines["prefill"] = [EXPIRED.format(rid="cmpl-p-1")]
    v = judge(sc(LIVELOCK, concurrent=2), obs, BLOCKS)
    assert v.verdict == "FAIL", v.reason
    assert v.reason.startswith("spec-admission-livelock matched on edge-126-0, but not: ")
    assert "parity: 0/1 equal; edge-126-1: diverged at 0" in v.reason and "kv-integrity:" in v.reason
    by = {c.name: c for c in v.checks}
    assert by["parity"].requests == ("edge-126-1",) and by["kv-integrity"].requests == ("edge-126-1",)
    assert by["completed"].requests == ("edge-126-0",)  # explained: the livelocked one


@pytest.mark.parametrize("run_check, breaks", [
    ("idle-after", lambda o: setattr(o, "drains", drains(idle=False))),
    ("alive", lambda o: setattr(o, "dead", {"prefill": -9})),
    ("no-fatal-log", lambda o: o.fatal_lines.update(decode=["ERROR Cannot get 3 free blocks from the pool"])),
])
def test_run_level_checks_are_excused_only_when_the_signature_names_them(run_check, breaks):
    obs = obs_of([stalled_record()])
    breaks(obs)
    v = judge(sc(LIVELOCK), obs, BLOCKS)
    assert v.verdict == "FAIL" and f"{run_check}: " in v.reason
    if run_check == "idle-after":
        named = {**LIVELOCK, "symptom": {**LIVELOCK_SIG, "excuses": ["idle-after"]}}
        assert judge(sc(named), obs, BLOCKS).verdict == "XFAIL"


def test_abandoned_requests_lease_line_is_explained_not_listed():
    obs = obs_of([stalled_record()])
    obs.kv_integrity_lines["prefill"] = [EXPIRED.format(rid="cmpl-p-0"), EXPIRED.format(rid="cmpl-other-9")]
    v = judge(sc(LIVELOCK), obs, BLOCKS)
    assert v.verdict == "XFAIL"
    detail = next(c for c in v.checks if c.name == "kv-integrity").detail
    assert "1 line(s) for requests abandoned by the rig (edge-126-0): lease housekeeping" in detail
    assert "1 line(s) naming no request of this scenario" in detail


def test_a_non_strict_known_issue_that_did_not_show_is_pass_with_a_note_and_still_xfails_when_it_does():
    loose = {**LIVELOCK, "strict": False}
    v = judge(sc(loose), obs_of([ok_record()]), BLOCKS)
    assert v.verdict == "PASS" and "did not show this time" in v.reason
    assert judge(sc(loose), obs_of([stalled_record()]), BLOCKS).verdict == "XFAIL"
    # non-strict excuses nothing else: another symptom is still FAIL
    assert judge(sc(loose), obs_of([error_record(status=500)]), BLOCKS).verdict == "FAIL"


def test_xpass_and_versions():
    v = judge(sc(LIVELOCK), obs_of([ok_record()]), BLOCKS)
    assert v.verdict == "XPASS" and "known issue fixed: update the expectation" in v.reason
    v = judge(sc(LIVELOCK), obs_of([stalled_record()], version="0.33.0"), BLOCKS)
    assert v.verdict == "FAIL" and v.expectation == "pass"
    assert v.reason.startswith("matches known issue spec-admission-livelock, outside its declared range "
                               ">=0.32.0,<0.33: update `affects`?")
    placeholder = obs_of([stalled_record()], versions={"prefill": "unknown", "decode": "unknown"}, vllm_version="")
    assert "the version of prefill and decode is unknown" in judge(sc(LIVELOCK), placeholder, BLOCKS).reason
    unknown = obs_of([stalled_record()], versions={"decode": "0.32.0"})
    v = judge(sc(LIVELOCK), unknown, BLOCKS)
    assert v.verdict == "ERROR" and "the version of prefill is unknown" in v.reason
    mixed = obs_of([stalled_record()], versions={"prefill": "0.32.0", "decode": "0.30.0"})
    v = judge(sc(LIVELOCK), mixed, BLOCKS)
    assert v.verdict == "ERROR" and "prefill runs 0.32.0 and decode 0.30.0" in v.reason


# ------------------------------------------------------------------------- http-error

HTTP_KI = {"id": "x-500", "title": "t", "affects": ">=0.32", "symptom": {"kind": "http-error", "status": 500,
                                                                        "message": "boom", "hop": "decode"}}


@pytest.mark.parametrize("rec, verdict", [
    (error_record(), "XFAIL"),
    (error_record(status=400), "FAIL"),
    (error_record(msg="other"), "FAIL"),
    (error_record(hop="prefill"), "FAIL"),
    (stalled_record(), "FAIL"),
])
def test_http_error_signature(rec, verdict):
    v = judge(sc(HTTP_KI), obs_of([rec]))
    assert v.verdict == verdict, v.reason
    if verdict == "XFAIL":
        assert v.reason == "x-500: edge-126-0: HTTP 500: boom"
    else:
        assert "expected HTTP 500 on the decode hop matching /boom/" in v.reason


# ------------------------------------------------------------------------- crash (0.30.0 log)

CRASH_KI = {"id": "ngram-warmup-crash", "title": "t", "affects": "==0.30.0",
            "symptom": {"kind": "crash", "instance": "decode", "fatal_log": "Cannot inspect kernel parameters"}}


def crashed_obs(**kw) -> ScenarioObservation:
    fatal = matching_lines(CRASH_LOG.read_text(), FATAL_PATTERNS)
    first = next(ln for ln in CRASH_LOG.read_text().splitlines() if "TypeError:" in ln)
    rec = PDRecord("edge-126-0", 126, 2, outcome="connection_error", diagnosis="decode: connection error")
    obs = obs_of([rec], version="0.30.0", dead={"decode": 1}, death_lines={"decode": first.split("] ", 1)[1]},
                 error="metrics unavailable: ConnectError")
    obs.fatal_lines["decode"] = fatal
    for k, v in kw.items():
        setattr(obs, k, v)
    return obs


def test_a_crash_is_fail_decode_died_not_a_rig_error():
    v = judge(sc(), crashed_obs())
    assert v.verdict == "FAIL", v.reason
    assert v.reason.startswith("alive: decode died (exit 1): TypeError: Cannot inspect kernel parameters for function")


def test_a_death_is_fail_even_when_the_dead_decode_left_no_version():
    # warm-up death: D never answered /version, and edge-126 declares a known issue
    v = judge(sc(LIVELOCK), crashed_obs(versions={"prefill": "0.30.0"}, vllm_version=""), BLOCKS)
    assert v.verdict == "FAIL" and v.reason.startswith("alive: decode died (exit 1): TypeError"), v.reason
    v = judge(sc(prompt_tokens=127, expect={"completion_tokens": 1, "by_version": [{"vllm": "<0.28",
                                                                                    "http_status": 400}]}),
              crashed_obs(versions={}, vllm_version=""))
    assert v.verdict == "FAIL" and v.reason.startswith("alive: decode died"), v.reason


def test_crash_signature():
    assert judge(sc(CRASH_KI), crashed_obs()).verdict == "XFAIL"
    other = crashed_obs(death_lines={"decode": "RuntimeError: out of memory"})
    other.fatal_lines["decode"] = ["RuntimeError: out of memory"]
    v = judge(sc(CRASH_KI), other)
    assert v.verdict == "FAIL" and "seen decode died (exit 1): RuntimeError: out of memory" in v.reason
    both = crashed_obs(dead={"decode": 1, "prefill": -9})
    assert judge(sc(CRASH_KI), both).verdict == "FAIL"  # P's death is collateral
    assert judge(sc(CRASH_KI), obs_of([stalled_record()], version="0.30.0")).verdict == "FAIL"


# ------------------------------------------------------------------------- stale-kv / wrong-output

STALE = {"id": "nixl-expired-lease-read", "title": "D reads released blocks", "affects": ">=0.32.0,<0.33",
         "symptom": {"kind": "stale-kv", "parity": True}}
WRONG = {"id": "wrong", "title": "t", "affects": ">=0.32", "symptom": {"kind": "wrong-output"}}


def stale_obs(line_for: str = "cmpl-p-0", diverged: bool = True) -> ScenarioObservation:
    obs = obs_of([ok_record()], parity=[ParityResult("diverged", 0, 139, 133) if diverged else ParityResult("equal")])
    obs.kv_integrity_lines["prefill"] = [EXPIRED.format(rid=line_for)]
    return obs


def test_stale_kv_needs_ps_line_naming_this_request_and_a_divergence():
    v = judge(sc(STALE), stale_obs())
    assert v.verdict == "XFAIL", v.reason
    assert v.reason == ("nixl-expired-lease-read: edge-126-0: P's 'Potentially invalid KV blocks' line names its "
                        "remote_request_id cmpl-p-0, parity diverged")
    # a divergence alone (any wrong-output bug) is not the lease issue
    alone = obs_of([ok_record()], parity=[ParityResult("diverged", 0, 139, 133)])
    v = judge(sc(STALE), alone)
    assert v.verdict == "FAIL" and "P's invalid-blocks line does not name it" in v.reason
    assert judge(sc(STALE), stale_obs(line_for="cmpl-other-3")).verdict == "FAIL"
    assert judge(sc(STALE), obs_of([stalled_record()])).verdict == "FAIL"


def test_stale_kv_line_without_divergence_is_not_the_full_signature():
    v = judge(sc(STALE), stale_obs(diverged=False))
    assert v.verdict == "FAIL" and "parity equal" in v.reason  # kv-integrity failed, parity did not diverge


def test_wrong_output_signature():
    v = judge(sc(WRONG), obs_of([ok_record()], parity=[ParityResult("diverged", 1, 13, 12)]))
    assert v.verdict == "XFAIL" and v.reason == "wrong: edge-126-0 diverged from the reference"
    assert judge(sc(WRONG), obs_of([stalled_record()])).verdict == "FAIL"
    assert judge(sc(WRONG), obs_of([error_record()])).verdict == "FAIL"


# ------------------------------------------------------------------------- canary

def canary(obs: ScenarioObservation):
    return judge(sc(tamper="swap-prompt"), obs)


def test_canary_caught_by_a_divergence_over_pulled_kv():
    v = canary(obs_of([ok_record()], parity=[ParityResult("diverged", 0, 966, 336)]))
    assert v.verdict == "PASS" and v.expectation == "caught: swap-prompt"
    assert v.reason.startswith("tampering caught by parity: 0/1 equal; edge-126-0: diverged at 0: 966 != 336")


def test_canary_caught_by_an_error_status_from_decode():
    v = canary(obs_of([error_record(status=400, msg="bad transfer")]))
    assert v.verdict == "PASS" and v.reason == "tampering caught by decode HTTP 400: HTTP 400: bad transfer"


@pytest.mark.parametrize("case", ["timeout", "stall", "no pull"])
def test_canary_without_a_real_catch_is_inconclusive(case):
    if case == "timeout":
        obs = obs_of([PDRecord("edge-126-0", 126, 2, outcome="timeout", diagnosis="no answer within 60 s")])
    elif case == "stall":
        obs = obs_of([stalled_record()])
    else:  # diverged, but D pulled nothing: it computed from the prompt, not from P's KV
        obs = obs_of([ok_record()], parity=[ParityResult("diverged", 0, 966, 336)],
                     evidence=TransferEvidence(nixl_bytes=0, nixl_transfers=0, external_prompt_tokens=0))
    v = canary(obs)
    assert v.verdict == "FAIL" and v.reason.startswith("canary inconclusive: no real catch"), v.reason


def test_canary_passing_silently_or_with_collateral_fails():
    v = canary(obs_of([ok_record()]))
    assert v.verdict == "FAIL" and "passed silently" in v.reason
    obs = obs_of([ok_record()], parity=[ParityResult("diverged", 0, 966, 336)], dead={"decode": 1})
    assert canary(obs).verdict == "FAIL" and canary(obs).reason.startswith("alive:")


# ------------------------------------------------------------------------- versioned expectations

CLAMPED = {"completion_tokens": 1, "total_tokens": 128,
           "by_version": [{"vllm": "<0.31", "http_status": 400, "http_message": "maximum context length is 128",
                           "note": "0.27.1-0.30.0 decode refuses"}]}


def refused(i: int = 0, msg: str = "This model's maximum context length is 128 tokens. However, you requested 2 "
                                   "output tokens") -> PDRecord:
    return error_record(i, status=400, msg=msg)


def test_version_dependent_outcome_is_data():
    s = sc(prompt_tokens=127, expect=CLAMPED)
    clamped = ok_record(tokens=[5], n=127)
    assert judge(s, obs_of([clamped], version="0.32.0")).verdict == "PASS"
    v = judge(s, obs_of([refused()], version="0.27.1"))
    assert v.verdict == "PASS", v.reason
    assert checks_of(v) == {"completed": True, "alive": True, "no-fatal-log": True, "kv-integrity": True,
                            "idle-after": True, "counters-monotonic": None}
    assert judge(s, obs_of([refused()], version="0.32.0")).verdict == "FAIL"
    assert judge(s, obs_of([refused(msg="bad kv_transfer_params")], version="0.29.0")).verdict == "FAIL"
    assert judge(s, obs_of([clamped], version="0.27.1")).verdict == "FAIL"
    v = judge(s, obs_of([clamped], version="", versions={}))
    assert v.verdict == "ERROR" and "depends on the vLLM version" in v.reason


def test_kv_pulled_counts_ds_prefix_cache_but_never_a_recompute():
    """A deployment attached to again has D's prefix cache warm for the edge prompt: 64 of 126
    tokens local, 62 pulled is a pull; 62 pulled and the rest recomputed is not."""
    def with_sources(external: float, cached: float) -> ScenarioObservation:
        return obs_of([ok_record()], evidence=TransferEvidence(
            nixl_bytes=32768.0, nixl_transfers=1, external_prompt_tokens=external, cached_prompt_tokens=cached))

    ok = checks_of(judge(sc(), with_sources(62, 64)))
    assert ok["kv-pulled"] is True
    assert checks_of(judge(sc(), with_sources(62, 0)))["kv-pulled"] is False


# A full-pool stall (bug record R01): nothing runs with every block taken. kv_usage_min names it; the
# admission livelock (KV empty) does not match it, nor does the full-pool stall match the livelock.
POOL_SIG = {"kind": "stall", "instance": "decode", "kv_usage_min": 0.99}
POOL_FULL = {'reason="capacity"': "2.0", 'stage="waiting_to_start"': "0.0", "vllm:kv_cache_usage_perc{": "1.0",
             "vllm:num_requests_waiting{": "2.0"}


def test_kv_usage_min_matches_a_full_pool_stall_only():
    issue = {"id": "spec-loads-fill-pool", "title": "two loads fill the pool", "affects": "<0.31",
             "symptom": POOL_SIG}
    full = stalled_record(facts=stall_facts(**POOL_FULL))
    v = judge(sc(issue), obs_of([full], version="0.27.1", versions={"prefill": "0.27.1", "decode": "0.27.1"}))
    assert v.verdict == "XFAIL", v.reason
    v = judge(sc(issue), obs_of([stalled_record()], version="0.27.1",
                                versions={"prefill": "0.27.1", "decode": "0.27.1"}))
    assert v.verdict == "FAIL" and "kv 0.0%" in v.reason  # the empty-pool livelock is another bug
    assert judge(sc(LIVELOCK), obs_of([full]), BLOCKS).verdict == "FAIL"


def test_kv_usage_floor_above_the_ceiling_is_refused():
    with pytest.raises(ValidationError, match="kv_usage_min 0.9 is above kv_usage_max 0.05"):
        sc({"id": "x", "title": "x", "affects": "<1", "symptom": {**LIVELOCK_SIG, "kv_usage_min": 0.9}})


def test_a_full_pool_stall_may_excuse_spec_drafted_only_when_it_names_it():
    # bug record R01 on 0.27.1: both requests froze before their first decode step, so D drafted nothing.
    expect = {"completion_tokens": 2, "total_tokens": 128, "min_spec_drafts": 1}
    versions = {"prefill": "0.27.1", "decode": "0.27.1"}
    stalled = [stalled_record(i, facts=stall_facts(**POOL_FULL)) for i in range(2)]
    named = {"id": "spec-loads-fill-pool", "title": "t", "affects": "<0.31",
             "symptom": {**POOL_SIG, "excuses": ["spec-drafted"]}}
    v = judge(sc(named, expect=expect), obs_of(stalled, version="0.27.1", versions=versions))
    assert v.verdict == "XFAIL", v.reason
    assert checks_of(v)["spec-drafted"] is False  # still shown failed, explained by the symptom
    unnamed = {**named, "symptom": POOL_SIG}
    v = judge(sc(unnamed, expect=expect), obs_of(stalled, version="0.27.1", versions=versions))
    assert v.verdict == "FAIL" and "spec-drafted" in v.reason
    # Out of its range (0.32.0) the same symptom is a plain FAIL.
    v = judge(sc(named, expect=expect), obs_of(stalled))
    assert v.verdict == "FAIL"


# -------------------------------------------------------------------------------------------------
# kv-pulled and the canary's catch as the user reads them (rig/judge/verdict.py): the prompt D
# served is D's ``usage.prompt_tokens`` (a chat template adds tokens), else the prompt the rig sent;
# NIXL's exact bytes count every prompt's blocks of a several-prompt request; the detail names P's
# side channel where D connected; a canary's catch quotes D's error up to 120 characters.
# Written against `make mutation` survivors (docs/howto/mutation.md).

BLOCK = 32_768  # bytes of one 32-token block (the tiny model at float32)


def ev(tokens: float, nbytes: float = 65536.0, transfers: float = 1) -> TransferEvidence:
    return TransferEvidence(nixl_bytes=nbytes, nixl_transfers=transfers, external_prompt_tokens=tokens)


# ------------------------------------------------------------------------- what D served

def test_the_prompt_d_served_is_its_usage_prompt_tokens_when_it_reports_them():
    rec = ok_record(n=126)
    rec.decode.usage = {**rec.decode.usage, "prompt_tokens": 131}  # a chat template's 5 tokens
    assert _kv_pulled(obs_of([rec], evidence=ev(131))).ok is True
    c = _kv_pulled(obs_of([rec], evidence=ev(126)))  # the 5 template tokens were not pulled
    assert c.ok is False and "external_kv_transfer + local_cache_hit = +131" in c.detail


def test_without_ds_usage_the_prompt_is_the_tokens_the_rig_sent():
    rec = ok_record(n=126)
    rec.decode.usage = None
    assert _kv_pulled(obs_of([rec], evidence=ev(126))).ok is True
    rec.decode.usage = {"completion_tokens": 2}  # usage without prompt_tokens
    c = _kv_pulled(obs_of([rec], evidence=ev(125)))
    assert c.ok is False and "= +126" in c.detail


def test_the_exact_bytes_of_a_single_prompt_use_ds_prompt_tokens():
    rec = ok_record(n=60)
    rec.decode.usage = {**rec.decode.usage, "prompt_tokens": 70}  # 3 blocks of 32, not 2
    c = _kv_pulled(obs_of([rec], evidence=ev(70, 3 * BLOCK), kv_bytes_per_block=BLOCK, block_size=32))
    assert c.ok is True and "nixl 98304 B (3 blocks x 32768 B)" in c.detail, c.detail


def test_the_exact_bytes_of_several_prompts_count_each_prompts_blocks():
    rec = ok_record(n=100)
    rec.prompt = [[1] * 40, [2] * 60]  # 2 + 2 blocks; their sum, 100 tokens, would be 4 blocks too
    rec.decode.usage = {"prompt_tokens": 100, "completion_tokens": 2, "total_tokens": 102}
    obs = obs_of([rec], evidence=ev(100, 4 * BLOCK, transfers=2), kv_bytes_per_block=BLOCK, block_size=32)
    c = _kv_pulled(obs)
    assert c.ok is True and "(4 blocks x 32768 B) in >= 2 transfers" in c.detail, c.detail
    rec.prompt = [[1] * 33, [2] * 33]  # 2 + 2 blocks, while 66 tokens together fill only 3
    rec.decode.usage = {"prompt_tokens": 66, "completion_tokens": 2, "total_tokens": 68}
    obs = obs_of([rec], evidence=ev(66, 4 * BLOCK, transfers=2), kv_bytes_per_block=BLOCK, block_size=32)
    c = _kv_pulled(obs)
    assert c.ok is True and "nixl 131072 B (4 blocks x 32768 B)" in c.detail, c.detail
    obs.evidence = ev(66, 3 * BLOCK, transfers=2)  # a block short
    assert _kv_pulled(obs).ok is False


def test_a_pulled_detail_reads_in_full():
    c = _kv_pulled(obs_of([ok_record()], evidence=ev(126)))
    assert c.detail == ("D: external_kv_transfer +126, local_cache_hit +0, local_compute +0, nixl 65536 B in 1 "
                        "transfers; expected pulled: external_kv_transfer + local_cache_hit = +126, local_compute +0, "
                        "nixl bytes > 0 in >= 1 transfers; per request (edge-126-0 ran alone)")


# ------------------------------------------------------------------------- P's side channel

def _with_side_channel(i: int, host: str | None, port: int | None = 5600):
    rec = ok_record(i)
    rec.prefill.kv_transfer_params = {**rec.prefill.kv_transfer_params, "remote_host": host, "remote_port": port}
    return rec


def test_the_detail_names_each_side_channel_p_advertised_once():
    recs = [_with_side_channel(0, "prefill", 5600), _with_side_channel(1, "prefill", 5600),
            _with_side_channel(2, "prefill-b", 5601)]
    c = _kv_pulled(obs_of(recs, evidence=ev(378, transfers=3)))
    assert c.ok is True
    assert c.detail.endswith("(not per request); P's side channel prefill:5600, prefill-b:5601"), c.detail


def test_no_side_channel_is_named_when_p_advertised_no_host():
    c = _kv_pulled(obs_of([_with_side_channel(0, None)], evidence=ev(126)))
    assert c.detail.endswith("per request (edge-126-0 ran alone)"), c.detail
    rec = ok_record()
    rec.prefill.kv_transfer_params = None
    assert _kv_pulled(obs_of([rec], evidence=ev(126))).detail.endswith("ran alone)")


# ------------------------------------------------------------------------- canary

def test_a_catch_by_ds_error_quotes_its_first_120_characters():
    rec = error_record(status=500, msg="x" * 200)
    m = canary_match(obs_of([rec], parity=[None]), [])
    assert m.seen == "decode HTTP 500: HTTP 500: " + "x" * 110  # D's error "HTTP 500: xxx...", cut at 120
    v = judge(sc(tamper="swap-prompt"), obs_of([rec], parity=[None]))
    assert (v.verdict, v.reason) == ("PASS", "tampering caught by decode HTTP 500: HTTP 500: " + "x" * 110)


# ------------------------------------------------------------------------- edge_checks

def _expect(**kw) -> dict:
    return {"completion_tokens": 2, "total_tokens": 128, **kw}


def test_a_declared_recompute_is_judged_in_the_recomputed_form():
    obs = obs_of([ok_record()], evidence=TransferEvidence(computed_prompt_tokens=126))
    v = judge(sc(expect=_expect(prompt_source="recomputed")), obs)
    kv = next(c for c in v.checks if c.name == "kv-pulled")
    assert kv.ok is True and "expected recomputed (declared): local_compute +126" in kv.detail
    assert v.verdict == "PASS", v.reason
    # the same evidence under the default (pulled) expectation is a failure
    assert judge(sc(), obs).verdict == "FAIL"


def test_preemptions_are_read_on_decode_unless_another_instance_is_named():
    v = judge(sc(expect=_expect(min_preemptions=1)), obs_of([ok_record()], evidence=None))
    pre = next(c for c in v.checks if c.name == "preempted")
    assert (pre.ok, pre.detail) == (None, "not checked: no decode metrics")
    assert v.verdict == "ERROR" and "preempted not checked: no decode metrics" in v.reason


# ------------------------------------------------------------------------- kv-pulled's forms

def full(computed: float = 0, ext: float = 0, cached: float = 0, nbytes: float = 0, transfers: float = 0):
    return TransferEvidence(nixl_bytes=nbytes, nixl_transfers=transfers, external_prompt_tokens=ext,
                            computed_prompt_tokens=computed, cached_prompt_tokens=cached)


def test_the_recomputed_form_holds_only_on_a_full_local_compute_and_nothing_pulled():
    def ok(ev, recs=None):
        return _kv_pulled(obs_of(recs or [ok_record()], evidence=ev), "recomputed").ok

    c = _kv_pulled(obs_of([ok_record()], evidence=full(computed=126)), "recomputed")
    assert c.ok is True and c.requests == ()
    assert c.detail == ("D: external_kv_transfer +0, local_cache_hit +0, local_compute +126, nixl 0 B in 0 "
                        "transfers; expected recomputed (declared): local_compute +126, nothing pulled (0 B), no "
                        "prefix-cache hit; per request (edge-126-0 ran alone)")
    assert ok(full(computed=125)) is False and ok(full(computed=127)) is False  # exact: one request alone
    assert ok(full(computed=126, ext=1)) is False
    assert ok(full(computed=126, cached=1)) is False
    assert ok(full(computed=126, nbytes=1)) is False and ok(full(computed=126, nbytes=65536, transfers=1)) is False
    assert ok(full(ext=126)) is False and ok(full(cached=126)) is False and ok(full(nbytes=0)) is False
    c = _kv_pulled(obs_of([ok_record()], evidence=full(computed=126, ext=126, nbytes=65536, transfers=1)),
                   "recomputed")
    assert c.ok is False and c.requests == ("edge-126-0",)


def _unanswered(i: int = 1):
    rec = error_record(i)
    rec.decode_sent_at = 1.0  # it reached D: D may have counted its prompt too
    return rec


def test_a_request_that_reached_d_unanswered_makes_the_recompute_a_lower_bound():
    recs = [ok_record(0), _unanswered()]
    c = _kv_pulled(obs_of(recs, evidence=full(computed=126)), "recomputed")
    assert c.ok is True, c.detail
    assert c.detail.endswith("; one delta over 2 requests, 1 of which reached D without an answer: lower bounds")
    assert _kv_pulled(obs_of(recs, evidence=full(computed=200)), "recomputed").ok is True
    assert _kv_pulled(obs_of(recs, evidence=full(computed=125)), "recomputed").ok is False


def test_an_unanswered_request_that_never_reached_d_keeps_the_counts_exact():
    never = error_record(1, hop="prefill")  # decode_sent_at None: D never saw it
    c = _kv_pulled(obs_of([ok_record(0), never], evidence=full(ext=126, nbytes=65536, transfers=1)))
    assert c.ok is True and c.detail.endswith("; one delta over the 2 requests sent together (not per request)")
    assert _kv_pulled(obs_of([ok_record(0), never], evidence=full(ext=127, nbytes=65536, transfers=1))).ok is False


def test_an_answered_request_that_reached_d_is_no_lower_bound():
    rec = ok_record()
    rec.decode_sent_at = 1.0
    c = _kv_pulled(obs_of([rec], evidence=full(ext=126, computed=1, nbytes=65536, transfers=1)))
    assert c.ok is False and c.detail.endswith("per request (edge-126-0 ran alone)")


def test_the_pulled_lower_bound_drops_local_compute_and_reads_at_least():
    recs = [ok_record(0), _unanswered()]
    c = _kv_pulled(obs_of(recs, evidence=full(ext=200, computed=9, nbytes=65536, transfers=2)))
    assert c.ok is True
    assert c.detail == ("D: external_kv_transfer +200, local_cache_hit +0, local_compute +9, nixl 65536 B in 2 "
                        "transfers; expected pulled: external_kv_transfer + local_cache_hit >= +126, nixl bytes > 0 "
                        "in >= 1 transfers; one delta over 2 requests, 1 of which reached D without an answer: "
                        "lower bounds")
    assert _kv_pulled(obs_of(recs, evidence=full(ext=125, nbytes=65536, transfers=2))).ok is False
    # exact when nothing else reached D: one computed token is a failure
    c = _kv_pulled(obs_of([ok_record()], evidence=full(ext=126, computed=3, nbytes=65536, transfers=1)))
    assert c.ok is False


def test_a_sequence_asks_for_lower_bounds_over_every_request_that_reached_d():
    obs = obs_of([ok_record()], evidence=full(ext=300, computed=40, nbytes=65536, transfers=3),
                 kv_bytes_per_block=BLOCK, block_size=32)
    c = _kv_pulled(obs, exact=False)
    assert c.ok is True and c.detail.endswith("nixl bytes > 0 in >= 1 transfers; one delta over every request "
                                              "that reached D: lower bounds"), c.detail


def test_the_exact_bytes_need_both_the_block_size_and_the_blocks_bytes():
    rec = ok_record(n=70)
    no_size = obs_of([rec], evidence=full(ext=70, nbytes=12345, transfers=1), kv_bytes_per_block=BLOCK)
    c = _kv_pulled(no_size)
    assert c.ok is True and "nixl bytes > 0 in >= 1 transfers" in c.detail
    no_bytes = obs_of([rec], evidence=full(ext=70, nbytes=12345, transfers=1), block_size=32)
    c = _kv_pulled(no_bytes)
    assert c.ok is True and "nixl bytes > 0 in >= 1 transfers" in c.detail


def test_a_prefix_hit_on_d_moves_fewer_blocks_so_the_bytes_are_not_exact():
    obs = obs_of([ok_record(n=70)], evidence=full(ext=38, cached=32, nbytes=2 * BLOCK, transfers=1),
                 kv_bytes_per_block=BLOCK, block_size=32)
    c = _kv_pulled(obs)
    assert c.ok is True and "nixl bytes > 0 in >= 1 transfers" in c.detail, c.detail
    obs.evidence = full(ext=70, nbytes=2 * BLOCK, transfers=1)  # no hit: all 3 blocks must move
    c = _kv_pulled(obs)
    assert c.ok is False and "nixl 98304 B (3 blocks x 32768 B)" in c.detail


# ------------------------------------------------------------------------- decide

KI = KnownIssue.model_validate(LIVELOCK)
KI_LOOSE = KnownIssue.model_validate({**LIVELOCK, "strict": False})
REQ = ("completed", "alive")


def chk(name: str, ok: bool | None, detail: str = "", requests: tuple[str, ...] = ()) -> Check:
    return Check(name, ok, detail or f"{name} said so", requests)


HELD = [chk("completed", True), chk("alive", True)]


def test_a_rig_error_is_error_unless_an_instance_died():
    exp = Expectation("pass", REQ)
    assert (decide("s", HELD, exp, error="rig broke").verdict, decide("s", HELD, exp, error="rig broke").reason) == (
        "ERROR", "rig broke")
    dead = [chk("completed", True), chk("alive", False, "decode died (exit 1)")]
    v = decide("s", dead, exp, error="rig broke", dead=True)
    assert (v.verdict, v.reason) == ("FAIL", "alive: decode died (exit 1)")
    assert (v.scenario, v.expectation, v.checks) == ("s", "pass", dead)


def test_an_expectation_problem_is_error_unless_an_instance_died():
    exp = Expectation("xfail: x", REQ, problem="versions differ")
    assert (decide("s", HELD, exp).verdict, decide("s", HELD, exp).reason) == ("ERROR", "versions differ")
    dead = [chk("completed", True), chk("alive", False, "decode died")]
    assert decide("s", dead, exp, dead=True).verdict == "FAIL"


def test_a_death_leads_the_failures_and_the_rest_keep_their_order():
    checks = [chk("parity", False, "1 diverged"), chk("completed", False, "0/1"), chk("alive", False, "decode died"),
              chk("no-fatal-log", False, "a line")]
    v = decide("s", checks, Expectation("pass", ()))
    assert (v.verdict, v.reason) == ("FAIL", "alive: decode died; parity: 1 diverged; completed: 0/1; "
                                             "no-fatal-log: a line")


def test_a_required_check_missing_or_not_checked_is_named_in_the_error():
    v = decide("s", [chk("completed", True), chk("parity", None, "not checked: no reference")],
               Expectation("pass", ("completed", "parity", "alive")))
    assert (v.verdict, v.reason) == ("ERROR", "inconclusive: parity not checked: no reference; alive not checked: "
                                              "the kind produced no such check")


def test_a_check_not_checked_and_not_required_does_not_stop_a_pass():
    v = decide("s", HELD + [chk("counters-monotonic", None, "not checked")], Expectation("pass", REQ))
    assert (v.verdict, v.reason) == ("PASS", "all checks hold")


def test_no_check_could_look_is_error_listing_what_was_seen_cut_at_300_characters():
    checks = [chk("a", None, "not checked: " + "x" * 200), chk("b", None, "not checked: " + "y" * 200)]
    v = decide("s", checks, Expectation("pass", ()))
    listed = ("a: not checked: " + "x" * 200 + "; b: not checked: " + "y" * 200)[:300]
    assert (v.verdict, v.reason) == ("ERROR", f"inconclusive: no check could look ({listed})")
    v = decide("s", [], Expectation("pass", ()))
    assert (v.verdict, v.reason) == ("ERROR", "inconclusive: no check could look")


def _match(requests=(), explains=(), run=(), **kw) -> Match:
    return Match(frozenset(requests), frozenset(explains), frozenset(run), **kw)


def test_a_known_issue_explains_only_its_requests_and_checks():
    exp = Expectation("xfail", REQ, known_issue=KI)
    failed = chk("completed", False, "r0 stalled", ("r0",))
    m = _match(["r0"], ["completed"], shown="r0 stalled as expected")
    v = decide("s", [failed, chk("alive", True)], exp, m)
    assert (v.verdict, v.reason) == ("XFAIL", "spec-admission-livelock: r0 stalled as expected")
    # a failed request the signature does not name is not explained
    wider = chk("completed", False, "r0, r1 stalled", ("r0", "r1"))
    v = decide("s", [wider, chk("alive", True)], exp, m)
    assert (v.verdict, v.reason) == ("FAIL", "spec-admission-livelock matched on r0, but not: completed: r0, r1 "
                                             "stalled")
    # a check the signature does not explain, on the very request it names
    other = chk("parity", False, "r0 diverged", ("r0",))
    v = decide("s", [failed, other, chk("alive", True)], exp, m)
    assert v.verdict == "FAIL" and v.reason.endswith("but not: parity: r0 diverged")
    # run-level: explained only when named in run_checks
    run = chk("alive", False, "decode died")
    assert decide("s", [failed, run], exp, m).verdict == "FAIL"
    assert decide("s", [failed, run], exp, _match(["r0"], ["completed"], ["alive"], shown="x")).verdict == "XFAIL"


def test_a_known_issue_that_did_not_match_says_what_it_expected_and_saw():
    exp = Expectation("xfail", REQ, known_issue=KI)
    v = decide("s", [chk("completed", False, "r0 timed out", ("r0",)), chk("alive", True)], exp,
               _match(expected="a stall", seen="a timeout"))
    assert (v.verdict, v.reason) == ("FAIL", "not known issue spec-admission-livelock: expected a stall, seen a "
                                             "timeout; completed: r0 timed out")


def test_a_known_issue_matched_on_an_instance_names_it():
    exp = Expectation("xfail", REQ, known_issue=KI)
    m = Match(frozenset(), frozenset(), frozenset({"alive"}), instances=frozenset({"decode"}), shown="crash")
    v = decide("s", [chk("completed", False, "r0 no answer", ("r0",)), chk("alive", False, "decode died")], exp, m)
    assert (v.verdict, v.reason) == ("FAIL", "spec-admission-livelock matched on decode, but not: completed: r0 no "
                                             "answer")


def test_a_known_issue_explains_a_not_checked_required_check_on_its_requests():
    exp = Expectation("xfail", REQ, known_issue=KI)
    v = decide("s", [chk("completed", None, "not checked", ("r0",)), chk("alive", False, "x", ())], exp,
               _match(["r0"], ["completed"], ["alive"], shown="stalled"))
    assert (v.verdict, v.reason) == ("XFAIL", "spec-admission-livelock: stalled")
    # without the match the gap stands
    v = decide("s", [chk("completed", None, "not checked", ("r0",)), chk("alive", True)], exp, None)
    assert v.verdict == "ERROR"


def test_a_known_issue_outside_its_range_explains_nothing_and_says_so():
    exp = Expectation("pass", REQ, out_of_range=KI)
    m = _match(["r0"], ["completed"], shown="r0 stalled")
    v = decide("s", [chk("completed", False, "r0 stalled", ("r0",)), chk("alive", True)], exp, m)
    assert (v.verdict, v.reason) == ("FAIL", "matches known issue spec-admission-livelock, outside its declared range "
                                             ">=0.32.0,<0.33: update `affects`? (r0 stalled); completed: r0 stalled")
    v = decide("s", [chk("completed", False, "r0 stalled", ("r0",)), chk("alive", True)], exp, _match())
    assert (v.verdict, v.reason) == ("FAIL", "completed: r0 stalled")
    assert decide("s", HELD, exp, m).verdict == "PASS"


def test_a_known_issue_that_did_not_show_is_xpass_or_a_noted_pass_when_not_strict():
    v = decide("s", HELD, Expectation("xfail", REQ, known_issue=KI), _match())
    assert (v.verdict, v.reason) == ("XPASS", "known issue fixed: update the expectation (spec-admission-livelock no "
                                              "longer reproduces)")
    assert not v.passed
    v = decide("s", HELD, Expectation("xfail", REQ, known_issue=KI_LOOSE), _match())
    assert (v.verdict, v.reason) == ("PASS", "all checks hold; known issue spec-admission-livelock did not show this "
                                             "time (strict: false, its showing depends on timing)")
    assert v.passed


def test_a_canary_verdict_in_each_state():
    exp = Expectation("caught: swap-prompt", REQ, tamper="swap-prompt")
    caught = _match(["r0"], ["parity", "completed"], seen="parity: 1 diverged", expected="a divergence")
    div = chk("parity", False, "1 diverged", ("r0",))
    v = decide("s", [div] + HELD, exp, caught)
    assert (v.verdict, v.reason, v.expectation) == ("PASS", "tampering caught by parity: 1 diverged",
                                                    "caught: swap-prompt")
    # a failure the catch does not explain
    v = decide("s", [div, chk("completed", True), chk("alive", False, "decode died")], exp, caught)
    assert (v.verdict, v.reason) == ("FAIL", "alive: decode died")
    # caught, but a required check not checked
    v = decide("s", [div, chk("completed", True)], exp, caught)
    assert (v.verdict, v.reason) == ("ERROR", "inconclusive: alive not checked: the kind produced no such check")
    # not caught, something failed: inconclusive canary
    v = decide("s", [chk("completed", False, "r0 timed out", ("r0",)), chk("alive", True)], exp,
               _match(expected="a divergence", seen="r0: timeout"))
    assert (v.verdict, v.reason) == ("FAIL", "canary inconclusive: no real catch (a divergence); seen: completed: r0 "
                                             "timed out")
    v = decide("s", [chk("completed", False, "r0 timed out", ("r0",)), chk("alive", True)], exp, None)
    assert v.reason.startswith("canary inconclusive: no real catch (a catch); seen: completed")
    # not caught, nothing failed, a gap: ERROR; no gap: passed silently
    v = decide("s", [chk("completed", True)], exp, _match())
    assert (v.verdict, v.reason) == ("ERROR", "inconclusive: alive not checked: the kind produced no such check")
    v = decide("s", HELD, exp, _match())
    assert (v.verdict, v.reason) == ("FAIL", "swap-prompt passed silently: the answer matched the reference of the "
                                             "prompt D was given, so parity cannot vouch for the KV")


# ------------------------------------------------------------------------- required checks, expectation

RULE = {"instance": "prefill", "metric": "vllm:nixl_num_kv_expired_reqs_total", "delta": 0}


def test_the_required_list_in_order_without_repeats():
    s = sc(expect=_expect(min_preemptions=1, min_spec_drafts=1, counters=[RULE]),
           require=["cached-tokens", "counters-monotonic", "cached-tokens"])
    assert required_checks(s) == ("completed", "token-counts", "kv-pulled", "parity", "alive", "no-fatal-log",
                                  "kv-integrity", "idle-after", "preempted", "spec-drafted", "counters",
                                  "cached-tokens", "counters-monotonic")
    s = sc(expect=_expect(min_spec_drafts=1, counters=[RULE]), require=["cached-tokens"], parity=False)
    assert required_checks(s) == ("completed", "token-counts", "kv-pulled", "alive", "no-fatal-log", "kv-integrity",
                                  "idle-after", "spec-drafted", "counters", "cached-tokens")
    assert required_checks(s, refusal=True) == ("completed", "alive", "no-fatal-log", "idle-after", "counters",
                                                "cached-tokens")


def _obs_versions(p: str, d: str, fallback: str = "") -> ScenarioObservation:
    return obs_of([ok_record()], versions={"prefill": p, "decode": d}, vllm_version=fallback)


def test_the_expectation_of_each_kind_of_scenario():
    obs = _obs_versions("0.32.0", "0.32.0")
    assert expectation_of(sc(tamper="swap-prompt"), obs) == Expectation(
        "caught: swap-prompt", required_checks(sc()), tamper="swap-prompt")
    assert expectation_of(sc(), obs) == Expectation("pass", required_checks(sc()))
    exp = expectation_of(sc(known_issue=LIVELOCK), obs)
    assert exp == Expectation("xfail: spec-admission-livelock (stall) on vLLM >=0.32.0,<0.33", required_checks(sc()),
                              known_issue=KI)
    exp = expectation_of(sc(known_issue=LIVELOCK), _obs_versions("0.31.0", "0.31.0"))
    assert exp == Expectation("pass", required_checks(sc()), out_of_range=KI)
    assert expectation_of(sc(), obs, refusal=True).required == required_checks(sc(), refusal=True)


def test_a_local_version_part_is_the_same_release_on_both_instances():
    exp = expectation_of(sc(known_issue=LIVELOCK), _obs_versions("0.32.0+cpu", "0.32.0"))
    assert exp.problem == "" and exp.known_issue == KI
    exp = expectation_of(sc(known_issue=LIVELOCK), _obs_versions("0.32.0", "0.32.0+cpu"))
    assert exp.problem == "" and exp.known_issue == KI
    exp = expectation_of(sc(known_issue=LIVELOCK), _obs_versions("0.32.0", "0.32.1+cpu"))
    assert exp.label == "xfail: spec-admission-livelock (stall) on vLLM >=0.32.0,<0.33"
    assert exp.problem == ("known issue spec-admission-livelock applies to vLLM >=0.32.0,<0.33, but prefill runs "
                           "0.32.0 and decode 0.32.1+cpu: judge one version at a time")
    assert exp.known_issue is None


def test_an_unknown_version_names_the_instance_that_did_not_answer():
    exp = expectation_of(sc(known_issue=LIVELOCK), _obs_versions("unknown", "0.32.0"))
    assert exp.problem == ("known issue spec-admission-livelock applies to vLLM >=0.32.0,<0.33, but the version of "
                           "prefill is unknown (no /version answer)")
    assert exp.label == "xfail: spec-admission-livelock (stall) on vLLM >=0.32.0,<0.33"
    exp = expectation_of(sc(known_issue=LIVELOCK), _obs_versions("", ""))
    assert exp.problem.endswith("but the version of prefill and decode is unknown (no /version answer)")
    # decode's version falls back to the run's vLLM version; prefill's does not
    exp = expectation_of(sc(known_issue=LIVELOCK), _obs_versions("0.32.0", "", fallback="0.32.0"))
    assert exp.problem == "" and exp.known_issue == KI
    exp = expectation_of(sc(known_issue=LIVELOCK), _obs_versions("", "0.32.0", fallback="0.32.0"))
    assert exp.problem.endswith("the version of prefill is unknown (no /version answer)")


# ------------------------------------------------------------------------- judge, counter_checks

FAILED = "vllm:nixl_num_failed_transfers_total"


def test_kind_checks_judge_a_versioned_scenario_whose_decode_version_is_unknown():
    s = sc(expect=_expect(by_version=[{"vllm": "<0.31", "http_status": 400, "note": "older decodes refuse"}]))
    obs = obs_of([ok_record()], versions={"prefill": "0.32.0"}, vllm_version="unknown")
    held = [Check("completed", True, "1/1"), Check("alive", True, "alive")]
    v = judge(s, obs, checks=held, required=("completed", "alive"))
    assert (v.verdict, v.reason) == ("PASS", "all checks hold")
    assert [c.name for c in v.checks] == ["completed", "alive", "counters-monotonic", "nixl-failed-transfers"]


def test_extra_checks_are_judged_and_a_required_override_replaces_the_kinds_list():
    obs = obs_of([ok_record()])
    v = judge(sc(), obs, extra=[Check("retrieval", False, "wrong passage")])
    assert (v.verdict, v.reason) == ("FAIL", "retrieval: wrong passage")
    obs.drains = []  # idle-after not checked: required by the kind, not by the override
    assert judge(sc(), obs).verdict == "ERROR"
    v = judge(sc(), obs, required=("completed", "kv-pulled"))
    assert (v.verdict, v.reason) == ("PASS", "all checks hold")


def test_a_versioned_outcome_without_rules_drops_the_base_outcomes_counters():
    s = sc(expect=_expect(counters=[RULE], by_version=[{"vllm": "<0.31", "completion_tokens": 2,
                                                        "total_tokens": 128}]))
    assert "counters" in required_checks(s)
    old = obs_of([ok_record()], version="0.30.0")  # no timeline: a rule would be not checked
    v = judge(s, old)
    assert "counters" not in {c.name for c in v.checks}
    assert (v.verdict, v.reason) == ("PASS", "all checks hold")
    v = judge(s, obs_of([ok_record()]))  # 0.32.0: the base outcome and its rule, not checked: ERROR
    assert v.verdict == "ERROR" and v.reason.startswith("inconclusive: counters prefill")


def test_a_refusal_expected_is_no_healthy_run_and_needs_only_the_refusal_checks():
    s = sc(expect={"http_status": 400, "http_message": "too long"})
    rec = error_record(status=400, msg="prompt too long")
    v = judge(s, obs_of([rec], parity=[None], timeline=_timeline(0, 5)))
    assert "nixl-failed-transfers" not in {c.name for c in v.checks}
    assert "kv-pulled" not in {c.name for c in v.checks}
    assert (v.verdict, v.reason) == ("PASS", "all checks hold")


def test_a_rule_naming_decode_by_its_instance_name_replaces_the_healthy_rule():
    rule = {"instance": "d1", "metric": FAILED, "min": 1}
    s = sc(decode="d1", expect=_expect(counters=[rule]))
    obs = obs_of([ok_record()], decode="d1", timeline=_timeline(0, 2, inst="d1"))
    obs.versions = {"prefill": "0.32.0", "d1": "0.32.0"}
    checks = {c.name: c for c in judge(s, obs).checks}
    assert "nixl-failed-transfers" not in checks and checks["counters"].ok is True


def test_the_healthy_rule_reads_decode_and_is_named_for_itself():
    c = {c.name: c for c in judge(sc(), obs_of([ok_record()], timeline=_timeline(0, 0))).checks}
    assert c["nixl-failed-transfers"].ok is True
    assert c["nixl-failed-transfers"].detail.startswith(f"decode {FAILED} +0 (expected +0: healthy run")


def _timeline(before: float, after: float, inst: str = "decode") -> list[dict]:
    other = "vllm:nixl_num_kv_expired_reqs_total"
    return [{"instance": i, "life": 1.0, "counters": {FAILED: a, other: 0.0}}
            for i, a in (("prefill", 0.0), (inst, before), ("prefill", 0.0), (inst, after))]


def test_spec_drafts_are_read_on_decode():
    v = judge(sc(expect=_expect(min_spec_drafts=1)), obs_of([ok_record()], evidence=None))
    drafted = next(c for c in v.checks if c.name == "spec-drafted")
    assert (drafted.ok, drafted.detail) == (None, "not checked: no decode metrics")


def test_an_unknown_decode_version_names_every_version_range_and_keeps_the_known_issue_label():
    s = sc(LIVELOCK, expect=_expect(by_version=[
        {"vllm": "<0.31", "http_status": 400, "note": "older decodes refuse"},
        {"vllm": ">=0.40", "completion_tokens": 1, "total_tokens": 127, "note": "a newer one stops early"}]))
    v = judge(s, obs_of([ok_record()], versions={"prefill": "0.32.0"}, vllm_version="unknown"))
    assert (v.verdict, v.reason) == ("ERROR", "the expected outcome depends on the vLLM version (<0.31, >=0.40) and "
                                              "decode's version is unknown")
    assert v.expectation == "xfail: spec-admission-livelock (stall) on vLLM >=0.32.0,<0.33" and v.checks == []


def test_an_instance_missing_from_the_versions_is_unknown():
    obs = obs_of([ok_record()], versions={}, vllm_version="")
    exp = expectation_of(sc(known_issue=LIVELOCK), obs)
    assert exp.problem.endswith("but the version of prefill and decode is unknown (no /version answer)")
    obs.vllm_version = "0.32.0"  # decode falls back to the run's version
    assert expectation_of(sc(known_issue=LIVELOCK), obs).problem.endswith("the version of prefill is unknown "
                                                                          "(no /version answer)")


def test_a_rule_naming_the_decode_role_replaces_the_healthy_rule_whatever_decodes_name():
    rule = {"instance": "decode", "metric": FAILED, "min": 1}
    s = sc(decode="d1", expect=_expect(counters=[rule]))
    obs = obs_of([ok_record()], decode="d1", timeline=_timeline(0, 2, inst="d1"))
    obs.versions = {"prefill": "0.32.0", "d1": "0.32.0"}
    v = judge(s, obs)
    checks = {c.name: c for c in v.checks}
    assert "nixl-failed-transfers" not in checks and checks["counters"].ok is True
    assert (v.scenario, v.verdict) == ("edge-126", "PASS")


def test_a_canary_is_judged_on_the_requests_its_kind_gives():
    # a kind (a wave) names its requests in the engine's vocabulary: the catch is looked for there
    reqs = [RequestFacts("edge-126-0", "ok", 126, parity="diverged")]
    obs = obs_of([ok_record()])  # the records alone show no divergence
    v = judge(sc(tamper="swap-prompt"), obs, reqs=reqs)
    assert v.verdict == "PASS" and v.reason.startswith("tampering caught by parity"), v.reason
    v = judge(sc(tamper="swap-prompt"), obs)
    assert v.verdict == "FAIL" and "passed silently" in v.reason


def test_a_partial_known_issue_match_names_every_request_and_instance_it_matched():
    exp = Expectation("xfail", REQ, known_issue=KI)
    m = Match(frozenset({"r1", "r0"}), frozenset({"completed"}), frozenset({"alive"}),
              instances=frozenset({"decode"}), shown="stalled")
    failed = [chk("completed", False, "r0, r1 stalled", ("r0", "r1")), chk("alive", False, "decode died"),
              chk("parity", False, "r2 diverged", ("r2",))]
    v = decide("s", failed, exp, m)
    assert (v.verdict, v.reason) == ("FAIL", "spec-admission-livelock matched on decode, r0, r1, but not: parity: r2 "
                                             "diverged")

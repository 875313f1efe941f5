"""The verdict engine: signatures, per-request attribution, canary, tri-state checks.

Observations are built in Python; stall facts come from the recorded 0.32.0 livelock
``/metrics`` (tests/data) and the crash from the recorded 0.30.0 ngram decode log.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rig.cluster.logs import FATAL_PATTERNS, matching_lines
from rig.config import ScenarioConfig
from rig.judge import verdict as engine
from rig.judge.signatures import BlockFacts
from rig.judge.verdict import judge, run_passed
from rig.observe.metrics import parse_metrics
from rig.observe.observations import DrainResult, ScenarioObservation, TransferEvidence
from rig.observe.parity import ParityResult
from rig.observe.stall import StallFacts, facts_of
from rig.transport.records import Hop, PDRecord

DATA = Path(__file__).resolve().parents[1] / "data"
STALLED_PROM = (DATA / "vllm-0.32.0-decode-stalled-edge-126.prom").read_text()
CRASH_LOG = DATA / "vllm-0.30.0-decode-ngram-crash.log"

LIVELOCK_SIG = {"kind": "stall", "instance": "decode", "waiting_reason": "capacity",
                "kv_fetch_stage": "waiting_to_start", "kv_usage_max": 0.05, "admission": "fits-but-waits"}
LIVELOCK = {"id": "spec-admission-livelock", "title": "flat spec block reservation",
            "affects": ">=0.32.0,<0.33", "symptom": LIVELOCK_SIG}
# cpu-tiny's `decode`: 32-token blocks, 5 blocks (4 usable), ngram k=1, max_model_len 128.
BLOCKS = BlockFacts(block_size=32, usable_blocks=4, num_speculative_tokens=1, max_model_len=128)
DIAG = ("admission livelock on decode: waiting=1 (capacity) running=0 kv=0.0% kv_fetch "
        "waiting_to_start=1, unchanged for 8.2 s")
EXPIRED = ("(Worker pid=6561) ERROR 11-29 19:43:00 [pull_worker.py:667] Potentially invalid KV blocks for "
           "unrecognized request {rid} were retrieved by a decode worker. They may have expired.")


def stall_facts(**swap: str) -> StallFacts:
    """Stall facts of the recorded 0.32.0 livelock; ``swap`` replaces exposition lines' values
    (``'reason="capacity"': '0.0'``) to build other frozen states from the same recording."""
    text = STALLED_PROM
    for label, value in swap.items():
        lines = text.splitlines()
        text = "\n".join(ln.rsplit(" ", 1)[0] + " " + value if label in ln and not ln.startswith("#") else ln
                         for ln in lines) + "\n"
    return facts_of(parse_metrics(text, "decode", t=0), 8.2)


HUNG_READ = {'reason="capacity"': "0.0", 'reason="deferred"': "1.0", 'stage="waiting_to_start"': "0.0",
             'stage="in_progress"': "1.0", "vllm:kv_cache_usage_perc{": "0.9"}


def sc(known_issue: dict | None = None, **kw) -> ScenarioConfig:
    base = dict(name="edge-126", decode="decode", prompt_tokens=126, max_tokens=2,
                expect={"completion_tokens": 2, "total_tokens": 128})
    base.update(kw)
    return ScenarioConfig(known_issue=known_issue, **base)


def ok_record(i: int = 0, tokens: list[int] | None = None, n: int = 126) -> PDRecord:
    tokens = [517, 12] if tokens is None else tokens
    rec = PDRecord(request_id=f"edge-126-{i}", prompt_len=n, max_tokens=2, outcome="ok", verdict_after_s=0.2,
                   prompt=list(range(n)))
    rec.prefill = Hop("prefill", status=200, latency_s=0.05, token_ids=[9],
                      usage={"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1},
                      kv_transfer_params={"do_remote_prefill": True, "remote_request_id": f"cmpl-p-{i}"})
    rec.decode = Hop("decode", status=200, latency_s=0.04, token_ids=tokens,
                     usage={"prompt_tokens": n, "completion_tokens": len(tokens), "total_tokens": n + len(tokens)})
    return rec


def stalled_record(i: int = 0, facts: StallFacts | None = None, n: int = 126) -> PDRecord:
    rec = PDRecord(request_id=f"edge-126-{i}", prompt_len=n, max_tokens=2, outcome="stalled",
                   diagnosis=DIAG, verdict_after_s=9.2, prompt=list(range(n)), stall=facts or stall_facts())
    rec.prefill = Hop("prefill", status=200, latency_s=0.05, token_ids=[9],
                      kv_transfer_params={"do_remote_prefill": True, "remote_request_id": f"cmpl-p-{i}"})
    return rec


def error_record(i: int = 0, status: int = 500, msg: str = "boom", hop: str = "decode") -> PDRecord:
    rec = ok_record(i)
    h = Hop(hop, status=status, error=f"HTTP {status}: {msg}")
    if hop == "decode":
        rec.decode = h
    else:
        rec.prefill, rec.decode = h, None
    rec.outcome, rec.diagnosis = "http_error", f"{hop}: HTTP {status}: {msg}"
    return rec


def drains(idle: bool = True) -> list[DrainResult]:
    final = {"waiting": 0.0, "running": 0.0, "kv_usage": 0.0 if idle else 0.5}
    return [DrainResult("decode", idle, 0.3, 0.0, final),
            DrainResult("prefill", True, 0.1, 0.0, {"waiting": 0, "running": 0, "kv_usage": 0})]


def obs_of(records: list[PDRecord], parity: list | None = None, version: str = "0.32.0", **kw) -> ScenarioObservation:
    """A fully observed scenario: both logs scanned (no lines), both versions known, drained."""
    answered = [r for r in records if r.outcome == "ok"]
    obs = ScenarioObservation(
        scenario="edge-126", decode="decode", prefill="prefill", records=records,
        parity=parity if parity is not None else [ParityResult("equal") if r.outcome == "ok" else None
                                                  for r in records],
        evidence=TransferEvidence(nixl_bytes=65536.0 * len(answered), nixl_transfers=len(answered),
                                  external_prompt_tokens=sum(r.prompt_len for r in answered)),
        fatal_lines={"prefill": [], "decode": []}, kv_integrity_lines={"prefill": [], "decode": []},
        drains=drains(), vllm_version=version, versions={"prefill": version, "decode": version}, wall_s=1.0)
    for k, v in kw.items():
        setattr(obs, k, v)
    return obs


def checks_of(v) -> dict[str, bool | None]:
    return {c.name: c.ok for c in v.checks}


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

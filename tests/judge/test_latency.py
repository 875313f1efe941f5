"""The latency check (rig.judge.latency): a hop far past the deployment's measured request fails,
naming the request, the hop, the wait and its part and the bound with its source; unanswered, held
and dead requests are left out with why; no baseline or a starved host is "not checked", never ok;
and through the verdict engine a slow hop turns PASS into FAIL."""

from __future__ import annotations

from rig.judge.latency import judge_latency, latency_check
from rig.judge.verdict import judge
from rig.transport.records import Hop, PDRecord
from tests.helpers.verdict_records import obs_of, ok_record, sc, stalled_record

# 126-token prompts, 2 tokens: 126 / 8 = 15.75 baseline round trips of work each. With a 0.01 s
# baseline the derived bound is 20 x 0.01 x 15.75 = 3.15 s per request: the 5 s floor decides.
BASE_S = 0.01


def slow(rec: PDRecord, decode_s: float | None = None, prefill_s: float | None = None,
         ttft_s: float | None = None) -> PDRecord:
    if decode_s is not None and rec.decode is not None:
        rec.decode.latency_s = decode_s
    if ttft_s is not None and rec.decode is not None:
        rec.decode.ttft_s = ttft_s
    if prefill_s is not None and rec.prefill is not None:
        rec.prefill.latency_s = prefill_s
    return rec


def observed(records: list[PDRecord], **kw):
    return obs_of(records, **{"baseline_request_s": BASE_S, **kw})


def test_a_decode_hop_that_waits_past_the_bound_fails_naming_request_hop_wait_and_bound():
    c = latency_check(observed([ok_record(0), slow(ok_record(1), decode_s=12.0)]))
    assert c.ok is False
    assert c.requests == ("edge-126-1",)
    assert c.detail.startswith("edge-126-1: decode hop (decode) waited 12.00 s in total; bound 6.3 s (")
    # two requests' work: 20 x 0.01 s x 31.5 round trips = 6.3 s, above the 5 s floor
    assert "20 x the measured request 0.01 s x 31.5 round trips of work" in c.detail


def test_a_healthy_scenario_is_ok_with_its_longest_hop_named():
    c = latency_check(observed([ok_record(0), slow(ok_record(1), decode_s=0.3)]))
    assert c.ok is True
    assert c.detail == ("2 request(s) within 6.3 s (20 x the measured request 0.01 s x 31.5 round trips of work): "
                        "longest edge-126-1: decode hop (decode) waited 0.30 s in total")


def test_the_floor_keeps_a_few_seconds_from_ever_being_a_finding():
    c = latency_check(observed([slow(ok_record(0), decode_s=4.9)]))
    assert c.ok is True and "5 s (timeouts.latency_floor_s, at least;" in c.detail
    assert latency_check(observed([slow(ok_record(0), decode_s=5.1)])).ok is False


def test_a_whole_kv_transfer_timeout_is_always_a_finding_however_much_work():
    # 40 requests of 126 tokens and a 0.2 s baseline: 20 x 0.2 x 630 = 2,520 s derived; the cap decides
    recs = [ok_record(i) for i in range(40)]
    slow(recs[7], decode_s=31.0)
    c = latency_check(observed(recs, baseline_request_s=0.2))
    assert c.ok is False and c.requests == ("edge-126-7",)
    assert "bound 30 s (timeouts.kv_transfer_s, at most;" in c.detail


def test_a_streamed_hop_that_waited_before_its_first_token_names_that_part():
    c = latency_check(observed([slow(ok_record(0), decode_s=9.1, ttft_s=9.0)]))
    assert c.ok is False
    assert c.detail.startswith("edge-126-0: decode hop (decode) waited 9.00 s to its first token;")
    # a stream whose first token came at once and whose tokens then trickled: the total is the wait
    c = latency_check(observed([slow(ok_record(0), decode_s=9.1, ttft_s=0.1)]))
    assert c.detail.startswith("edge-126-0: decode hop (decode) waited 9.10 s in total;")


def test_the_prefill_hop_and_a_router_are_named_as_such():
    c = latency_check(observed([slow(ok_record(0), prefill_s=8.0)]))
    assert c.ok is False and c.detail.startswith("edge-126-0: prefill hop (prefill) waited 8.00 s in total")
    routed = ok_record(0)
    routed.prefill, routed.decode = None, Hop("router", status=200, latency_s=7.0, token_ids=[1, 2],
                                              usage={"prompt_tokens": 126, "completion_tokens": 2})
    c = latency_check(observed([routed]))
    assert c.ok is False and c.detail.startswith("edge-126-0: router hop (router) waited 7.00 s in total")


def test_no_baseline_is_not_checked_never_ok():
    c = latency_check(obs_of([slow(ok_record(0), decode_s=60.0)]))  # baseline_request_s None
    assert c.ok is None and c.detail.startswith("not checked: no per-request baseline measured")


def test_unanswered_and_cancelled_requests_are_left_out_with_why():
    cut = slow(ok_record(1), decode_s=20.0)
    cut.outcome = "cancelled"
    stalled = stalled_record(2)
    c = latency_check(observed([ok_record(0), cut, stalled]))
    assert c.ok is True
    assert c.detail.endswith("; left out: 1 cancelled, 1 not answered (stalled: judged by its own checks)")
    only_cut = latency_check(observed([cut]))
    assert only_cut.ok is None and only_cut.detail == "not checked: no hop to judge; left out: 1 cancelled"


def test_a_decode_hop_held_on_purpose_is_left_out_but_its_prefill_hop_is_judged():
    held = slow(ok_record(0), decode_s=20.0)
    c = latency_check(observed([held]), held_s=3.0)
    assert c.ok is True and "prefill hop" in c.detail
    assert c.detail.endswith("left out: 1 decode hop(s) held 3 s on purpose (hold_between_s)")
    assert latency_check(observed([slow(ok_record(0), decode_s=20.0, prefill_s=9.0)]), held_s=3.0).ok is False


def test_a_death_leaves_every_request_out():
    c = latency_check(observed([slow(ok_record(0), decode_s=20.0)], dead={"decode": -9}))
    assert c.ok is None and c.detail == "not checked: no hop to judge; left out: 1 decode died in the scenario"


def test_a_host_starved_since_the_baseline_makes_a_slow_hop_not_checked_but_not_a_far_slower_one():
    starved = {"baseline_host_load_1m": 1.0, "host_load_1m": 20.0, "host_cpus": 2}  # up to 10 x slower
    c = latency_check(observed([slow(ok_record(0), decode_s=12.0)], **starved))
    assert c.ok is None
    assert c.detail.startswith("not checked: edge-126-0: decode hop (decode) waited 12.00 s in total, over the "
                               "bound 5 s")
    assert "host load 20 on 2 CPUs, 1 when the baseline was measured: up to 10 x slower" in c.detail
    c = latency_check(observed([slow(ok_record(0), decode_s=55.0)], **starved))
    assert c.ok is False and "(x 10 for the host's load: host load 20 on 2 CPUs" in c.detail
    # the same load when the baseline was measured: the baseline already carries it
    same = {**starved, "baseline_host_load_1m": 20.0}
    assert latency_check(observed([slow(ok_record(0), decode_s=12.0)], **same)).ok is False


def test_the_judgement_keeps_one_wait_per_hop_longest_first():
    j = judge_latency(observed([slow(ok_record(0), decode_s=9.0, ttft_s=8.5), slow(ok_record(1), decode_s=30.0)]))
    assert [(w.request, w.hop, w.part) for w in j.over] == [("edge-126-1", "decode", "total"),
                                                          ("edge-126-0", "decode", "first-token")]


def test_through_the_verdict_engine_a_slow_hop_fails_an_otherwise_passing_scenario():
    healthy = judge(sc(), observed([ok_record(0)]), extra=[latency_check(observed([ok_record(0)]))])
    assert healthy.verdict == "PASS", healthy.reason
    o = observed([slow(ok_record(0), decode_s=12.0)])
    v = judge(sc(), o, extra=[latency_check(o)])
    assert v.verdict == "FAIL"
    assert v.reason.startswith("latency: edge-126-0: decode hop (decode) waited 12.00 s in total; bound 5 s")
    # not required: without a baseline the scenario still passes, with the check shown not checked
    o = obs_of([ok_record(0)])
    v = judge(sc(), o, extra=[latency_check(o)])
    assert v.verdict == "PASS" and {c.name: c.ok for c in v.checks}["latency"] is None


def test_on_a_starved_host_the_part_beyond_the_host_excuse_is_the_one_named():
    starved = {"baseline_host_load_1m": 1.0, "host_load_1m": 6.0, "host_cpus": 2}  # up to 3 x slower: 15 s
    # the first token came at 8 s (excused by the load), the stream ended at 20 s (not excused)
    c = latency_check(observed([slow(ok_record(0), decode_s=20.0, ttft_s=8.0)], **starved))
    assert c.ok is False
    assert c.detail.startswith("edge-126-0: decode hop (decode) waited 20.00 s in total; bound 5 s")

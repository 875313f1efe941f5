"""Store checks where `make mutation` found the evidence unpinned (rig/judge/store_checks.py): the
summary of a store wave's planned cancels names each point with its count, apart, in order, and
the span of times they were closed at; a store wave's parity and stream checks say what they
compared; any byte put counts as written; a request the store never answered adds no token;
store-loaded reads each record's own route (a request cancelled on purpose shifts nothing); one
preemption is pressure; a scenario that did not run is ERROR naming why, with no check."""

from __future__ import annotations

from rig.judge.store_checks import cancel_summary, judge_store, store_checks
from rig.observe.observations import DrainResult
from rig.observe.parity import ParityResult
from rig.observe.store_metrics import STORE_SOURCE
from rig.transport.records import PDRecord, PlannedCancel
from test_store_checks import by_name, healthy, obs, ok, scen


def cut(rid: str, hop: str, fired_ms: float, point: str) -> PDRecord:
    r = PDRecord(rid, 64, 4, outcome="cancelled")
    r.cancel = PlannedCancel(hop, 100.0, fired_ms=fired_ms, point=point)
    return r


def test_the_cancel_summary_names_every_point_apart():
    recs = [cut("c0", "decode", 130.0, "during-decode"), cut("c1", "prefill", 101.0, "between"),
            cut("c2", "prefill", 102.0, "before-prefill"), cut("c3", "decode", 250.0, "during-decode")]
    assert cancel_summary(recs) == ("4 cancelled on purpose (before-prefill 1, between 1, during-decode 2), closed "
                                    "101-250 ms after their hop was sent; 0 planned cancels missed (the decode hop "
                                    "answered first)")


def test_a_store_wave_parity_detail_says_what_the_answers_were_compared_with():
    cs = by_name(store_checks(scen("store-roundtrip"), obs(ok(), parity=[ParityResult("equal")]), healthy()))
    assert (cs["parity"].ok, cs["parity"].detail) == (True, "1/1 equal to a direct request to P")


def test_a_streamed_store_answer_is_judged_complete():
    r = ok()
    r.decode.ttft_s, r.decode.stream_problem = 0.1, "no [DONE]"
    c = by_name(store_checks(scen("store-roundtrip"), obs(r), healthy()))["stream-complete"]
    assert (c.ok, c.detail, c.requests) == (False, "r0: no [DONE]", ("r0",))


def test_any_byte_put_into_the_store_counts_as_written():
    so = healthy(p_ops={"save_put": {"keys": 1, "ok_bytes": 1}})
    assert by_name(store_checks(scen("store-roundtrip"), obs(ok()), so))["store-written"].ok is True
    so = healthy(p_ops={"save_put": {"keys": 1, "ok_bytes": 0}})
    assert by_name(store_checks(scen("store-roundtrip"), obs(ok()), so))["store-written"].ok is False


def test_a_request_the_store_never_answered_adds_no_token_to_the_total():
    rows = [{"request_id": "r0", "store_tokens": 64, "expected_store_tokens": 64, "local_prefix_hits": 0},
            {"request_id": "r1", "expected_store_tokens": 64}]
    c = by_name(store_checks(scen("store-roundtrip"), obs(ok(), ok("r1")), healthy(per_request=rows)))["store-loaded"]
    assert c.ok is False and c.requests == ("r1",)
    assert c.detail == ("D took 64/64 expected tokens from the store, load_get 4,096 B ok; r1: no answer tokens, "
                        "expected 64")


def test_store_loaded_counts_the_store_routed_answers_in_request_order_past_a_cancel():
    # routes are per request, the cancelled-on-purpose one too: the store-routed request was cut
    c0 = cut("c0", "prefill", 120.0, "between")
    so = healthy("prefix-wave-store", routes=["store", "pd"], d={f"cached_{STORE_SOURCE}": 64.0})
    c = by_name(store_checks(scen("prefix-wave-store"), obs(c0, ok("a")), so))["store-loaded"]
    assert c.ok is None and c.detail == ("not checked: no answered request went through the store; D took 64 prompt "
                                         "tokens from the store (4,096 B) over 1 store-routed requests (0 answered)")
    so.routes = ["pd", "store"]
    assert by_name(store_checks(scen("prefix-wave-store"), obs(c0, ok("a")), so))["store-loaded"].ok is True


def test_any_token_and_byte_loaded_from_the_store_counts():
    so = healthy("prefix-wave-store", routes=["store"], d={f"cached_{STORE_SOURCE}": 1.0},
                 d_ops={"load_get": {"keys": 1, "ok_bytes": 1}})
    c = by_name(store_checks(scen("prefix-wave-store"), obs(ok()), so))["store-loaded"]
    assert c.ok is True and c.detail.startswith("D took 1 prompt tokens from the store (1 B)")


def test_one_preemption_is_kv_pressure():
    so = healthy("long-generation", d={"preemptions": 1.0})
    c = by_name(store_checks(scen("long-generation"), obs(ok()), so))["kv-pressure"]
    assert c.ok is True and c.detail.startswith("D preempted 1 times (num_preemptions_total), 0 running->waiting")
    c = by_name(store_checks(scen("long-generation"), obs(ok()), healthy("long-generation")))["kv-pressure"]
    assert c.ok is False and c.detail.endswith(" (no pressure: raise store.requests or max_tokens)")


def test_a_store_scenario_without_an_observation_is_error_with_no_check_and_says_why():
    v = judge_store(scen("store-roundtrip"), obs(), None)
    assert (v.scenario, v.verdict, v.reason, v.checks) == ("s", "ERROR", "no store observation (scenario not run)",
                                                           [])
    v = judge_store(scen("store-roundtrip"), obs(), healthy(error="P refused the warm-up"))
    assert (v.verdict, v.reason, v.checks) == ("ERROR", "P refused the warm-up", [])
    v = judge_store(scen("store-roundtrip"), obs(dead={"decode": 1}), None)
    assert v.verdict == "FAIL" and [c.name for c in v.checks] == ["alive"]


def test_resets_that_all_answered_success_pass_the_required_reset_check():
    sc = scen("prefix-wave-store", reset_prefix_cache=True, rounds=2)
    so = healthy("prefix-wave-store", routes=["store"], d={f"cached_{STORE_SOURCE}": 64.0},
                 resets=[{"round": 1, "instance": "decode", "status": 200, "success": True, "attempts": 1}])
    o = obs(ok(), parity=[ParityResult("equal")], fatal_lines={"prefill": [], "decode": []},
            drains=[DrainResult("decode", True, 0.1, 0.0, {"waiting": 0, "running": 0, "kv_usage": 0})])
    v = judge_store(sc, o, so)
    assert (v.verdict, v.reason) == ("PASS", "all checks hold")
    so.resets = []
    v = judge_store(sc, o, so)
    assert v.verdict == "ERROR" and "prefix-cache-reset not checked: no round after the first ran" in v.reason

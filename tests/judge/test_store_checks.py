"""Store checks on hand-built observations, no servers (rig/judge/store_checks.py): each store check
fails on its missing or wrong evidence (no put reached the master, D took the wrong token count
from the store, D's own cache served the prompt, NIXL carried bytes, the master served nothing or
died), a check that could not look is not checked, and cancelled-on-purpose requests are left out.
Written against `make mutation` survivors (docs/mutation.md)."""

from __future__ import annotations

import pytest

from rig.config import ScenarioConfig
from rig.judge.store_checks import cancel_summary, fmt_bytes, judge_store, store_checks
from rig.observe.observations import DrainResult, ScenarioObservation
from rig.observe.parity import ParityResult
from rig.observe.store_metrics import STORE_SOURCE, StoreObservation
from rig.transport.records import Hop, PDRecord, PlannedCancel


def scen(kind: str, **store) -> ScenarioConfig:
    return ScenarioConfig.model_validate({"name": "s", "kind": kind, "prompt_tokens": 64, "max_tokens": 4,
                                          **({"store": store} if store else {})})


def ok(rid: str = "r0") -> PDRecord:
    r = PDRecord(rid, 64, 4, outcome="ok")
    r.decode = Hop("decode", status=200, token_ids=[1] * 4, usage={"prompt_tokens": 64, "completion_tokens": 4})
    return r


def obs(*records: PDRecord, **kw) -> ScenarioObservation:
    o = ScenarioObservation(scenario="s", decode="decode", prefill="prefill", records=list(records))
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def healthy(kind: str = "store-roundtrip", **kw) -> StoreObservation:
    base = dict(kind=kind, block_size=32, master_name="mooncake-master",
                p_ops={"save_put": {"keys": 2, "ok_bytes": 4096}}, d_ops={"load_get": {"keys": 2, "ok_bytes": 4096}},
                master={"put_end_items": 2, "get_replica_list_items": 2, "mem_cache_hit_bytes": 4096},
                master_after={"key_count": 2}, master_health="HTTP 200", master_alive_end=True,
                expected_store_tokens=64,
                per_request=[{"request_id": "r0", "store_tokens": 64, "expected_store_tokens": 64,
                              "local_prefix_hits": 0, "nixl_bytes": 0}])
    base.update(kw)
    return StoreObservation(**base)


def by_name(checks) -> dict:
    return {c.name: c for c in checks}


def test_a_healthy_roundtrip_passes_every_store_check_with_its_detail():
    cs = by_name(store_checks(scen("store-roundtrip"), obs(ok()), healthy()))
    for name in ("failed-loads", "store-written", "store-loaded", "d-cache-cold", "not-nixl", "master-served",
                 "master-alive"):
        assert cs[name].ok is True, name
    assert cs["failed-loads"].detail == "load_get failed_keys 0, non-ok calls 0 (of 2 keys)"
    assert cs["store-written"].detail == ("P save_put 2 keys / 4,096 B ok, rejected 0; master put_end +2 items, "
                                          "key_count 2")
    assert cs["store-loaded"].detail == "D took 64/64 expected tokens from the store, load_get 4,096 B ok"
    assert cs["d-cache-cold"].detail == "D's own prefix cache held none of the prompts"
    assert cs["not-nixl"].detail == "NIXL bytes on D during the store requests: 0"
    assert cs["master-served"].detail == "master get_replica_list +2 items, mem_cache_hit_bytes +4,096"
    assert cs["master-alive"].detail == "mooncake-master /health: HTTP 200"
    assert judge_store(scen("store-roundtrip"), obs(ok(), fatal_lines={"prefill": [], "decode": []}),
                       healthy()).verdict != "FAIL"


@pytest.mark.parametrize("change,check", [
    ({"d_ops": {"load_get": {"keys": 2, "ok_bytes": 4096, "failed_keys": 1}}}, "failed-loads"),
    ({"p_ops": {"save_put": {"keys": 2, "ok_bytes": 4096}, "load_get": {"bad_calls": 1}}}, "failed-loads"),
    ({"master": {"put_end_items": 0, "get_replica_list_items": 2}}, "store-written"),
    ({"p_ops": {"save_put": {"keys": 2, "ok_bytes": 0}}}, "store-written"),
    ({"master": {"put_end_items": 2, "get_replica_list_items": 0}}, "master-served"),
    ({"d_ops": {"load_get": {"keys": 2, "ok_bytes": 0}}}, "store-loaded"),
    ({"per_request": []}, "store-loaded"),
    ({"per_request": [{"request_id": "r0", "store_tokens": 32, "expected_store_tokens": 64}]}, "store-loaded"),
    ({"per_request": [{"request_id": "r0", "expected_store_tokens": 64}]}, "store-loaded"),
    ({"per_request": []}, "d-cache-cold"),
    ({"per_request": [{"request_id": "r0", "store_tokens": 64, "expected_store_tokens": 64,
                       "local_prefix_hits": 32}]}, "d-cache-cold"),
    ({"per_request": [{"request_id": "r0", "store_tokens": 64, "expected_store_tokens": 64,
                       "nixl_bytes": 1}]}, "not-nixl"),
    ({"master_alive_end": False}, "master-alive"),
])
def test_each_store_check_fails_on_its_wrong_evidence(change, check):
    cs = by_name(store_checks(scen("store-roundtrip"), obs(ok()), healthy(**change)))
    assert cs[check].ok is False
    v = judge_store(scen("store-roundtrip"), obs(ok()), healthy(**change))
    assert v.verdict == "FAIL" and check in v.reason


def test_failed_check_details_name_the_request_and_the_counts():
    wrong = [{"request_id": "r0", "store_tokens": 64, "expected_store_tokens": 64},
             {"request_id": "r1", "store_tokens": 32, "expected_store_tokens": 64, "local_prefix_hits": 32}]
    cs = by_name(store_checks(scen("store-roundtrip"), obs(ok(), ok("r1")), healthy(per_request=wrong)))
    assert cs["store-loaded"].requests == ("r1",)
    assert cs["store-loaded"].detail == ("D took 96/64 expected tokens from the store, load_get 4,096 B ok; r1: 32 "
                                         "tokens, expected 64")
    assert cs["d-cache-cold"].requests == ("r1",)
    assert cs["d-cache-cold"].detail == "r1: D's prefix cache hit 32 tokens (the store was not what served it)"
    unanswered = [{"request_id": "r0", "expected_store_tokens": 64}]
    c = by_name(store_checks(scen("store-roundtrip"), obs(ok()), healthy(per_request=unanswered)))["store-loaded"]
    assert c.detail.endswith("; r0: no answer tokens, expected 64")
    cs = by_name(store_checks(scen("store-roundtrip"), obs(ok(), dead={"mooncake-master": -9}), healthy()))
    assert cs["master-alive"].ok is False and cs["master-alive"].detail == "mooncake-master exited (-9)"
    assert cs["alive"].ok is True  # the master's death is master-alive's, not alive's


def test_prefix_wave_store_loaded_only_when_a_store_request_was_answered():
    sc = scen("prefix-wave-store")
    so = healthy("prefix-wave-store", routes=["store", "pd"], d={"cached_external_kv_transfer": 0.0})
    from rig.observe.store_metrics import STORE_SOURCE
    so.d = {f"cached_{STORE_SOURCE}": 64.0}
    c = by_name(store_checks(sc, obs(ok("a"), ok("b")), so))["store-loaded"]
    assert c.ok is True and c.detail == ("D took 64 prompt tokens from the store (4,096 B) over 1 store-routed "
                                         "requests (1 answered)")
    so.d = {}
    assert by_name(store_checks(sc, obs(ok("a"), ok("b")), so))["store-loaded"].ok is False
    so.d = {f"cached_{STORE_SOURCE}": 64.0}
    so.d_ops = {"load_get": {"ok_bytes": 0}}
    assert by_name(store_checks(sc, obs(ok("a"), ok("b")), so))["store-loaded"].ok is False
    failed = PDRecord("a", 64, 4, outcome="timeout")
    c = by_name(store_checks(sc, obs(failed, ok("b")), so))["store-loaded"]
    assert c.ok is None and c.detail.startswith("not checked: no answered request went through the store; ")
    so.routes = ["pd", "pd"]
    assert by_name(store_checks(sc, obs(ok("a"), ok("b")), so))["store-loaded"].ok is None


def test_long_generation_needs_pressure():
    sc = scen("long-generation")
    c = by_name(store_checks(sc, obs(ok()), healthy("long-generation")))["kv-pressure"]
    assert c.ok is False and c.detail.endswith(" (no pressure: raise store.requests or max_tokens)")
    c = by_name(store_checks(sc, obs(ok()), healthy("long-generation", d={"preemptions": 2.0})))["kv-pressure"]
    assert c.ok is True and c.detail == ("D preempted 2 times (num_preemptions_total), 0 running->waiting seen in "
                                         "samples, peak running 0; reloaded 4,096 B from the store")
    assert by_name(store_checks(sc, obs(ok()), healthy("long-generation", requeues_seen=1)))["kv-pressure"].ok


def test_resets_between_rounds():
    sc = scen("prefix-wave-store", reset_prefix_cache=True, rounds=2)
    so = healthy("prefix-wave-store", routes=["pd"])
    c = by_name(store_checks(sc, obs(ok()), so))["prefix-cache-reset"]
    assert c.ok is None and c.detail == "not checked: no round after the first ran"
    so.resets = [{"round": 1, "instance": "decode", "status": 200, "success": True, "attempts": 1},
                 {"round": 1, "instance": "prefill", "status": 503, "success": False, "attempts": 3,
                  "detail": "busy"}]
    c = by_name(store_checks(sc, obs(ok()), so))["prefix-cache-reset"]
    assert c.ok is False and c.detail == ("1/2 POST /reset_prefix_cache answered success; round 1 prefill: HTTP 503 "
                                          "busy after 3 attempt(s)")
    so.resets = so.resets[:1]
    c = by_name(store_checks(sc, obs(ok()), so))["prefix-cache-reset"]
    assert c.ok is True and c.detail == "1/1 POST /reset_prefix_cache answered success"
    assert "prefix-cache-reset" not in by_name(store_checks(scen("prefix-wave-store"), obs(ok()),
                                                             healthy("prefix-wave-store", routes=["pd"])))


def test_cancelled_on_purpose_requests_are_left_out_and_summarised():
    cut = PDRecord("c0", 64, 4, outcome="cancelled")
    cut.cancel = PlannedCancel("prefill", 100.0, fired_ms=120.0, point="between")
    late = PDRecord("c1", 64, 4, outcome="ok")
    late.decode = ok().decode
    late.cancel = PlannedCancel("decode", 100.0)  # the decode hop answered first
    assert cancel_summary([cut, late]) == ("1 cancelled on purpose (between 1), closed 120-120 ms after their hop "
                                           "was sent; 1 planned cancels missed (the decode hop answered first)")
    assert cancel_summary([late]) == ("0 cancelled on purpose (); 1 planned cancels missed (the decode hop answered "
                                      "first)")
    cs = by_name(store_checks(scen("prefix-wave-store"), obs(ok(), cut), healthy("prefix-wave-store",
                                                                                 routes=["pd", "pd"])))
    assert cs["completed"].ok is True and cs["completed"].detail.startswith("1/1 completed; 1 cancelled on purpose")
    assert fmt_bytes(1234567.4) == "1,234,567 B"


def test_a_store_scenario_that_did_not_run_is_error_and_a_death_is_fail():
    assert judge_store(scen("store-roundtrip"), obs(), None).verdict == "ERROR"
    v = judge_store(scen("store-roundtrip"), obs(error="boom"), healthy())
    assert v.verdict == "ERROR"
    v = judge_store(scen("store-roundtrip"), obs(dead={"decode": 1}, death_lines={"decode": "AssertionError: x"}),
                    healthy(error="decode died"))
    assert v.verdict == "FAIL" and "decode died (exit 1)" in v.reason


def test_a_failed_request_beside_cancels_on_purpose_still_fails_completed():
    cut = PDRecord("c0", 64, 4, outcome="cancelled")
    cut.cancel = PlannedCancel("prefill", 100.0, fired_ms=120.0, point="between")
    lost = PDRecord("t0", 64, 4, outcome="timeout")
    cs = by_name(store_checks(scen("prefix-wave-store"), obs(ok(), lost, cut),
                              healthy("prefix-wave-store", routes=["pd", "pd", "pd"])))
    assert cs["completed"].ok is False and cs["completed"].requests == ("t0",)
    assert cs["completed"].detail.startswith("1/2 completed; t0: timeout; 1 cancelled on purpose")
    cs = by_name(store_checks(scen("prefix-wave-store"), obs(ok()), healthy("prefix-wave-store", routes=["pd"])))
    assert cs["completed"].detail == "1/1 completed"  # nothing cancelled: no cancel summary


def test_a_reset_that_never_ran_is_required_so_the_verdict_is_not_pass():
    sc = scen("prefix-wave-store", reset_prefix_cache=True, rounds=2)
    so = healthy("prefix-wave-store", routes=["pd"])
    o = obs(ok(), fatal_lines={"prefill": [], "decode": []})
    v = judge_store(sc, o, so)
    assert v.verdict == "ERROR" and "prefix-cache-reset" in v.reason


def test_a_known_crash_before_the_store_ran_is_xfail_and_only_alive_is_judged():
    sc = ScenarioConfig.model_validate({"name": "s", "kind": "store-roundtrip", "prompt_tokens": 64, "max_tokens": 4,
                                        "known_issue": {"id": "store-load-async", "title": "t", "affects": ">=0.1",
                                                        "symptom": {"kind": "crash", "instance": "decode",
                                                                    "fatal_log": "load_async"}}})
    o = obs(dead={"decode": 1}, death_lines={"decode": "AssertionError: load_async must be true"},
            vllm_version="0.32.0", versions={"prefill": "0.32.0", "decode": "0.32.0"})
    v = judge_store(sc, o, healthy(error="decode died at the warm-up"))
    assert v.verdict == "XFAIL", v.reason
    o.death_lines = {"decode": "RuntimeError: other"}
    assert judge_store(sc, o, healthy(error="decode died")).verdict == "FAIL"


def test_store_counters_absent_from_the_master_fail_and_one_is_enough():
    absent = by_name(store_checks(scen("store-roundtrip"), obs(ok()), healthy(master={}, master_after={})))
    assert absent["store-written"].ok is False and absent["master-served"].ok is False
    assert absent["store-written"].detail.endswith("master put_end +0 items, key_count 0")
    assert absent["master-served"].detail == "master get_replica_list +0 items, mem_cache_hit_bytes +0"
    one = healthy(master={"put_end_items": 1, "get_replica_list_items": 1}, d_ops={"load_get": {"ok_bytes": 1}},
                  per_request=[{"request_id": "r0", "store_tokens": 64, "expected_store_tokens": 64}])
    cs = by_name(store_checks(scen("store-roundtrip"), obs(ok()), one))
    assert all(cs[n].ok for n in ("store-written", "master-served", "store-loaded", "d-cache-cold", "not-nixl"))
    warm = healthy(per_request=[{"request_id": "r0", "store_tokens": 64, "expected_store_tokens": 64,
                                 "local_prefix_hits": 1}])
    assert by_name(store_checks(scen("store-roundtrip"), obs(ok()), warm))["d-cache-cold"].ok is False
    two = healthy(p_ops={"save_put": {"keys": 2, "ok_bytes": 4096}, "load_get": {"keys": 3}},
                  d_ops={"load_get": {"keys": 5, "ok_bytes": 4096}})
    assert by_name(store_checks(scen("store-roundtrip"), obs(ok()), two))["failed-loads"].detail.endswith("(of 8 keys)")


# -------------------------------------------------------------------------------------------------
# Store checks where `make mutation` found the evidence unpinned (rig/judge/store_checks.py): the
# summary of a store wave's planned cancels names each point with its count, apart, in order, and
# the span of times they were closed at; a store wave's parity and stream checks say what they
# compared; any byte put counts as written; a request the store never answered adds no token;
# store-loaded reads each record's own route (a request cancelled on purpose shifts nothing); one
# preemption is pressure; a scenario that did not run is ERROR naming why, with no check.

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

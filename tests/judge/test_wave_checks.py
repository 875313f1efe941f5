"""Wave checks on built results, no servers (rig/judge/wave_checks.py): P's prefix hits that differ
from the expectation fail, a stall is explained only by held blocks that really fill P's pool
and only until their lease expires, a wave without a transfer or an answer fails kv-pulled.
Written against `make mutation` survivors (docs/howto/mutation.md)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from rig.config import ScenarioConfig
from rig.judge.wave_checks import (
    UNWATCHED,
    UNWATCHED_WHY,
    _prefix_hits,
    _stall_check,
    explain_stall,
    judge_wave,
    wave_checks,
    wave_kv_pulled,
)
from rig.observe.observations import ScenarioObservation, TransferEvidence
from rig.observe.timeline import TimelineSampler
from rig.transport.endpoint import Endpoint
from rig.transport.records import WaveRecord
from rig.workload.wave_result import WaveResult


def rec(i: int = 0, outcome: str = "ok", prompt_len: int = 31, tokens: int | None = 2, **kw) -> WaveRecord:
    return WaveRecord(request_id=f"w-{i}", prompt_len=prompt_len, max_tokens=2, index=i, stream=False,
                      outcome=outcome, tokens=tokens, **kw)


def wave(records: list[WaveRecord] | None = None, kind: str = "prefix-wave", **kw) -> WaveResult:
    base = dict(scenario="w", kind=kind, client="fast", params={"prompt_tokens": 31, "concurrency": 2},
                instances={"prefill": "prefill", "decode": "decode"},
                records=records if records is not None else [rec()],
                expected_prefix_hits=64, prefix_fits=True, deltas={"prefill": {"prefix_hits": 64.0}},
                usable_blocks={"prefill": 8}, block_size=16, kv_lease_s=30.0)
    base.update(kw)
    return WaveResult(**base)


def obs(**kw) -> ScenarioObservation:
    o = ScenarioObservation(scenario="w", decode="decode", prefill="prefill",
                            evidence=TransferEvidence(nixl_bytes=1024.0, nixl_transfers=1, external_prompt_tokens=31))
    for k, v in kw.items():
        setattr(o, k, v)
    return o


# ------------------------------------------------------------------------- prefix-hits

@pytest.mark.parametrize("hits,ok", [(64.0, True), (63.0, False), (65.0, False), (0.0, False)])
def test_prefix_hits_must_equal_the_expectation(hits, ok):
    c = _prefix_hits(obs(), wave(deltas={"prefill": {"prefix_hits": hits}}), [rec()])
    assert c.ok is ok and c.detail.startswith(f"P hits {hits:.0f} tokens, expected 64")


def test_only_ps_hits_count_and_ds_are_named():
    w = wave(deltas={"prefill": {"prefix_hits": 10.0}, "decode": {"prefix_hits": 54.0, "external_prefix_hits": 3.0}})
    c = _prefix_hits(obs(), w, [rec()])
    assert c.ok is False and c.detail.endswith("D decode: local 54, external 3")
    two_p = wave(instances={"p1": "prefill", "p2": "prefill", "decode": "decode"},
                 deltas={"p1": {"prefix_hits": 30.0}, "p2": {"prefix_hits": 34.0}})
    assert _prefix_hits(obs(), two_p, [rec()]).ok is True


@pytest.mark.parametrize("kw,why", [
    ({"expected_prefix_hits": None}, "the expected hits are unknown"),
    ({"prefix_fits": False}, "the prefixes cannot all stay cached on P"),
])
def test_prefix_hits_not_checked_when_the_expectation_cannot_hold(kw, why):
    c = _prefix_hits(obs(), wave(**kw, deltas={"prefill": {"prefix_hits": 63.0}}), [rec()])
    assert c.ok is None and c.name == "prefix-hits" and c.detail.startswith(f"not checked: {why}; ")


def test_prefix_hits_equal_to_the_expectation_are_ok_even_where_they_might_not_have_been():
    c = _prefix_hits(obs(), wave(prefix_fits=False), [rec()])
    assert c.ok is True and c.detail.endswith("; matched although the prefixes could not all stay cached on P")
    c = _prefix_hits(obs(), wave(), [rec(), rec(1, outcome="cancelled", cancel_point="before-prefill")])
    assert c.ok is True and c.detail.endswith("; matched although 1 requests cancelled before P answered")


def test_prefix_hits_not_checked_after_early_cancels_or_without_ps_counter():
    early = [rec(), rec(1, outcome="cancelled", cancel_point="before-prefill")]
    c = _prefix_hits(obs(), wave(deltas={"prefill": {"prefix_hits": 63.0}}), early)
    assert c.ok is None and c.detail.startswith("not checked: 1 requests cancelled before P answered")
    c = _prefix_hits(obs(missing_metrics={"prefill": ["vllm:prefix_cache_hits_total"]}), wave(), [rec()])
    assert c.ok is None and "prefill lacks" in c.detail


# ------------------------------------------------------------------------- explain_stall

def held(i: int, t_end: float, prompt_len: int = 31) -> WaveRecord:
    return rec(i, outcome="cancelled", prompt_len=prompt_len, planned_cancel="between", cancel_point="between",
               p_instance="prefill", t_end=t_end)


def stall(start: float = 40.0, duration: float = 5.0, instance: str = "prefill") -> dict:
    return {"instance": instance, "start_s": start, "duration_s": duration, "diagnosis": "frozen"}


# 6 held requests of 31+1 tokens = 2 blocks each (16-token blocks) = 12 blocks; + 2 in flight x 2 = 16
HELD = [held(i, 20.0 + i) for i in range(6)]


def test_a_stall_of_ps_pool_full_of_abandoned_blocks_is_explained():
    text = explain_stall(stall(), wave(HELD, usable_blocks={"prefill": 16}))
    assert text.startswith("6 requests abandoned between the hops in the 30 s before hold ~12 of P's 16 usable")


def test_a_decode_stall_is_never_explained():
    assert explain_stall(stall(instance="decode"), wave(HELD, usable_blocks={"prefill": 16})) == ""


@pytest.mark.parametrize("usable,explained", [(16, True), (17, False), (None, True)])
def test_held_blocks_plus_in_flight_must_reach_ps_usable_blocks(usable, explained):
    text = explain_stall(stall(), wave(HELD, usable_blocks={"prefill": usable}))
    assert bool(text) is explained, text


def test_the_held_requests_are_ps_cancelled_between_the_hops_in_the_lease_before_the_stall():
    w = wave(usable_blocks={"prefill": 2}, params={"prompt_tokens": 31, "concurrency": 0})
    assert explain_stall(stall(40.0), wave([held(0, 9.0)], **_kw(w))) != ""  # 40 - 30 - 1 = 9: inside
    assert explain_stall(stall(40.0), wave([held(0, 8.9)], **_kw(w))) == ""  # ended before the lease window
    assert explain_stall(stall(40.0), wave([held(0, 41.0)], **_kw(w))) != ""  # up to 1 s after the start
    assert explain_stall(stall(40.0), wave([held(0, 41.1)], **_kw(w))) == ""
    other_p = held(0, 20.0)
    other_p.p_instance = "p2"
    assert explain_stall(stall(40.0), wave([other_p], **_kw(w))) == ""
    answered = rec(0, t_end=20.0, p_instance="prefill", cancel_point=None)
    assert explain_stall(stall(40.0), wave([answered], **_kw(w))) == ""
    no_end = held(0, 20.0)
    no_end.t_end = None
    assert explain_stall(stall(40.0), wave([no_end], **_kw(w))) == ""


def _kw(w: WaveResult) -> dict:
    return {"usable_blocks": w.usable_blocks, "params": w.params}


def test_a_stall_that_outlives_the_first_lease_is_not_explained():
    w = dict(usable_blocks={"prefill": 2}, params={"prompt_tokens": 31, "concurrency": 0})
    # first lease expires at 20 + 30 = 50; + 12 s slack = 62
    assert explain_stall(stall(40.0, 22.0), wave([held(0, 20.0)], **w)) != ""
    assert explain_stall(stall(40.0, 22.1), wave([held(0, 20.0)], **w)) == ""


def test_block_arithmetic_of_held_and_in_flight_requests():
    # a 32-token prompt + 1 = 33 tokens = 3 blocks of 16; in flight: 2 x cdiv(32, 16) = 4 -> 7
    w = dict(params={"prompt_tokens": 31, "concurrency": 2})
    assert explain_stall(stall(), wave([held(0, 20.0, prompt_len=32)], usable_blocks={"prefill": 7}, **w)) != ""
    assert explain_stall(stall(), wave([held(0, 20.0, prompt_len=32)], usable_blocks={"prefill": 8}, **w)) == ""
    # no block size known: 16
    assert explain_stall(stall(), wave([held(0, 20.0, prompt_len=32)], usable_blocks={"prefill": 7},
                                       block_size=None, **w)) != ""


def test_the_stall_check_fails_on_any_unexplained_stall():
    assert _stall_check(wave()).ok is True
    w = wave(stalls=[{**stall(), "explained": "held blocks"}, {**stall(instance="decode"), "explained": ""}])
    c = _stall_check(w)
    assert c.ok is False and "decode at 40 s for 5 s: UNEXPLAINED: frozen" in c.detail
    assert _stall_check(wave(stalls=[{**stall(), "explained": "held"}])).ok is True


# ------------------------------------------------------------------------- kv-pulled and the others

@pytest.mark.parametrize("ev,ok", [
    (TransferEvidence(nixl_transfers=1, external_prompt_tokens=31), True),
    (TransferEvidence(nixl_transfers=0, external_prompt_tokens=31), False),
    (TransferEvidence(nixl_transfers=1, external_prompt_tokens=30), False),
    (TransferEvidence(nixl_transfers=1, external_prompt_tokens=20, cached_prompt_tokens=11), True),
])
def test_wave_kv_pulled(ev, ok):
    c = wave_kv_pulled(obs(evidence=ev), [rec()])
    assert c.ok is ok and c.requests == (() if ok else ("w-0",))


def test_wave_kv_pulled_without_answer_or_metrics():
    c = wave_kv_pulled(obs(), [rec(outcome="timeout")])
    assert c.ok is False and c.requests == ("w-0",)
    assert wave_kv_pulled(obs(evidence=None), [rec()]).ok is None
    assert wave_kv_pulled(obs(missing_metrics={"decode": ["vllm:nixl_bytes_transferred_sum"]}), [rec()]).ok is None
    # a parity mismatch is answered: its prompt must have been pulled too
    assert wave_kv_pulled(obs(), [rec(), rec(1, outcome="parity_mismatch")]).ok is False


def sc(**kw) -> ScenarioConfig:
    base = dict(name="w", kind="pressure-wave", prompt_tokens=31, max_tokens=2)
    base.update(kw)
    return ScenarioConfig(**base)


def states(checks) -> dict:
    return {c.name: c.ok for c in checks}


def test_wave_checks_fail_on_errors_empties_and_wrong_counts():
    w = wave([rec(0), rec(1, outcome="timeout"), rec(2, outcome="empty", tokens=0), rec(3, tokens=1),
              rec(4, outcome="cancelled", planned_cancel="between", cancel_point="between"),
              rec(5, outcome="cancelled")], kind="pressure-wave")
    cs = {c.name: c for c in wave_checks(sc(), obs(), w)}
    assert cs["completed"].ok is False and set(cs["completed"].requests) == {"w-1", "w-2", "w-5"}
    assert cs["no-errors"].ok is False and cs["no-errors"].requests == ("w-1", "w-5")
    assert cs["no-errors"].detail.startswith("aborted 1, timeout 1; first: w-1: timeout")
    assert cs["no-empty"].ok is False and cs["no-empty"].requests == ("w-2",)
    assert cs["token-counts"].ok is False and cs["token-counts"].requests == ("w-3",)
    assert cs["alive"].ok is True and cs["no-fatal-log"].ok is None  # no death seen; no log scanned
    cs = {c.name: c for c in wave_checks(sc(), obs(), w, unwatched=True)}  # pdrig wave at bare URLs
    assert cs["alive"].ok is None and cs["no-fatal-log"].ok is None and cs["kv-integrity"].ok is None
    assert cs["alive"].detail.startswith("not checked: not required")


def test_wave_token_counts_against_usage_and_max_model_len():
    r = rec(0, usage_tokens=3)
    assert states(wave_checks(sc(), obs(), wave([r], kind="pressure-wave")))["token-counts"] is False
    # clamped by max_model_len: 32 - 31 = 1 token expected
    w = wave([rec(0, tokens=1)], kind="pressure-wave", max_model_len=32)
    assert states(wave_checks(sc(), obs(), w))["token-counts"] is True
    assert states(wave_checks(sc(), obs(), wave([rec(0, tokens=1)], kind="pressure-wave")))["token-counts"] is False
    nothing = wave([rec(0, outcome="timeout")], kind="pressure-wave")
    c = next(c for c in wave_checks(sc(), obs(), nothing) if c.name == "token-counts")
    assert c.ok is False and c.detail == "no answer to count" and c.requests == ("w-0",)


def test_wave_parity_sample():
    w = wave([rec(0), rec(1, outcome="parity_mismatch", parity="diverged at 0")], kind="pressure-wave",
             params={"parity_fraction": 0.5}, parity={"compared": 2, "equal": 1})
    c = next(c for c in wave_checks(sc(), obs(), w) if c.name == "parity")
    assert c.ok is False and c.requests == ("w-1",)
    w = wave([rec(0)], kind="pressure-wave", params={"parity_fraction": 0.5}, parity={"compared": 0})
    assert states(wave_checks(sc(), obs(), w))["parity"] is None
    w = wave([rec(0)], kind="pressure-wave", params={"parity_fraction": 0.5}, parity={"compared": 1, "equal": 1,
                                                                                       "failed": 1})
    assert states(wave_checks(sc(), obs(), w))["parity"] is None
    w = wave([rec(0)], kind="pressure-wave", params={"parity_fraction": 0.5}, parity={"compared": 1, "refused": 1})
    assert states(wave_checks(sc(), obs(), w))["parity"] is False
    w = wave([rec(0, outcome="timeout")], kind="pressure-wave", params={"parity_fraction": 0.5})
    assert states(wave_checks(sc(), obs(), w))["parity"] is False
    w = wave([rec(0)], kind="pressure-wave", params={"parity_fraction": 0.5}, parity={"compared": 1, "equal": 1})
    assert states(wave_checks(sc(), obs(), w))["parity"] is True
    assert "parity" not in states(wave_checks(sc(parity=False), obs(), w))


# ------------------------------------------------------------------------- judge_wave

def full_obs(**kw) -> ScenarioObservation:
    from rig.observe.observations import DrainResult
    o = obs(fatal_lines={"prefill": [], "decode": []}, kv_integrity_lines={"prefill": [], "decode": []},
            drains=[DrainResult("decode", True, 0.1, 0.0, {"waiting": 0, "running": 0, "kv_usage": 0}),
                    DrainResult("prefill", True, 0.1, 0.0, {"waiting": 0, "running": 0, "kv_usage": 0})],
            vllm_version="0.32.0", versions={"prefill": "0.32.0", "decode": "0.32.0"})
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def healthy_wave(**kw) -> WaveResult:
    kw.setdefault("params", {"prompt_tokens": 31, "concurrency": 2, "parity_fraction": 1.0})
    kw.setdefault("parity", {"compared": 1, "equal": 1})
    return wave(kw.pop("records", [rec(0)]), kind="pressure-wave", **kw)


def test_judge_wave_passes_a_healthy_wave_and_never_a_broken_one():
    from rig.judge.wave_checks import judge_wave
    v = judge_wave(sc(), full_obs(), healthy_wave())
    assert v.verdict == "PASS", v.reason
    # the wave's own error (a metrics scrape failed) is a failed check, also with records
    v = judge_wave(sc(), full_obs(), healthy_wave(error="metrics unavailable: ConnectError"))
    assert v.verdict == "FAIL" and "metrics: metrics unavailable: ConnectError" in v.reason
    # no records and an error: the wave did not run
    v = judge_wave(sc(), full_obs(), wave([], kind="pressure-wave", error="boom"))
    assert (v.verdict, v.reason, v.scenario) == ("ERROR", "boom", "w")
    v = judge_wave(sc(), full_obs(error="rig: lost the decode"), healthy_wave())
    assert (v.verdict, v.reason) == ("ERROR", "rig: lost the decode")
    v = judge_wave(sc(), full_obs(), None)
    assert (v.verdict, v.reason) == ("ERROR", "the wave did not run")


def test_judge_wave_explains_recorded_stalls_and_fails_the_unexplained():
    from rig.judge.wave_checks import judge_wave
    w = healthy_wave(stalls=[stall(instance="decode")])
    v = judge_wave(sc(), full_obs(), w)
    assert v.verdict == "FAIL" and "UNEXPLAINED" in v.reason and w.stalls[0]["explained"] == ""
    w = healthy_wave(records=HELD + [rec(9)], usable_blocks={"prefill": 16}, stalls=[stall()])
    judge_wave(sc(), full_obs(), w)
    assert w.stalls[0]["explained"].startswith("6 requests abandoned between the hops")
    w = healthy_wave(stalls=[{**stall(instance="decode"), "explained": "given by the wave"}])
    judge_wave(sc(), full_obs(), w)
    assert w.stalls[0]["explained"] == "given by the wave"  # an explanation the wave gave is kept


# ------------------------------------------------------------------------- details and gaps (mutation survivors)

def test_wave_parity_details_and_a_sample_that_never_ran():
    from rig.judge.wave_checks import _wave_parity
    c = _wave_parity(wave(parity={"compared": 3, "equal": 3}), [rec()], 1)
    assert (c.name, c.ok, c.detail) == ("parity", True, "3/3 sampled answers equal to a direct request to P")
    c = _wave_parity(wave(parity={}), [rec()], 1)  # no sample compared at all: never ok
    assert c.ok is None and c.detail == "not checked: 0/0 sampled answers equal to a direct request to P"
    c = _wave_parity(wave(parity={"compared": 2, "equal": 2, "failed": 1}), [rec()], 1)
    assert c.ok is None and c.detail == ("not checked: 2/2 sampled answers equal to a direct request to P, "
                                         "1 references failed")
    bad = rec(1, outcome="parity_mismatch", parity="diverged at 0: 1 != 2")
    c = _wave_parity(wave(parity={"compared": 2, "equal": 1}), [rec(), bad], 1)
    assert c.ok is False and c.requests == ("w-1",)
    assert c.detail == "1/2 sampled answers equal to a direct request to P; w-1: diverged at 0: 1 != 2"
    c = _wave_parity(wave(parity={}), [rec(0, outcome="timeout"), rec(1, outcome="cancelled", planned_cancel="x",
                                                                       cancel_point="between")], 0)
    assert (c.ok, c.detail, c.requests) == (False, "no answer to compare", ("w-0",))


def test_prefix_hits_detail_names_every_count_and_its_name_in_every_state():
    w = wave(instances={"prefill": "prefill", "decode": "decode"}, deltas={"prefill": {"prefix_hits": 64.0}},
             prefix_note="2 prefixes x 32")
    c = _prefix_hits(obs(), w, [rec()])
    assert (c.name, c.ok) == ("prefix-hits", True)
    assert c.detail == "P hits 64 tokens, expected 64 (2 prefixes x 32); D decode: local 0, external 0"
    c = _prefix_hits(obs(), wave(deltas={}, expected_prefix_hits=0), [rec()])
    assert c.ok is True and c.detail.startswith("P hits 0 tokens, expected 0")  # no delta = no hit
    c = _prefix_hits(obs(), wave(deltas={}, expected_prefix_hits=1), [rec()])
    assert c.ok is False and c.name == "prefix-hits"
    c = _prefix_hits(obs(), wave(expected_prefix_hits=None), [rec()])
    assert c.detail.startswith("not checked: the expected hits are unknown; P hits 64 tokens, expected ? (")
    d2 = wave(instances={"prefill": "prefill", "d1": "decode", "d2": "decode"})
    assert _prefix_hits(obs(), d2, [rec()]).detail.endswith("D d1: local 0, external 0; d2: local 0, external 0")
    c = _prefix_hits(obs(missing_metrics={"prefill": ["vllm:prefix_cache_hits_total"]}), wave(), [rec()])
    assert c.name == "prefix-hits"


def test_stall_check_details_the_first_four_and_counts_the_rest():
    c = _stall_check(wave(samples={"prefill": 3, "decode": 2}))
    assert (c.name, c.ok, c.detail, c.samples) == ("no-stall", True, "no instance froze with requests waiting "
                                                   "(5 samples)", 5)
    c = _stall_check(wave(samples={"prefill": 3, "decode": 0}))  # D never read: not checked, with the count
    assert (c.ok, c.samples) == (None, 3) and c.detail.startswith("not checked: decode never sampled")
    five = [{**stall(start=float(i)), "explained": ""} for i in range(5)]
    c = _stall_check(wave(stalls=five))
    assert c.name == "no-stall" and c.ok is False
    assert c.detail == "; ".join(f"prefill at {i} s for 5 s: UNEXPLAINED: frozen" for i in range(4)) + "; +1 more"
    c = _stall_check(wave(stalls=five[:4]))
    assert "more" not in c.detail and c.detail.count("UNEXPLAINED") == 4
    shy = [{**stall(), "explained": "", "inconclusive": True}, {**stall(instance="decode"), "explained": "held"}]
    c = _stall_check(wave(stalls=shy))
    assert c.ok is None and c.name == "no-stall" and c.detail.startswith(
        "not checked: every unexplained freeze was inconclusive: prefill at 40 s for 5 s: UNEXPLAINED: frozen")
    mixed = [{**stall(), "explained": "", "inconclusive": True}, {**stall(instance="decode"), "explained": ""}]
    assert _stall_check(wave(stalls=mixed)).ok is False


def test_the_first_error_is_named_without_trailing_space():
    w = wave([rec(0), rec(1, outcome="timeout")], kind="pressure-wave")
    cs = {c.name: c for c in wave_checks(sc(), obs(), w)}
    assert cs["no-errors"].detail == "timeout 1; first: w-1: timeout"
    w = wave([rec(0), rec(1, outcome="empty", tokens=0)], kind="pressure-wave")
    cs = {c.name: c for c in wave_checks(sc(), obs(), w)}
    assert cs["no-empty"].detail == "1 empty answers (200 without tokens); first: w-1: empty"
    assert cs["no-errors"].ok is True


# ------------------------------------------------------------------------- kv-integrity and the all-cancelled rule

LINE = ("(Worker pid=1) ERROR [pull_worker.py:667] Potentially invalid KV blocks for unrecognized request {rid} were "
        "retrieved by a decode worker. They may have expired.")


def test_wave_kv_integrity_fails_an_answered_request_and_explains_an_abandoned_one():
    answered_rec = rec(0, remote_request_id="cmpl-p-0")
    cut = rec(1, outcome="cancelled", planned_cancel="between", cancel_point="between", remote_request_id="cmpl-p-1")
    w = wave([answered_rec, cut], kind="pressure-wave")
    o = obs(kv_integrity_lines={"prefill": [LINE.format(rid="cmpl-p-0")], "decode": []})
    c = next(c for c in wave_checks(sc(), o, w) if c.name == "kv-integrity")
    assert c.ok is False and c.requests == ("w-0",)
    o = obs(kv_integrity_lines={"prefill": [LINE.format(rid="cmpl-p-1")], "decode": []})
    c = next(c for c in wave_checks(sc(), o, w) if c.name == "kv-integrity")
    assert c.ok is True and "w-1" in c.detail and "lease housekeeping" in c.detail
    mismatch = rec(2, outcome="parity_mismatch", parity="diverged at 0", remote_request_id="cmpl-p-2")
    o = obs(kv_integrity_lines={"prefill": [LINE.format(rid="cmpl-p-2")], "decode": []})
    c = next(c for c in wave_checks(sc(), o, wave([mismatch], kind="pressure-wave")) if c.name == "kv-integrity")
    assert c.ok is False and c.requests == ("w-2",)  # a parity mismatch was answered too


def _all_cut(n: int = 2, kind: str = "pressure-wave", **kw) -> WaveResult:
    cuts = [rec(i, outcome="cancelled", planned_cancel="between", cancel_point="between") for i in range(n)]
    kw.setdefault("params", {"prompt_tokens": 31, "concurrency": 2, "parity_fraction": 1.0})
    return wave(cuts, kind=kind, **kw)


def test_an_all_cancelled_wave_has_its_answer_checks_not_checked_and_named():
    why = "not checked: all 2 requests were cancelled on purpose (between 2): no answer to "
    cs = {c.name: c for c in wave_checks(sc(), obs(), _all_cut())}
    assert (cs["token-counts"].ok, cs["token-counts"].detail) == (None, why + "count")
    assert (cs["kv-pulled"].ok, cs["kv-pulled"].detail) == (None, why + "show a transfer for")
    assert (cs["parity"].ok, cs["parity"].detail) == (None, why + "compare")
    assert "prefix-hits" not in cs
    assert cs["completed"].ok is True and cs["completed"].detail == ("0/0 completed (2 requests, 2 cancelled on "
                                                                     "purpose: between 2)")
    cs = {c.name: c for c in wave_checks(sc(kind="prefix-wave", prompt_tokens=48), obs(), _all_cut(kind="prefix-wave"))}
    assert (cs["prefix-hits"].ok, cs["prefix-hits"].detail) == (None, why + "hit P's prefix cache for")
    assert "parity" not in {c.name for c in wave_checks(sc(parity=False), obs(), _all_cut())}
    no_sample = _all_cut(params={"prompt_tokens": 31, "concurrency": 2, "parity_fraction": 0.0})
    assert "parity" not in {c.name for c in wave_checks(sc(), obs(), no_sample)}


def test_judge_wave_on_an_all_cancelled_wave_judges_the_run_level_checks():
    from rig.judge.wave_checks import judge_wave
    v = judge_wave(sc(), full_obs(), _all_cut(parity={}))
    assert v.verdict == "PASS", v.reason
    assert v.reason.startswith("all 2 requests cancelled on purpose: no answer to judge; completed, no-errors")
    assert v.reason.endswith(" hold")
    v = judge_wave(sc(), full_obs(dead={"decode": -9}), _all_cut(parity={}))
    assert v.verdict == "FAIL" and not v.reason.startswith("all 2 requests")
    one_answered = _all_cut(parity={})
    one_answered.records.append(rec(5))
    v = judge_wave(sc(), full_obs(), one_answered)
    assert not v.reason.startswith("all ")  # an answer is judged: parity was never compared, so not PASS
    assert v.verdict == "ERROR"


def test_judge_wave_unwatched_says_why_the_process_checks_were_not_required():
    from rig.judge.wave_checks import UNWATCHED, UNWATCHED_WHY, judge_wave
    v = judge_wave(sc(), full_obs(), healthy_wave(), unwatched=True)
    assert v.verdict == "PASS" and v.reason.endswith(f"; {', '.join(UNWATCHED)} not checked, {UNWATCHED_WHY}")
    assert not v.reason.startswith(";")  # the sentence is added to the reason, not in its place
    v = judge_wave(sc(), full_obs(), healthy_wave(records=[rec(0, outcome="timeout")]), unwatched=True)
    assert v.verdict == "FAIL" and UNWATCHED_WHY not in v.reason


def test_in_flight_blocks_count_only_the_requests_the_wave_had_in_flight():
    # 6 held x 2 blocks = 12: without a concurrency nothing else is in flight, so 13 usable blocks are not full
    assert explain_stall(stall(), wave(HELD, usable_blocks={"prefill": 13}, params={"prompt_tokens": 31})) == ""
    # a 32-token prompt in flight + its first token = 33 tokens = 3 blocks of 16: 12 + 3 = 15 fill 15
    w = wave(HELD, usable_blocks={"prefill": 15}, params={"prompt_tokens": 32, "concurrency": 1})
    assert explain_stall(stall(), w).startswith("6 requests abandoned between the hops in the 30 s before hold ~12 "
                                                "of P's 15 usable blocks")
    w = wave(HELD, usable_blocks={}, params={"prompt_tokens": 31, "concurrency": 1})
    assert explain_stall(stall(), w).endswith("hold ~12 of P's ? usable blocks until NIXL's kv_lease_duration expires "
                                              "(nobody tells P that D will never read them)")


def test_wave_kv_pulled_details_and_gaps():
    c = wave_kv_pulled(obs(), [rec(0, outcome="timeout")])
    assert (c.name, c.ok, c.detail, c.requests) == ("kv-pulled", False, "no answered request to show a transfer for",
                                                    ("w-0",))
    c = wave_kv_pulled(obs(evidence=None), [rec()])
    assert (c.name, c.ok, c.detail) == ("kv-pulled", None, "not checked: no decode metrics")
    c = wave_kv_pulled(obs(), [rec()])
    assert c.detail == ("D: 31 prompt tokens from external_kv_transfer + 0 from its prefix cache (expected >= 31 for "
                        "1 answered prompts), nixl 1024 B in 1 transfers")


def test_wave_check_details_when_all_is_well_and_cancel_points_in_order():
    cut = [rec(i, outcome="cancelled", planned_cancel=p, cancel_point=p)
           for i, p in enumerate(["during-decode", "between", "between"], start=1)]
    w = wave([rec(0), *cut], kind="pressure-wave")
    cs = {c.name: c for c in wave_checks(sc(), obs(), w)}
    assert cs["completed"].detail == "1/1 completed (4 requests, 3 cancelled on purpose: between 2, during-decode 1)"
    assert cs["no-errors"].detail == "no timeouts, HTTP or connection errors"
    assert cs["no-empty"].detail == "no empty answers"
    assert cs["token-counts"].detail == "every answer has its expected token count"
    w = wave([rec(i, tokens=1) for i in range(5)], kind="pressure-wave")
    c = next(c for c in wave_checks(sc(), obs(), w) if c.name == "token-counts")
    assert c.detail == "5 wrong: w-0: 1 tokens, expected 2; w-1: 1 tokens, expected 2; w-2: 1 tokens, expected 2"
    w = wave([rec(0, outcome="timeout")], kind="pressure-wave")
    c = next(c for c in wave_checks(sc(), obs(), w) if c.name == "token-counts")
    assert (c.ok, c.detail, c.requests) == (False, "no answer to count", ("w-0",))
    w = wave([rec(0, tokens=3)], kind="pressure-wave")  # expect.completion_tokens overrides max_tokens
    assert next(c for c in wave_checks(sc(expect={"completion_tokens": 3}), obs(), w)
                if c.name == "token-counts").ok is True


def test_cancel_points_are_listed_by_name_even_an_unknown_point():
    cut = [rec(1, outcome="cancelled", planned_cancel="between", cancel_point="between"),
           rec(2, outcome="cancelled", planned_cancel="between", cancel_point=None),
           rec(3, outcome="cancelled", planned_cancel="between", cancel_point=None)]
    c = next(c for c in wave_checks(sc(), obs(), wave([rec(0), *cut], kind="pressure-wave")) if c.name == "completed")
    assert c.detail == "1/1 completed (4 requests, 3 cancelled on purpose: None 2, between 1)"


def test_one_unexplained_stall_is_named_exactly():
    c = _stall_check(wave(stalls=[{**stall(), "explained": ""}]))
    assert (c.name, c.ok, c.detail) == ("no-stall", False, "prefill at 40 s for 5 s: UNEXPLAINED: frozen")


def test_idle_after_names_a_leak_in_ps_usable_blocks():
    from rig.observe.observations import DrainResult
    leak = DrainResult("prefill", False, 5.0, 0.0, {"waiting": 0, "running": 0, "kv_usage": 0.5})
    c = next(c for c in wave_checks(sc(), obs(drains=[leak]), healthy_wave()) if c.name == "idle-after")
    assert c.ok is False and c.detail.endswith(" = 4.0 of 8 usable blocks held (4.0 blocks' worth above the baseline)")


# -------------------------------------------------------------------------------------------------
# Wave verdicts where `make mutation` found the evidence unpinned (rig/judge/wave_checks.py): a
# stall is explained only when the in-flight requests' blocks really fill P's pool (one-token
# blocks, no prompt length given); a wave that did not run is ERROR with no check and its
# expectation still read; a caller's own required list holds when checks are dropped; an
# unwatched wave's XFAIL and XPASS say which checks were not looked at.

KI = {"id": "wrong", "title": "t", "affects": ">=0.32", "symptom": {"kind": "wrong-output"}}
NOTE = f"; {', '.join(UNWATCHED)} not checked, {UNWATCHED_WHY}"


def test_without_a_prompt_length_each_in_flight_request_holds_its_first_tokens_block():
    # 1-token blocks: 6 held requests x (31 + 1) = 192 blocks; 3 in flight x 1 block (its first token) = 3
    params = {"concurrency": 3}
    assert explain_stall(stall(), wave(HELD, block_size=1, usable_blocks={"prefill": 196}, params=params)) == ""
    text = explain_stall(stall(), wave(HELD, block_size=1, usable_blocks={"prefill": 195}, params=params))
    assert text.startswith("6 requests abandoned between the hops in the 30 s before hold ~192 of P's 195 usable")


def test_a_wave_that_did_not_run_is_error_with_no_check_and_the_scenarios_expectation():
    v = judge_wave(sc(known_issue=KI), full_obs(), None)
    assert (v.verdict, v.reason, v.checks) == ("ERROR", "the wave did not run", [])
    assert v.expectation == "xfail: wrong (wrong-output) on vLLM >=0.32"


def test_a_callers_required_list_holds_when_unwatched_checks_are_dropped():
    never_compared = healthy_wave(parity={"compared": 0})  # parity not checked: the kind requires it
    v = judge_wave(sc(), full_obs(), never_compared, unwatched=True)
    assert v.verdict == "ERROR" and "parity not checked" in v.reason
    v = judge_wave(sc(), full_obs(), never_compared, required=("completed", "no-errors"), unwatched=True)
    assert v.verdict == "PASS" and v.reason.endswith(NOTE)


def test_an_unwatched_xfail_and_xpass_say_which_checks_were_not_looked_at():
    shown = healthy_wave(records=[rec(0), rec(1, outcome="parity_mismatch", parity="diverged at 0")],
                         parity={"compared": 2, "equal": 1})
    two_pulled = full_obs(evidence=TransferEvidence(nixl_bytes=2048.0, nixl_transfers=2, external_prompt_tokens=62))
    v = judge_wave(sc(known_issue=KI), two_pulled, shown, unwatched=True)
    assert v.verdict == "XFAIL" and v.reason == "wrong: w-1 diverged from the reference" + NOTE
    v = judge_wave(sc(known_issue=KI), full_obs(), healthy_wave(), unwatched=True)
    assert v.verdict == "XPASS" and v.reason.endswith(NOTE)
    v = judge_wave(sc(known_issue=KI), two_pulled, shown)  # watched: nothing to add
    assert v.reason == "wrong: w-1 diverged from the reference"


def by_name(checks) -> dict:
    return {c.name: c for c in checks}


def test_completed_without_a_cancel_names_no_cancel_point():
    c = by_name(wave_checks(sc(), obs(), wave([rec(0), rec(1)], kind="pressure-wave")))["completed"]
    assert (c.ok, c.detail) == (True, "2/2 completed (2 requests, 0 cancelled on purpose)")


def test_token_counts_that_hold_name_no_request_even_beside_an_unanswered_one():
    cs = by_name(wave_checks(sc(), obs(), wave([rec(0), rec(1, outcome="timeout")], kind="pressure-wave")))
    assert cs["completed"].requests == ("w-1",)
    c = cs["token-counts"]
    assert (c.ok, c.detail, c.requests) == (True, "every answer has its expected token count", ())


@pytest.mark.parametrize("params", [{}, {"parity_fraction": 0}, {"parity_fraction": None}])
def test_a_wave_that_sampled_no_parity_has_no_parity_check(params):
    assert "parity" not in by_name(wave_checks(sc(), obs(), wave([rec(0)], kind="pressure-wave", params=params)))
    cut = wave([rec(0, outcome="cancelled", planned_cancel="between", cancel_point="between")],
               kind="pressure-wave", params=params)
    assert "parity" not in by_name(wave_checks(sc(), obs(), cut))
    assert by_name(wave_checks(sc(), obs(), cut))["token-counts"].ok is None  # the all-cancelled branch


# -------------------------------------------------------------------------------------------------
# A wave's no-stall check when an instance's /metrics was never read during the wave
# (rig/judge/wave_checks.py, rig/observe/timeline.py): "no instance froze" cannot be said of an
# instance nobody looked at, so the check is "not checked" and a wave that requires it is not PASS;
# a conclusive unexplained freeze elsewhere still FAILs.

def _no_stall(w):
    return next(c for c in wave_checks(sc(), full_obs(), w) if c.name == "no-stall")


def test_an_instance_never_sampled_leaves_no_stall_not_checked_and_the_wave_not_pass():
    w = healthy_wave(samples={"prefill": 12, "decode": 0}, scrape_errors=12)
    c = _no_stall(w)
    assert c.ok is None
    assert c.detail == "not checked: decode never sampled during the wave (12 /metrics scrape(s) failed)"
    v = judge_wave(sc(), full_obs(), w)
    assert v.verdict == "ERROR" and "no-stall not checked: decode never sampled" in v.reason


def test_every_instance_sampled_reads_ok_and_an_unexplained_freeze_still_fails():
    assert _no_stall(healthy_wave(samples={"prefill": 3, "decode": 3})).ok is True
    assert _no_stall(healthy_wave()).ok is True  # a result from before samples were counted
    frozen = healthy_wave(samples={"prefill": 0, "decode": 9}, stalls=[dict(stall(), explained="")])
    c = _no_stall(frozen)
    assert c.ok is False and "UNEXPLAINED" in c.detail


def test_an_explained_freeze_beside_an_unsampled_instance_is_not_checked():
    explained = dict(stall(), explained="P's pool held by leases")
    c = _no_stall(healthy_wave(samples={"prefill": 4, "decode": 0}, stalls=[explained]))
    assert c.ok is None and c.detail.startswith("not checked: decode never sampled during the wave")
    assert "explained: P's pool held by leases" in c.detail


def test_the_sampler_counts_snapshots_per_instance_and_not_failed_scrapes():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.port == 8200:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    async def go() -> TimelineSampler:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            s = TimelineSampler(http, [Endpoint("prefill", "http://127.0.0.1:8100"),
                                       Endpoint("decode", "http://127.0.0.1:8200")], None, "w")
            await s.sample_once()
            await s.sample_once()
            return s

    s = asyncio.run(go())
    assert s.samples == {"prefill": 2, "decode": 0} and s.scrape_errors == 2


def test_every_unsampled_instance_is_named():
    c = _no_stall(healthy_wave(samples={"prefill": 0, "decode": 0}, scrape_errors=6))
    assert c.detail == "not checked: decode, prefill never sampled during the wave (6 /metrics scrape(s) failed)"

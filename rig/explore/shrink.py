"""Shrinking a failing action to a minimal one that still shows the same signature.

Delta debugging (Zeller and Hildebrandt's ddmin) over the action's steps, then a greedy pass over
each remaining step's parts: ``count`` to 1, one prompt per request, each drawn request field
dropped, the completions endpoint, no start rule, ``max_tokens`` and ``prompt_tokens`` lowered (to
the grammar's smaller edge lengths first). A candidate is kept when ``test(candidate)`` says it
still fails *the same way* (the caller compares signatures); every candidate validates as the
scenario language does (:meth:`rig.explore.grammar.Action.sequence`) or is skipped.

Pure: ``test`` is the only effect, and ``budget`` bounds how often it is called (each call is a
live run of the candidate). Tested on synthetic predicates (tests/test_explore_shrink.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from rig.config.faults import Fault, Trigger
from rig.config.sequence import Step
from rig.explore.grammar import Action, Topology
from rig.explore.refusals import problems

T = TypeVar("T")


class Budget:
    """Counts calls of a test; ``spent()`` True once ``limit`` calls were made."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def spent(self) -> bool:
        """True when no call is left."""
        return self.used >= self.limit


def ddmin(items: Sequence[T], test: Callable[[list[T]], bool], budget: Budget) -> list[T]:
    """A 1-minimal sublist of ``items`` (order kept) for which ``test`` holds, assuming it holds
    for ``items``; stops early, returning the smallest found, when ``budget`` is spent."""
    cur, n = list(items), 2
    while len(cur) >= 2 and not budget.spent():
        chunk = max(1, len(cur) // n)
        subsets = [cur[i:i + chunk] for i in range(0, len(cur), chunk)]
        progressed = False
        for i, sub in enumerate(subsets):
            if budget.spent():
                break
            complement = [x for j, s in enumerate(subsets) if j != i for x in s]
            for cand in (sub, complement) if len(subsets) > 2 else (sub,):
                if not cand or budget.spent():
                    continue
                budget.used += 1
                if test(cand):
                    cur, n, progressed = cand, max(2 if cand is sub else n - 1, 2), True
                    break
            if progressed:
                break
        if not progressed:
            if n >= len(cur):
                break
            n = min(len(cur), 2 * n)
    return cur


def with_steps(action: Action, steps: list[Step], topo: Topology | None = None) -> Action | None:
    """``action`` with only ``steps``; a start rule naming a dropped step is dropped too (that
    step then starts at the beginning). None when the result does not validate, or (given
    ``topo``) carries a request the rig itself makes invalid (rig.explore.refusals.problems)."""
    ids = {s.id for s in steps}
    fixed = [s if s.start is None or s.start.after in ids else s.model_copy(update={"start": None}) for s in steps]
    return _valid(action.model_copy(update={"steps": fixed}), topo)


def _valid(action: Action, topo: Topology | None = None) -> Action | None:
    """``action`` when it validates and (given ``topo``) has no rig-made problem, else None: e.g.
    a candidate that drops ``seed`` but keeps ``temperature`` is never run."""
    try:
        Action.model_validate(action.model_dump())
        action.sequence()
    except (ValidationError, ValueError):
        return None
    if topo is not None and problems(action, topo):
        return None
    return action


def step_variants(step: Step, topo: Topology) -> list[Step]:
    """Simpler versions of ``step``, simplest change first (each differs in one part)."""
    out: list[Step] = []

    def upd(**kw: Any) -> None:
        with contextlib.suppress(ValidationError):
            out.append(Step.model_validate({**step.model_dump(), **kw}))

    if step.count > 1:
        upd(count=1)
    if step.route in ("pd-retry", "pd-swallow-cancel"):
        # the plain P/D route: a failure that stays without the retry (or the swallowed cancel)
        # is not the hop ordering's
        upd(route="pd", retry_after_ms=None, cancel_after_ms=None)
    if step.cancel_after_ms is not None:
        upd(cancel_after_ms=None)
        lo, hi = step.cancel_after_ms
        if hi > lo:
            upd(cancel_after_ms=(lo, lo))
            upd(cancel_after_ms=(hi, hi))
    if step.start is not None:
        upd(start=None)
        if step.start.after_ms:
            upd(start={**step.start.model_dump(), "after_ms": 0})
    req = step.request.model_dump() if step.request else None
    if req is not None:
        upd(request=None)
        if req.get("prompts", 1) > 1:
            upd(request={**req, "prompts": 1})
        if req.get("endpoint", "completions") != "completions":
            upd(request={**req, "endpoint": "completions"})
        for hop in ("all", "decode", "prefill", "reference"):
            for k in req.get(hop) or {}:
                upd(request={**req, hop: {kk: v for kk, v in req[hop].items() if kk != k}})
    for m in sorted({1, step.max_tokens // 2} - {step.max_tokens}):
        if 1 <= m < step.max_tokens:
            upd(max_tokens=m)
    smaller = [n for n in topo.edge_lengths() if n < step.prompt_tokens] if not step.same_as else []
    for n in ([smaller[0], smaller[len(smaller) // 2], smaller[-1]] if smaller else []):
        upd(prompt_tokens=n)
    seen: set[str] = set()
    unique = []
    for v in out:  # pydantic models are not hashable: drop duplicates by their JSON
        key = v.model_dump_json()
        if key not in seen:
            seen.add(key)
            unique.append(v)
    return unique


def action_variants(action: Action, topo: Topology | None = None) -> list[Action]:
    """Simpler versions of ``action`` as a whole, simplest first: without its prompt resources
    (the steps send fresh prompts of the same lengths: the earlier send was not needed); for a
    nemesis, the step without the nemesis (a plain P/D request: the fault was not needed), then
    fewer requests under the fault (a trigger that needs the dropped requests is moved to request
    0's exchange). [] when there is nothing of that to drop."""
    out: list[Action | None] = []
    if action.resources:
        fresh = [s.model_copy(update={"same_as": None, "head_of": None}) for s in action.steps]
        out.append(_valid(action.model_copy(update={"resources": [], "steps": fresh}), topo))
    nem = action.nemesis
    if nem is None:
        return [a for a in out if a is not None]
    out.append(_valid(action.model_copy(update={"nemesis": None, "why": ""}), topo))
    for n in range(1, nem.requests):
        faults = [f if f.trigger.k is None or f.trigger.k < n else f.model_copy(update={"trigger": _own_event(f)})
                  for f in nem.faults]
        with contextlib.suppress(ValidationError):
            out.append(_valid(action.model_copy(update={"nemesis": nem.model_validate(
                {**nem.model_dump(), "requests": n, "faults": [f.model_dump() for f in faults]})}), topo))
    return [a for a in out if a is not None]


def _own_event(f: Fault) -> Trigger:
    """The trigger on request 0's own exchange for a fault aimed at an instance."""
    return Trigger(event="decode-sent") if f.target == "decode" else Trigger(event="prefill-answered")


@dataclass
class ShrinkResult:
    """The minimal action found and the number of test runs it took."""

    action: Action
    runs: int


def shrink(action: Action, test: Callable[[Action], bool], topo: Topology, budget: int = 30) -> ShrinkResult:
    """The smallest action found that ``test`` still holds for (same signature), within
    ``budget`` calls of ``test``: ddmin over steps, then :func:`step_variants` greedily until no
    variant holds (a fixpoint) or the budget is spent."""
    b = Budget(budget)

    def test_steps(steps: list[Step]) -> bool:
        cand = with_steps(action, steps, topo)
        return cand is not None and test(cand)

    best: Action = with_steps(action, ddmin(action.steps, test_steps, b), topo) or action
    for alt in action_variants(best, topo):  # the shrinker may drop the nemesis, or send fewer requests under it
        if b.spent():
            break
        b.used += 1
        if test(alt):
            best = alt
            break
    changed = True
    while changed and not b.spent():
        changed = False
        for i, step in enumerate(best.steps):
            for v in step_variants(step, topo):
                if b.spent():
                    break
                cand = with_steps(best, [*best.steps[:i], v, *best.steps[i + 1:]], topo)
                if cand is None:
                    continue
                b.used += 1
                if test(cand):
                    best, changed = cand, True
                    break
            if changed:
                break
    return ShrinkResult(best, b.used)

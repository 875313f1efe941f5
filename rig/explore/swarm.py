"""Swarm testing: each segment of an exploration draws only a random subset of the generator's features.

Groce, Zhang, Eide, Chen and Regehr, "Swarm testing" (ISSTA 2012): a random generator that may
draw every feature in every test makes each test a mix of all of them, so a feature that *hides* a
bug (a cancel that ends the request before the faulty path, a burst that changes the timing, a
field that sends the request elsewhere) is always present beside the one that reaches it;
configurations that leave a random half of the features out find more distinct failures than the
all-features default. Here the exploration is cut into segments of ``--swarm-every N`` actions per
topology; segment ``k`` (numbered over the whole exploration) keeps each feature the flags allow
with probability :data:`KEEP` (``random.Random(f"{seed}/swarm/{k}")``, one coin per feature of
:data:`CATALOGUE` in its order, whatever the flags: the same seed gives the same coins).

The features (:func:`catalogue`): each route of rig.explore.grammar.ROUTE_WEIGHTS (``route:pd``,
...: the routes of an action's own steps, its prompt resources' and its background bursts'), each
motif of MOTIF_WEIGHTS (``motif:lease-hold``, ...), ``cancel``, ``resource`` (prompt reuse across
actions), ``sample`` (seeded sampling, rig.explore.sampling), ``background``
(rig.explore.background), the request fields drawn from vLLM's request models by group
(:data:`FIELD_GROUPS`: ``fields:logprobs``, ``fields:penalties``, ``fields:shape``,
``fields:other``) and, with ``--nemesis-every``, each nemesis kind of NEMESIS_WEIGHTS
(``nemesis:sigstop-prefill``, ...; a segment without one has no nemesis phase: those slots are
plain actions). A nemesis phase's own request is a P/D request whatever the routes kept (it is the
fault kind's).

A subset only removes: a removed feature's weight or share is 0 (Generator.narrowed), so what the
flags turned off stays off, and the goal-biased draws (Generator.steers) skip a goal whose hint
needs a removed feature. A subset always keeps a route that is answered: when the coins leave only
``pd-abandon`` or no route, ``route:pd`` is put back (the first answered route the flags allow
when they forbid pd). The first segment of each topology keeps every feature (``full``): an
exploration no longer than ``N`` actions per topology draws what it drew without swarm, and each
deployment meets the all-features default first.

Each action's history line carries its segment's subset (:meth:`Subset.to_json`), so ``--replay``
reports the same segments; :class:`SwarmLog` gathers explore.md's "Swarm segments" and "Swarm
features" tables (actions and distinct findings with each feature on and off).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from rig.explore.generate import Generator
from rig.explore.grammar import MOTIF_WEIGHTS, NEMESIS_WEIGHTS, ROUTE_WEIGHTS

KEEP = 0.5  # chance that a feature is kept in a segment (Groce et al.: each feature on with 1/2)
SHARES = ("cancel", "resource", "sample", "background")  # features that are a share of the Generator
# Request fields by what they change (the fields drawn are vLLM's request models' minus
# rig.explore.generate.EXCLUDED); a field of no group is in "other".
FIELD_GROUPS: dict[str, frozenset[str]] = {
    # log-probabilities of the output and of the prompt (prompt_logprobs makes D recompute the prompt)
    "logprobs": frozenset({"logprobs", "prompt_logprobs", "top_logprobs"}),
    # what may come next: penalties, top-k, allowed tokens, min_tokens (holds back EOS and stops)
    "penalties": frozenset({"frequency_penalty", "presence_penalty", "repetition_penalty", "top_k",
                            "allowed_token_ids", "min_tokens", "bad_words"}),
    # the answer's shape: choices, echo, token IDs, special tokens, reasoning
    "shape": frozenset({"n", "echo", "return_token_ids", "return_tokens_as_token_ids", "skip_special_tokens",
                        "spaces_between_special_tokens", "include_reasoning", "reasoning_effort"}),
}
ANSWERED = tuple(r for r in ROUTE_WEIGHTS if r != "pd-abandon")  # routes whose request is answered


def field_group(name: str) -> str:
    """The feature of request field ``name``: ``fields:<group>`` of :data:`FIELD_GROUPS`, else ``fields:other``."""
    return "fields:" + next((g for g, names in FIELD_GROUPS.items() if name in names), "other")


def catalogue() -> tuple[str, ...]:
    """Every feature, in the order the coins are drawn (new features go last: earlier coins stay put)."""
    return (*(f"route:{r}" for r in ROUTE_WEIGHTS), *(f"motif:{m}" for m in MOTIF_WEIGHTS), *SHARES,
            *(f"fields:{g}" for g in (*FIELD_GROUPS, "other")), *(f"nemesis:{k}" for k in NEMESIS_WEIGHTS))


CATALOGUE = catalogue()


@dataclass(frozen=True)
class Subset:
    """The features of segment ``segment``: ``on`` (kept) out of ``available`` (what the flags and
    the topology let the generator draw), both in :data:`CATALOGUE` order; ``full``: the first
    segment of a topology (every available feature on); ``topology``: its name (the variant, else
    ``prefill+decode``); ``every``: the segments' length (actions, ``--swarm-every``)."""

    segment: int
    on: tuple[str, ...]
    available: tuple[str, ...]
    full: bool = False
    topology: str = ""
    every: int = 0

    @property
    def off(self) -> tuple[str, ...]:
        """The available features this segment removed."""
        return tuple(f for f in self.available if f not in self.on)

    def kept(self, prefix: str) -> set[str]:
        """The names of the kept features of kind ``prefix`` (``route``, ``motif``, ``fields``, ``nemesis``)."""
        return {f.split(":", 1)[1] for f in self.on if f.startswith(prefix + ":")}

    def nemesis_kinds(self) -> list[str]:
        """The nemesis kinds kept (NEMESIS_WEIGHTS order; [] when none: no nemesis phase in the segment)."""
        return [k for k in NEMESIS_WEIGHTS if f"nemesis:{k}" in self.on]

    def to_json(self) -> dict[str, Any]:
        """The history line's ``swarm`` entry."""
        return {"segment": self.segment, "on": list(self.on), "available": list(self.available), "full": self.full,
                "topology": self.topology, "every": self.every}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Subset:
        """The subset a history line recorded (:meth:`to_json`); KeyError / TypeError for another mapping."""
        return cls(segment=int(data["segment"]), on=tuple(data["on"]), available=tuple(data["available"]),
                   full=bool(data.get("full")), topology=str(data.get("topology") or ""),
                   every=int(data.get("every") or 0))


def available_features(gen: Generator, nemesis: list[str] | None) -> tuple[str, ...]:
    """The features ``gen`` (the flags' generator of one topology) can draw, :data:`CATALOGUE`
    order: its routes and motifs, the shares above 0, the field groups with a field on some
    endpoint, and the nemesis kinds ``nemesis`` ([]: no nemesis phases; None: every kind)."""
    fields = {field_group(k) for per in gen.fields.values() for k in per}
    shares = {s for s in SHARES if getattr(gen, f"{s}_share") > 0}
    kinds = set(NEMESIS_WEIGHTS) if nemesis is None else set(nemesis)
    have = ({f"route:{r}" for r in gen.routes} | {f"motif:{m}" for m in gen.motifs} | shares | fields
            | {f"nemesis:{k}" for k in kinds})
    return tuple(f for f in CATALOGUE if f in have)


def draw_subset(seed: int, segment: int, available: tuple[str, ...], full: bool = False,
                topology: str = "", every: int = 0) -> Subset:
    """Segment ``segment``'s subset of ``available`` (module docstring): one coin per feature of
    :data:`CATALOGUE` from ``random.Random(f"{seed}/swarm/{segment}")``, a feature kept on a coin
    below :data:`KEEP`; an answered route put back when none is kept; every feature when ``full``
    (``topology`` and ``every`` are recorded as given)."""
    rng = random.Random(f"{seed}/swarm/{segment}")
    coins = {f: rng.random() < KEEP for f in CATALOGUE}
    on = {f for f in available if full or coins[f]}
    routes = [f"route:{r}" for r in ANSWERED if f"route:{r}" in available]
    # a swallowed cancel is drawn only with cuts on (rig.explore.generate.Generator._orderings)
    drawable = {r for r in routes if r != "route:pd-swallow-cancel" or "cancel" in on}
    if routes and not on & drawable:
        on.add("route:pd" if "route:pd" in routes else routes[0])
    return Subset(segment, tuple(f for f in CATALOGUE if f in on), available, full, topology, every)


def narrow(gen: Generator, subset: Subset) -> Generator:
    """``gen`` drawing only ``subset``'s features (``gen`` itself for a full subset)."""
    if subset.full:
        return gen
    groups = subset.kept("fields")
    fields = {ep: {k: t for k, t in per.items() if field_group(k).split(":", 1)[1] in groups}
              for ep, per in gen.fields.items()}
    return gen.narrowed(subset.kept("route"), subset.kept("motif"), {s for s in SHARES if s not in subset.on}, fields)


class SwarmLog:
    """The swarm rows of the report: every action's segment and the mechanism key of its violation
    (None: none, or not judged), in the order they ran."""

    def __init__(self) -> None:
        self.subsets: dict[int, Subset] = {}
        self.actions: list[tuple[int, int, str | None]] = []  # (segment, action index, mechanism key)

    def add(self, subset: Subset, index: int, key: str | None) -> None:
        """Action ``index`` ran in ``subset``'s segment; ``key``: its violation's mechanism key."""
        self.subsets.setdefault(subset.segment, subset)
        self.actions.append((subset.segment, index, key))

    def segments(self) -> list[dict[str, Any]]:
        """One row per segment: segment, topology, its actions (count, first and last index),
        full, the features on and off, the distinct failures (mechanism keys) seen in it."""
        rows = []
        for seg, sub in self.subsets.items():
            mine = [(i, k) for s, i, k in self.actions if s == seg]
            rows.append({"segment": seg, "topology": sub.topology, "actions": len(mine), "first": mine[0][0],
                         "last": mine[-1][0], "full": sub.full, "on": list(sub.on), "off": list(sub.off),
                         "failures": sorted({k for _, k in mine if k})})
        return rows

    def features(self) -> list[dict[str, Any]]:
        """One row per feature available in some segment: actions with it on / off (off: removed
        by swarm, not by the flags) and the distinct findings (mechanism keys) seen with it on / off."""
        names = [f for f in CATALOGUE if any(f in s.available for s in self.subsets.values())]
        rows = []
        for f in names:
            on = [k for s, _, k in self.actions if f in self.subsets[s].on]
            off = [k for s, _, k in self.actions if f in self.subsets[s].off]
            rows.append({"feature": f, "actions_on": len(on), "actions_off": len(off),
                         "findings_on": sorted({k for k in on if k}), "findings_off": sorted({k for k in off if k})})
        return rows

    def to_json(self) -> dict[str, Any]:
        """The report's ``swarm`` entry ({} when no action ran in a segment)."""
        if not self.actions:
            return {}
        every = next(iter(self.subsets.values())).every
        return {"every": every, "segments": self.segments(), "features": self.features()}

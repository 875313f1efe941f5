"""Background traffic: a second stream of drawn requests overlapping an action's own steps.

A deployment serves more than one client: while a request is prefilled, pulled and decoded, other
requests keep P and D busy, fill their pools and queue behind their scheduler caps. A share of the
actions (:data:`BACKGROUND_SHARE`) gets one or two *background* steps (ids ``bg0``, ``bg1``): a
burst of distinct prompts straight to D, straight to P or over both, sent at the action's start
or just after one of its own steps was sent, so they overlap it. A burst exceeds every scheduler
cap of the instances it reaches (the topology's ``caps``, rig.explore.topologies.caps_of):
``max_num_seqs + 1`` requests and more prompt tokens in all than ``max_num_batched_tokens``
(vllm/v1/core/sched/scheduler.py: requests beyond the caps wait); without a drawn cap, bursts of
:data:`DEFAULT_BURST`. Background steps are steps of the scenario language like the others: their
answers are compared with the reference, the shrinker drops them when the failure does not need
them, and the emitted YAML carries them. They are never cancelled, never sampled, and start only
on ``sent`` (an event every step reaches).

Drawn from a stream of its own (``{seed}/{index}/background``): the rest of an action is what it
was without it.
"""

from __future__ import annotations

import random

from rig.config.base import MAX_SENT_TOGETHER
from rig.config.sequence import StartRule, Step
from rig.explore.grammar import Topology

BACKGROUND_SHARE = 0.2
BACKGROUND_ROUTES: dict[str, float] = {"decode": 2.0, "pd": 2.0, "prefill": 1.0}
BACKGROUND_DELAYS_MS = (0.0, 5.0, 20.0)
BACKGROUND_MAX_TOKENS = (4, 8)
DEFAULT_BURST = 4  # requests of a burst when no cap was drawn (MAX_COUNT + 1 of the grammar)
MAX_BURST = 16  # a burst larger than this is not drawn (on a CPU box each request takes seconds)
PREFIX = "bg"
SIDES = {"decode": ("decode",), "prefill": ("prefill",), "pd": ("prefill", "decode")}


def is_background(step: Step) -> bool:
    """True for a background step (its id starts with :data:`PREFIX`)."""
    return step.id.startswith(PREFIX)


def burst_shape(topo: Topology, route: str, rng: random.Random) -> tuple[int, int, int]:
    """``(count, prompt_tokens, max_tokens)`` of a burst over ``route`` that exceeds every cap of
    the sides it reaches: more requests than each ``max_num_seqs``, more prompt tokens in all than
    each ``max_num_batched_tokens``, within ``max_model_len`` and :data:`MAX_BURST`."""
    caps = {k.split(".", 1)[1]: v for k, v in topo.caps.items() if k.split(".", 1)[0] in SIDES[route]}
    m = rng.choice(BACKGROUND_MAX_TOKENS)
    lengths = [n for n in topo.edge_lengths() if n + m <= topo.max_model_len] or [1]
    n = rng.choice(lengths[len(lengths) // 2:])  # the longer half: tokens that fill the batch
    count = DEFAULT_BURST
    if "max_num_seqs" in caps:
        count = max(count, caps["max_num_seqs"] + 1)
    if "max_num_batched_tokens" in caps:
        count = max(count, caps["max_num_batched_tokens"] // n + 1)
    return min(count, MAX_BURST, MAX_SENT_TOGETHER), n, m


def over_caps(topo: Topology, step: Step) -> bool:
    """True when ``step`` sends more than every cap of the sides it reaches (no cap: always)."""
    sides = SIDES.get(step.route, ("prefill", "decode"))
    for key, cap in topo.caps.items():
        side, name = key.split(".", 1)
        if side not in sides:
            continue
        if name == "max_num_seqs" and step.count <= cap:
            return False
        if name == "max_num_batched_tokens" and step.count * step.prompt_tokens <= cap:
            return False
    return True


def background_steps(rng: random.Random, topo: Topology, steps: list[Step],
                     routes: dict[str, float] | None = None) -> list[Step]:
    """One or two background steps overlapping ``steps`` (the module docstring), over ``routes``
    (route -> weight; default :data:`BACKGROUND_ROUTES`)."""
    routes = BACKGROUND_ROUTES if routes is None else routes
    out = []
    for j in range(rng.choices((1, 2), (3, 1))[0]):
        route = rng.choices(list(routes), list(routes.values()))[0]
        count, n, m = burst_shape(topo, route, rng)
        start = None
        if rng.random() < 0.5:
            start = StartRule(after=rng.choice(steps).id, event="sent", after_ms=rng.choice(BACKGROUND_DELAYS_MS))
        out.append(Step(id=f"{PREFIX}{j}", route=route, prompt_tokens=n, max_tokens=m, count=count, start=start))
    return out


def maybe_background(seed: int, index: int, topo: Topology, steps: list[Step], share: float,
                     routes: dict[str, float] | None = None) -> list[Step]:
    """``steps`` followed by background steps over ``routes`` (default :data:`BACKGROUND_ROUTES`)
    for ``share`` of the actions (stream ``{seed}/{index}/background``); ``steps`` unchanged otherwise."""
    rng = random.Random(f"{seed}/{index}/background")
    if share <= 0 or rng.random() >= share:
        return steps
    return [*steps, *background_steps(rng, topo, steps, routes)]


"""Sampled requests with a fixed seed: ``temperature > 0`` and ``seed`` on a hop, one to three choices.

Greedy decoding is what the reference comparison was built on; seeded sampling is compared the
same way, because vLLM's sampler draws from a generator seeded per request (vllm/v1/sample/sampler.py,
``SamplingParams.seed``; a child of ``n > 1`` gets its own seed, vllm/v1/engine/parallel_sampling.py):
the non-disaggregated reference asked with the same fields must answer the same tokens per choice,
whatever computed the prompt's KV (pulled from P, D's cache, recomputed).

Where the sampling goes (``hop``, drawn with :data:`SAMPLE_HOPS`):

- ``all``: every hop and the reference carry ``temperature`` and ``seed``; ``n`` goes to the decode
  hop and the reference only (``n > 1`` on P's hop is the n-prefill motif: P's answer then names
  one child's KV, vLLM PR #38900, a known issue of its own);
- ``decode``: D's hop and the reference (P's hop stays greedy: it answers one token D does not use);
- ``prefill``: P's hop only, one choice; it matters where a router appends P's first token to D's
  prompt (the reference is asked for the prompt D got).

Not drawn when the decode runs speculative decoding (``num_speculative_tokens`` > 0): its
rejection sampler consumes the seeded generator otherwise than the reference's plain sampler, so a
correct D answers other tokens than the same-seed reference (rig.explore.generate.Generator).

A one-hop route (decode, prefill) sends its hop with the decode fields, so ``prefill`` there is
``all``. ``n > 1`` is not drawn on a streamed hop (the fake server streams one choice). Every
result passes rig.explore.refusals (a temperature always has its seed). Drawn from a stream of its
own (``{seed}/{index}/sample``): an action's other parts are what they were without it.
"""

from __future__ import annotations

import random
from typing import Any

from rig.config.request_fields import RequestFields
from rig.config.sequence import Step

SAMPLE_SHARE = 0.15  # share of actions with one sampled step
TEMPERATURES = (0.7, 1.0)
SAMPLE_HOPS: dict[str, float] = {"all": 2.0, "decode": 2.0, "prefill": 1.0}
CHOICES = (1, 2, 3)
CHOICE_WEIGHTS = (2.0, 2.0, 1.0)
SEED_RANGE = 1 << 16


def is_sampled(step: Step) -> bool:
    """True when a hop of ``step`` (or its reference) asks for ``temperature > 0``."""
    return any(float(step.fields_for(h).get("temperature") or 0) > 0 for h in ("prefill", "decode", "reference"))


def choices_of(step: Step) -> int:
    """Choices the decode hop asks for (``n``, 1 without)."""
    return int(step.fields_for("decode").get("n") or 1)


def sample_step(rng: random.Random, step: Step) -> Step:
    """``step`` with seeded sampling on a hop drawn from :data:`SAMPLE_HOPS` (module docstring);
    its other fields kept. Consumes a fixed count of random numbers from ``rng``."""
    hop = rng.choices(list(SAMPLE_HOPS), list(SAMPLE_HOPS.values()))[0]
    temp, seed = rng.choice(TEMPERATURES), rng.randrange(SEED_RANGE)
    n = rng.choices(CHOICES, CHOICE_WEIGHTS)[0]
    req: dict[str, Any] = step.request.model_dump(mode="json", exclude_defaults=True) if step.request else {}
    one_hop = step.route in ("decode", "prefill")
    if hop == "prefill" and one_hop:
        hop = "all"
    streamed = any(bool(req.get(h, {}).get("stream")) for h in ("all", "decode"))
    if streamed or hop == "prefill" or step.prompts > 1 and one_hop:
        n = 1
    base = {"temperature": temp, "seed": seed}
    hops = {"all": ("all",), "decode": ("decode", "reference"), "prefill": ("prefill",)}[hop]
    for h in hops:
        req[h] = {**req.get(h, {}), **base}
    if n > 1:
        for h in ("decode", "reference"):
            req[h] = {**req.get(h, {}), "n": n}
    return step.model_copy(update={"request": RequestFields.model_validate(req)})


def maybe_sample(seed: int, index: int, steps: list[Step], share: float) -> list[Step]:
    """``steps`` with one of them (drawn among those that send a prompt to be answered) sampled,
    for ``share`` of the actions (stream ``{seed}/{index}/sample``); unchanged otherwise."""
    rng = random.Random(f"{seed}/{index}/sample")
    if share <= 0 or rng.random() >= share:
        return steps
    able = [i for i, s in enumerate(steps) if s.route != "pd-abandon" and not s.repeat_of]
    if not able:
        return steps
    i = rng.choice(able)
    return [sample_step(rng, s) if j == i else s for j, s in enumerate(steps)]

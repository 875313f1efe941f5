"""The explorer's action grammar, as data.

An *action* is what the explorer fires at one live deployment in one go: one to three *steps* in
the rig's own scenario language (:class:`rig.config.sequence.Step`: a route, an exact prompt
length, ``max_tokens``, ``count`` distinct prompts sent together, request fields per hop, a start
rule after an earlier step's event). So an action validates through the same pydantic models as a
hand-written scenario, and the scenario it runs as (:func:`rig.explore.emit.scenario_of`) is the
YAML that a failure is emitted as: what ran is what reproduces.

The grammar's rules (which routes, which lengths, which request fields, which timings) are the
data below and :class:`Topology` (the deployment's knobs that make a length an edge). Lengths are
biased to the edges that matter on a decode pool (vllm/v1/core/kv_cache_utils.py cdiv arithmetic):
``k*block_size - 1``, ``k*block_size``, ``k*block_size + 1``, ``max_model_len - 1`` and the prompt
that, with its completion, fills the usable blocks exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from rig.config.base import StrictModel
from rig.config.sequence import SequenceConfig, Step

# Route -> weight when a step is drawn (rig.config.sequence.ROUTE_EVENTS names the routes).
ROUTE_WEIGHTS: dict[str, float] = {"pd": 6.0, "decode": 1.5, "prefill": 1.0, "pd-abandon": 0.5}
# Where a later step starts: the events of the earlier step it may follow, and the delays drawn (ms).
START_EVENTS = ("sent", "prefill-answered", "decode-sent", "answered")
START_DELAYS_MS = (0.0, 5.0, 20.0, 100.0)
MAX_STEPS = 3
MAX_COUNT = 3  # distinct prompts of one step sent together (a burst)
MAX_TOKENS_CHOICES = (1, 2, 4, 8)
ENDPOINT_WEIGHTS: dict[str, float] = {"completions": 8.0, "chat": 1.0}


@dataclass(frozen=True)
class Topology:
    """The deployment's knobs the grammar needs: ``block_size`` (tokens), ``max_model_len``
    (tokens), ``usable_blocks`` of the decode instance (``num_gpu_blocks_override - 1``; None when
    vLLM sized the pool itself), ``spec_tokens`` (its ``num_speculative_tokens``, 0 without spec
    decode)."""

    prefill: str
    decode: str
    block_size: int
    max_model_len: int
    usable_blocks: int | None
    spec_tokens: int = 0

    def edge_lengths(self) -> list[int]:
        """Prompt lengths at the edges, sorted, each in ``[1, max_model_len - 1]``:
        ``k*bs - 1``, ``k*bs``, ``k*bs + 1`` for every k, ``max_model_len - 1`` and the prompt that
        fills the usable blocks with one completion token (``usable*bs - 1``)."""
        bs, mml = self.block_size, self.max_model_len
        out = {mml - 1}
        for k in range(1, mml // bs + 1):
            out |= {k * bs - 1, k * bs, k * bs + 1}
        if self.usable_blocks:
            out.add(self.usable_blocks * bs - 1)
        return sorted(n for n in out if 1 <= n <= mml - 1)

    def blocks_needed(self, prompt_tokens: int, max_tokens: int) -> int:
        """Blocks one request needs on D at its end: ``cdiv(min(n + max_tokens, mml), bs)``."""
        return math.ceil(min(prompt_tokens + max_tokens, self.max_model_len) / self.block_size)


class Action(StrictModel):
    """One action: the steps fired together (a :class:`rig.config.sequence.SequenceConfig`'s
    rules hold: unique ids, start rules naming earlier steps and events their route produces).
    ``index`` is the action's position in the history; ``why`` names the coverage goal that
    biased it, if any."""

    index: int = Field(ge=0)
    steps: list[Step] = Field(min_length=1)
    why: str = ""

    def sequence(self) -> SequenceConfig:
        """The steps as a validated :class:`SequenceConfig` (raises pydantic's ValidationError)."""
        return SequenceConfig(steps=self.steps, idle_margin_s=2)

    def requests(self) -> int:
        """Requests the action sends (``count`` x prompts per request, summed over steps)."""
        return sum(s.count * s.prompts for s in self.steps)

    def describe(self) -> str:
        """One line: each step's :meth:`Step.describe` joined by '; '."""
        return "; ".join(s.describe() for s in self.steps)


def check_fits(action: Action, topo: Topology) -> None:
    """Raise ValueError naming the step when a step's prompt + ``max_tokens`` exceeds
    ``max_model_len`` (the rig's config refuses such a scenario, rig.config.topology)."""
    for s in action.steps:
        if s.prompt_tokens + s.max_tokens > topo.max_model_len:
            raise ValueError(f"action {action.index} step {s.id}: prompt_tokens {s.prompt_tokens} + max_tokens "
                             f"{s.max_tokens} > max_model_len {topo.max_model_len}; lower max_tokens")


def step_dict(step: Step) -> dict[str, Any]:
    """A step as the YAML mapping of the scenario language (defaults left out)."""
    return step.model_dump(mode="json", exclude_defaults=True)

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

from pydantic import Field, model_validator

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
# Motifs: whole actions of a known shape whose parameters are drawn (rig.explore.generate
# Generator._motif), each reaching a P/D code path a step drawn part by part rarely reaches:
# - lease-hold: one P/D request whose decode hop is held ``hold_s`` (a factor of the lease) while
#   direct requests cycle P's KV pool (the edge kind's hold_between_s / flush_prefill); past the
#   lease P may reuse the blocks D is about to read (nixl base_scheduler.py lease reaper);
# - n-prefill: ``n: 2`` on the prefill hop only (sampled: vLLM 0.32.0 refuses n > 1 with greedy
#   sampling), D's hop greedy: P's answer names one child's KV (vLLM PR #38900);
# - prompts: several token-ID prompts in one completions request over P and D (P's answer carries
#   one kv_transfer_params for the batch, vllm entrypoints/openai/completion/serving.py);
# - append-first-token: a router that appends P's first token to D's prompt (vLLM PR #50558), after
#   a direct request that puts the prompt's first blocks in D's prefix cache, then the prompt D got
#   sent again (prompt reuse: repeat_of);
# - reuse: a prompt sent again, or extended, by a later step (repeat_of / prefix_of): D's prefix
#   cache serves the shared blocks.
MOTIF_WEIGHTS: dict[str, float] = {"lease-hold": 1.0, "n-prefill": 1.0, "prompts": 1.0, "append-first-token": 1.0,
                                   "reuse": 1.0}
MOTIF_SHARE = 0.25  # share of the actions not shaped by a goal that are a motif
HOLD_FACTORS = (0.5, 1.6, 2.0)  # hold_s = factor x the lease; drawn with HOLD_WEIGHTS
HOLD_WEIGHTS = (1.0, 2.0, 2.0)


@dataclass(frozen=True)
class Topology:
    """The deployment's knobs the grammar needs: ``block_size`` (tokens), ``max_model_len``
    (tokens), ``usable_blocks`` of the decode instance (``num_gpu_blocks_override - 1``; None when
    vLLM sized the pool itself), ``spec_tokens`` (its ``num_speculative_tokens``, 0 without spec
    decode), ``lease_s`` (P's ``kv_lease_duration``, s; vLLM's default 30)."""

    prefill: str
    decode: str
    block_size: int
    max_model_len: int
    usable_blocks: int | None
    spec_tokens: int = 0
    lease_s: float = 30.0

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
    biased it, if any. ``hold_s`` (s, 0 = none) holds the decode hop of a single P/D step that
    long after P answered, and ``flush_prefill`` cycles P's KV pool with direct requests during
    the hold: the edge kind's ``hold_between_s`` / ``flush_prefill`` (rig.config.scenarios), so
    both need one P/D step started at once. ValueError (pydantic's ValidationError) names the
    field otherwise."""

    index: int = Field(ge=0)
    steps: list[Step] = Field(min_length=1)
    why: str = ""
    hold_s: float = Field(0, ge=0, description="decode hop held this long after P answered (s)")
    flush_prefill: bool = Field(False, description="cycle P's pool with direct requests during the hold")

    @model_validator(mode="after")
    def _hold_on_one_pd_step(self) -> Action:
        if self.flush_prefill and not self.hold_s:
            raise ValueError(f"action {self.index}: flush_prefill needs hold_s > 0 (the flush runs during the hold)")
        if self.hold_s and (len(self.steps) != 1 or self.steps[0].route != "pd" or self.steps[0].start is not None
                            or self.steps[0].transform is not None):
            raise ValueError(f"action {self.index}: hold_s needs exactly one pd step started at once, without a "
                             "transform (it is the edge kind's hold_between_s); drop hold_s or the other steps")
        return self

    def sequence(self) -> SequenceConfig:
        """The steps as a validated :class:`SequenceConfig` (raises pydantic's ValidationError)."""
        return SequenceConfig(steps=self.steps, idle_margin_s=2)

    def requests(self) -> int:
        """Requests the action sends (``count`` x prompts per request, summed over steps)."""
        return sum(s.count * s.prompts for s in self.steps)

    def describe(self) -> str:
        """One line: each step's :meth:`Step.describe` joined by '; ', then the hold if any."""
        hold = f"; decode hop held {self.hold_s:g}s" + (" with P's pool flushed" if self.flush_prefill else "") \
            if self.hold_s else ""
        return "; ".join(s.describe() for s in self.steps) + hold


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

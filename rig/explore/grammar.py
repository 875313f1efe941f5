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

from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, model_validator

from rig.config.base import StrictModel
from rig.config.blocks import blocks_for
from rig.config.faults import Fault
from rig.config.sequence import SequenceConfig, Step

# Route -> weight when a step is drawn (rig.config.sequence.ROUTE_EVENTS names the routes).
ROUTE_WEIGHTS: dict[str, float] = {"pd": 6.0, "decode": 1.5, "prefill": 1.0, "pd-abandon": 0.5, "pd-retry": 0.75,
                                   "pd-swallow-cancel": 0.5}
# Hop orderings of other routers (rig.config.sequence): drawn in place of a pd step, from a random
# stream of their own (rig.explore.generate), so the rest of every action is what it was before they
# existed; their weight counts against pd's (a pd step becomes pd-retry with 0.75 / (6 + 0.75 + 0.5)).
# pd-retry's first decode attempt is closed RETRY_POINTS_MS after it was sent (0: before D's pull can
# end; 500: mostly after D answered, a connection dropped after the answer); pd-swallow-cancel's
# client closes at CANCEL_POINTS_MS, or at the pd step's own drawn cancel time.
ORDER_ROUTES = ("pd-retry", "pd-swallow-cancel")
RETRY_POINTS_MS = (0.0, 20.0, 100.0, 500.0)
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
# Cancels (the scenario language's cancel_after_ms, rig.config.sequence.Step): a share of the pd
# steps drawn part by part close their request at a drawn time after it was sent, on whichever hop
# is in flight then (0 ms: before P answers; later: during D's KV pull or decoding). A step of
# count > 1 sweeps [lo, hi] over its requests. The oracles that catch what a cancel breaks: the
# sequence kind's idle-after (P and D back to idle within kv_lease_duration + idle_margin_s: an
# abort lost on either side leaves a request running or its blocks held) and completed (a request
# that neither answered nor was cut).
CANCEL_SHARE = 0.2
CANCEL_POINTS_MS = (0.0, 5.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
# The nemesis (Jepsen's): a phase of its own between batches of actions, every ``nemesis_every``
# actions (ExploreSettings): a fault of the rig's fault scenarios (rig.config.faults.Fault) is
# injected on the exchange of ``requests`` P/D requests sent one after another, then healed
# (SIGCONT, or the killed instance restarted on its ports), then the liveness oracle: the fault
# kind's recovery (P and D idle within kv_lease_duration + heal_s, a fresh P/D request answered over
# pulled KV with parity). Name -> weight when one is drawn:
# - sigstop-prefill / sigstop-decode: SIGSTOP the instance for NEMESIS_STOP_S seconds, then SIGCONT;
# - sigkill-prefill / sigkill-decode: SIGKILL its process group, restart it on the same ports;
# - delay-past-lease: hold the decode hop NEMESIS_DELAY_FACTOR x P's kv_lease_duration after P answered.
NEMESIS_WEIGHTS: dict[str, float] = {"sigstop-prefill": 2.0, "sigstop-decode": 2.0, "sigkill-prefill": 1.0,
                                     "sigkill-decode": 1.0, "delay-past-lease": 1.0}
NEMESIS_STOP_S = (1.0, 2.0, 4.0)
NEMESIS_REQUESTS = (1, 2, 3)
NEMESIS_DELAY_FACTOR = 1.6
DEFAULT_CHAT_OVERHEAD = 32  # tokens a chat template adds when the server cannot /tokenize (Qwen3's: ~10)
NEMESIS_HEAL_S = 10.0  # the liveness bound after heal, beyond the lease (the fault kind's idle_margin_s)


@dataclass(frozen=True)
class Topology:
    """The deployment's knobs the grammar needs: ``block_size`` (tokens), ``max_model_len``
    (tokens), ``usable_blocks`` of the decode instance (``InstanceConfig.usable_blocks``; None when
    vLLM sized the pool itself), ``spec_tokens`` (its ``num_speculative_tokens``, 0 without spec
    decode), ``lease_s`` (P's ``kv_lease_duration``, s; vLLM's default 30); ``variant`` and
    ``sets``: a topology drawn from vLLM's knobs (rig.explore.topologies) and the ``--set``
    strings that reproduce it; ``chat_overhead``: tokens the chat template adds to a prompt
    (measured with P's ``/tokenize``, rig.explore.probe; rig.explore.refusals bounds chat lengths);
    ``caps``: the scheduler caps each side is started with, ``{"prefill.max_num_seqs": 2,
    "decode.max_num_batched_tokens": 128, ...}`` (rig.explore.topologies.caps_of; a cap left to
    vLLM's default is absent): the background bursts exceed every one (rig.explore.background)."""

    prefill: str
    decode: str
    block_size: int
    max_model_len: int
    usable_blocks: int | None
    spec_tokens: int = 0
    lease_s: float = 30.0
    variant: str = ""  # a drawn topology's name (rig.explore.topologies), "" for the config as is
    sets: tuple[str, ...] = ()  # the --set strings that make the config that topology
    chat_overhead: int = DEFAULT_CHAT_OVERHEAD  # tokens P's chat template adds (rig.explore.probe)
    caps: dict[str, int] = field(default_factory=dict)  # "<side>.<cap>" -> value (rig.explore.topologies)

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
        return blocks_for(min(prompt_tokens + max_tokens, self.max_model_len), self.block_size)


# Prompts as resources across actions: a share of the actions (RESOURCE_SHARE, when earlier actions
# left a prompt) send again, whole (same_as) or its first blocks (head_of), a prompt an earlier
# action sent to P (route prefill), to D (decode) or to both (pd): a prefix hit across actions on
# the instance that saw it. The step names the resource as "@r0"; rig.explore.emit.scenario_of puts
# the resource's scenario first (the earlier action's during exploration; a one-step primer with the
# same route and length in every re-run and in the emitted YAML) and the name it has there.
RESOURCE_SHARE = 0.15
RESOURCE_ROUTES = ("pd", "decode", "prefill")


class Resource(StrictModel):
    """A prompt an earlier action sent: ``origin`` (that action's scenario mapping, seed included,
    as it ran), ``step`` (the step id in it; None: an edge scenario's request 0), the ``route`` it
    went over (prefill: P saw it; decode: D; pd: both) and its length ``prompt_tokens``. A re-run
    sends it first as a one-step primer scenario of the same route and length
    (:meth:`primer`)."""

    name: str = Field(pattern=r"^r\d+$")
    origin: dict
    step: str | None = None
    route: str
    prompt_tokens: int = Field(ge=1)

    def ref_in_origin(self) -> str:
        """The prompt-resource name of the prompt in its origin scenario (rig.workload.prompts)."""
        return f"{self.origin['name']}/{self.step}" if self.step else str(self.origin["name"])

    def primer(self, name: str) -> dict:
        """The one-step sequence scenario ``name`` that sends the resource again (1 token asked)."""
        return {"name": name, "kind": "sequence", "description": f"explore: prompt resource {self.name} "
                f"({self.route}, {self.prompt_tokens} tokens) sent before the action",
                "prefill": self.origin.get("prefill"), "decode": self.origin.get("decode"),
                "sequence": {"steps": [{"id": "s0", "route": self.route, "prompt_tokens": self.prompt_tokens,
                                        "max_tokens": 1}], "idle_margin_s": 2}}


class Nemesis(StrictModel):
    """One nemesis phase: ``name`` (a :data:`NEMESIS_WEIGHTS` key, for the report), the
    ``faults`` (the fault scenarios' own :class:`rig.config.faults.Fault`, validated as they are),
    the ``requests`` P/D requests sent one after another while the fault is on (the action's one
    step gives their shape), and ``heal_s`` (s): after the heal, P and D must be idle within
    ``kv_lease_duration + heal_s`` and a fresh P/D request must be answered over pulled KV with
    parity (the liveness oracle, rig/judge/fault_checks.py), else the phase fails with the stall or
    leak it left."""

    name: str
    faults: list[Fault] = Field(min_length=1)
    requests: int = Field(1, ge=1)
    heal_s: float = Field(NEMESIS_HEAL_S, ge=0, description="liveness bound after heal beyond the lease (s)")

    @model_validator(mode="after")
    def _k_in_range(self) -> Nemesis:
        for f in self.faults:
            if f.trigger.k is not None and f.trigger.k >= self.requests:
                raise ValueError(f"nemesis {self.name}: trigger.k {f.trigger.k} must be below requests "
                                 f"{self.requests} (a request must come after the fault)")
        return self

    def describe(self) -> str:
        """'nemesis sigstop-prefill: sigstop 2s prefill on after-requests(k=1) over 2 requests' style."""
        return (f"nemesis {self.name}: {', '.join(f.describe() for f in self.faults)} over {self.requests} "
                f"request(s), heal bound lease+{self.heal_s:g}s")


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
    nemesis: Nemesis | None = Field(None, description="a nemesis phase: the step is the shape of its requests")
    resources: list[Resource] = Field(default_factory=list, description="prompts of earlier actions the steps "
                                                                        "reuse (same_as / head_of '@r<k>')")

    @model_validator(mode="after")
    def _resources_named(self) -> Action:
        names = {r.name for r in self.resources}
        for s in self.steps:
            ref = s.same_as or s.head_of
            if ref and ref.startswith("@") and ref[1:] not in names:
                raise ValueError(f"action {self.index} step {s.id}: {ref} names no resource of the action "
                                 f"({sorted(names)})")
        return self

    @model_validator(mode="after")
    def _nemesis_on_one_plain_pd_step(self) -> Action:
        if self.nemesis is None:
            return self
        s = self.steps[0]
        if (len(self.steps) != 1 or s.route != "pd" or s.count != 1 or s.start is not None or s.transform
                or s.cancel_after_ms or s.same_as or s.head_of or s.prefix_of or s.repeat_of or self.hold_s):
            raise ValueError(f"action {self.index}: a nemesis runs as a fault scenario (rig.config.faults): give "
                             "exactly one pd step of count 1 started at once, without transform, cancel, prompt "
                             "source or hold")
        return self

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
        if self.nemesis is not None:  # the fault kind's requests plus its recovery request
            return self.nemesis.requests + 1
        return sum(s.count * s.prompts for s in self.steps) + len(self.resources)

    def describe(self) -> str:
        """One line: each step's :meth:`Step.describe` joined by '; ', then the hold if any."""
        hold = f"; decode hop held {self.hold_s:g}s" + (" with P's pool flushed" if self.flush_prefill else "") \
            if self.hold_s else ""
        nem = f"; {self.nemesis.describe()}" if self.nemesis else ""
        return "; ".join(s.describe() for s in self.steps) + hold + nem


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

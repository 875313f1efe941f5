"""Fault actions as data: what a ``kind: fault`` scenario does to the exchange.

A fault is a *trigger* (an event of the P/D exchange), a *target* (an instance by role or name,
or the faulted request itself) and an *action*. The models here only validate; the executor is
:mod:`rig.workload.faults`. Units: milliseconds where the name says ``_ms``, else seconds.

Triggers (``trigger.event``):

- ``prefill-answered``: P answered the faulted request's prefill hop (its blocks are now held
  for D until ``nixl.kv_lease_duration``), before the decode hop is sent;
- ``decode-sent``: ``after_ms`` after the faulted request's decode hop was sent;
- ``kv-fetch-in-progress``: D's ``vllm:num_requests_kv_fetch_by_stage{stage="in_progress"}`` is
  above 0 while the faulted request's decode hop is in flight (D is pulling its KV). D's
  ``/metrics`` is polled every ``poll_ms``; if the stage is not seen within ``within_s`` the fault
  does not fire and the scenario says so (``fault-fired`` not checked: ERROR inconclusive);
- ``after-requests``: after ``k`` of the scenario's requests have completed (before request
  ``k`` is sent); instance targets only.

Actions on an instance (``target``: ``prefill`` / ``decode`` / an instance name): ``sigkill``,
``sigterm`` (to the instance's process group, so EngineCore and workers get it too; the rig then
restarts the instance on the same HTTP and NIXL side-channel ports unless ``restart: false``),
``sigstop`` (SIGSTOP, ``stop_s`` seconds, SIGCONT), ``restart`` (stop, then start on the same
ports). Actions on the request (``target: request``): ``cancel-decode`` (close the decode hop's
connection; vLLM aborts it), ``abandon`` (never send the decode hop), ``delay-decode`` (send the
decode hop ``delay_s`` later).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rig.config.base import MAX_ROUNDS, StrictModel

TriggerEvent = Literal["prefill-answered", "decode-sent", "kv-fetch-in-progress", "after-requests"]
InstanceAction = Literal["sigkill", "sigterm", "sigstop", "restart"]
RequestAction = Literal["cancel-decode", "abandon", "delay-decode"]
INSTANCE_ACTIONS: tuple[str, ...] = InstanceAction.__args__  # type: ignore[attr-defined]
REQUEST_ACTIONS: tuple[str, ...] = RequestAction.__args__  # type: ignore[attr-defined]
# Events that happen on or after the decode hop is sent: an action that needs the decode hop
# unsent (abandon, delay) cannot follow them.
DECODE_EVENTS = ("decode-sent", "kv-fetch-in-progress")


class Trigger(StrictModel):
    """When a fault fires (see the module docstring for each ``event``)."""

    event: TriggerEvent
    after_ms: float = Field(0, ge=0, description="decode-sent: milliseconds after the decode hop was sent")
    k: int | None = Field(None, ge=1, description="after-requests: fire after this many requests completed")
    poll_ms: float = Field(20, gt=0, description="kv-fetch-in-progress: D's /metrics poll period")
    within_s: float = Field(5, gt=0, description="kv-fetch-in-progress: give up (fault not fired) after this")

    @model_validator(mode="after")
    def _fields_of_event(self) -> Trigger:
        if self.event == "after-requests" and self.k is None:
            raise ValueError("trigger.k: required for event after-requests (fire after k completed requests)")
        if self.event != "after-requests" and self.k is not None:
            raise ValueError(f"trigger.k: only for event after-requests (event is {self.event!r}); remove it")
        if self.after_ms and self.event != "decode-sent":
            raise ValueError(f"trigger.after_ms: only for event decode-sent (event is {self.event!r}); remove it")
        return self


class Fault(StrictModel):
    """One fault: ``action`` on ``target`` when ``trigger`` happens."""

    trigger: Trigger
    target: str = Field(description="'prefill', 'decode', an instance name, or 'request' (the faulted request)")
    action: Literal["sigkill", "sigterm", "sigstop", "restart", "cancel-decode", "abandon", "delay-decode"]
    stop_s: float | None = Field(None, gt=0, description="sigstop: seconds between SIGSTOP and SIGCONT")
    delay_s: float | None = Field(None, gt=0, description="delay-decode: seconds the decode hop is held")
    restart: bool = Field(True, description="sigkill / sigterm: restart the instance on the same ports "
                                            "afterwards (the later scenarios need it)")

    @model_validator(mode="after")
    def _consistent(self) -> Fault:
        a, t, ev = self.action, self.target, self.trigger.event
        if a in REQUEST_ACTIONS and t != "request":
            raise ValueError(f"action {a}: acts on the request; set target: request (target is {t!r})")
        if a in INSTANCE_ACTIONS and t == "request":
            raise ValueError(f"action {a}: acts on an instance; set target to prefill, decode or an instance name")
        if (a == "sigstop") != (self.stop_s is not None):
            raise ValueError("stop_s: give it exactly for action sigstop (how long the instance stays stopped)")
        if (a == "delay-decode") != (self.delay_s is not None):
            raise ValueError("delay_s: give it exactly for action delay-decode (how long the decode hop is held)")
        if a in ("abandon", "delay-decode") and ev != "prefill-answered":
            raise ValueError(f"action {a}: needs trigger event prefill-answered (the decode hop must not be sent "
                             f"yet; event is {ev!r})")
        if a == "cancel-decode" and ev not in DECODE_EVENTS:
            raise ValueError(f"action cancel-decode: needs trigger event decode-sent or kv-fetch-in-progress "
                             f"(a decode hop in flight; event is {ev!r})")
        if ev == "after-requests" and t == "request":
            raise ValueError("trigger after-requests: aims at an instance, not a request")
        return self

    def describe(self) -> str:
        """'sigkill prefill on prefill-answered' style label."""
        when = self.trigger.event + (f"+{self.trigger.after_ms:g}ms" if self.trigger.after_ms else "") + (
            f"(k={self.trigger.k})" if self.trigger.k else "")
        extra = f" {self.stop_s:g}s" if self.stop_s else f" {self.delay_s:g}s" if self.delay_s else ""
        return f"{self.action}{extra} {self.target} on {when}"


class FaultScenarioConfig(StrictModel):
    """Settings of ``kind: fault``: the requests sent (one after another), which one is faulted,
    the faults, and the recovery checks' bounds."""

    requests: int = Field(1, ge=1, le=MAX_ROUNDS, description="P/D requests sent one after another")
    faulted: int = Field(0, ge=0, description="index of the request the exchange events refer to")
    faults: list[Fault] = Field(min_length=1)
    recovery: bool = Field(True, description="after the faults: survivors back to idle within the bound, "
                                             "then a fresh P/D request with parity")
    idle_margin_s: float = Field(
        10, ge=0, description="idle bound = nixl.kv_lease_duration + this (P may hold an abandoned "
                              "request's blocks until its lease expires)")
    expected_survivor_errors: list[str] = Field(
        default_factory=list,
        description="regexes of the exception lines the fault is expected to make a survivor log with a "
                    "traceback, e.g. D's handled 'NIXL_ERR_REMOTE_DISCONNECT' when P is killed: such a "
                    "traceback on an instance that stayed alive is named in no-fatal-log, not failed. "
                    "Only tracebacks (never 'Cannot get', EngineDeadError, a segfault), only once a fault fired")

    @field_validator("expected_survivor_errors")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        for rx in v:
            try:
                re.compile(rx)
            except re.error as e:
                raise ValueError(f"expected_survivor_errors: {rx!r} is not a regular expression ({e})") from None
        return v

    @model_validator(mode="after")
    def _faulted_in_range(self) -> FaultScenarioConfig:
        if self.faulted >= self.requests:
            raise ValueError(f"faulted {self.faulted}: must be below requests {self.requests} (0-based index)")
        for f in self.faults:
            if f.trigger.k is not None and f.trigger.k >= self.requests:
                raise ValueError(f"trigger.k {f.trigger.k}: must be below requests {self.requests} "
                                 "(some request must come after the fault)")
        return self

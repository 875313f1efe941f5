"""The hops' bodies and their dispatch, once for every HTTP implementation of
:class:`rig.transport.client.Transport` (aiohttp, httpx, rig.transport.fast): which body each hop
sends (rig.transport.bodies), to which route, streamed or not, and how a whole answer's bytes
become a :class:`~rig.transport.records.Hop` (rig.transport.answers).

Every hop tells the transport's ``listeners`` (:class:`HopListener`) where it is: ``sent`` before
its request goes out, ``first-byte`` at a stream's first payload, ``answered`` when it returned
(with or without an error) and ``cancelled`` when it was cancelled in flight. The observer samples
the instance concerned at these moments (rig.observe.events), so what a check judges follows the
work, not the clock: a request that takes milliseconds is still seen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rig.config.routes import Transform
from rig.transport.answers import StreamReader, decode, error_text, fill_from_answer
from rig.transport.bodies import ROUTE, Prompt, decode_body, prefill_body, request_body
from rig.transport.endpoint import Endpoint
from rig.transport.records import Hop, HopFailure

STREAM_OPTIONS = {"stream_options": {"include_usage": True}}
# The events a hop reports to its transport's listeners, in the order they happen.
HOP_EVENTS = ("sent", "first-byte", "answered", "cancelled")


class HopListener(Protocol):
    """Told of every hop's events (:data:`HOP_EVENTS`) with the instance it goes to
    (``Endpoint.name``); called synchronously from the hop's task, so it must not block
    (rig.observe.events.SampleEvents only wakes the samplers of that instance)."""

    def hop_event(self, instance: str, event: str) -> None:
        """Hop to ``instance`` reached ``event`` (one of :data:`HOP_EVENTS`)."""


class HopsBase:
    """The hops of rig.transport.client.Transport, built and read once for every HTTP library: a
    subclass supplies ``_post`` (send ``body`` to the full ``url``, fill ``hop`` from the whole
    answer: :func:`fill_whole`) and ``_stream`` (send it, feed each SSE ``data:`` payload to the
    :class:`~rig.transport.answers.StreamReader` until it says stop), and sets ``name``."""

    name = ""

    def __init__(self, model: str, timeout_s: float):
        self.model, self.timeout_s = model, timeout_s
        self.listeners: list[HopListener] = []  # told of every hop's events (module docstring)

    def notify(self, instance: str, event: str) -> None:
        """Tell every listener that a hop to ``instance`` reached ``event`` (:data:`HOP_EVENTS`)."""
        for listener in self.listeners:
            listener.hop_event(instance, event)

    async def _watched(self, instance: str, hop: Awaitable[Hop]) -> Hop:
        """Await ``hop`` between its ``sent`` and its ``answered`` (or ``cancelled``) event."""
        self.notify(instance, "sent")
        try:
            done = await hop
        except asyncio.CancelledError:
            self.notify(instance, "cancelled")
            raise
        self.notify(instance, "answered")
        return done

    async def prefill(self, ep: Endpoint, prompt: Prompt, *, fields: dict[str, Any] | None = None,
                      endpoint: str = "completions") -> Hop:
        """The prefill hop (``max_tokens: 1``, ``do_remote_decode``); P answers with ``kv_transfer_params``."""
        body = prefill_body(request_body(endpoint, self.model, prompt, 1, **(fields or {})))
        return await self._watched(ep.name, self._post(Hop(instance=ep.name), ep.url + ROUTE[endpoint], body))

    async def decode(self, ep: Endpoint, prompt: Prompt, max_tokens: int, ktp: dict[str, Any],
                     stream: bool = False, stop_after_tokens: int | None = None, *,
                     fields: dict[str, Any] | None = None, endpoint: str = "completions",
                     strip: Sequence[str] = ()) -> Hop:
        """The decode hop with P's ``kv_transfer_params`` (``ktp``); streamed when ``stream`` (or
        ``fields`` has ``stream: true``), closed after ``stop_after_tokens`` streamed tokens (an
        intentional cancellation during D's stream). ``strip``: top-level fields removed from the
        finished body (a router transform, :func:`derive_decode`)."""
        return await self._watched(ep.name, self._send(ep, prompt, max_tokens, fields, endpoint, ktp,
                                                       stream or stop_after_tokens is not None, stop_after_tokens,
                                                       strip))

    async def direct(self, ep: Endpoint, prompt: Prompt, max_tokens: int, *,
                     fields: dict[str, Any] | None = None, endpoint: str = "completions") -> Hop:
        """A non-disaggregated request (no ``kv_transfer_params``): the parity reference;
        streamed when ``fields`` has ``stream: true``."""
        return await self._watched(ep.name, self._send(ep, prompt, max_tokens, fields, endpoint, None, False, None))

    async def _send(self, ep: Endpoint, prompt: Prompt, max_tokens: int, fields: dict[str, Any] | None,
                    endpoint: str, ktp: dict[str, Any] | None, stream: bool, stop_after: int | None,
                    strip: Sequence[str] = ()) -> Hop:
        fields = fields or {}
        url, hop = ep.url + ROUTE[endpoint], Hop(instance=ep.name)
        if stream or fields.get("stream"):
            extra = {**STREAM_OPTIONS, **fields, "stream": True}
            body = request_body(endpoint, self.model, prompt, max_tokens, **extra)
            body = _without(decode_body(body, ktp) if ktp is not None else body, strip)
            t0 = time.monotonic()
            reader = StreamReader(hop, t0, stop_after, on_first=lambda: self.notify(ep.name, "first-byte"))
            await self._stream(hop, url, body, reader)
            hop.latency_s = time.monotonic() - t0
            return reader.finish()
        body = request_body(endpoint, self.model, prompt, max_tokens, **fields)
        return await self._post(hop, url, _without(decode_body(body, ktp) if ktp is not None else body, strip))

    async def _post(self, hop: Hop, url: str, body: dict[str, Any]) -> Hop:
        raise NotImplementedError

    async def _stream(self, hop: Hop, url: str, body: dict[str, Any], reader: StreamReader) -> None:
        raise NotImplementedError


def _without(body: dict[str, Any], strip: Sequence[str]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in strip} if strip else body


@dataclass(frozen=True)
class DecodeRequest:
    """One decode hop a router transform asks for: the ``prompt`` D gets, the ``max_tokens`` it
    asks (the step's unless ``transform.set`` rewrites it), the extra body ``fields`` (the step's
    decode fields with ``transform.set`` over them), the top-level fields to ``strip`` from the
    finished body, and the ``reference_fields`` its parity reference gets (the step's reference
    fields with ``transform.set``: parity for the request D got)."""

    prompt: Prompt
    max_tokens: int
    fields: dict[str, Any] = field(default_factory=dict)
    strip: tuple[str, ...] = ()
    reference_fields: dict[str, Any] = field(default_factory=dict)


def first_token(prefill: Hop) -> int | None:
    """P's first generated token ID (its answer's ``token_ids[0]``), None when it has none."""
    return prefill.token_ids[0] if prefill.token_ids else None


def derive_decode(transform: Transform | None, prompt: Prompt, prefill: Hop, max_tokens: int,
                  fields: dict[str, Any] | None = None, reference_fields: dict[str, Any] | None = None
                  ) -> list[DecodeRequest]:
    """D's request(s) from the prompt and P's answer as a router would (rig.config.routes.Transform),
    a pure function: ``transform.decode_hops`` identical requests whose prompt is ``prompt`` (+ P's
    first generated token when ``append_first_token``), ``max_tokens`` and ``fields`` with
    ``transform.set`` over them, ``transform.strip`` to remove. None = the rig's own decode hop.

    Raises ValueError when ``append_first_token`` meets a prompt that is not one token-ID list or a
    P answer without ``token_ids`` (the rig's requests ask for ``return_token_ids``)."""
    fields, reference_fields = dict(fields or {}), dict(reference_fields or {})
    if transform is None:
        return [DecodeRequest(prompt, max_tokens, fields, (), reference_fields)]
    if transform.append_first_token:
        if not isinstance(prompt, list) or (prompt and not isinstance(prompt[0], int)):
            raise ValueError("append_first_token needs one token-ID prompt")
        tok = first_token(prefill)
        if tok is None:
            raise ValueError(f"append_first_token: P's answer ({prefill.instance}) has no token_ids to append")
        prompt = [*prompt, tok]
    sets = dict(transform.set)
    max_tokens = int(sets.pop("max_tokens", max_tokens))
    one = DecodeRequest(prompt, max_tokens, {**fields, **sets}, tuple(transform.strip), {**reference_fields, **sets})
    return [one] * transform.decode_hops


def fill_whole(hop: Hop, raw: bytes) -> Hop:
    """A whole answer's bytes into ``hop`` (status already set): an error text unless 200 JSON."""
    if hop.status != 200:
        hop.fail(HopFailure.HTTP_ERROR, error_text(hop.status or 0, raw.decode("utf-8", "replace")))
        return hop
    try:
        fill_from_answer(hop, decode(raw))
    except ValueError as e:
        hop.fail(HopFailure.CONNECTION_ERROR, f"connection error: answer is not JSON: {e}")
    return hop

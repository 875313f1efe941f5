"""The hops' bodies and their dispatch, once for every HTTP implementation of
:class:`rig.transport.client.Transport` (aiohttp, httpx, rig.transport.fast): which body each hop
sends (rig.transport.bodies), to which route, streamed or not, and how a whole answer's bytes
become a :class:`~rig.transport.records.Hop` (rig.transport.answers)."""

from __future__ import annotations

import time
from typing import Any

from rig.transport.answers import StreamReader, decode, error_text, fill_from_answer
from rig.transport.bodies import ROUTE, Prompt, decode_body, prefill_body, request_body
from rig.transport.endpoint import Endpoint
from rig.transport.records import Hop

STREAM_OPTIONS = {"stream_options": {"include_usage": True}}


class HopsBase:
    """The hops of rig.transport.client.Transport, built and read once for every HTTP library: a
    subclass supplies ``_post`` (send ``body`` to the full ``url``, fill ``hop`` from the whole
    answer: :func:`fill_whole`) and ``_stream`` (send it, feed each SSE ``data:`` payload to the
    :class:`~rig.transport.answers.StreamReader` until it says stop), and sets ``name``."""

    name = ""

    def __init__(self, model: str, timeout_s: float):
        self.model, self.timeout_s = model, timeout_s

    async def prefill(self, ep: Endpoint, prompt: Prompt, *, fields: dict[str, Any] | None = None,
                      endpoint: str = "completions") -> Hop:
        """The prefill hop (``max_tokens: 1``, ``do_remote_decode``); P answers with ``kv_transfer_params``."""
        body = prefill_body(request_body(endpoint, self.model, prompt, 1, **(fields or {})))
        return await self._post(Hop(instance=ep.name), ep.url + ROUTE[endpoint], body)

    async def decode(self, ep: Endpoint, prompt: Prompt, max_tokens: int, ktp: dict[str, Any],
                     stream: bool = False, stop_after_tokens: int | None = None, *,
                     fields: dict[str, Any] | None = None, endpoint: str = "completions") -> Hop:
        """The decode hop with P's ``kv_transfer_params`` (``ktp``); streamed when ``stream`` (or
        ``fields`` has ``stream: true``), closed after ``stop_after_tokens`` streamed tokens (an
        intentional cancellation during D's stream)."""
        return await self._send(ep, prompt, max_tokens, fields, endpoint, ktp,
                                stream or stop_after_tokens is not None, stop_after_tokens)

    async def direct(self, ep: Endpoint, prompt: Prompt, max_tokens: int, *,
                     fields: dict[str, Any] | None = None, endpoint: str = "completions") -> Hop:
        """A non-disaggregated request (no ``kv_transfer_params``): the parity reference;
        streamed when ``fields`` has ``stream: true``."""
        return await self._send(ep, prompt, max_tokens, fields, endpoint, None, False, None)

    async def _send(self, ep: Endpoint, prompt: Prompt, max_tokens: int, fields: dict[str, Any] | None,
                    endpoint: str, ktp: dict[str, Any] | None, stream: bool, stop_after: int | None) -> Hop:
        fields = fields or {}
        url, hop = ep.url + ROUTE[endpoint], Hop(instance=ep.name)
        if stream or fields.get("stream"):
            extra = {**STREAM_OPTIONS, **fields, "stream": True}
            body = request_body(endpoint, self.model, prompt, max_tokens, **extra)
            body = decode_body(body, ktp) if ktp is not None else body
            t0 = time.monotonic()
            reader = StreamReader(hop, t0, stop_after)
            await self._stream(hop, url, body, reader)
            hop.latency_s = time.monotonic() - t0
            return reader.finish()
        body = request_body(endpoint, self.model, prompt, max_tokens, **fields)
        return await self._post(hop, url, decode_body(body, ktp) if ktp is not None else body)

    async def _post(self, hop: Hop, url: str, body: dict[str, Any]) -> Hop:
        raise NotImplementedError

    async def _stream(self, hop: Hop, url: str, body: dict[str, Any], reader: StreamReader) -> None:
        raise NotImplementedError


def fill_whole(hop: Hop, raw: bytes) -> Hop:
    """A whole answer's bytes into ``hop`` (status already set): an error text unless 200 JSON."""
    if hop.status != 200:
        hop.error = error_text(hop.status or 0, raw.decode("utf-8", "replace"))
        return hop
    try:
        fill_from_answer(hop, decode(raw))
    except ValueError as e:
        hop.error = f"connection error: answer is not JSON: {e}"
    return hop

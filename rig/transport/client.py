"""One client for the two P/D hops: the :class:`Transport` interface and its implementations.

Every workload (edge, waves, store, retrieval, faults, warm-up), the pytest plugin and the CLI
send their hops through a :class:`Transport`: ``prefill`` (P computes the prompt, keeps its KV
and answers ``kv_transfer_params``), ``decode`` (D pulls that KV and generates; streamed or not),
``direct`` (a non-disaggregated reference) and ``aclose``. Bodies are
:mod:`rig.transport.bodies`' (shared with ``pdrig proxy``); answers are read by
:mod:`rig.transport.answers`, for completions and chat alike.

Two well-kept HTTP libraries implement it with the same bodies, answers and error classes:
:class:`AiohttpTransport` (the default everywhere) and :class:`HttpxTransport` (``--client
httpx``; its ``httpx.AsyncClient`` can be given, which the store tests use to put an
``httpx.MockTransport`` world behind it). scripts/bench_workload.py measures them (figures in
docs/measurements.md): aiohttp is the default because httpx's pool does not scale to a wave's
concurrency. A faster hand-written HTTP client was deliberately not kept: the rig's job is P/D,
not HTTP.

Hops never raise for HTTP problems: they return a :class:`~rig.transport.records.Hop` whose
``error`` starts with ``timeout``, ``HTTP <code>`` or ``connection error``
(:func:`rig.transport.records.classify`); cancellation propagates (cancelling a hop closes its
connection, which makes vLLM abort the request).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import aiohttp
import httpx

from rig.transport.answers import StreamReader, decode, encode, error_text, fill_from_answer
from rig.transport.bodies import ROUTE, Prompt, decode_body, prefill_body, request_body
from rig.transport.endpoint import Endpoint
from rig.transport.records import Hop

STREAM_OPTIONS = {"stream_options": {"include_usage": True}}
_JSON_HEADERS = {"Content-Type": "application/json"}


class Transport(Protocol):
    """The two hops and the reference over one HTTP client (see the module docstring).

    ``fields``: extra request fields passed through unchanged (rig.config.request_fields, per
    hop). ``endpoint``: ``completions`` or ``chat`` (rig.transport.bodies.API_ENDPOINTS).
    """

    name: str
    timeout_s: float  # seconds a hop may wait for its next bytes

    async def prefill(self, ep: Endpoint, prompt: Prompt, *, fields: dict[str, Any] | None = None,
                      endpoint: str = "completions") -> Hop:
        """The prefill hop (``max_tokens: 1``, ``do_remote_decode``); P answers with ``kv_transfer_params``."""

    async def decode(self, ep: Endpoint, prompt: Prompt, max_tokens: int, ktp: dict[str, Any],
                     stream: bool = False, stop_after_tokens: int | None = None, *,
                     fields: dict[str, Any] | None = None, endpoint: str = "completions") -> Hop:
        """The decode hop with P's ``kv_transfer_params`` (``ktp``); streamed when ``stream`` (or
        ``fields`` has ``stream: true``), closed after ``stop_after_tokens`` streamed tokens (an
        intentional cancellation during D's stream)."""

    async def direct(self, ep: Endpoint, prompt: Prompt, max_tokens: int, *,
                     fields: dict[str, Any] | None = None, endpoint: str = "completions") -> Hop:
        """A non-disaggregated request (no ``kv_transfer_params``): the parity reference;
        streamed when ``fields`` has ``stream: true``."""

    async def aclose(self) -> None:
        """Close the client's connections."""


class _Hops:
    """The hops' bodies and dispatch, shared by the implementations; a subclass supplies
    ``_post`` (a whole answer) and ``_stream`` (an SSE answer read by a StreamReader)."""

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
            body = request_body(endpoint, self.model, prompt, max_tokens, **{**STREAM_OPTIONS, **fields, "stream": True})
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


def _fill(hop: Hop, raw: bytes) -> Hop:
    """A whole answer's bytes into ``hop`` (status already set): an error text unless 200 JSON."""
    if hop.status != 200:
        hop.error = error_text(hop.status or 0, raw.decode("utf-8", "replace"))
        return hop
    try:
        fill_from_answer(hop, decode(raw))
    except ValueError as e:
        hop.error = f"connection error: answer is not JSON: {e}"
    return hop


class AiohttpTransport(_Hops):
    """The hops over one aiohttp session (``max_connections`` pooled; a hop silent for
    ``timeout_s`` seconds is a ``timeout``). Create it inside a running event loop."""

    name = "aiohttp"

    def __init__(self, model: str, timeout_s: float = 60.0, max_connections: int = 256):
        super().__init__(model, timeout_s)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, ttl_dns_cache=None),
            # As httpx's timeout: ``timeout_s`` between bytes (a long stream may take longer in
            # all); the workloads bound a request's total time themselves (their deadline_s).
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=timeout_s),
            read_bufsize=1 << 20,  # SSE lines with prompt_token_ids of long prompts
            # vLLM sets no cookies; without a jar aiohttp skips cookie filtering per request
            # (+5 % aiohttp exchanges per CPU-s against the fake, 2-core/24 GiB CPU box, 2026-11-30).
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent",))

    async def _post(self, hop: Hop, url: str, body: dict[str, Any]) -> Hop:
        t0 = time.monotonic()
        try:
            async with self.session.post(url, data=encode(body), headers=_JSON_HEADERS) as r:
                hop.status = r.status
                raw = await r.read()
        except TimeoutError as e:
            hop.error = f"timeout: {type(e).__name__}"
        except aiohttp.ClientError as e:
            hop.error = f"connection error: {type(e).__name__}: {e}"
        hop.latency_s = time.monotonic() - t0
        return hop if hop.error else _fill(hop, raw)

    async def _stream(self, hop: Hop, url: str, body: dict[str, Any], reader: StreamReader) -> None:
        try:
            async with self.session.post(url, data=encode(body), headers=_JSON_HEADERS) as r:
                hop.status = r.status
                if r.status != 200:
                    hop.error = error_text(r.status, (await r.read()).decode("utf-8", "replace"))
                    return
                async for line in r.content:
                    if line.startswith(b"data: ") and reader.feed(line[6:].rstrip()):
                        r.close()  # drop the connection: vLLM aborts the request
                        break
        except TimeoutError as e:
            hop.error = f"timeout: {type(e).__name__}"
        except aiohttp.ClientError as e:
            hop.error = f"connection error: {type(e).__name__}: {e}"
        except ValueError as e:
            hop.error = f"connection error: bad SSE chunk: {e}"

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self.session.close()


class HttpxTransport(_Hops):
    """The hops over one ``httpx.AsyncClient`` (the same bodies, answers and error classes as
    :class:`AiohttpTransport`). ``http``: a client to use instead of a new pooled one (tests put
    an ``httpx.MockTransport`` behind it); closed by :meth:`aclose` either way."""

    name = "httpx"

    def __init__(self, model: str, timeout_s: float = 60.0, max_connections: int = 256,
                 http: httpx.AsyncClient | None = None):
        super().__init__(model, timeout_s)
        self.http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))

    async def _post(self, hop: Hop, url: str, body: dict[str, Any]) -> Hop:
        t0 = time.monotonic()
        try:
            r = await self.http.post(url, content=encode(body), headers=_JSON_HEADERS)
        except httpx.TimeoutException as e:
            hop.error = f"timeout: {type(e).__name__}"
        except httpx.HTTPError as e:
            hop.error = f"connection error: {type(e).__name__}: {e}"
        hop.latency_s = time.monotonic() - t0
        if hop.error:
            return hop
        hop.status = r.status_code
        return _fill(hop, r.content)

    async def _stream(self, hop: Hop, url: str, body: dict[str, Any], reader: StreamReader) -> None:
        try:
            async with self.http.stream("POST", url, content=encode(body), headers=_JSON_HEADERS) as r:
                hop.status = r.status_code
                if r.status_code != 200:
                    hop.error = error_text(r.status_code, (await r.aread()).decode("utf-8", "replace"))
                    return
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and reader.feed(line[6:].rstrip()):
                        break  # leaving the block closes the unread response's connection
        except httpx.TimeoutException as e:
            hop.error = f"timeout: {type(e).__name__}"
        except httpx.HTTPError as e:
            hop.error = f"connection error: {type(e).__name__}: {e}"
        except ValueError as e:
            hop.error = f"connection error: bad SSE chunk: {e}"

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self.http.aclose()


CLIENTS = ("aiohttp", "httpx")


def make_transport(kind: str, model: str, timeout_s: float, max_connections: int = 256) -> Transport:
    """An ``aiohttp`` or ``httpx`` :class:`Transport` (create it inside a running event loop);
    raises ValueError for another name."""
    if kind == "aiohttp":
        return AiohttpTransport(model, timeout_s, max_connections)
    if kind == "httpx":
        return HttpxTransport(model, timeout_s, max_connections)
    raise ValueError(f"unknown client {kind!r}; use one of {list(CLIENTS)}")


async def cancel_task(task: asyncio.Task) -> None:
    """Cancel ``task`` and wait for it to finish (closing its HTTP connection)."""
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass

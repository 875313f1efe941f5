"""One client for the two P/D hops: the :class:`Transport` interface and its implementations.

Every workload (edge, waves, store, retrieval, faults, warm-up), the pytest plugin and the CLI
send their hops through a :class:`Transport`: ``prefill`` (P computes the prompt, keeps its KV
and answers ``kv_transfer_params``), ``decode`` (D pulls that KV and generates; streamed or not),
``direct`` (a non-disaggregated reference) and ``aclose``. Bodies are
:mod:`rig.transport.bodies`' (shared with ``pdrig proxy``); answers are read by
:mod:`rig.transport.answers`, for completions and chat alike.

Three implementations share the bodies, answers and error classes (rig.transport.hops.HopsBase)
and differ only in how bytes move: :class:`AiohttpTransport` (the default everywhere),
:class:`HttpxTransport` (``--client httpx``; its ``httpx.AsyncClient`` can be given, which the
store tests use to put an ``httpx.MockTransport`` world behind it) and
:class:`~rig.transport.fast.FastTransport` (``--client fast``: keep-alive POSTs over asyncio
protocols with httptools' parser, about twice aiohttp's P/D requests per client CPU-second).
scripts/bench_workload.py measures them (figures in docs/measurements.md); httpx's pool does not
scale to a wave's concurrency.

Hops never raise for HTTP problems: they return a :class:`~rig.transport.records.Hop` whose
``error`` starts with ``timeout``, ``HTTP <code>`` or ``connection error``
(:func:`rig.transport.records.classify`); cancellation propagates (cancelling a hop closes its
connection, which makes vLLM abort the request).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any, Protocol

import aiohttp
import httpx

from rig.transport.answers import StreamReader, consume_sse, encode, hop_error
from rig.transport.bodies import Prompt
from rig.transport.endpoint import Endpoint
from rig.transport.fast import KEEPALIVE_S, FastTransport
from rig.transport.hops import HopListener, HopsBase, fill_whole
from rig.transport.records import Hop

_JSON_HEADERS = {"Content-Type": "application/json"}


class Transport(Protocol):
    """The two hops and the reference over one HTTP client (see the module docstring).

    ``fields``: extra request fields passed through unchanged (rig.config.request_fields, per
    hop). ``endpoint``: ``completions`` or ``chat`` (rig.transport.bodies.API_ENDPOINTS).
    """

    name: str
    timeout_s: float  # seconds a hop may wait for its next bytes
    listeners: list[HopListener]  # told of every hop's events (rig.transport.hops.HOP_EVENTS)

    async def prefill(self, ep: Endpoint, prompt: Prompt, *, fields: dict[str, Any] | None = None,
                      endpoint: str = "completions") -> Hop:
        """The prefill hop (``max_tokens: 1``, ``do_remote_decode``); P answers with ``kv_transfer_params``."""

    async def decode(self, ep: Endpoint, prompt: Prompt, max_tokens: int, ktp: dict[str, Any],
                     stream: bool = False, stop_after_tokens: int | None = None, *,
                     fields: dict[str, Any] | None = None, endpoint: str = "completions",
                     strip: Sequence[str] = ()) -> Hop:
        """The decode hop with P's ``kv_transfer_params`` (``ktp``); streamed when ``stream`` (or
        ``fields`` has ``stream: true``), closed after ``stop_after_tokens`` streamed tokens (an
        intentional cancellation during D's stream); ``strip``: top-level fields removed from the
        body (a router transform, rig.transport.hops.derive_decode)."""

    async def direct(self, ep: Endpoint, prompt: Prompt, max_tokens: int, *,
                     fields: dict[str, Any] | None = None, endpoint: str = "completions") -> Hop:
        """A non-disaggregated request (no ``kv_transfer_params``): the parity reference;
        streamed when ``fields`` has ``stream: true``."""

    async def aclose(self) -> None:
        """Close the client's connections."""


class AiohttpTransport(HopsBase):
    """The hops over one aiohttp session (``max_connections`` pooled; a hop silent for
    ``timeout_s`` seconds is a ``timeout``). Create it inside a running event loop."""

    name = "aiohttp"

    def __init__(self, model: str, timeout_s: float = 60.0, max_connections: int = 256):
        super().__init__(model, timeout_s)
        self.session = aiohttp.ClientSession(
            # keepalive_timeout: aiohttp keeps an idle connection 15 s by default, but vLLM's uvicorn
            # closes it after VLLM_HTTP_TIMEOUT_KEEP_ALIVE = 5 s (vllm/envs.py); a request that picks
            # such a connection as the server closes it fails before vLLM sees it ("ClientOSError: Can
            # not write request body", seen on the first request of a wave round after an idle gap).
            # The fast transport's bound (KEEPALIVE_S, 2 s) keeps every reuse well inside vLLM's.
            connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, ttl_dns_cache=None,
                                           keepalive_timeout=KEEPALIVE_S),
            # As httpx's timeout: ``timeout_s`` between bytes (a long stream may take longer in
            # all); the workloads bound a request's total time themselves (their deadline_s).
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=timeout_s),
            read_bufsize=1 << 20,  # SSE lines with prompt_token_ids of long prompts
            # vLLM sets no cookies; without a jar aiohttp skips cookie filtering per request
            # (the gain: docs/measurements.md).
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent",))

    async def _post(self, hop: Hop, url: str, body: dict[str, Any]) -> Hop:
        t0 = time.monotonic()
        try:
            async with self.session.post(url, data=encode(body), headers=_JSON_HEADERS) as r:
                hop.status = r.status
                raw = await r.read()
        except (TimeoutError, aiohttp.ClientError) as e:
            hop.fail(*hop_error(e, TimeoutError, aiohttp.ClientError))
        hop.latency_s = time.monotonic() - t0
        return hop if hop.error else fill_whole(hop, raw)

    async def _stream(self, hop: Hop, url: str, body: dict[str, Any], reader: StreamReader) -> None:
        try:
            async with self.session.post(url, data=encode(body), headers=_JSON_HEADERS) as r:
                if await consume_sse(hop, r.status, r.read, r.content, reader):
                    r.close()  # drop the connection: vLLM aborts the request
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            hop.fail(*hop_error(e, TimeoutError, aiohttp.ClientError))

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self.session.close()


class HttpxTransport(HopsBase):
    """The hops over one ``httpx.AsyncClient`` (the same bodies, answers and error classes as
    :class:`AiohttpTransport`). ``http``: a client to use instead of a new pooled one (tests put
    an ``httpx.MockTransport`` behind it); closed by :meth:`aclose` either way."""

    name = "httpx"

    def __init__(self, model: str, timeout_s: float = 60.0, max_connections: int = 256,
                 http: httpx.AsyncClient | None = None):
        super().__init__(model, timeout_s)
        self.http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            # keepalive_expiry: httpx's default (5 s) equals vLLM's server-side keep-alive, a race on
            # every reuse near it; KEEPALIVE_S as the aiohttp transport (the comment there).
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                                keepalive_expiry=KEEPALIVE_S))

    async def _post(self, hop: Hop, url: str, body: dict[str, Any]) -> Hop:
        t0 = time.monotonic()
        try:
            r = await self.http.post(url, content=encode(body), headers=_JSON_HEADERS)
        except httpx.HTTPError as e:
            hop.fail(*hop_error(e, httpx.TimeoutException, httpx.HTTPError))
        hop.latency_s = time.monotonic() - t0
        if hop.error:
            return hop
        hop.status = r.status_code
        return fill_whole(hop, r.content)

    async def _stream(self, hop: Hop, url: str, body: dict[str, Any], reader: StreamReader) -> None:
        try:
            async with self.http.stream("POST", url, content=encode(body), headers=_JSON_HEADERS) as r:
                # an early stop just leaves the block: that closes the unread response's connection
                await consume_sse(hop, r.status_code, r.aread, r.aiter_lines(), reader)
        except (httpx.HTTPError, ValueError) as e:
            hop.fail(*hop_error(e, httpx.TimeoutException, httpx.HTTPError))

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self.http.aclose()


CLIENTS = ("aiohttp", "httpx", "fast")


def make_transport(kind: str, model: str, timeout_s: float, max_connections: int = 256) -> Transport:
    """An ``aiohttp``, ``httpx`` or ``fast`` :class:`Transport` (create it inside a running event
    loop); raises ValueError for another name."""
    if kind == "aiohttp":
        return AiohttpTransport(model, timeout_s, max_connections)
    if kind == "httpx":
        return HttpxTransport(model, timeout_s, max_connections)
    if kind == "fast":
        return FastTransport(model, timeout_s, max_connections)
    raise ValueError(f"unknown client {kind!r}; use one of {list(CLIENTS)}")


async def cancel_task(task: asyncio.Task) -> None:
    """Cancel ``task`` and wait for it to finish (closing its HTTP connection)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task

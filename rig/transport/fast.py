"""The wave engine's fast HTTP/1.1 transport: httptools' response parser under asyncio protocols.

Why it exists: a wave is thousands of small two-hop P/D requests, and with aiohttp most of the
client's CPU goes to aiohttp's request machinery (per-request ClientRequest/ClientResponse
objects, header multidicts, timers and tasks), not to the rig. Measured with
scripts/bench_workload.py (figures with date, machine and command in docs/measurements.md).
This module keeps only what the rig's hops need and leaves the HTTP grammar to a well-kept
parser: ``httptools`` (MagicStack, the llhttp bindings uvicorn uses) parses status, headers,
``Content-Length`` and chunked bodies; asyncio's (uvloop's) transports do the I/O.

What it does (and only this): ``POST`` a JSON body to the hop's URL on keep-alive
connections, one request per connection at a time (no pipelining), to ``http://`` or
``https://`` URLs. A reused connection has been idle for less than :data:`KEEPALIVE_S`
(vLLM's uvicorn closes idle connections after ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` = 5 s,
vllm/envs.py), so the server does not close one under a request. A connection goes back to
the pool only after a complete answer the server did not mark ``Connection: close``; every
other ending (an error, a timeout, a cancel, a stream cut short) closes it, which is how vLLM
learns that the client is gone and aborts the request.

:class:`FastTransport` implements rig.transport.client's ``Transport`` with the same bodies,
answers and error strings as its aiohttp transport (rig.transport.hops.HopsBase builds the
bodies, for completions and chat, and reads the answers): a hop never raises for an HTTP
problem, its ``Hop.error`` starts with ``timeout`` (``timeout_s`` passed for the whole hop, or
10 s to connect), ``HTTP <code>`` (non-200 answer, vLLM's error message) or ``connection
error`` (refused, reset, closed early, an answer that is not HTTP/JSON/SSE); cancelling the
awaiting task closes the connection and propagates.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httptools

from rig.errors import TransportError
from rig.transport.answers import StreamReader, encode, error_text
from rig.transport.hops import HopsBase, fill_whole
from rig.transport.records import Hop, HopFailure

KEEPALIVE_S = 2.0  # reuse idle connections younger than this (vLLM closes them at 5 s)
CONNECT_TIMEOUT_S = 10.0  # as the aiohttp transport's sock_connect


class BadStreamChunk(TransportError):
    """An SSE ``data:`` payload of a 200 stream that is not a JSON chunk (the message of
    msgspec's DecodeError)."""


class _Target:
    """Where one endpoint URL's requests go: host, port, TLS and the request head up to
    ``Content-Length``'s value (built once per URL)."""

    __slots__ = ("head", "host", "idle", "port", "ssl")

    def __init__(self, url: str):
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"endpoint URL {url!r}: expected http://HOST:PORT or https://HOST:PORT")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        # TLS verified as aiohttp does by default: the system CAs (or SSL_CERT_FILE / SSL_CERT_DIR)
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None
        path = u.path or "/"  # the hop's route (rig.transport.bodies.ROUTE)
        self.head = (f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                     f"Accept: */*\r\nUser-Agent: pdrig\r\nContent-Length: ").encode("ascii")
        self.idle: list[_Conn] = []  # LIFO: the most recently used connection first


class _Conn(asyncio.Protocol):
    """One keep-alive connection and the state of the exchange on it (at most one).

    ``waiter`` resolves when the answer is complete, a stream was cut on purpose (``cut``), or
    fails with ConnectionError / TimeoutError / :class:`BadStreamChunk`.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.status = 0
        self.body: list[bytes] = []
        self.on_line: Callable[[bytes], bool] | None = None  # streaming: one SSE data payload; True = stop
        self.tail = b""
        self.cut = False
        self.closed = False
        self.reusable = False
        self.idle_since = 0.0

    # ---- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionError("server closed the connection before the answer was complete"
                                   + (f" ({exc})" if exc else "")))

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.close()  # bytes nobody asked for (or after a cut stream): never reuse this connection
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:  # our callback raised (a bad SSE chunk)
            bad = e.__context__
            self._fail(BadStreamChunk(str(bad)) if isinstance(bad, ValueError) else ConnectionError(str(e)))
        except httptools.HttpParserError as e:
            self._fail(ConnectionError(f"answer is not HTTP/1.1: {e}"))

    # ---- httptools callbacks
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, data: bytes) -> None:
        if self.on_line is None or self.status != 200:
            self.body.append(data)
            return
        if self.cut:
            return
        lines = (self.tail + data).split(b"\n") if self.tail else data.split(b"\n")
        self.tail = lines.pop()
        on_line = self.on_line
        for line in lines:
            if line[:6] == b"data: " and on_line(line[6:]):
                self.cut = True  # the caller has what it wanted; the connection is closed
                self._done()
                return

    def on_message_complete(self) -> None:
        if self.on_line is not None and self.tail and not self.cut and self.status == 200:
            self.on_body(b"\n")  # a last line without its newline
        self.reusable = self.parser.should_keep_alive() and not self.cut
        self._done()

    # ---- the exchange
    def _done(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def _timed_out(self, timeout_s: float) -> None:
        self._fail(TimeoutError(f"no complete answer within {timeout_s:g} s"))

    def send(self, loop: asyncio.AbstractEventLoop, request: bytes, on_line: Callable[[bytes], bool] | None,
             timeout_s: float) -> asyncio.Future[None]:
        """Write one request; returns the future of its answer (see the class docstring)."""
        self.status, self.body, self.on_line, self.tail, self.cut, self.reusable = 0, [], on_line, b"", False, False
        self.waiter = loop.create_future()
        self.timer = loop.call_later(timeout_s, self._timed_out, timeout_s)
        self.transport.write(request)  # type: ignore[union-attr]
        return self.waiter

    def finish(self) -> None:
        """After the waiter settled (or the awaiting task was cancelled): stop the timer."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.waiter = None
        self.on_line = None

    def close(self) -> None:
        """Close the connection (vLLM aborts a request whose client went away)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class FastTransport(HopsBase):
    """The hops of a wave over :class:`_Conn` keep-alive connections (module docstring).

    ``timeout_s`` bounds each hop from send to the end of the answer (seconds);
    ``max_connections`` bounds the exchanges in flight (callers beyond it wait for a slot).
    """

    name = "fast"

    def __init__(self, model: str, timeout_s: float, max_connections: int):
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1 (got {max_connections})")
        super().__init__(model, timeout_s)
        self._slots = asyncio.Semaphore(max_connections)
        self._targets: dict[str, _Target] = {}
        self._open: set[_Conn] = set()

    async def _connect(self, t: _Target) -> _Conn:
        loop = asyncio.get_running_loop()
        limit = min(CONNECT_TIMEOUT_S, self.timeout_s)
        try:
            async with asyncio.timeout(limit):
                _, conn = await loop.create_connection(_Conn, t.host, t.port, ssl=t.ssl)
        except TimeoutError:
            raise TimeoutError(f"connecting to {t.host}:{t.port} took over {limit:g} s") from None
        self._open.add(conn)
        return conn

    async def _exchange(self, url: str, body: dict[str, Any], hop: Hop,
                        on_line: Callable[[bytes], bool] | None = None) -> bytes | None:
        """POST ``body`` to ``url`` (the hop's full URL); sets ``hop.status``/``hop.error``;
        returns the raw body of a non-streamed answer (None after an error). Cancellation
        closes the connection and propagates."""
        t = self._targets.get(url)
        if t is None:
            t = self._targets[url] = _Target(url)
        data = encode(body)
        request = t.head + str(len(data)).encode() + b"\r\n\r\n" + data
        loop = asyncio.get_running_loop()
        async with self._slots:
            conn = None
            now = time.monotonic()
            while t.idle:
                c = t.idle.pop()
                if not c.closed and now - c.idle_since < KEEPALIVE_S:
                    conn = c
                    break
                c.close()
                self._open.discard(c)
            try:
                if conn is None:
                    conn = await self._connect(t)
                await conn.send(loop, request, on_line, self.timeout_s)
            except TimeoutError as e:
                hop.fail(HopFailure.TIMEOUT, f"timeout: {e}")
            except BadStreamChunk as e:
                hop.fail(HopFailure.CONNECTION_ERROR, f"connection error: bad SSE chunk: {e}")
            except OSError as e:  # refused, reset, closed early (ConnectionError), TLS (ssl.SSLError)
                hop.fail(HopFailure.CONNECTION_ERROR, f"connection error: {type(e).__name__}: {e}")
            finally:  # also on cancellation: the connection is dropped, vLLM aborts the request
                if conn is not None:
                    conn.finish()
                    if hop.error is None and conn.reusable and not conn.closed:
                        conn.idle_since = time.monotonic()
                        t.idle.append(conn)
                    else:
                        conn.close()
                        self._open.discard(conn)
            if hop.error is not None or conn is None:  # conn is set whenever no error was
                return None
            assert conn is not None  # no error: the connection was made and answered
            hop.status = conn.status
            raw = b"".join(conn.body)
            if conn.status != 200:
                hop.fail(HopFailure.HTTP_ERROR, error_text(conn.status, raw.decode("utf-8", "replace")))
                return None
            return raw

    async def _post(self, hop: Hop, url: str, body: dict[str, Any]) -> Hop:
        t0 = time.monotonic()
        raw = await self._exchange(url, body, hop)
        hop.latency_s = time.monotonic() - t0
        return hop if raw is None else fill_whole(hop, raw)

    async def _stream(self, hop: Hop, url: str, body: dict[str, Any], reader: StreamReader) -> None:
        await self._exchange(url, body, hop, reader.feed)

    async def aclose(self) -> None:
        """Close every connection (idle or not)."""
        for c in list(self._open):
            c.close()
        self._open.clear()
        for t in self._targets.values():
            t.idle.clear()
        await asyncio.sleep(0)  # let the transports' close callbacks run

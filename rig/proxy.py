"""``pdrig proxy``: an OpenAI-compatible server in front of a P/D deployment.

Any OpenAI client (the OpenAI SDK, ``vllm bench serve``, lm-eval, guidellm) can drive the P/D
pair through it. For each ``POST /v1/completions`` or ``POST /v1/chat/completions``:

1. Prefill hop: the client's body as :func:`rig.transport.bodies.prefill_body` makes it (``max_tokens: 1``,
   not streamed, ``kv_transfer_params = {do_remote_decode: true, ...}``) to a prefill instance.
2. Decode hop: the client's body, streamed or not as the client asked, with P's
   ``kv_transfer_params`` (:func:`rig.transport.bodies.decode_body`) to a decode instance; D's answer is
   relayed byte for byte (status, content type, body or SSE stream).

One module (~460 lines): the request path (hops, statuses, streaming relay, cancellation) and the
server around it (routing policy, /metrics, the thread the pytest plugin runs it in, and
:func:`reserved_proxy`, the same thread on a port the rig locks for a scenario whose requests go
through a router) are one small program; the hop bodies and answer parsing it shares with the rig are in rig/transport.

Contracts:

- **kv_transfer_params come only from P.** A client-supplied ``kv_transfer_params`` is dropped
  (counted in ``pdrig_proxy_client_kv_transfer_params_dropped_total``): D reads whatever block IDs
  it is given (the rig's ``canary-swapped-prompt`` shows D answering from another prompt's KV), so
  a client able to pass them could read other requests' KV.
- **Statuses keep their meaning.** A hop that answers non-200 has its status and body relayed
  unchanged; a hop that cannot be reached is 502 (connection error) or 504 (no answer within
  ``timeout_s``); P answering 200 without ``kv_transfer_params`` (P is no KV producer) is 502. The
  header ``X-PD-Failed-Hop: prefill|decode`` names the failed hop, and errors the proxy writes
  itself carry ``error.hop`` in vLLM's error JSON. A decode stream that breaks after its first
  byte ends with an SSE ``data: {"error": {...}}`` event (vLLM's own mid-stream error form) and
  no ``[DONE]``. ``X-PD-Prefill`` / ``X-PD-Decode`` name the instances that served a request.
- **The other hop is cancelled when the client goes away.** The server cancels a handler whose
  client disconnected (aiohttp ``handler_cancellation``); the hop in flight then closes its
  upstream connection, which makes vLLM abort the request, and a decode hop is never sent. A
  request abandoned between the hops leaves its blocks on P until NIXL's ``kv_lease_duration``
  (vLLM default 30 s) expires: P has no abort for a finished request.
- **Several P and D instances**, picked independently per hop by a policy: ``round-robin`` or
  ``least-outstanding`` (fewest requests in flight on that instance, ties in list order).
- ``GET /metrics`` is the proxy's own Prometheus registry (prometheus_client); ``GET /health`` is
  the proxy's own liveness; ``GET /v1/models`` and ``GET /version`` are relayed from a decode
  instance. The server binds 127.0.0.1 unless told otherwise. The client's ``Authorization``
  header (servers started with ``--api-key``) and ``X-Request-Id`` (else one the proxy makes) go
  to both hops.

The proxy is deliberately thin: it never parses D's answer. Its speed is measured by
scripts/bench_proxy.py against vLLM's toy proxy design (docs/measurements.md). (A little over 400
lines of code: the hops, their failure mapping, the metrics and the in-thread server of ``pdrig up
--proxy`` share one contract, stated here.)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rig.cluster.ports import PortConflict, PortReservation
from rig.config.endpoints_file import base_url, by_role, read_endpoints
from rig.errors import TransportError
from rig.transport import aio
from rig.transport.bodies import decode_body, prefill_body
from rig.transport.fast import KEEPALIVE_S

POLICIES = ("round-robin", "least-outstanding")
ROUTES = ("/v1/completions", "/v1/chat/completions")
FAILED_HOP = "X-PD-Failed-Hop"
PREFILL_HEADER, DECODE_HEADER = "X-PD-Prefill", "X-PD-Decode"
_JSON = "application/json"
# Hop latency buckets (seconds): from sub-millisecond stub answers to long generations.
_HOP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 600)


@dataclass
class Backend:
    """One vLLM instance behind the proxy: ``name``, base ``url`` and requests in flight on it."""

    name: str
    url: str
    outstanding: int = 0


@dataclass
class Picker:
    """Chooses the instance for one hop among ``backends`` by ``policy`` (see :data:`POLICIES`).

    Raises ValueError for an unknown policy or an empty list. Not thread-safe (one event loop).
    """

    backends: list[Backend]
    policy: str = "round-robin"
    _cycle: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r} is unknown; use one of {list(POLICIES)}")
        if not self.backends:
            raise ValueError("a proxy needs at least one prefill and one decode URL")
        self._cycle = itertools.cycle(self.backends)

    def pick(self) -> Backend:
        """The next instance: in turn (round-robin) or the one with the fewest requests in
        flight (least-outstanding; the first such in list order)."""
        if self.policy == "round-robin":
            return next(self._cycle)
        return min(self.backends, key=lambda b: b.outstanding)


class ProxyMetrics:
    """The proxy's own metrics in a private registry (``GET /metrics``).

    - ``pdrig_proxy_requests_total{route, status, failed_hop}``: finished client requests by the
      status the client got (``failed_hop`` is ``""``, ``prefill`` or ``decode``);
    - ``pdrig_proxy_hop_seconds{hop, instance}``: each hop's time to its full answer (seconds);
    - ``pdrig_proxy_outstanding{hop, instance}``: hops in flight;
    - ``pdrig_proxy_client_disconnects_total{stage}``: clients that went away (``prefill``,
      ``decode``: the hop that was cancelled);
    - ``pdrig_proxy_client_kv_transfer_params_dropped_total``: client bodies whose
      ``kv_transfer_params`` were dropped.
    """

    def __init__(self, prefills: Sequence[Backend], decodes: Sequence[Backend]):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("pdrig_proxy_requests", "Client requests by status and failed hop.",
                                ["route", "status", "failed_hop"], registry=r)
        self.hop_seconds = Histogram("pdrig_proxy_hop_seconds", "Time of each hop to its full answer.",
                                     ["hop", "instance"], buckets=_HOP_BUCKETS, registry=r)
        self.outstanding = Gauge("pdrig_proxy_outstanding", "Hops in flight.", ["hop", "instance"], registry=r)
        self.disconnects = Counter("pdrig_proxy_client_disconnects", "Clients that went away, by the hop "
                                   "in flight (which was cancelled).", ["stage"], registry=r)
        self.dropped_ktp = Counter("pdrig_proxy_client_kv_transfer_params_dropped",
                                   "Client requests whose kv_transfer_params were dropped.", registry=r)
        for hop, pool in (("prefill", prefills), ("decode", decodes)):
            for b in pool:
                self.outstanding.labels(hop, b.name)
                self.hop_seconds.labels(hop, b.name)


class HopFailed(TransportError):
    """A hop that gave no usable answer; ``response`` is what the client gets."""

    def __init__(self, response: web.StreamResponse):
        super().__init__(response.status)
        self.response = response


def error_response(status: int, message: str, hop: str, err_type: str) -> web.Response:
    """vLLM's error JSON (``{"error": {message, type, param, code}}``,
    vllm/entrypoints/openai/protocol.py ErrorResponse) plus ``error.hop``, with the
    ``X-PD-Failed-Hop`` header."""
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status, "hop": hop}}
    return web.Response(status=status, body=json.dumps(body), content_type=_JSON, headers={FAILED_HOP: hop})


def _relay(status: int, raw: bytes, content_type: str, hop: str | None, headers: dict[str, str]) -> web.Response:
    """An upstream answer relayed unchanged (status, body, content type) with the P/D headers."""
    h = dict(headers)
    if hop:
        h[FAILED_HOP] = hop
    return web.Response(status=status, body=raw, headers={**h, "Content-Type": content_type or _JSON})


class PDProxy:
    """The proxy application over ``prefills`` and ``decodes`` (lists of ``(name, url)``).

    ``policy``: see :data:`POLICIES`. ``timeout_s``: the longest wait for an upstream's next
    bytes (seconds; a hop silent this long is a 504). ``max_connections``: upstream connection
    pool size. Build the aiohttp app with :meth:`app`; the client session is created on start-up.
    Raises ValueError for an unknown policy, an empty instance list or a URL that is not an
    instance's base URL (rig.config.endpoints_file.base_url), naming it.
    """

    def __init__(self, prefills: Sequence[tuple[str, str]], decodes: Sequence[tuple[str, str]],
                 policy: str = "round-robin", timeout_s: float = 600.0, max_connections: int = 1024):
        def backends(pool: Sequence[tuple[str, str]], role: str) -> list[Backend]:
            out = []
            for n, u in pool:
                try:
                    out.append(Backend(n, base_url(u)))
                except ValueError as e:
                    raise ValueError(f"{role} {n}: {e}") from None
            return out

        self.prefill = Picker(backends(prefills, "prefill"), policy)
        self.decode = Picker(backends(decodes, "decode"), policy)
        self.timeout_s, self.max_connections = timeout_s, max_connections
        self.metrics = ProxyMetrics(self.prefill.backends, self.decode.backends)
        self.session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        """The aiohttp application (routes in the module docstring)."""
        app = web.Application(client_max_size=64 << 20)  # long prompts as token-ID lists
        app.add_routes([web.post(r, self._pd) for r in ROUTES] +
                       [web.get("/metrics", self._metrics), web.get("/health", self._health),
                        web.get("/v1/models", self._relay_get), web.get("/version", self._relay_get)])
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            # keepalive_timeout below vLLM's server-side 5 s (rig.transport.client.AiohttpTransport
            # says why): a relayed hop never picks a connection vLLM is closing.
            connector=aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, ttl_dns_cache=None,
                                           keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=self.timeout_s),
            read_bufsize=1 << 20, skip_auto_headers=("User-Agent",), auto_decompress=False)

    async def _close(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _session(self) -> aiohttp.ClientSession:
        """The client session the app's start-up created; RuntimeError before start-up."""
        if self.session is None:
            raise RuntimeError("PDProxy: the client session is created when the app starts (PDProxy.app)")
        return self.session

    async def _relay_get(self, request: web.Request) -> web.Response:
        b = self.decode.backends[0]
        try:
            async with self._session().get(b.url + request.path) as r:
                return _relay(r.status, await r.read(), r.headers.get("Content-Type", ""), None,
                              {DECODE_HEADER: b.name})
        except (aiohttp.ClientError, TimeoutError) as e:
            return error_response(502, f"decode instance {b.name} ({b.url}): {type(e).__name__}: {e}",
                                  "decode", "BadGatewayError")

    # -- the two hops ---------------------------------------------------------------------

    async def _pd(self, request: web.Request) -> web.StreamResponse:
        route, m = request.path, self.metrics
        stage = "prefill"
        try:
            try:
                body = json.loads(await request.read())
            except ValueError as e:
                return self._done(route, web.Response(status=400, content_type=_JSON, body=json.dumps(
                    {"error": {"message": f"the request body is not JSON: {e}", "type": "BadRequestError",
                               "param": None, "code": 400}})))
            if not isinstance(body, dict):
                return self._done(route, web.Response(status=400, content_type=_JSON, body=json.dumps(
                    {"error": {"message": "the request body must be a JSON object", "type": "BadRequestError",
                               "param": None, "code": 400}})))
            if body.pop("kv_transfer_params", None) is not None:
                m.dropped_ktp.inc()
            rid = request.headers.get("X-Request-Id") or f"pdproxy-{uuid.uuid4().hex}"
            headers = {"X-Request-Id": rid}  # one id in P's and D's logs
            if "Authorization" in request.headers:  # servers started with --api-key
                headers["Authorization"] = request.headers["Authorization"]
            p = self.prefill.pick()
            out_headers = {PREFILL_HEADER: p.name}
            try:
                ktp = await self._prefill(p, route, prefill_body(body), headers, out_headers)
            except HopFailed as e:
                return self._done(route, e.response)
            stage = "decode"
            d = self.decode.pick()
            out_headers[DECODE_HEADER] = d.name
            return self._done(route, await self._decode(request, d, route, decode_body(body, ktp), headers,
                                                        out_headers, bool(body.get("stream"))))
        except asyncio.CancelledError:
            m.disconnects.labels(stage).inc()  # the client went away; the hop's connection is closed
            raise

    def _done(self, route: str, resp: web.StreamResponse) -> web.StreamResponse:
        self.metrics.requests.labels(route, str(resp.status), resp.headers.get(FAILED_HOP, "")).inc()
        return resp

    async def _prefill(self, p: Backend, route: str, body: dict[str, Any], headers: dict[str, str],
                       out_headers: dict[str, str]) -> dict[str, Any]:
        """P's ``kv_transfer_params``; raises :class:`HopFailed` with the client's answer."""
        try:
            with self._in_flight("prefill", p):
                async with self._session().post(p.url + route, data=json.dumps(body),
                                             headers={**headers, "Content-Type": _JSON}) as r:
                    raw = await r.read()
                    status, ctype = r.status, r.headers.get("Content-Type", "")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise HopFailed(self._unreachable("prefill", p, e)) from None
        if status != 200:
            raise HopFailed(_relay(status, raw, ctype, "prefill", out_headers))
        try:
            ktp = json.loads(raw).get("kv_transfer_params")
        except (ValueError, AttributeError):
            ktp = None
        if not ktp:
            raise HopFailed(error_response(502, f"prefill instance {p.name} answered 200 without "
                                           "kv_transfer_params (is it a kv_producer?)", "prefill", "BadGatewayError"))
        return ktp

    async def _decode(self, request: web.Request, d: Backend, route: str, body: dict[str, Any],
                      headers: dict[str, str], out_headers: dict[str, str], stream: bool) -> web.StreamResponse:
        """D's answer relayed to the client (streamed when D streams)."""
        try:
            with self._in_flight("decode", d):
                async with self._session().post(d.url + route, data=json.dumps(body),
                                             headers={**headers, "Content-Type": _JSON}) as r:
                    ctype = r.headers.get("Content-Type", "")
                    if r.status != 200 or not stream or not ctype.startswith("text/event-stream"):
                        return _relay(r.status, await r.read(), ctype, "decode" if r.status != 200 else None,
                                      out_headers)
                    out = web.StreamResponse(status=200, headers={**out_headers, "Content-Type": ctype})
                    await out.prepare(request)
                    return await self._pipe(r, out, d)
        except (aiohttp.ClientError, TimeoutError) as e:
            return self._unreachable("decode", d, e)

    @contextlib.contextmanager
    def _in_flight(self, hop: str, b: Backend) -> Iterator[None]:
        """Count a hop as outstanding on ``b`` (the policy and the gauge) and time it."""
        gauge, t0 = self.metrics.outstanding.labels(hop, b.name), time.monotonic()
        b.outstanding += 1
        gauge.inc()
        try:
            yield
        finally:
            b.outstanding -= 1
            gauge.dec()
            self.metrics.hop_seconds.labels(hop, b.name).observe(time.monotonic() - t0)

    def _unreachable(self, hop: str, b: Backend, e: BaseException) -> web.Response:
        """504 for a hop silent past ``timeout_s``, 502 for a connection error; names the hop."""
        if isinstance(e, TimeoutError):
            return error_response(504, f"{hop} instance {b.name} ({b.url}) sent nothing for {self.timeout_s:g} s",
                                  hop, "GatewayTimeoutError")
        return error_response(502, f"{hop} instance {b.name} ({b.url}): connection error: {type(e).__name__}: {e}",
                              hop, "BadGatewayError")


    async def _pipe(self, r: aiohttp.ClientResponse, out: web.StreamResponse, d: Backend) -> web.StreamResponse:
        """Copy D's SSE stream to the client. Upstream and downstream failures differ: D breaking
        off ends the client's stream with an error event (the headers are gone, so this is how
        vLLM reports mid-stream errors too); the client going away closes D's connection, which
        makes vLLM abort the request."""
        chunks = r.content.iter_any()
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except (aiohttp.ClientError, TimeoutError) as e:
                err = {"error": {"message": f"decode instance {d.name} broke off its stream: "
                                            f"{type(e).__name__}: {e}", "type": "BadGatewayError",
                                 "param": None, "code": 502, "hop": "decode"}}
                with contextlib.suppress(ConnectionResetError):
                    await out.write(f"data: {json.dumps(err)}\n\n".encode())
                return out
            try:
                await out.write(chunk)
            except ConnectionResetError:  # the client went away mid-stream
                r.close()
                self.metrics.disconnects.labels("decode").inc()
                return out
        await out.write_eof()
        return out


def endpoints_from_file(path: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(prefills, decodes)`` as ``(name, url)`` from an ``endpoints.json`` written by ``pdrig up``
    (``{name: {"url": ..., "role": "prefill"|"decode"|...}}``). Raises ValueError naming the file
    when it is unreadable or lacks a prefill or a decode."""
    entries = read_endpoints(path)  # InputFileError (a ConfigError, so a ValueError) names the entry
    pre = [(n, e.url) for n, e in by_role(entries, "prefill")]
    dec = [(n, e.url) for n, e in by_role(entries, "decode")]
    if not pre or not dec:
        raise ValueError(f"--endpoints {path}: needs at least one prefill and one decode entry")
    return pre, dec


async def serve(proxy: PDProxy, host: str, port: int, started: threading.Event | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Serve ``proxy`` on ``host:port`` until ``stop`` is set (forever without one); sets
    ``started`` once the socket listens. Raises OSError when the port cannot be bound."""
    runner = web.AppRunner(proxy.app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, backlog=1024).start()
        if started is not None:
            started.set()
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        await runner.cleanup()


class ProxyThread:
    """A proxy serving from a daemon thread of this process (``pdrig up --proxy``, tests).

    ``url`` is its base URL once :meth:`start` returned; :meth:`stop` ends it. Being a thread of
    the caller, it cannot outlive it. ``start`` raises OSError when the port cannot be bound.
    """

    def __init__(self, proxy: PDProxy, host: str = "127.0.0.1", port: int = 8000):
        self.proxy, self.host, self.port = proxy, host, port
        self.url = f"http://{host}:{port}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="pdrig-proxy", daemon=True)
        self._started = threading.Event()

    def _main(self) -> None:
        async def run() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            await serve(self.proxy, self.host, self.port, self._started, self._stop)
        try:
            aio.run(run())
        except BaseException as e:  # reported by start()
            self._error = e
            self._started.set()

    def start(self, timeout_s: float = 10.0) -> ProxyThread:
        """Start serving and wait until the socket listens; returns self (already serving: no-op)."""
        if self._thread.is_alive():
            return self
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise TimeoutError(f"the proxy did not listen on {self.url} within {timeout_s:g} s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        """Stop serving (in-flight requests are cancelled) and join the thread."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def reserved_proxy(prefills: Sequence[tuple[str, str]], decodes: Sequence[tuple[str, str]], lock_dir: str | Path,
                   holder: str, host: str = "127.0.0.1", timeout_s: float = 600.0) -> Iterator[ProxyThread]:
    """A :class:`ProxyThread` over ``prefills`` / ``decodes`` on a free port of ``host`` that this
    run reserves (the rig's port locks in ``lock_dir``, written with ``holder``), for a scenario
    whose requests go through ``pdrig proxy``; stopped and unlocked on exit. Raises
    rig.cluster.ports.PortConflict when no free port could be locked in 20 tries."""
    res = PortReservation(lock_dir, holder)
    for _ in range(20):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        try:
            res.acquire({port: "pdrig proxy of a router scenario"})
            break
        except PortConflict:  # another run took it between bind and lock: try another
            continue
    else:
        raise PortConflict("pdrig proxy: no free port could be reserved in 20 tries", 0, "")
    thread = ProxyThread(PDProxy(prefills, decodes, timeout_s=timeout_s), host, port)
    try:
        thread.start()
        yield thread
    finally:
        thread.stop()
        res.release()

"""The wave engine: many two-hop P/D requests at bounded concurrency, one record per request.

Each request is the P/D exchange of :mod:`rig.transport.client` (prefill hop to P with ``max_tokens: 1``
and ``do_remote_decode``, then the decode hop to D with P's ``kv_transfer_params``), run by one
of ``concurrency`` workers (a worker pool: at most ``concurrency`` requests in flight, like a
semaphore, without a task per waiting request). Every request has a deadline for both hops.

The decode hop is streamed (SSE, gives TTFT) or not, per request. A request can be cancelled on
purpose at one of three points (:data:`CANCEL_POINTS`):

- ``before-prefill``: the prefill hop is abandoned ``cancel_prefill_after_s`` after it was sent,
  before P answered (the connection is closed, so vLLM aborts the request). If P answers first,
  the request is abandoned between the hops instead and recorded so (``cancel_point: between``).
- ``between``: P answered (and holds the KV for D); D is never asked. On vLLM, P frees those
  blocks when ``kv_lease_duration`` (30 s) expires; drain checks must wait longer than that.
- ``during-decode``: D's stream is closed right after its first token arrives.

Outcome (``status``) of a record: ``ok`` or its error class: ``timeout`` (deadline passed),
``http_error`` (non-200 answer, or P answering without ``kv_transfer_params``),
``connection_error``, ``empty`` (200 with no tokens), ``cancelled`` (intentional when
``planned_cancel`` is set, else an abort of the wave), ``parity_mismatch`` (set by
:meth:`WaveEngine.parity` when the tokens differ from a direct request to P).

Two well-kept HTTP clients implement the hops with the same bodies and error classes:
:class:`AiohttpTransport` (the default) and :class:`HttpxTransport` (via
:class:`~rig.transport.client.PDClient`). scripts/bench_workload.py measures them (figures in
docs/measurements.md): aiohttp is the default because httpx's pool does not scale to a wave's
concurrency. A faster hand-written HTTP client was deliberately not kept: the rig's job is P/D,
not HTTP.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import msgspec

from rig.transport.client import PREFILL_PARAMS, Hop, PDClient, classify, completion_body, error_text, fill_from_completion
from rig.observe.parity import ParityCase, run_parity
from rig.workload.edge import Endpoint

CANCEL_POINTS = ("before-prefill", "between", "during-decode")
ERROR_CLASSES = ("timeout", "http_error", "connection_error", "empty", "cancelled", "parity_mismatch")
STREAM_EXTRA = {"stream": True, "stream_options": {"include_usage": True}}
_JSON_HEADERS = {"Content-Type": "application/json"}
# msgspec's JSON codec: bodies (token-ID lists) encode ~10x and answers decode ~4x faster than the
# standard library's json (48-token prompt, 8-token answer: 6.2 -> 0.6 us and 7.1 -> 1.9 us per
# call on the 2-core/24 GiB CPU box, 2026-11-30, docs/performance.md). Its DecodeError is a ValueError.
_ENCODE = msgspec.json.Encoder().encode
_DECODE = msgspec.json.Decoder().decode


class _StreamState:
    """Accumulates one SSE stream; ``feed`` returns True when the caller should stop reading."""

    __slots__ = ("hop", "t0", "tokens", "stop_after", "cut")

    def __init__(self, hop: Hop, t0: float, stop_after: int | None):
        self.hop, self.t0, self.tokens, self.stop_after, self.cut = hop, t0, [], stop_after, False

    def feed(self, payload: bytes | str) -> bool:
        """One SSE ``data:`` payload (JSON or ``[DONE]``); True = stop reading."""
        if payload[:1] == "[" or payload[:1] == b"[":  # [DONE]
            return False
        return self.feed_obj(_DECODE(payload))

    def feed_obj(self, chunk: dict[str, Any]) -> bool:
        """One parsed stream chunk; True = stop reading."""
        if chunk.get("usage"):
            self.hop.usage = chunk["usage"]
        last = False
        for choice in chunk.get("choices") or ():
            ids = choice.get("token_ids") or ()
            if (ids or choice.get("text")) and self.hop.ttft_s is None:
                self.hop.ttft_s = time.monotonic() - self.t0
            self.tokens.extend(ids)
            if choice.get("finish_reason"):
                self.hop.finish_reason = choice["finish_reason"]
                last = True
        if self.stop_after is not None and not last and len(self.tokens) >= self.stop_after:
            self.cut = True  # intentional cancel during D's stream
            self.hop.finish_reason = "cancelled"
            return True
        return False


class Transport(Protocol):
    """The hops of a wave over one HTTP client. Hops never raise for HTTP problems: they
    return a :class:`~rig.transport.client.Hop` whose ``error`` starts with ``timeout``, ``HTTP <code>`` or
    ``connection error`` (see :func:`rig.transport.client.classify`); cancellation propagates."""

    name: str

    async def prefill(self, ep: Endpoint, prompt: list[int]) -> Hop:
        """The prefill hop (``max_tokens: 1``, ``do_remote_decode``); P answers with ``kv_transfer_params``."""

    async def decode(self, ep: Endpoint, prompt: list[int], max_tokens: int, ktp: dict[str, Any],
                     stream: bool, stop_after_tokens: int | None = None) -> Hop:
        """The decode hop with P's ``kv_transfer_params`` (``ktp``); streamed when ``stream``, closed
        after ``stop_after_tokens`` streamed tokens (an intentional cancellation during D's stream)."""

    async def direct(self, ep: Endpoint, prompt: list[int], max_tokens: int) -> Hop:
        """A non-disaggregated request: the parity reference."""

    async def aclose(self) -> None:
        """Close the client's connections."""


class HttpxTransport:
    """Hops over httpx: :class:`~rig.transport.client.PDClient` for the non-streamed hops, its connection
    pool for streams (read here so a stream can be cut after its first token)."""

    name = "httpx"

    def __init__(self, model: str, timeout_s: float, max_connections: int):
        self.client = PDClient(model, timeout_s=timeout_s, max_connections=max_connections)
        self.model = model

    async def prefill(self, ep: Endpoint, prompt: list[int]) -> Hop:
        """The prefill hop (``max_tokens: 1``, ``do_remote_decode``); P answers with ``kv_transfer_params``."""
        return await self.client.prefill(ep.name, ep.url, prompt, 1)

    async def decode(self, ep: Endpoint, prompt: list[int], max_tokens: int, ktp: dict[str, Any],
                     stream: bool, stop_after_tokens: int | None = None) -> Hop:
        """The decode hop with P's ``kv_transfer_params`` (``ktp``); streamed when ``stream``, closed
        after ``stop_after_tokens`` streamed tokens (an intentional cancellation during D's stream)."""
        if not stream:
            return await self.client.decode(ep.name, ep.url, prompt, max_tokens, ktp)
        hop = Hop(instance=ep.name)
        body = completion_body(self.model, prompt, max_tokens, kv_transfer_params=ktp, **STREAM_EXTRA)
        t0 = time.monotonic()
        st = _StreamState(hop, t0, stop_after_tokens)
        try:
            async with self.client.http.stream("POST", f"{ep.url}/v1/completions", json=body) as r:
                hop.status = r.status_code
                if r.status_code != 200:
                    hop.error = error_text(r.status_code, (await r.aread()).decode("utf-8", "replace"))
                else:
                    async for line in r.aiter_lines():
                        if line.startswith("data: ") and st.feed(line[6:]):
                            break  # leaving the block closes the unread response's connection
        except httpx.TimeoutException as e:
            hop.error = f"timeout: {type(e).__name__}"
        except httpx.HTTPError as e:
            hop.error = f"connection error: {type(e).__name__}: {e}"
        except ValueError as e:
            hop.error = f"connection error: bad SSE chunk: {e}"
        hop.latency_s = time.monotonic() - t0
        hop.token_ids = st.tokens
        return hop

    async def direct(self, ep: Endpoint, prompt: list[int], max_tokens: int) -> Hop:
        """A non-disaggregated request: the parity reference."""
        return await self.client.direct(ep.name, ep.url, prompt, max_tokens)

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self.client.aclose()


class AiohttpTransport:
    """Hops over aiohttp (the same bodies and error classes as :class:`HttpxTransport`)."""

    name = "aiohttp"

    def __init__(self, model: str, timeout_s: float, max_connections: int):
        import aiohttp

        self._aiohttp = aiohttp
        self.model = model
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, ttl_dns_cache=None),
            timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=10.0),
            read_bufsize=1 << 20,  # SSE lines with prompt_token_ids of long prompts
            # vLLM sets no cookies; without a jar aiohttp skips cookie filtering per request
            # (+5 % aiohttp exchanges per CPU-s against the fake, 2-core/24 GiB CPU box, 2026-11-30).
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent",))

    async def _post(self, hop: Hop, url: str, body: dict[str, Any]) -> Hop:
        t0 = time.monotonic()
        try:
            async with self.session.post(f"{url}/v1/completions", data=_ENCODE(body),
                                         headers=_JSON_HEADERS) as r:
                hop.status = r.status
                raw = await r.read()
        except TimeoutError as e:
            hop.error = f"timeout: {type(e).__name__}"
        except self._aiohttp.ClientError as e:
            hop.error = f"connection error: {type(e).__name__}: {e}"
        hop.latency_s = time.monotonic() - t0
        if hop.error:
            return hop
        if hop.status != 200:
            hop.error = error_text(hop.status, raw.decode("utf-8", "replace"))
            return hop
        try:
            fill_from_completion(hop, _DECODE(raw))
        except ValueError as e:
            hop.error = f"connection error: answer is not JSON: {e}"
        return hop

    async def prefill(self, ep: Endpoint, prompt: list[int]) -> Hop:
        """The prefill hop (``max_tokens: 1``, ``do_remote_decode``); P answers with ``kv_transfer_params``."""
        body = completion_body(self.model, prompt, 1, kv_transfer_params=dict(PREFILL_PARAMS))
        return await self._post(Hop(instance=ep.name), ep.url, body)

    async def decode(self, ep: Endpoint, prompt: list[int], max_tokens: int, ktp: dict[str, Any],
                     stream: bool, stop_after_tokens: int | None = None) -> Hop:
        """The decode hop with P's ``kv_transfer_params`` (``ktp``); streamed when ``stream``, closed
        after ``stop_after_tokens`` streamed tokens (an intentional cancellation during D's stream)."""
        if not stream:
            body = completion_body(self.model, prompt, max_tokens, kv_transfer_params=ktp)
            return await self._post(Hop(instance=ep.name), ep.url, body)
        hop = Hop(instance=ep.name)
        body = completion_body(self.model, prompt, max_tokens, kv_transfer_params=ktp, **STREAM_EXTRA)
        t0 = time.monotonic()
        st = _StreamState(hop, t0, stop_after_tokens)
        try:
            async with self.session.post(f"{ep.url}/v1/completions", data=_ENCODE(body),
                                         headers=_JSON_HEADERS) as r:
                hop.status = r.status
                if r.status != 200:
                    hop.error = error_text(r.status, (await r.read()).decode("utf-8", "replace"))
                else:
                    async for line in r.content:
                        if line.startswith(b"data: ") and st.feed(line[6:]):
                            r.close()  # drop the connection: vLLM aborts the request
                            break
        except TimeoutError as e:
            hop.error = f"timeout: {type(e).__name__}"
        except self._aiohttp.ClientError as e:
            hop.error = f"connection error: {type(e).__name__}: {e}"
        except ValueError as e:
            hop.error = f"connection error: bad SSE chunk: {e}"
        hop.latency_s = time.monotonic() - t0
        hop.token_ids = st.tokens
        return hop

    async def direct(self, ep: Endpoint, prompt: list[int], max_tokens: int) -> Hop:
        """A non-disaggregated request: the parity reference."""
        return await self._post(Hop(instance=ep.name), ep.url, completion_body(self.model, prompt, max_tokens))

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self.session.close()


CLIENTS = ("aiohttp", "httpx")


def make_transport(kind: str, model: str, timeout_s: float, max_connections: int) -> Transport:
    """An ``aiohttp`` or ``httpx`` transport; raises ValueError for another name."""
    if kind == "aiohttp":
        return AiohttpTransport(model, timeout_s, max_connections)
    if kind == "httpx":
        return HttpxTransport(model, timeout_s, max_connections)
    raise ValueError(f"unknown client {kind!r}; use one of {list(CLIENTS)}")


@dataclass(slots=True)
class WaveRequest:
    """One request of a wave: its prompt, cap, streaming and planned cancel point.

    ``keep_tokens``: keep the generated token IDs in the record (the parity sample).
    """

    index: int
    request_id: str
    prompt: list[int]
    max_tokens: int
    stream: bool = False
    cancel_at: str | None = None
    group: int | None = None
    keep_tokens: bool = False


@dataclass(slots=True)
class WaveRecord:
    """Everything the engine saw of one request (times in seconds).

    ``t_start``/``t_end`` are offsets from the wave's start; ``ttft_s`` is from the request's
    start to D's first streamed token (so it includes the prefill hop); ``latency_s`` from start
    to the end of the last hop. ``tokens`` counts token IDs received from D; ``usage_tokens`` is
    D's ``usage.completion_tokens``. ``cancel_point`` is where a cancel really happened.
    """

    request_id: str
    index: int
    prompt_len: int
    max_tokens: int
    stream: bool
    planned_cancel: str | None = None
    group: int | None = None
    status: str = "pending"
    error: str = ""
    cancel_point: str | None = None
    prefill: str | None = None
    decode: str | None = None
    p_status: int | None = None
    p_latency_s: float | None = None
    d_status: int | None = None
    d_latency_s: float | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    tokens: int | None = None
    usage_tokens: int | None = None
    t_start: float | None = None
    t_end: float | None = None
    token_ids: list[int] | None = None
    parity: str | None = None
    remote_request_id: str | None = None  # P's id for the KV it holds (kv_transfer_params)

    @property
    def intentional(self) -> bool:
        """True for a cancel the wave planned (any point)."""
        return self.status == "cancelled" and self.planned_cancel is not None

    @property
    def hops(self) -> int:
        """Hops sent: 0, 1 (P) or 2 (P and D)."""
        return (self.p_status is not None or self.p_latency_s is not None) + \
            (self.d_status is not None or self.d_latency_s is not None)

    def to_json(self) -> dict[str, Any]:
        """A compact JSON-able dict (one line of records.jsonl)."""
        d = {k: getattr(self, k) for k in self.__slots__ if k != "token_ids"}
        d["hops"] = [h for h in (
            {"instance": self.prefill, "status": self.p_status, "latency_s": self.p_latency_s}
            if self.prefill and self.hops >= 1 else None,
            {"instance": self.decode, "status": self.d_status, "latency_s": self.d_latency_s}
            if self.decode else None) if h]
        for k in ("p_latency_s", "d_latency_s", "ttft_s", "latency_s", "t_start", "t_end"):
            if d[k] is not None:
                d[k] = round(d[k], 5)
        return d


class WaveEngine:
    """Runs a list of :class:`WaveRequest` against P/D endpoints (round robin over several).

    ``counts`` is live: ``ok``, ``cancelled`` (intentional), ``failed`` (any error class),
    ``in_flight`` and ``started``; a progress display reads it while :meth:`run` works.
    """

    def __init__(self, transport: Transport, prefills: list[Endpoint], decodes: list[Endpoint],
                 concurrency: int, deadline_s: float, cancel_prefill_after_s: float = 0.005):
        if not prefills or not decodes:
            raise ValueError("a wave needs at least one prefill and one decode endpoint")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1 (got {concurrency})")
        self.transport = transport
        self.prefills, self.decodes = prefills, decodes
        self.concurrency, self.deadline_s = concurrency, deadline_s
        self.cancel_prefill_after_s = cancel_prefill_after_s
        self.counts: Counter[str] = Counter()
        self.t0: float | None = None
        self.records: list[WaveRecord] = []

    async def run(self, requests: list[WaveRequest]) -> list[WaveRecord]:
        """Send every request (at most ``concurrency`` at a time); one record each, in order.

        If the wave itself is cancelled (Ctrl-C), unfinished records are ``cancelled`` with
        ``error`` "wave aborted" and the cancellation propagates.
        """
        records = [WaveRecord(r.request_id, r.index, len(r.prompt), r.max_tokens, r.stream,
                              r.cancel_at, r.group) for r in requests]
        self.records = records  # readable when run() is interrupted: the partial wave
        self.t0 = time.monotonic()
        todo = iter(range(len(requests)))

        async def worker() -> None:
            for i in todo:  # a shared iterator: each index is taken by exactly one worker
                await self._one(requests[i], records[i])

        workers = [asyncio.create_task(worker()) for _ in range(min(self.concurrency, len(requests)))]
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            for rec in records:
                if rec.status == "pending":
                    rec.status, rec.error = "cancelled", "wave aborted"
        return records

    async def _one(self, req: WaveRequest, rec: WaveRecord) -> None:
        c = self.counts
        start = time.monotonic()
        rec.t_start = start - (self.t0 or start)
        c["started"] += 1
        c["in_flight"] += 1
        try:
            async with asyncio.timeout(self.deadline_s):
                await self._pd(req, rec, start)
        except TimeoutError:
            if rec.status == "pending":
                rec.status = "timeout"
                rec.error = f"no answer within the {self.deadline_s:g} s deadline"
        finally:
            end = time.monotonic()
            rec.latency_s, rec.t_end = end - start, end - (self.t0 or start)
            if rec.status == "pending":  # cancelled from outside (the wave was aborted)
                rec.status, rec.error = "cancelled", "wave aborted"
            c["in_flight"] -= 1
            c["ok" if rec.status == "ok" else "cancelled" if rec.intentional else "failed"] += 1

    async def _pd(self, req: WaveRequest, rec: WaveRecord, start: float) -> None:
        p = self.prefills[req.index % len(self.prefills)]
        d = self.decodes[req.index % len(self.decodes)]
        rec.prefill = p.name
        tr = self.transport
        if req.cancel_at == "before-prefill":
            try:
                async with asyncio.timeout(self.cancel_prefill_after_s):
                    hop = await tr.prefill(p, req.prompt)
            except TimeoutError:
                rec.p_latency_s = time.monotonic() - start
                rec.status, rec.cancel_point = "cancelled", "before-prefill"
                return
        else:
            hop = await tr.prefill(p, req.prompt)
        rec.p_status, rec.p_latency_s = hop.status, hop.latency_s
        outcome = classify(hop)
        if outcome != "ok" or not hop.kv_transfer_params:
            if outcome == "ok":
                rec.status = "http_error"
                rec.error = "prefill answered without kv_transfer_params (is P a kv_producer?)"
            else:
                rec.status, rec.error = outcome, f"prefill: {hop.error or 'empty answer'}"
            return
        if req.cancel_at in ("before-prefill", "between"):  # P answered first: abandon between hops
            rec.status, rec.cancel_point = "cancelled", "between"
            return
        rec.decode = d.name
        rec.remote_request_id = hop.kv_transfer_params.get("remote_request_id")
        cut = 1 if req.cancel_at == "during-decode" else None
        sent = time.monotonic()
        hop = await tr.decode(d, req.prompt, req.max_tokens, hop.kv_transfer_params,
                              stream=req.stream or cut is not None, stop_after_tokens=cut)
        rec.d_status, rec.d_latency_s = hop.status, hop.latency_s
        if hop.ttft_s is not None:
            rec.ttft_s = sent - start + hop.ttft_s
        rec.tokens = len(hop.token_ids) if hop.token_ids is not None else None
        rec.usage_tokens = (hop.usage or {}).get("completion_tokens")
        outcome = classify(hop)
        if outcome == "ok" and hop.finish_reason == "cancelled":
            rec.status, rec.cancel_point = "cancelled", "during-decode"
            return
        rec.status = outcome
        if outcome != "ok":
            rec.error = f"decode: {hop.error or 'empty answer (200 without tokens)'}"
        elif req.keep_tokens:
            rec.token_ids = hop.token_ids

    async def parity(self, records: list[WaveRecord], requests: list[WaveRequest],
                     reference: Endpoint | None = None) -> dict[str, int]:
        """Compare every ``ok`` record that kept its tokens with a direct (non-disaggregated)
        request to P (``reference``, default the P that served it). A divergence turns the
        record's status into ``parity_mismatch``. Returns ``{compared, equal, diverged, failed}``.
        """
        todo = [rec for rec in records if rec.status == "ok" and rec.token_ids is not None]

        def case(rec: WaveRecord) -> ParityCase:
            req = requests[rec.index]
            ep = reference or next(p for p in self.prefills if p.name == rec.prefill)
            return ParityCase(Hop(instance=rec.decode or "", token_ids=rec.token_ids), req.max_tokens,
                              lambda: self.transport.direct(ep, req.prompt, req.max_tokens))

        outcomes = await run_parity([case(rec) for rec in todo], self.concurrency, self.deadline_s)
        out: Counter[str] = Counter()
        for rec, o in zip(todo, outcomes):
            assert o is not None
            if o.result is None:
                rec.parity = f"reference failed: {o.failure}"
                out["failed"] += 1
                continue
            res = o.result
            rec.parity = res.describe()
            out["compared"] += res.status != "refused"
            out[res.status] += 1
            if res.status == "diverged":
                rec.status, rec.error = "parity_mismatch", f"parity: {res.describe()}"
                self.counts["ok"] -= 1
                self.counts["failed"] += 1
        return {k: out.get(k, 0) for k in ("compared", "equal", "diverged", "refused", "failed")}


def plan_cancels(n: int, fraction: float, points: list[str] | tuple[str, ...], seed: int) -> list[str | None]:
    """``n`` entries: ``round(fraction * n)`` random ones get a cancel point (round robin over
    ``points``), the rest None. Deterministic for a seed. Raises ValueError for an unknown point."""
    bad = [p for p in points if p not in CANCEL_POINTS]
    if bad:
        raise ValueError(f"unknown cancel points {bad}; choose from {list(CANCEL_POINTS)}")
    k = round(fraction * n)
    out: list[str | None] = [None] * n
    chosen = sorted(random.Random(seed).sample(range(n), k)) if k else []
    for j, i in enumerate(chosen):
        out[i] = points[j % len(points)]
    return out

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

The outcome of a record (:class:`~rig.transport.records.WaveRecord`, ``outcome`` in the one
vocabulary of rig.transport.records): ``ok`` or its error class: ``timeout`` (deadline passed),
``http_error`` (non-200 answer, or P answering without ``kv_transfer_params``),
``connection_error``, ``empty`` (200 with no tokens), ``cancelled`` (intentional when
``planned_cancel`` is set, else an abort of the wave), ``parity_mismatch`` (set by
:meth:`WaveEngine.parity` when the tokens differ from a direct request to P). The hops go
through a :class:`~rig.transport.client.Transport` (rig.transport.client.make_transport: client
``aiohttp``, ``httpx`` or ``fast``, rig.transport.fast).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass

from rig.observe.parity import ParityCase, run_parity
from rig.transport.client import Transport
from rig.transport.endpoint import Endpoint
from rig.transport.records import ERROR_OUTCOMES, Hop, WaveRecord, classify, prefill_failure

CANCEL_POINTS = ("before-prefill", "between", "during-decode")
ERROR_CLASSES = ERROR_OUTCOMES


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
        ``diagnosis`` "wave aborted" and the cancellation propagates.
        """
        records = [WaveRecord(request_id=r.request_id, index=r.index, prompt_len=len(r.prompt),
                              max_tokens=r.max_tokens, stream=r.stream, planned_cancel=r.cancel_at, group=r.group)
                   for r in requests]
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
                if rec.outcome == "pending":
                    rec.outcome, rec.diagnosis = "cancelled", "wave aborted"
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
            if rec.outcome == "pending":
                rec.outcome = "timeout"
                rec.diagnosis = f"no answer within the {self.deadline_s:g} s deadline"
        finally:
            end = time.monotonic()
            rec.latency_s, rec.t_end = end - start, end - (self.t0 or start)
            if rec.outcome == "pending":  # cancelled from outside (the wave was aborted)
                rec.outcome, rec.diagnosis = "cancelled", "wave aborted"
            c["in_flight"] -= 1
            c["ok" if rec.outcome == "ok" else "cancelled" if rec.intentional else "failed"] += 1

    async def _pd(self, req: WaveRequest, rec: WaveRecord, start: float) -> None:
        p = self.prefills[req.index % len(self.prefills)]
        d = self.decodes[req.index % len(self.decodes)]
        rec.p_instance = p.name
        tr = self.transport
        if req.cancel_at == "before-prefill":
            try:
                async with asyncio.timeout(self.cancel_prefill_after_s):
                    hop = await tr.prefill(p, req.prompt)
            except TimeoutError:
                rec.p_latency_s = time.monotonic() - start
                rec.outcome, rec.cancel_point = "cancelled", "before-prefill"
                return
        else:
            hop = await tr.prefill(p, req.prompt)
        rec.p_status, rec.p_latency_s = hop.status, hop.latency_s
        failure = prefill_failure(hop)
        if failure or not hop.kv_transfer_params:
            rec.outcome, rec.diagnosis = failure or ("http_error", "no kv_transfer_params")
            return
        if req.cancel_at in ("before-prefill", "between"):  # P answered first: abandon between hops
            rec.outcome, rec.cancel_point = "cancelled", "between"
            return
        rec.d_instance = d.name
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
            rec.outcome, rec.cancel_point = "cancelled", "during-decode"
            return
        rec.outcome = outcome
        if outcome != "ok":
            rec.diagnosis = f"decode: {hop.error or 'empty answer (200 without tokens)'}"
        elif req.keep_tokens:
            rec.token_ids = hop.token_ids

    async def parity(self, records: list[WaveRecord], requests: list[WaveRequest],
                     reference: Endpoint | None = None) -> dict[str, int]:
        """Compare every ``ok`` record that kept its tokens with a direct (non-disaggregated)
        request to P (``reference``, default the P that served it). A divergence turns the
        record's outcome into ``parity_mismatch``. Returns ``{compared, equal, diverged, failed}``.
        """
        todo = [rec for rec in records if rec.outcome == "ok" and rec.token_ids is not None]

        def case(rec: WaveRecord) -> ParityCase:
            req = requests[rec.index]
            ep = reference or next(p for p in self.prefills if p.name == rec.p_instance)
            return ParityCase(Hop(instance=rec.d_instance or "", token_ids=rec.token_ids), req.max_tokens,
                              lambda: self.transport.direct(ep, req.prompt, req.max_tokens))

        outcomes = await run_parity([case(rec) for rec in todo], self.concurrency, self.deadline_s)
        out: Counter[str] = Counter()
        for rec, o in zip(todo, outcomes, strict=True):
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
                rec.outcome, rec.diagnosis = "parity_mismatch", f"parity: {res.describe()}"
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

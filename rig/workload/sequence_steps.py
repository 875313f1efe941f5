"""The sequence executor's parts that are not one scenario's run (rig.workload.sequence): how far a
step's requests got (:class:`StepState`, what start rules wait on) and the hop orderings of a router
that is not the rig's plain P-then-D client (rig.config.sequence.ROUTE_EVENTS):

- :func:`retried_decode` (route ``pd-retry``): the decode hop sent, closed after ``retry_after_ms``
  (or ended first: its answer counted as lost with a dropped connection), then sent again with the
  same ``kv_transfer_params``, as a router does after a timeout or a dropped connection;
- :func:`swallowed` (route ``pd-swallow-cancel``): the client closes at its cancel time, the router
  does not forward the abort, the hops run to completion and the rig reads them to the end;

and :func:`probe_refusals`, what D itself answers to a router request that got no answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rig.config.sequence import SequenceConfig, Step
from rig.transport.client import cancel_task
from rig.transport.endpoint import Endpoint
from rig.transport.hops import DecodeRequest
from rig.transport.records import Hop, HopFailure, PDRecord, classify
from rig.workload.sequence_result import RefusalProbe, SequenceEntry


class StepState:
    """How far the requests of one step got: per event, how many reached it; how many ended."""

    def __init__(self, step: Step):
        self.step = step
        self.n = step.count * step.decode_hops  # records of the step
        self.reached: dict[str, int] = {}
        self.ended = 0
        self.changed = asyncio.Condition()

    async def mark(self, event: str) -> None:
        """One request of the step reached ``event``."""
        self.reached[event] = self.reached.get(event, 0) + 1
        async with self.changed:
            self.changed.notify_all()

    async def end(self) -> None:
        """One request of the step ended (whatever its outcome)."""
        self.ended += 1
        async with self.changed:
            self.changed.notify_all()

    async def wait(self, event: str) -> bool:
        """True once every request reached ``event``; False once that can no longer happen."""
        n = self.n
        async with self.changed:
            await self.changed.wait_for(lambda: self.reached.get(event, 0) >= n or self.ended >= n)
        return self.reached.get(event, 0) >= n


@dataclass
class Retried:
    """What :func:`retried_decode` saw: the ``first`` attempt (its answer, or a connection error
    "closed by the router" when it was closed in flight), ``how`` it ended in words, and the
    ``retry`` (the hop the request is judged on)."""

    first: Hop
    how: str
    retry: Hop


async def retried_decode(client: Any, d: Endpoint, want: DecodeRequest, ktp: dict[str, Any], endpoint: str,
                         after_ms: float, on_retry: Callable[[], Awaitable[None]]) -> Retried:
    """Route ``pd-retry``'s decode hop to ``d``: ``want`` (rig.transport.hops.derive_decode) with P's
    ``ktp``, closed ``after_ms`` ms after it was sent unless it ended first (then its answer counts
    as lost with the connection: a router that never saw it retries at once), then ``on_retry()``
    and the same request with the same ``ktp`` again. With vLLM's NIXL connector D tells P it is
    done after the first attempt's pull and P frees the blocks (nixl base_worker.py), so the retry
    may read released blocks: what the judge holds it to (rig.judge.sequence_checks)."""
    def send() -> Awaitable[Hop]:
        return client.decode(d, want.prompt, want.max_tokens, ktp, fields=want.fields, endpoint=endpoint,
                             strip=want.strip)

    t0 = time.monotonic()
    first_task = asyncio.ensure_future(send())
    try:
        done, _ = await asyncio.wait({first_task}, timeout=after_ms / 1000)
    finally:
        if not first_task.done():
            await cancel_task(first_task)  # the router's timeout: it closes the connection
    if first_task in done:
        first = first_task.result()
        how = (f"first decode attempt ended ({classify(first)}) {1000 * (time.monotonic() - t0):.0f} ms after it "
               "was sent: retried as a dropped connection (its answer lost)")
    else:
        first = Hop(instance=d.name).fail(HopFailure.CONNECTION_ERROR,
                                          f"closed by the router {after_ms:g} ms after it was sent (its timeout)")
        how = f"first decode attempt closed in flight {after_ms:g} ms after it was sent (the router's timeout)"
    await on_retry()
    return Retried(first, how, await send())


async def swallowed(route: Awaitable[None], at_ms: float, on_close: Callable[[], None]) -> None:
    """Route ``pd-swallow-cancel``: run ``route`` (the request's P and D hops), call ``on_close()``
    when the client closes ``at_ms`` ms after sending while ``route`` is still running, and read the
    hops to their end anyway (the router does not forward the abort). Cancelling this cancels the
    hops (the scenario's deadline, a stall)."""
    inner = asyncio.ensure_future(route)
    try:
        done, _ = await asyncio.wait({inner}, timeout=at_ms / 1000)
        if inner not in done:
            on_close()
        await inner
    finally:
        if not inner.done():
            await cancel_task(inner)


async def probe_refusals(ctx: Any, spec: SequenceConfig, entries: Iterable[SequenceEntry],
                         records: Mapping[str, PDRecord]) -> list[RefusalProbe]:
    """Every router request of ``entries`` that ended without an answer (``records`` by request
    id), sent once more straight to ``ctx.decode`` with the same body: what D itself answers, for
    the ``refusal-relayed`` check (bug record R27: a router must pass D's refusal on, never report 200)."""
    by_step, out = {s.id: s for s in spec.steps}, []
    for e in entries:
        rec = records[e.request_id]
        if e.route != "router" or rec.outcome in ("ok", "cancelled", "stalled") or rec.decode is None:
            continue
        s = by_step[e.step]
        hop = await ctx.client.direct(ctx.decode, rec.prompt, rec.max_tokens, fields=s.fields_for("decode"),
                                      endpoint=s.endpoint)
        out.append(RefusalProbe(rec.request_id, rec.decode.status, rec.decode.error or "", hop.status, hop.error or ""))
    return out

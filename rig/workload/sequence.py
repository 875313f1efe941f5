"""Requests over several routes in a given order: the executor of ``kind: sequence`` (bug record R02, R06).

Every step of the scenario (:mod:`rig.config.sequence`) becomes ``count`` requests sent together
when the step's start rule fires: at the scenario's start, or ``after_ms`` after an earlier step
reached an event (``sent``, ``prefill-answered``, ``decode-sent``, ``answered``; a step reaches an
event when every one of its requests has). A step whose event can no longer come (a request of
the referenced step ended before reaching it) is never sent; its requests end ``cancelled`` with
the diagnosis naming the event that did not come. Nothing fires before its event: the start
waits on the event itself, then sleeps the rest of ``after_ms`` on the monotonic clock.

Routes: ``pd`` (P hop with ``do_remote_decode``, then D hop with P's ``kv_transfer_params``),
``decode`` (one request straight to D, never any ``kv_transfer_params``), ``prefill`` (one plain
request to P), ``pd-abandon`` (P hop only; outcome ``cancelled``, "abandoned by the scenario"),
``router`` (one request to the router, ``pdrig proxy`` the rig started or the user's URL, which
drives both hops), ``pd-retry`` and ``pd-swallow-cancel`` (a router that retries the decode hop
with the same params, one that swallows the client's cancel: rig.workload.sequence_steps). A
one-hop request keeps its hop in ``PDRecord.decode`` (the hop that answered; its ``instance``
says where it went: ``router`` for the router route) so the checks every kind shares read it
unchanged.

A ``pd`` step's ``transform`` derives D's request(s) from the prompt and P's answer
(rig.transport.hops.derive_decode); with ``decode_hops`` > 1 one P answer feeds several decode
hops, each its own record (request ids ``<scenario>-<step>-<k * decode_hops + j>``). The prompt D
got is kept in ``PDRecord.decode_prompt`` and parity is computed against the reference of that
prompt. A router step's request that ended without an answer is sent once more straight to D
with the same body (``refusals``): the client's status and error must be D's own.
A ``pd`` step with ``cancel_after_ms`` closes request k's hops in flight at its point of the sweep
(outcome ``cancelled``, :data:`CANCELLED`; event ``cut``), and no later hop is sent.

While any request is outstanding, D is watched by the one stall watcher
(:func:`rig.observe.stall.watch`); on a stall every outstanding request is cancelled and ends
``stalled`` with the diagnosis, which names the steps whose requests were outstanding. P's
``vllm:nixl_num_kv_expired_reqs_total`` is sampled too when a step abandons its decode hop, so the
``lease-reaped`` check can say when P reaped the abandoned leases and which steps were still
outstanding then (bug record R06: a heartbeated entry must not shield expired ones).

Each request's step, route and event times (ms from the scenario's start) go to
``sequence-<scenario>.json`` in the run directory, also when the scenario fails or is interrupted
(the result's types: :mod:`rig.workload.sequence_result`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict
from typing import Any

import httpx

from rig.config import ScenarioConfig
from rig.config.sequence import Step
from rig.observe import metrics as m
from rig.observe.events import trigger_of
from rig.observe.observations import ScenarioObservation, wait_idle
from rig.observe.parity import record_parity
from rig.observe.stall import StallWatcher, watch
from rig.transport.client import cancel_task
from rig.transport.endpoint import Endpoint
from rig.transport.hops import DecodeRequest, derive_decode
from rig.transport.records import Hop, PDRecord, classify, prefill_failure
from rig.workload.prompts import make_prompt, resolve, seed_of
from rig.workload.sequence_result import (
    ABANDONED,
    CANCELLED,
    SWALLOWED,
    GaugeGap,
    LeaseReap,
    RefusalProbe,
    SequenceEntry,
    SequenceResult,
    at_d,
    step_of,
)
from rig.workload.sequence_steps import StepState, probe_refusals, retried_decode, swallowed

# The result types (defined in rig.workload.sequence_result) are importable from the executor's
# module too: the judge, the report and the tests name them by the kind.
__all__ = ["ABANDONED", "CANCELLED", "SWALLOWED", "GaugeGap", "LeaseReap", "RefusalProbe", "SequenceEntry",
           "SequenceResult", "run_sequence_scenario", "step_of"]


class _Sequence:
    """One sequence scenario's run."""

    def __init__(self, sc: ScenarioConfig, ctx: Any, obs: ScenarioObservation):
        assert sc.sequence is not None  # the config validator guarantees it for kind sequence
        self.sc, self.ctx, self.obs, self.spec = sc, ctx, obs, sc.sequence
        self.result = SequenceResult()
        self.t0 = time.monotonic()
        self.states = {s.id: StepState(s) for s in self.spec.steps}
        self.entries: dict[str, SequenceEntry] = {}
        self.tasks: dict[str, asyncio.Task] = {}  # by the group's first request id
        self.groups: dict[str, list[PDRecord]] = {}  # first request id -> the records of one P answer
        self.decode_fields: dict[str, tuple[dict, dict, tuple[str, ...]]] = {}  # rid -> decode/reference fields, strip
        self.deadline_s = sc.deadline_s or ctx.cfg.timeouts.request_s
        self.router = Endpoint("router", self.spec.router_url or getattr(ctx, "router_url", None) or "")

    def ms(self) -> float:
        return round(1000 * (time.monotonic() - self.t0), 1)

    # -- records --------------------------------------------------------------------------

    def _records(self) -> list[tuple[Step, PDRecord]]:
        """Every step's records, in step order; ``prefix_of`` prompts start with the source step's
        (its request ``k mod count``); ``repeat_of`` prompts are filled when the step is sent; the
        others follow the seed rule or their ``same_as`` / ``head_of`` (rig.workload.prompts.resolve)."""
        seed = self.sc.seed if self.sc.seed is not None else seed_of(self.sc.name)
        out: list[tuple[Step, PDRecord]] = []
        prompts: dict[str, list] = {}
        for s in self.spec.steps:
            prompts[s.id] = []
            for k in range(s.count):
                if s.prefix_of is not None:
                    src = prompts[s.prefix_of]
                    head = src[k % len(src)]
                    prompt = head + make_prompt(s.prompt_tokens - len(head), seed_of(f"{seed}/{s.id}/{k}"))
                else:  # the seed rule, or same_as / head_of (rig.workload.prompts.resolve)
                    prompt = resolve(self.ctx.cfg.scenarios, self.sc, s, k)
                prompts[s.id].append(prompt)
                group = []
                for j in range(s.decode_hops):
                    rid = f"{self.sc.name}-{s.id}-{k * s.decode_hops + j}"
                    rec = PDRecord(request_id=rid, prompt_len=s.prompt_tokens, max_tokens=s.max_tokens,
                                   prompt=list(prompt), endpoint=s.endpoint)
                    self.entries[rid] = SequenceEntry(rid, s.id, s.route)
                    out.append((s, rec))
                    group.append(rec)
                self.groups[group[0].request_id] = group
        return out

    async def _reach(self, s: Step, rec: PDRecord, event: str) -> None:
        self.entries[rec.request_id].events_ms[event] = self.ms()
        await self.states[s.id].mark(event)

    async def _reach_all(self, s: Step, recs: list[PDRecord], event: str) -> None:
        for rec in recs:
            await self._reach(s, rec, event)

    # -- one request ----------------------------------------------------------------------

    async def _one(self, s: Step, recs: list[PDRecord]) -> None:
        """Send the group ``recs`` (one P/D request; several records when one P answer feeds
        several decode hops) over ``s.route``, bounded by the scenario's deadline."""
        try:
            async with asyncio.timeout(self.deadline_s):
                at_ms = s.cancel_at_ms(int(recs[0].request_id.rsplit("-", 1)[1]) // s.decode_hops)
                if at_ms is None:
                    await self._route(s, recs)
                elif s.route == "pd-swallow-cancel":
                    await swallowed(self._route(s, recs), at_ms, lambda: self._client_closed(recs, at_ms))
                else:
                    await self._cut(s, recs, at_ms)
        except TimeoutError:
            for rec in recs:
                if rec.outcome == "pending":
                    rec.outcome, rec.diagnosis = "timeout", f"no answer within the {self.deadline_s:.0f} s deadline"
        except asyncio.CancelledError:
            for rec in recs:
                if rec.outcome == "pending":
                    rec.outcome, rec.diagnosis = "cancelled", "cancelled by the rig (the run was interrupted)"
            raise
        finally:
            for rec in recs:
                e = self.entries[rec.request_id]
                e.ended_ms, e.outcome, e.diagnosis = self.ms(), rec.outcome, rec.diagnosis
                if rec.decode_sent_at is not None and rec.verdict_after_s is None:
                    rec.verdict_after_s = time.monotonic() - rec.decode_sent_at
                await self.states[s.id].end()

    async def _cut(self, s: Step, recs: list[PDRecord], at_ms: float) -> None:
        """Send the group ``recs`` over ``s.route`` and close whatever hops are in flight ``at_ms``
        after it was sent (no later hop is sent); a request answered first keeps its answer."""
        inner = asyncio.create_task(self._route(s, recs))
        done, _ = await asyncio.wait({inner}, timeout=at_ms / 1000)
        if inner in done:
            inner.result()
            return
        await cancel_task(inner)
        for rec in recs:
            if rec.outcome not in ("pending", "cancelled"):
                continue  # this decode hop ended before the cut
            e = self.entries[rec.request_id]
            e.events_ms["cut"] = self.ms()
            hop = "decode" if "decode-sent" in e.events_ms else "prefill"
            rec.outcome, rec.diagnosis = "cancelled", f"{CANCELLED}: {hop} hop closed {at_ms:g} ms after it was sent"

    def _client_closed(self, recs: list[PDRecord], at_ms: float) -> None:
        """Route pd-swallow-cancel: the client closed ``at_ms`` after sending; the hops run on."""
        for rec in recs:
            self.entries[rec.request_id].events_ms["client-closed"] = self.ms()
            rec.diagnosis = f"{SWALLOWED} (client closed at {at_ms:g} ms)"

    async def _answered(self, s: Step, rec: PDRecord) -> None:
        """``answered`` when the client got the answer: not after a swallowed cancel's close."""
        if rec.outcome == "ok" and "client-closed" not in self.entries[rec.request_id].events_ms:
            await self._reach(s, rec, "answered")

    def _repeat_prompt(self, s: Step, rec: PDRecord) -> bool:
        """Fill ``rec.prompt`` from the prompt D got in step ``s.repeat_of`` (its request of the same
        index modulo its count); False (request ended ``cancelled``) when that request never got
        P's answer, so there is no such prompt."""
        src = next(st for st in self.spec.steps if st.id == s.repeat_of)
        k = int(rec.request_id.rsplit("-", 1)[1]) % (src.count * src.decode_hops)
        got = self._by_id[f"{self.sc.name}-{src.id}-{k}"]
        if src.appends and got.decode_prompt is None:
            rec.outcome, rec.diagnosis = "cancelled", (f"not sent: {got.request_id} (step {src.id!r}) got no P "
                                                       "answer, so the prompt D got there does not exist")
            return False
        rec.prompt = list(got.decode_prompt if got.decode_prompt is not None else got.prompt)
        return True

    async def _route(self, s: Step, recs: list[PDRecord]) -> None:
        client, p, d = self.ctx.client, self.ctx.prefill, self.ctx.decode
        rec = recs[0]
        if s.repeat_of is not None and not self._repeat_prompt(s, rec):
            return
        await self._reach_all(s, recs, "sent")
        if s.route in ("decode", "prefill", "router"):
            ep = {"decode": d, "prefill": p, "router": self.router}[s.route]
            rec.decode_sent_at = time.monotonic()
            rec.decode = await client.direct(ep, rec.prompt, rec.max_tokens, fields=s.fields_for("decode"),
                                             endpoint=s.endpoint)
            self._finish(rec)
            await self._answered(s, rec)
            return
        rec.prefill = await client.prefill(p, rec.prompt, fields=s.fields_for("prefill"), endpoint=s.endpoint)
        for sib in recs[1:]:
            sib.prefill = rec.prefill
        failure = prefill_failure(rec.prefill)
        if failure:
            for r in recs:
                r.outcome, r.diagnosis = failure
            return
        await self._reach_all(s, recs, "prefill-answered")
        if s.route == "pd-abandon":
            rec.outcome, rec.diagnosis = "cancelled", ABANDONED
            return
        try:
            wants = derive_decode(s.transform, rec.prompt, rec.prefill, rec.max_tokens, s.fields_for("decode"),
                                  s.fields_for("reference"))
        except ValueError as e:  # P answered without token_ids: nothing to append
            for r in recs:
                r.outcome, r.diagnosis = "empty", f"{rec.prefill.instance}: router transform: {e}"
            return
        ktp = rec.prefill.kv_transfer_params or {}
        tasks = []
        for r, want in zip(recs, wants, strict=True):
            r.max_tokens = want.max_tokens
            if want.prompt != r.prompt:
                r.decode_prompt = list(want.prompt)
            self.decode_fields[r.request_id] = (want.fields, want.reference_fields, want.strip)
            r.decode_sent_at = time.monotonic()
            tasks.append(asyncio.create_task(
                self._retried(s, r, want, ktp) if s.route == "pd-retry" else
                client.decode(d, want.prompt, want.max_tokens, ktp, fields=want.fields, endpoint=s.endpoint,
                              strip=want.strip)))
        await self._reach_all(s, recs, "decode-sent")
        try:
            for r, task in zip(recs, tasks, strict=True):
                r.decode = await task
                self._finish(r)
                await self._answered(s, r)
        finally:
            for task in tasks:
                await cancel_task(task)

    async def _retried(self, s: Step, rec: PDRecord, want: DecodeRequest, ktp: dict) -> Hop:
        """Route pd-retry's decode hop (rig.workload.sequence_steps.retried_decode): the retry's hop,
        the first attempt kept in ``rec.first_decode``."""
        async def again() -> None:
            self.entries[rec.request_id].events_ms["retry-sent"] = self.ms()
            rec.decode_sent_at = time.monotonic()  # the latency of the hop judged: the retry's

        assert s.retry_after_ms is not None  # the config validator guarantees it for route pd-retry
        got = await retried_decode(self.ctx.client, self.ctx.decode, want, ktp, s.endpoint, s.retry_after_ms, again)
        rec.first_decode, self.entries[rec.request_id].first_attempt = got.first, got.how
        return got.retry

    @staticmethod
    def _finish(rec: PDRecord) -> None:
        rec.verdict_after_s = time.monotonic() - (rec.decode_sent_at or time.monotonic())
        rec.outcome = classify(rec.decode)
        if rec.outcome != "ok":
            rec.diagnosis = f"{rec.decode.instance if rec.decode else 'decode'}: " \
                            f"{(rec.decode.error if rec.decode else None) or 'empty answer'}"

    # -- one step -------------------------------------------------------------------------

    async def _step(self, s: Step, recs: list[PDRecord]) -> None:
        """Wait for ``s``'s start rule, then send its requests together."""
        if s.start is not None:
            came = await self.states[s.start.after].wait(s.start.event)
            if not came:
                why = (f"not sent: step {s.start.after!r} never reached {s.start.event} "
                       f"(a request of it ended before)")
                for rec in recs:
                    rec.outcome, rec.diagnosis = "cancelled", why
                    e = self.entries[rec.request_id]
                    e.outcome, e.diagnosis, e.ended_ms = rec.outcome, why, self.ms()
                    await self.states[s.id].end()
                return
            target = time.monotonic() + s.start.after_ms / 1000
            # asyncio may wake a timer up to its clock resolution early: sleep until really due.
            while (now := time.monotonic()) < target:
                await asyncio.sleep(target - now)
        leaders = [r for r in recs if r.request_id in self.groups]
        for rec in leaders:
            self.tasks[rec.request_id] = asyncio.create_task(self._one(s, self.groups[rec.request_id]))
        # Cancelled requests (a stall, the deadline) end as CancelledError; anything else is a rig bug
        # and must surface (the runner reports ERROR with rig-traceback.txt), never a quiet outcome.
        results = await asyncio.gather(*(self.tasks[r.request_id] for r in leaders), return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException) and not isinstance(res, asyncio.CancelledError):
                raise res

    def _outstanding(self) -> list[str]:
        """Steps with a request sent and not ended, as 'id (k of n)'."""
        out = []
        for sid, st in self.states.items():
            busy = [e for e in self.entries.values() if e.step == sid and e.sent_ms is not None and e.ended_ms is None]
            if busy:
                out.append(f"{sid} ({len(busy)} of {st.step.count}, route {st.step.route})")
        return out

    # -- watchers -------------------------------------------------------------------------

    async def _watch_d(self, done: asyncio.Event) -> None:
        """The stall watcher on D while requests are outstanding; on a stall, cancel every
        outstanding request with the diagnosis naming the steps they belong to."""
        t = self.ctx.cfg.timeouts
        d, http = self.ctx.decode, self.ctx.http
        self.result.gauge_window_s, self.result.sample_gap_s = t.stall_window_s, t.sample_gap_s

        async def scrape() -> m.MetricSnapshot:  # D's gauges: judged against requests outstanding all along it
            self.result.gauges.begin(at_d(self.entries.values()))
            return await m.scrape(http, d.url, d.name)

        def sampled(snap: m.MetricSnapshot) -> None:  # every snapshot the stall watcher is fed
            self.ctx.store.sample(self.sc.name, snap)
            self.result.stall_samples += 1  # counted here: the watcher task is cancelled at the end
            g = self.result.gauges
            g.feed(snap, g.held(at_d(self.entries.values())), time.monotonic(), self.ms())

        watcher = StallWatcher(t.stall_window_s, transfer_window_s=t.kv_transfer_s,
                               inconclusive_s=t.stall_inconclusive_wait(self.sc.deadline_s),
                               probe=self.ctx.cluster.proc_sample)
        with trigger_of(getattr(self.ctx, "events", None), d.name) as trigger:
            stall = await watch(watcher, scrape, done.is_set, t.metrics_interval_s, on_sample=sampled, trigger=trigger,
                                wake=done)
        if stall is None:
            self.result.stall_unwatched = watcher.unwatched()
            return
        outstanding = self._outstanding()
        self.result.stall = f"{stall.diagnosis}; outstanding: {', '.join(outstanding) or 'none'}"
        self.result.stalled_steps = [o.split(" ", 1)[0] for o in outstanding]
        for rid, task in self.tasks.items():
            e = self.entries[rid]
            if e.ended_ms is None and not task.done():
                for rec in self.groups[rid]:
                    if rec.outcome == "pending":
                        rec.outcome, rec.diagnosis, rec.stall = "stalled", self.result.stall, stall.facts
                task.cancel()

    async def _watch_p_expired(self, done: asyncio.Event) -> None:
        """Sample P's expired-lease counter until every abandoned lease was reaped, or until every
        request ended and ``nixl.kv_lease_duration + sequence.idle_margin_s`` passed since the last
        abandoned request's prefill answer (the bound the ``lease-reaped`` check applies)."""
        reap = self.result.reap
        assert reap is not None
        p, http = self.ctx.prefill, self.ctx.http
        interval = self.ctx.cfg.timeouts.metrics_interval_s
        bound_ms = 1000 * (self.ctx.cfg.lease_s_of(self.ctx.prefill.name) + self.spec.idle_margin_s)
        while True:
            try:
                snap = await m.scrape(http, p.url, p.name, timeout_s=2.0)
                self.ctx.store.sample(self.sc.name, snap)
                reap.samples += 1
                if reap.expired_before is not None and snap.has(m.NIXL_EXPIRED):
                    reap.rose = snap.value(m.NIXL_EXPIRED) - reap.expired_before
                    if reap.rose >= reap.want and reap.reaped_ms is None:
                        reap.reaped_ms = self.ms()
                        reap.outstanding_then = self._outstanding()
                        return
            except (httpx.HTTPError, ValueError):
                pass
            if done.is_set() and (reap.last_abandoned_ms is None or self.ms() > reap.last_abandoned_ms + bound_ms):
                return  # every request ended and the lease (+ margin) of the last abandoned one is over
            await asyncio.sleep(interval)

    # -- the scenario ---------------------------------------------------------------------

    async def run(self) -> SequenceResult:
        ctx, spec = self.ctx, self.spec
        self.result.lease_s = ctx.cfg.lease_s_of(ctx.prefill.name)
        if spec.routes_through_router:
            if not self.router.url:
                raise RuntimeError("a router step needs a router: the runner starts pdrig proxy for it "
                                   "(ScenarioContext.router_url) unless sequence.router.url is given")
            self.result.router_url = self.router.url
        pairs = self._records()
        self.obs.records = [rec for _, rec in pairs]
        self.result.entries = list(self.entries.values())
        self._by_id = {rec.request_id: rec for rec in self.obs.records}
        before = {e.name: await self._scrape(e) for e in (ctx.decode, ctx.prefill)}
        if spec.abandons:
            p_snap = before[ctx.prefill.name]
            self.result.reap = LeaseReap(
                expired_before=p_snap.value(m.NIXL_EXPIRED) if p_snap is not None and
                p_snap.has(m.NIXL_EXPIRED) else None,
                want=sum(s.count for s in spec.steps if s.route == "pd-abandon"))
        self.t0 = time.monotonic()
        done = asyncio.Event()
        watchers = [asyncio.create_task(self._watch_d(done))]
        if self.result.reap is not None:
            watchers.append(asyncio.create_task(self._watch_p_expired(done)))
        steps = [asyncio.create_task(self._step(s, [r for st, r in pairs if st is s])) for s in spec.steps]
        try:
            await asyncio.gather(*steps)
            if self.result.reap is not None:
                abandoned = [e.events_ms.get("prefill-answered") for e in self.entries.values()
                             if e.route == "pd-abandon"]
                self.result.reap.last_abandoned_ms = max((a for a in abandoned if a is not None), default=None)
            done.set()
            if self.result.reap is not None:
                # The watcher stops at its next sample now that ``done`` is set unless the leases
                # were reaped already; the drain below waits for what P still holds.
                await watchers[1]
        finally:
            done.set()
            for t in steps + watchers:
                await cancel_task(t)
        await self._drain(before)
        self.result.refusals += await probe_refusals(ctx, self.spec, self.entries.values(), self._by_id)
        await self._parity()
        return self.result

    async def _scrape(self, e: Any) -> m.MetricSnapshot | None:
        try:
            return await m.scrape(self.ctx.http, e.url, e.name)
        except (httpx.HTTPError, ValueError):
            return None

    async def _drain(self, before: dict[str, m.MetricSnapshot | None]) -> None:
        """P and D back to their pre-scenario KV usage within the bound: ``timeouts.drain_s``, or
        with abandoned requests ``nixl.kv_lease_duration + sequence.idle_margin_s`` (P frees an
        abandoned request's blocks when its lease expires, vllm/.../nixl/base_worker.py
        ``_reap_expired_send_leases``)."""
        ctx = self.ctx
        self.result.idle_bound_s = (ctx.cfg.lease_s_of(ctx.prefill.name) + self.spec.idle_margin_s
                                    if self.spec.abandons or self.spec.cancels else ctx.cfg.timeouts.drain_s)
        for e in (ctx.decode, ctx.prefill):
            snap = before[e.name]
            base = snap.value(m.KV_USAGE) if snap is not None else 0.0
            self.result.drains.append(await wait_idle(ctx.http, e.name, e.url, base, self.result.idle_bound_s))

    async def _parity(self) -> None:
        """Every answered request against the same prompt served directly by P (the reference
        instance of every kind; a straight-to-D request's reference is the same as a P/D one's)."""
        ctx = self.ctx
        self.obs.parity = [None] * len(self.obs.records)
        if not self.sc.parity:
            return
        steps = {e.request_id: e.step for e in self.entries.values()}
        by_step = {s.id: s for s in self.spec.steps}

        async def reference(rec: PDRecord):
            s = by_step[steps[rec.request_id]]
            # The request D got: a router transform's prompt (P's first token appended) and fields.
            fields = self.decode_fields[rec.request_id][1] if rec.request_id in self.decode_fields \
                else s.fields_for("reference")
            prompt = rec.decode_prompt if rec.decode_prompt is not None else rec.prompt
            return await ctx.client.direct(ctx.prefill, prompt, rec.max_tokens, fields=fields, endpoint=s.endpoint)
        self.obs.parity = await record_parity(self.obs.records, reference, self.sc.parity_tolerance)


async def run_sequence_scenario(sc: ScenarioConfig, ctx: Any, obs: ScenarioObservation) -> SequenceResult:
    """Run a ``kind: sequence`` scenario on ``ctx`` (a :class:`rig.run.kinds.ScenarioContext`),
    filling ``obs.records`` (one PDRecord per request, in step order) and ``obs.parity``; returns
    the :class:`SequenceResult`. ``sequence-<scenario>.json`` is written also on failure."""
    seq = _Sequence(sc, ctx, obs)
    try:
        return await seq.run()
    finally:
        (ctx.run_dir / f"sequence-{sc.name}.json").write_text(json.dumps(asdict(seq.result), indent=1))

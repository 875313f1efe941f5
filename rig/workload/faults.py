"""Faults and recovery: the executor of ``kind: fault`` scenarios.

The scenario sends ``fault.requests`` P/D requests one after another. The faults
(:mod:`rig.config.faults`) fire at events of the exchange of request ``fault.faulted`` (P answered;
decode hop sent + N ms; D's KV fetch in progress) or between requests (after K completed).
Each fault is recorded as a :class:`FaultEvent` with the monotonic time of its event and of the
action, so "fired at its event, not before" is a fact in the report, not a hope.

While a decode hop is in flight D is watched by the stall detector (:mod:`rig.observe.stall`): a hang
after a fault ends as ``stalled`` with its diagnosis, never as a bare timeout. Instances killed
on purpose (sigkill / sigterm) are restarted on their own HTTP and NIXL side-channel ports once
every request of the scenario has ended (``restart: false`` leaves them down), so the next
scenario finds the topology whole; a SIGSTOPped instance always gets its SIGCONT, also when the
scenario is cancelled (and the rig's teardown continues stopped groups: rig.cluster.reaper.kill_groups).

Then the recovery checks: a fresh P/D request served with parity over KV D really pulled, and
then every instance back to idle (waiting 0, running 0, KV usage at its pre-scenario baseline)
within ``nixl.kv_lease_duration + fault.idle_margin_s`` (P may hold an abandoned request's
blocks until its lease expires). The checks (:func:`rig.judge.fault_checks.fault_checks`) go
through the one verdict engine (:func:`rig.judge.verdict.judge`), so a known issue excuses only the symptom it names.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from rig.cluster.processes import ClusterError
from rig.cluster.proctree import ProcSample
from rig.config import RigConfig, ScenarioConfig
from rig.config.faults import Fault
from rig.config.request_fields import RequestFields
from rig.observe import metrics as m
from rig.observe.events import trigger_of
from rig.observe.observations import DrainResult, ScenarioObservation, SnapshotStore, wait_idle
from rig.observe.parity import record_parity
from rig.observe.stall import StallWatcher, watch
from rig.transport.client import Transport, cancel_task
from rig.transport.endpoint import Endpoint
from rig.transport.records import PDRecord, classify, prefill_failure
from rig.workload.edge import reference
from rig.workload.prompts import request_prompt, seed_of

# Outcomes that end a faulted request with an answer or a diagnosis; "timeout" is the one that
# does not (the rig waited out the deadline without knowing why).
DIAGNOSED = ("ok", "http_error", "connection_error", "stalled", "cancelled", "empty")
SIGNALS = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM}


@dataclass
class FaultEvent:
    """What became of one fault: ``event_at`` when its trigger's event happened, ``fired_at``
    when the action was taken, ``done_at`` when it completed (SIGCONT sent, instance ready
    again); monotonic seconds, None when it did not happen. ``detail`` says what was done."""

    fault: str
    target: str
    event_at: float | None = None
    fired_at: float | None = None
    done_at: float | None = None
    detail: str = ""
    error: str = ""

    @property
    def fired(self) -> bool:
        """True when the action was taken."""
        return self.fired_at is not None


@dataclass
class FaultResult:
    """The kind's own result: fault events, which instances were killed / restarted (seconds to
    ready), the recovery request's id, the idle bound (s) and the recovery drains."""

    events: list[FaultEvent] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)
    restarted: dict[str, float] = field(default_factory=dict)
    restart_errors: dict[str, str] = field(default_factory=dict)
    recovery_id: str | None = None
    recovery_pulled: float | None = None  # D's external_kv_transfer prompt tokens during recovery
    idle_bound_s: float = 0.0
    drains: list[DrainResult] = field(default_factory=list)


class FaultCluster(Protocol):
    """What a fault does to the topology (:class:`rig.cluster.processes.Cluster` has it)."""

    def signal(self, name: str, sig: int) -> int:
        """Send ``sig`` to instance ``name``'s process group; returns the pgid; ClusterError if it is gone."""
        ...

    def restart(self, name: str) -> float:
        """Restart instance ``name`` on its own ports; returns seconds to ready; ClusterError on failure."""
        ...

    def how(self, name: str) -> str:
        """What ``signal`` acts on, for the report: 'process group N' or 'container <id>'."""
        ...

    def proc_sample(self, name: str) -> ProcSample | None:
        """What instance ``name``'s process tree is doing (the stall evidence); None if unknown."""
        ...


class FaultContext(Protocol):
    """What a fault scenario uses from the runner (``rig.run.kinds.ScenarioContext`` has it):
    the config, the cluster to act on, both endpoints, the P/D client, a plain HTTP client for
    ``/metrics``, the metrics snapshot store and the run directory (``faults-<scenario>.json``)."""

    @property
    def cfg(self) -> RigConfig: ...
    @property
    def cluster(self) -> FaultCluster: ...
    @property
    def prefill(self) -> Endpoint: ...
    @property
    def decode(self) -> Endpoint: ...
    @property
    def client(self) -> Transport: ...
    @property
    def http(self) -> httpx.AsyncClient: ...
    @property
    def store(self) -> SnapshotStore: ...
    @property
    def run_dir(self) -> Path: ...


class _Exchange:
    """One scenario's run: the requests, the faults and their bookkeeping."""

    def __init__(self, sc: ScenarioConfig, ctx: FaultContext, obs: ScenarioObservation):
        assert sc.fault is not None  # the config validator guarantees it for kind fault
        self.sc, self.ctx, self.obs, self.spec = sc, ctx, obs, sc.fault
        self.result = FaultResult()
        self.background: list[asyncio.Task] = []
        t = ctx.cfg.timeouts
        self.deadline_s = sc.deadline_s or t.request_s

    def _instance(self, target: str) -> str:
        return {"prefill": self.ctx.prefill.name, "decode": self.ctx.decode.name}.get(target, target)

    def _event(self, f: Fault) -> FaultEvent:
        ev = FaultEvent(f.describe(), self._instance(f.target) if f.target != "request" else "request")
        self.result.events.append(ev)
        return ev

    # -- instance actions -----------------------------------------------------------------

    async def _instance_action(self, f: Fault, ev: FaultEvent) -> None:
        name = self._instance(f.target)
        cluster = self.ctx.cluster
        try:
            if f.action in SIGNALS:
                ev.fired_at = time.monotonic()
                cluster.signal(name, SIGNALS[f.action])
                ev.detail = f"{f.action.upper()} to {name}'s {cluster.how(name)}"
                if f.restart:
                    self.result.killed.append(name)
            elif f.action == "sigstop":
                ev.fired_at = time.monotonic()
                cluster.signal(name, signal.SIGSTOP)
                ev.detail = f"SIGSTOP to {name}'s {cluster.how(name)} for {f.stop_s:g} s"
                self.background.append(asyncio.create_task(self._continue_after(name, f.stop_s or 0, ev)))
            elif f.action == "restart":
                ev.fired_at = time.monotonic()
                ready = await asyncio.to_thread(cluster.restart, name)
                ev.done_at = time.monotonic()
                self.result.restarted[name] = ready
                ev.detail = f"{name} restarted on its ports, ready after {ready:.1f} s"
        except ClusterError as e:
            ev.error = str(e).splitlines()[0]

    async def _continue_after(self, name: str, stop_s: float, ev: FaultEvent) -> None:
        try:
            await asyncio.sleep(stop_s)
        finally:  # also when cancelled: never leave a group stopped
            try:
                self.ctx.cluster.signal(name, signal.SIGCONT)
                ev.done_at = time.monotonic()
                ev.detail += f"; SIGCONT after {ev.done_at - (ev.fired_at or ev.done_at):.1f} s"
            except ClusterError as e:
                ev.error = str(e)

    # -- one request ----------------------------------------------------------------------

    async def request(self, rec: PDRecord, faults: list[Fault]) -> None:
        """Run ``rec`` through both hops with ``faults`` attached to its exchange, bounded by the
        scenario's deadline; a hang on D is cut by the stall detector with its diagnosis."""
        try:
            async with asyncio.timeout(self.deadline_s):
                await self._two_hops(rec, faults)
        except TimeoutError:
            rec.outcome = "timeout"
            rec.diagnosis = f"no answer within the {self.deadline_s:.0f} s deadline"
            if rec.decode_sent_at:
                rec.verdict_after_s = time.monotonic() - rec.decode_sent_at

    async def _two_hops(self, rec: PDRecord, faults: list[Fault]) -> None:
        client, p, d = self.ctx.client, self.ctx.prefill, self.ctx.decode
        fields = self.sc.request or RequestFields()
        rec.prefill = await client.prefill(p, rec.prompt, fields=fields.for_hop("prefill"), endpoint=fields.endpoint)
        failure = prefill_failure(rec.prefill)
        if failure:
            rec.outcome, rec.diagnosis = failure
            return
        answered_at = time.monotonic()
        hold, abandon = 0.0, False
        for f in (f for f in faults if f.trigger.event == "prefill-answered"):
            ev = self._event(f)
            ev.event_at = answered_at
            if f.action == "abandon":
                ev.fired_at, ev.detail, abandon = time.monotonic(), "decode hop never sent", True
            elif f.action == "delay-decode":
                ev.fired_at, hold = time.monotonic(), f.delay_s or 0.0
                ev.detail = f"decode hop held {hold:g} s"
            else:
                await self._instance_action(f, ev)
        if abandon:
            rec.outcome, rec.diagnosis = "cancelled", "abandoned by the fault: the decode hop was never sent"
            return
        if hold:
            await asyncio.sleep(hold)
        rec.decode_sent_at = time.monotonic()
        task = asyncio.create_task(client.decode(d, rec.prompt, rec.max_tokens, rec.prefill.kv_transfer_params or {},
                                                 fields=fields.for_hop("decode"), endpoint=fields.endpoint))
        cancelled_by: list[str] = []
        helpers = [asyncio.create_task(self._on_decode(f, rec, task, cancelled_by))
                   for f in faults if f.trigger.event in ("decode-sent", "kv-fetch-in-progress")]
        helpers.append(asyncio.create_task(self._watch_decode(rec, task, cancelled_by)))
        try:
            rec.decode = await task
        except asyncio.CancelledError:
            if not cancelled_by:
                raise
        finally:
            for h in helpers:
                await cancel_task(h)
        rec.verdict_after_s = time.monotonic() - rec.decode_sent_at
        if cancelled_by:
            rec.outcome, rec.diagnosis = ("stalled" if rec.stall else "cancelled"), cancelled_by[0]
            return
        rec.outcome = classify(rec.decode)
        if rec.outcome != "ok":
            rec.diagnosis = f"decode: {(rec.decode.error if rec.decode else None) or 'empty answer'}"

    async def _on_decode(self, f: Fault, rec: PDRecord, task: asyncio.Task, cancelled_by: list[str]) -> None:
        """Wait for ``f``'s decode-side event, then act."""
        ev = self._event(f)
        sent = rec.decode_sent_at or time.monotonic()
        if f.trigger.event == "decode-sent":
            target = sent + f.trigger.after_ms / 1000
            # asyncio runs a timer up to its clock resolution early (seen live: docs/measurements.md):
            # sleep again until the event has really come, never fire before it.
            while (now := time.monotonic()) < target:
                await asyncio.sleep(target - now)
            ev.event_at = time.monotonic()
        else:
            seen = await self._kv_fetch_in_progress(f, task)
            if seen is None:
                ev.detail = (f"D's kv_fetch stage in_progress not seen within {f.trigger.within_s:g} s "
                             f"(polled every {f.trigger.poll_ms:g} ms): the fault did not fire")
                return
            ev.event_at = seen
        if task.done():
            ev.detail = "the decode hop had already ended: the fault did not fire"
            return
        if f.action == "cancel-decode":
            ev.fired_at = time.monotonic()
            ev.detail = f"decode hop cancelled {1000 * (ev.fired_at - sent):.0f} ms after it was sent"
            cancelled_by.append(f"cancelled by the fault {ev.detail}")
            task.cancel()
        else:
            await self._instance_action(f, ev)

    async def _kv_fetch_in_progress(self, f: Fault, task: asyncio.Task) -> float | None:
        """The monotonic time D first showed a KV fetch in progress, or None (not within the window,
        or the decode hop ended first)."""
        d, http = self.ctx.decode, self.ctx.http
        end = time.monotonic() + f.trigger.within_s
        while time.monotonic() < end and not task.done():
            try:
                snap = await m.scrape(http, d.url, d.name, timeout_s=1.0)
                if snap.value(m.KV_FETCH_BY_STAGE, stage="in_progress") > 0:
                    return snap.t
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(f.trigger.poll_ms / 1000)
        return None

    async def _watch_decode(self, rec: PDRecord, task: asyncio.Task, cancelled_by: list[str]) -> None:
        """The stall watcher on D while the decode hop runs (:func:`rig.observe.stall.watch`; D
        stopped or dead gives no sample, the deadline or the hop's own error ends it); on a stall
        the hop is cancelled and the record carries the diagnosis and the frozen facts."""
        t = self.ctx.cfg.timeouts
        d, http = self.ctx.decode, self.ctx.http
        with trigger_of(getattr(self.ctx, "events", None), d.name) as trigger:
            stall = await watch(StallWatcher(t.stall_window_s, transfer_window_s=t.kv_transfer_s,
                                             inconclusive_s=t.stall_inconclusive_wait(self.sc.deadline_s),
                                             probe=self.ctx.cluster.proc_sample),
                                lambda: m.scrape(http, d.url, d.name), task.done, t.metrics_interval_s,
                                on_sample=lambda snap: self.ctx.store.sample(self.sc.name, snap), trigger=trigger)
        if stall is not None:
            rec.stall = stall.facts
            cancelled_by.append(stall.diagnosis)
            task.cancel()

    # -- the scenario ---------------------------------------------------------------------

    async def run(self) -> FaultResult:
        sc, spec, ctx = self.sc, self.spec, self.ctx
        seed = sc.seed if sc.seed is not None else seed_of(sc.name)
        before = {e.name: await self._kv_usage(e) for e in (ctx.decode, ctx.prefill)}
        fields = sc.request or RequestFields()
        self.obs.records = [PDRecord(request_id=f"{sc.name}-{i}", prompt_len=sc.prompt_tokens, max_tokens=sc.max_tokens,
                                     prompt=request_prompt(sc.prompt_tokens, seed + i, fields.prompts),
                                     endpoint=fields.endpoint)
                            for i in range(spec.requests)]
        exchange_faults = [f for f in spec.faults if f.trigger.event != "after-requests"]
        try:
            for i, rec in enumerate(self.obs.records):
                for f in (f for f in spec.faults if f.trigger.k == i):
                    ev = self._event(f)
                    ev.event_at = time.monotonic()
                    await self._instance_action(f, ev)
                await self.request(rec, exchange_faults if i == spec.faulted else [])
        except BaseException:
            for task in self.background:  # cancelled: its ``finally`` sends SIGCONT at once
                await cancel_task(task)
            raise
        for task in self.background:  # a stopped instance is continued before recovery
            await task
        await self._restart_killed()
        if spec.recovery:
            await self._recover(seed, before)
        await self._parity()
        return self.result

    async def _kv_usage(self, e: Any) -> float:
        try:
            return (await m.scrape(self.ctx.http, e.url, e.name)).value(m.KV_USAGE)
        except (httpx.HTTPError, ValueError):
            return 0.0

    async def _restart_killed(self) -> None:
        for name in dict.fromkeys(self.result.killed):
            try:
                self.result.restarted[name] = await asyncio.to_thread(self.ctx.cluster.restart, name)
            except ClusterError as e:
                self.result.restart_errors[name] = str(e).splitlines()[0]

    async def _recover(self, seed: int, before: dict[str, float]) -> None:
        ctx = self.ctx
        fields = self.sc.request or RequestFields()
        rec = PDRecord(request_id=f"{self.sc.name}-recovery", prompt_len=self.sc.prompt_tokens,
                       max_tokens=self.sc.max_tokens, endpoint=fields.endpoint,
                       prompt=request_prompt(self.sc.prompt_tokens, seed + 900_001, fields.prompts))
        self.result.recovery_id = rec.request_id
        self.obs.records.append(rec)
        try:
            d0 = await m.scrape(ctx.http, ctx.decode.url, ctx.decode.name)
        except (httpx.HTTPError, ValueError):
            d0 = None
        await self.request(rec, [])
        try:
            d1 = await m.scrape(ctx.http, ctx.decode.url, ctx.decode.name)
            if d0 is not None:
                self.result.recovery_pulled = m.delta(d0, d1, m.PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer")
        except (httpx.HTTPError, ValueError):
            pass
        # After the recovery request: its own blocks must come back too. The bound counts from
        # here, later than the fault, so it is never tighter than the lease that applies.
        self.result.idle_bound_s = ctx.cfg.lease_s_of(ctx.prefill.name) + self.spec.idle_margin_s
        for e in (ctx.decode, ctx.prefill):
            self.result.drains.append(await wait_idle(ctx.http, e.name, e.url, before[e.name],
                                                      self.result.idle_bound_s))

    async def _parity(self) -> None:
        """Every answered request against a direct (non-disaggregated) reference on P."""
        ctx = self.ctx
        self.obs.parity = [None] * len(self.obs.records)
        if not self.sc.parity:
            return
        self.obs.parity = await record_parity(self.obs.records,
                                              lambda rec: reference(ctx.client, ctx.prefill, rec, self.sc.request),
                                              self.sc.parity_tolerance)


async def run_fault_scenario(sc: ScenarioConfig, ctx: FaultContext, obs: ScenarioObservation) -> FaultResult:
    """Run a ``kind: fault`` scenario on ``ctx`` (a :class:`rig.run.kinds.ScenarioContext`),
    filling ``obs.records`` (the scenario's requests, then the recovery request) and
    ``obs.parity``; returns the :class:`FaultResult`."""
    ex = _Exchange(sc, ctx, obs)
    try:
        return await ex.run()
    finally:  # kept also when the scenario fails or is interrupted
        (ctx.run_dir / f"faults-{sc.name}.json").write_text(json.dumps(asdict(ex.result), indent=1))

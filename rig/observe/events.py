"""Sampling that follows the work: ``/metrics`` scrapes at the rig's own request events, not only by the clock.

Every sampling loop of the rig (the stall watcher's :func:`rig.observe.stall.watch`, the wave's
:class:`rig.observe.timeline.TimelineSampler`) scrapes its instance every ``timeouts.metrics_interval_s``.
A request that takes milliseconds (a GPU node: a whole P/D request in a few ms) falls between two
such scrapes, and a check built on sampled state (``gauges-account``, ``no-stall``, KV usage during a
wave) then judges nothing. So the loops also wake at the rig's request events: the transport tells
its listeners (:class:`rig.transport.hops.HopListener`) of every hop's ``sent``, ``first-byte``,
``answered`` and ``cancelled``, and the runner of every scenario boundary (:meth:`SampleEvents.phase`);
:class:`SampleEvents` is that listener and wakes the loops that watch the instance concerned.

Coalesced: a loop scrapes one instance at a time (at most one scrape of it in flight per loop), and a
:class:`SampleTrigger` returns no sooner than ``min_gap_s`` after its previous return, so events that
arrive during a scrape or within the gap fold into one more scrape. A burst of N requests therefore
costs at most ``1 + duration / min_gap_s`` scrapes per loop, and exactly two when the whole burst
arrives while one scrape is in flight (the one in flight and one after it), whatever N is.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator

# Events of the runner (rig.run.runner): a scenario's start and end wake every loop.
PHASE_EVENT = "phase"


class SampleTrigger:
    """The wake-up of one sampling loop that watches ``instances``: :meth:`fire` (an event of one of
    them) makes a pending :meth:`wait` return early, but never sooner than ``min_gap_s`` seconds
    after the previous return. ``clock`` is the monotonic clock in seconds (a test's own clock).

    ``fired``: events received; ``woken``: waits that an event ended before their period."""

    def __init__(self, instances: frozenset[str], min_gap_s: float, clock: Callable[[], float] = time.monotonic):
        if min_gap_s < 0:
            raise ValueError(f"min_gap_s must be >= 0, got {min_gap_s}")
        self.instances, self.min_gap_s, self.clock = instances, min_gap_s, clock
        self._event = asyncio.Event()
        self._last = -math.inf
        self.fired = 0
        self.woken = 0

    def fire(self) -> None:
        """An event of a watched instance: the next (or pending) :meth:`wait` returns early."""
        self.fired += 1
        self._event.set()

    @property
    def pending(self) -> bool:
        """True when an event came since the last :meth:`wait` returned."""
        return self._event.is_set()

    async def wait(self, interval_s: float, stop: asyncio.Event | None = None) -> bool:
        """Sleep until ``interval_s`` seconds passed, an event came (then at least until
        ``min_gap_s`` after the previous return) or ``stop`` is set. Returns True when an event
        ended it early (the caller scrapes now either way)."""
        waits = [asyncio.ensure_future(self._event.wait())]
        if stop is not None:
            waits.append(asyncio.ensure_future(stop.wait()))
        try:
            done, _ = await asyncio.wait(waits, timeout=max(0.0, interval_s), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        woke = self._event.is_set() and not (stop is not None and stop.is_set())
        if woke:
            gap = self._last + self.min_gap_s - self.clock()
            if gap > 0:
                await asyncio.sleep(gap)  # events meanwhile fold into this scrape
            self.woken += 1
        self._event.clear()
        self._last = self.clock()
        return woke


class SampleEvents:
    """The rig's request events, turned into wake-ups of the sampling loops (module docstring).

    A :class:`rig.transport.hops.HopListener`: add it to a transport's ``listeners``. Loops get
    their :class:`SampleTrigger` from :meth:`watching`. ``counts``: events seen per
    ``(instance, event)`` (the phase events under instance ``*``)."""

    def __init__(self, min_gap_s: float = 0.05, clock: Callable[[], float] = time.monotonic):
        self.min_gap_s, self.clock = min_gap_s, clock
        self._triggers: list[SampleTrigger] = []
        self.counts: Counter[tuple[str, str]] = Counter()

    def hop_event(self, instance: str, event: str) -> None:
        """A hop to ``instance`` reached ``event``: wake every loop that watches ``instance``."""
        self.counts[(instance, event)] += 1
        for t in self._triggers:
            if instance in t.instances:
                t.fire()

    def phase(self, name: str) -> None:
        """A boundary of the run (a scenario starts or ends, a step of it): wake every loop."""
        self.counts[("*", f"{PHASE_EVENT}:{name}")] += 1
        for t in self._triggers:
            t.fire()

    def trigger(self, *instances: str, min_gap_s: float | None = None) -> SampleTrigger:
        """A new trigger of the loop that watches ``instances`` (``min_gap_s``: a longer gap than the
        default for a loop that scrapes many instances per round); :meth:`release` it when the loop ends."""
        gap = self.min_gap_s if min_gap_s is None else max(self.min_gap_s, min_gap_s)
        t = SampleTrigger(frozenset(instances), gap, self.clock)
        self._triggers.append(t)
        return t

    def release(self, t: SampleTrigger) -> None:
        """Stop waking ``t`` (its loop ended); a trigger released twice is ignored."""
        with contextlib.suppress(ValueError):
            self._triggers.remove(t)

    @contextlib.contextmanager
    def watching(self, *instances: str, min_gap_s: float | None = None) -> Iterator[SampleTrigger]:
        """:meth:`trigger` for the ``with`` block, released at its end."""
        t = self.trigger(*instances, min_gap_s=min_gap_s)
        try:
            yield t
        finally:
            self.release(t)


@contextlib.contextmanager
def trigger_of(events: SampleEvents | None, *instances: str,
               min_gap_s: float | None = None) -> Iterator[SampleTrigger | None]:
    """``events.watching(*instances)``, or None without events (the loop samples by its period only)."""
    if events is None:
        yield None
        return
    with events.watching(*instances, min_gap_s=min_gap_s) as t:
        yield t

"""Step 5's groundwork: gathering the evidence every scenario's checks rest on, and saying what
could not be gathered.

What the runner asks of a phase's instances, besides the requests its kinds send:

- their logs, read through :meth:`rig.cluster.processes.Cluster.log_source` (:class:`LogScanner`): fatal
  lines and KV-integrity lines since the last scan; a log that cannot be read is *unscanned*,
  never clean;
- whether they are alive (:func:`settle_deaths`): a vLLM server whose EngineCore died answers
  HTTP 500, stops serving and then exits (with code 0: vllm/entrypoints/launcher.py's shutdown;
  tests/data/vllm-0.30.0-decode-ngram-crash.log, docs/explanation/evidence.md). An instance that stopped
  answering ``/health`` gets ``timeouts.shutdown_grace_s`` to exit before it is called alive, so
  a dying decode reads as a death (FAIL), not as "metrics unavailable" (ERROR);
- their vLLM versions from ``/version`` (:func:`read_versions`; "unknown" when it does not answer);
- whether they expose every metric the checks read (:func:`metric_presence`; the lists are in
  :mod:`rig.observe.metrics`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from rig.cluster.logs import (
    FATAL_PATTERNS,
    KV_INTEGRITY_PATTERNS,
    death_summary,
    fatal_lines,
    matching_lines,
    owner_stop_line,
)
from rig.cluster.processes import Cluster
from rig.observe import metrics as m
from rig.observe.observations import ScenarioObservation

UNKNOWN_VERSION = "unknown"
NO_LOG_SOURCE = ("no log source given (attach mode: the rig did not launch it; give the instance's "
                 "log source, e.g. a log path)")


class LogScanner:
    """Reads each instance's log from where the previous scan ended.

    Marks are the :class:`~rig.cluster.logs.LogSource`'s own (opaque) offsets: ``_scan[name]`` where the
    not-yet-scanned part starts (None: unreadable at that time), ``_start[name]`` where the
    instance's current incarnation started writing (for its death line).
    """

    def __init__(self) -> None:
        self._scan: dict[str, int | None] = {}
        self._start: dict[str, int] = {}

    def starting(self, cluster: Cluster, names: list[str]) -> None:
        """Call before (re)starting ``names``: their death lines are looked for after this point."""
        for n in names:
            src = cluster.log_source(n)
            mark = src.mark() if src is not None else None
            self._start[n] = mark if mark is not None else 0  # a log not yet written: from its start

    def phase_started(self, cluster: Cluster) -> None:
        """Call once the phase's instances are up: fatal lines count from here (warm-up included);
        an instance kept from the previous phase keeps its mark (its lines are scanned once); a
        frozen instance (``Cluster.freeze``: not in this phase) is marked when a phase continues it."""
        for n in cluster.procs:
            if n not in self._scan and n not in cluster.frozen:
                src = cluster.log_source(n)
                self._scan[n] = src.mark() if src is not None else None

    def forget(self, names: list[str]) -> None:
        """Drop the scan marks of stopped instances (a restart starts a new phase mark)."""
        for n in names:
            self._scan.pop(n, None)

    def scan(self, cluster: Cluster, obs: ScenarioObservation) -> None:
        """Fill ``obs.fatal_lines`` and ``obs.kv_integrity_lines`` for every running instance from
        its log written since the last scan, or ``obs.unscanned_logs[name]`` with the reason.

        The end mark is taken before reading: a line written meanwhile is scanned again by the
        next scenario rather than lost.
        """
        obs.fatal_lines = {}
        for n in cluster.procs:
            if n in cluster.frozen:  # held for a later phase: writes nothing, scanned once continued
                continue
            src = cluster.log_source(n)
            if src is None:
                obs.unscanned_logs[n] = NO_LOG_SOURCE
                continue
            start, end = self._scan.get(n), src.mark()
            text = src.since(start) if start is not None else None
            if text is None:
                obs.unscanned_logs[n] = (f"cannot read {src.describe()}" if start is not None or end is None
                                         else f"{src.describe()} was not readable when the phase started")
                if start is None:
                    self._scan[n] = end  # readable from now on: the next scenario scans it
                continue
            obs.fatal_lines[n] = fatal_lines(text, FATAL_PATTERNS)
            obs.kv_integrity_lines[n] = matching_lines(text, KV_INTEGRITY_PATTERNS)
            self._scan[n] = end if end is not None else start

    def stop_line(self, cluster: Cluster, name: str) -> str | None:
        """The line in which instance ``name``'s owner said it was stopping it, written since it
        was started (:func:`rig.cluster.logs.owner_stop_line`); None when there is none or its
        log cannot be read."""
        src = cluster.log_source(name)
        text = src.since(self._start.get(name, 0)) if src is not None else None
        return owner_stop_line(text, name) if text is not None else None

    def death_line(self, cluster: Cluster, name: str) -> str:
        """What ended instance ``name`` since it was started: the exception that ended the traceback
        of its first fatal line, then that line (:func:`rig.cluster.logs.death_summary`), else its
        last log line, else why there is none."""
        src = cluster.log_source(name)
        if src is None:
            return NO_LOG_SOURCE
        text = src.since(self._start.get(name, 0))
        if text is None:
            return f"cannot read {src.describe()}"
        line = death_summary(text, FATAL_PATTERNS)
        if line is not None:
            return line
        last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
        return f"no fatal line; last log line: {last}" if last else "no fatal line; the log is empty"


async def healthy(http: httpx.AsyncClient, url: str) -> bool:
    """True when ``url/health`` answers 200 within 5 s."""
    try:
        return (await http.get(url + "/health", timeout=5.0)).status_code == 200
    except httpx.HTTPError:
        return False


async def settle_deaths(http: httpx.AsyncClient, cluster: Cluster, names: list[str],
                        within_s: float) -> dict[str, int]:
    """The processes of ``cluster`` that have exited (``{name: exit code}``), after giving every
    one of ``names`` that is still running but no longer answers ``/health`` up to ``within_s``
    seconds to exit. Returns at once when all of ``names`` answer."""
    deadline = time.monotonic() + within_s
    while True:
        dead = await asyncio.to_thread(cluster.dead)
        silent = [n for n in names if n in cluster.procs and n not in dead
                  and not await healthy(http, cluster.url(n))]
        if not silent or time.monotonic() >= deadline:
            return dead
        await asyncio.sleep(0.25)


async def read_versions(http: httpx.AsyncClient, cluster: Cluster, names: list[str]) -> dict[str, str]:
    """``{name: vLLM version from GET /version}``; :data:`UNKNOWN_VERSION` for an instance that
    does not answer it with a ``version`` (vllm/entrypoints/serve/instrumentator/basic.py)."""
    out: dict[str, str] = {}
    for n in names:
        try:
            r = await http.get(cluster.url(n) + "/version", timeout=5.0)
            v = r.json().get("version") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            v = None
        out[n] = str(v) if v else UNKNOWN_VERSION
    return out


@dataclass
class MetricPresence:
    """Which metrics the checks read are absent, per instance: ``required`` (the checks cannot
    look: the scenarios are ERROR) and ``diagnostic`` (recorded, the scenarios still run);
    ``unreachable`` names instances whose ``/metrics`` could not be read at all, with the error."""

    required: dict[str, list[str]] = field(default_factory=dict)
    diagnostic: dict[str, list[str]] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)

    def all_missing(self) -> dict[str, list[str]]:
        """``{instance: every absent metric}`` (for ``ScenarioObservation.missing_metrics``)."""
        names = set(self.required) | set(self.diagnostic)
        return {n: self.required.get(n, []) + self.diagnostic.get(n, []) for n in sorted(names)
                if self.required.get(n) or self.diagnostic.get(n)}

    def error(self, versions: dict[str, str]) -> str:
        """The ERROR reason naming each absent required metric and the instance's vLLM version;
        '' when nothing required is missing."""
        parts = [f"{n} (vLLM {versions.get(n, UNKNOWN_VERSION)}) lacks {', '.join(ms)}"
                 for n, ms in self.required.items() if ms]
        if not parts:
            return ""
        return ("metrics the checks read are missing: " + "; ".join(parts) +
                " (rig/observe/metrics.py REQUIRED_METRICS: a renamed metric needs the rig updated "
                "for this vLLM version)")


async def metric_presence(http: httpx.AsyncClient, cluster: Cluster, roles: dict[str, str],
                          nixl: dict[str, bool]) -> MetricPresence:
    """Scrape each instance in ``roles`` (``{name: "prefill" | "decode"}``) and list the metrics of
    :func:`rig.observe.metrics.required_metrics` / :data:`rig.observe.metrics.DIAGNOSTIC_METRICS` it lacks;
    ``nixl[name]`` says whether that instance pulls over NIXL."""
    out = MetricPresence()
    for name, role in roles.items():
        try:
            snap = await m.scrape(http, cluster.url(name), name)
        except (httpx.HTTPError, ValueError) as e:
            out.unreachable[name] = f"{type(e).__name__}: {e}"
            continue
        out.required[name] = m.missing_metrics(snap, m.required_metrics(role, nixl.get(name, False)))
        out.diagnostic[name] = m.missing_metrics(snap, m.DIAGNOSTIC_METRICS.get(role, ()))
    return out

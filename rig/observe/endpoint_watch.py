"""Watching instances the rig talks to but did not start in this process (``pdrig wave`` against
``pdrig up``): their logs and whether they are still alive, from what ``endpoints.json`` says
of each (its log path and pid, :class:`rig.transport.endpoint.Endpoint`).

The same evidence a launched run gathers (:mod:`rig.observe.evidence`), read without a
:class:`~rig.cluster.processes.Cluster`: fatal and KV-integrity lines written since
:meth:`EndpointWatch.start`, deaths (the pid is gone, or, without a pid, ``/health`` does not
answer), and an instance its owner stopped (``pdrig up`` wrote its stop line into the log:
:func:`rig.cluster.logs.owner_stop_line`) told from one that died. An instance with no log path is
"unscanned" with the reason, never clean.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from rig.cluster.logs import (
    FATAL_PATTERNS,
    KV_INTEGRITY_PATTERNS,
    FileLog,
    fatal_lines,
    first_fatal_line,
    matching_lines,
    owner_stop_line,
)
from rig.observe.evidence import healthy
from rig.observe.observations import ScenarioObservation
from rig.transport.endpoint import Endpoint

NO_LOG_PATH = "no log path for it (endpoints.json of `pdrig up` names each instance's log; a bare URL has none)"


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists on this host and is not a zombie (``/proc/<pid>/stat``
    state ``Z``: exited, not yet reaped by its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # exists (kill said so); no /proc to say more


class EndpointWatch:
    """The logs and lives of ``endpoints`` over one wave: :meth:`start` before it, then
    :meth:`observe` after it. ``watched`` is False when no endpoint has a log path or a pid
    (bare URLs): the rig then has no way to look, and the checks say so."""

    def __init__(self, endpoints: list[Endpoint]) -> None:
        self.endpoints = endpoints
        self.logs = {e.name: FileLog(e.name, e.log) for e in endpoints if e.log}
        self.marks: dict[str, int | None] = {}

    @property
    def watched(self) -> bool:
        """True when at least one endpoint has a log path or a pid."""
        return any(e.log or e.pid for e in self.endpoints)

    def start(self) -> None:
        """Mark every log's current end: lines after it belong to this wave."""
        self.marks = {n: src.mark() for n, src in self.logs.items()}

    async def observe(self, http: httpx.AsyncClient, obs: ScenarioObservation) -> None:
        """Fill ``obs``'s ``fatal_lines``, ``kv_integrity_lines``, ``unscanned_logs``, ``dead``
        (exit code unknown: -1, as for an attached process), ``death_lines`` and ``stopped``.
        Nothing when :attr:`watched` is False."""
        if not self.watched:
            return
        for e in self.endpoints:
            src, mark = self.logs.get(e.name), self.marks.get(e.name)
            text = src.since(mark) if src is not None and mark is not None else None
            if src is None:
                obs.unscanned_logs[e.name] = NO_LOG_PATH
            elif text is None:
                obs.unscanned_logs[e.name] = f"cannot read {src.describe()}"
            else:
                obs.fatal_lines[e.name] = fatal_lines(text, FATAL_PATTERNS)
                obs.kv_integrity_lines[e.name] = matching_lines(text, KV_INTEGRITY_PATTERNS)
            gone = not pid_alive(e.pid) if e.pid else not await healthy(http, e.url)
            if not gone:
                continue
            stop = owner_stop_line(text, e.name) if text is not None else None
            if stop is not None:
                obs.stopped[e.name] = stop
                continue
            obs.dead[e.name] = -1
            line = first_fatal_line(text, FATAL_PATTERNS) if text is not None else None
            last = next((ln.strip() for ln in reversed((text or "").splitlines()) if ln.strip()), "")
            obs.death_lines[e.name] = line or (f"no fatal line; last log line: {last}" if last else
                                               "no fatal line" if text is not None else obs.unscanned_logs[e.name])

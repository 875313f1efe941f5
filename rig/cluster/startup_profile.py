"""The start-up profile of one vLLM server: where its seconds from spawn to ready went.

Read from two clocks: the rig's (the spawn and the moment the server answered ready, wall-clock
seconds, :class:`rig.cluster.startup.StartupWatch`) and the server's own log lines, which vLLM
stamps to the second (``(EngineCore pid=11330) INFO 12-02 10:11:28 [core.py:133] ...``, local
time, no year; NIXL's own lines carry ``2026-12-02 10:11:55``). Each phase ends at the first line
of the next one (:data:`BOUNDARIES`, lines vLLM 0.32.0 writes on the way up, file named beside
each), so a phase's seconds are good to about a second; the first (import) and the last (HTTP
ready) are bounded by the rig's clock on one side.

The phases, in order:

============== ========================================================================================
import          spawn -> the API server's first log line: Python imports torch and vLLM
config          -> ``Resolved architecture``: arguments, model config; with a cold model-info cache
                vLLM inspects the model class in a subprocess that imports vLLM again
                (vllm/model_executor/models/registry.py, cache under ``VLLM_CACHE_ROOT/modelinfos``)
engine-core     -> ``Initializing a V1 LLM engine``: the EngineCore process is spawned and imports
spawn           torch and vLLM (vllm/v1/engine/core.py); vLLM's OpenAI server always runs it apart
worker set-up   -> ``Starting to load model``: the production CPU layout spawns a worker process that
                imports everything a third time (vllm/v1/executor/multiproc_executor.py); in the fast
                layout the model runner starts inside EngineCore (about a second)
model load      -> ``Loading weights took`` / ``Model loading took``
KV cache        -> ``Registering KV_Caches`` (NIXL) / ``Registered KV caches`` (Mooncake store): the
                cache sized and allocated, the connector created
KV registration -> ``init engine (profile, create kv cache, warmup model) took``: NIXL agent and UCX
                backend up, the caches registered, the model warmed up (vllm/v1/engine/core.py)
HTTP ready      -> the rig's ready: scheduler and connector scheduler side, the API server's routes,
                uvicorn, and the rig's readiness probe (/health, /v1/models, the side channel)
============== ========================================================================================

A boundary that never appears (another vLLM version, a server that died first) leaves both
phases beside it without seconds (None), never a guess. :func:`profile_from_log` is pure.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict

# (phase, markers of the line that ends it): the first line containing any marker, at or after
# the previous boundary's line, ends the phase. None: the phase ends at the rig's ready.
BOUNDARIES: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("import", ()),  # () = the first timestamped vLLM line (vllm/entrypoints/utils.py's banner)
    ("config", ("Resolved architecture:",)),  # vllm/config/model.py
    ("engine-core spawn", ("Initializing a V1 LLM engine",)),  # vllm/v1/engine/core.py
    ("worker set-up", ("Starting to load model",)),  # vllm/v1/worker/cpu_model_runner.py, gpu_model_runner.py
    ("model load", ("Loading weights took", "Model loading took")),  # model_loader/default_loader.py
    ("KV cache", ("Registering KV_Caches", "Registered KV caches")),  # nixl/base_worker.py, mooncake/store/worker.py
    ("KV registration", ("init engine (profile, create kv cache, warmup model) took",)),  # vllm/v1/engine/core.py
    ("HTTP ready", None),
)
PHASES = tuple(name for name, _ in BOUNDARIES)

# "(EngineCore pid=11330) INFO 12-02 10:11:28 [core.py:133] msg"; the process prefix is absent
# in some set-ups (then the kind is unknown), EngineCore_DP0 / VllmWorker-0 / Worker_TP1 are kinds
# EngineCore / Worker.
_VLLM_LINE = re.compile(r"^(?:\((?P<proc>[A-Za-z]+)[\w-]* pid=(?P<pid>\d+)\) )?"
                        r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) \[")
_FULL_STAMP = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) ")  # NIXL's own logger
_KINDS = {"APIServer": "APIServer", "EngineCore": "EngineCore", "VllmWorker": "Worker", "Worker": "Worker"}


class ProfilePhase(BaseModel):
    """One phase of a start-up, in seconds after the spawn (the rig's clock)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str
    """The phase (:data:`PHASES`)."""
    start_s: float | None
    """Seconds after spawn at which it began (None: its first line was not seen)."""
    end_s: float | None
    """Seconds after spawn at which it ended (None: not seen, or the server never got past it)."""
    seconds: float | None
    """``end_s - start_s`` (None when either is unknown)."""


class StartupProfile(BaseModel):
    """Where one server's start-up went (:func:`profile_from_log`); report.json
    ``startup_profiles.<instance>``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    outcome: str
    """How the start ended: ``ready``, ``exited``, ``stuck``, ``timeout``, ... (StartupWatch.outcome)."""
    total_s: float | None
    """Seconds from spawn to ready (the rig's clock); None when it was never ready."""
    phases: list[ProfilePhase]
    """Every phase of :data:`PHASES`, in order."""
    processes: dict[str, int] = {}
    """The vLLM processes that logged, kind -> pid (``APIServer``, ``EngineCore``, ``Worker``): the
    layout as it ran (fast: no Worker on CPU)."""
    log_resolution_s: float = 1.0
    """vLLM stamps its lines to the second: each log boundary is good to about this much."""
    reached: str = ""
    """The last phase that began (where a start that was not ready stopped)."""

    def seconds(self) -> dict[str, float | None]:
        """``{phase: seconds}`` in order (None: not measured)."""
        return {p.name: p.seconds for p in self.phases}


def _stamp(line: str, year: int) -> tuple[datetime, str, int] | None:
    """``(local time, process kind or '', pid or 0)`` of a timestamped log line, else None."""
    m = _VLLM_LINE.match(line)
    if m:
        kind = _KINDS.get(m.group("proc") or "", m.group("proc") or "")
        return (datetime.strptime(f"{year}-{m.group('ts')}", "%Y-%m-%d %H:%M:%S"), kind, int(m.group("pid") or 0))
    m = _FULL_STAMP.match(line)
    if m:
        return datetime.strptime(m.group("ts"), "%Y-%m-%d %H:%M:%S"), "", 0
    return None


def boundary_times(text: str, spawned_at: datetime) -> tuple[dict[str, datetime], dict[str, int]]:
    """The local time each phase of ``text`` (one start's log) ended, ``{phase: time}`` (phases
    whose end line was not seen are absent), and the processes that logged ``{kind: pid}``.

    ``spawned_at`` (local, naive) gives the year the log lines leave out; a line stamped more than
    a day before it belongs to the next year (a start across New Year)."""
    ends: dict[str, datetime] = {}
    procs: dict[str, int] = {}
    step = 0  # index into BOUNDARIES of the phase whose end is looked for
    last: datetime | None = None
    for line in text.splitlines():
        got = _stamp(line, spawned_at.year)
        if got is None:
            continue
        when, kind, pid = got
        if when < spawned_at - timedelta(days=1):
            when = when.replace(year=when.year + 1)
        if kind and pid:
            procs.setdefault(kind, pid)
        last = when if last is None else max(last, when)
        if step == 0:  # the first timestamped line: the imports are done
            ends[PHASES[0]], step = last, 1
        for j in range(step, len(BOUNDARIES)):  # a boundary never seen is skipped, not waited for
            markers = BOUNDARIES[j][1]
            if markers and any(mk in line for mk in markers):
                ends[BOUNDARIES[j][0]], step = last, j + 1
                break
    return ends, procs


def profile_from_log(text: str, spawned_wall: float, end_wall: float, outcome: str) -> StartupProfile:
    """The profile of one start: ``text`` is the server's log from its spawn on (its own lines
    only), ``spawned_wall`` / ``end_wall`` the rig's wall-clock seconds (``time.time()``) of the
    spawn and of the start's end (ready, exit, give-up), ``outcome`` how it ended (``ready`` ...).

    Times are seconds after the spawn, rounded to 0.1; a log boundary earlier than the previous
    one (the log's second resolution against the rig's clock) is moved up to it, so phases never
    run backwards."""
    spawned_at = datetime.fromtimestamp(spawned_wall)
    ends, procs = boundary_times(text, spawned_at)
    total = end_wall - spawned_wall
    at: dict[str, float] = {}
    floor = 0.0
    for name, _ in BOUNDARIES:
        if name in ends:
            floor = at[name] = min(total, max(floor, (ends[name] - spawned_at).total_seconds()))
    if outcome == "ready":
        at[PHASES[-1]] = total
    phases: list[ProfilePhase] = []
    start: float | None = 0.0
    reached = ""
    for name in PHASES:
        end = at.get(name)
        if start is not None or end is not None:
            reached = name
        seconds = None if start is None or end is None else round(end - start, 1)
        phases.append(ProfilePhase(name=name, start_s=None if start is None else round(start, 1),
                                   end_s=None if end is None else round(end, 1), seconds=seconds))
        start = end
    return StartupProfile(outcome=outcome, total_s=round(total, 1) if outcome == "ready" else None,
                          phases=phases, processes=procs, reached=reached)

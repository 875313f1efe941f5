"""Step 3 of the rig's flow: the cluster, i.e. the instances of a plan, ready and supervised.

:class:`Cluster` keeps what every deployment shares: readiness (an instance is *ready* when it is
alive, ``/health`` answers 200, ``/v1/models`` lists the served model and its NIXL side-channel
port accepts connections), the phases of a suite (start, hold with :meth:`Cluster.freeze`, thaw,
restart) and teardown on every exit path (the context manager, ``atexit``, the signal handlers
the CLI installs). How instances are spawned, signalled and stopped is its
:class:`~rig.cluster.backends.base.Backend`'s: processes the rig launches
(:mod:`rig.cluster.backends.local`), Compose containers (:mod:`rig.cluster.backends.containers`)
or endpoints started elsewhere (:mod:`rig.cluster.backends.attached`).

An instance that exits before it is ready fails the start at once with the tail of its log; a
launched one that shows no progress (log, CPU, start-up phase: :mod:`rig.cluster.startup`) for
``startup_stall_s`` fails naming the phase it is stuck in; an attached one that does not answer
at all fails within seconds; ``startup_timeout_s`` is the hard ceiling. :meth:`Cluster.start_each`
gives each instance's outcome on its own, so one that does not start leaves the others running.
"""

from __future__ import annotations

import atexit
import signal
import time
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TextIO

import httpx

from rig.cluster.backends.attached import Attached
from rig.cluster.backends.base import Backend, Probe, Running
from rig.cluster.backends.containers import Compose
from rig.cluster.backends.local import Local, processes_of_run
from rig.cluster.containers import ComposeContainers
from rig.cluster.logs import LogSource
from rig.cluster.proctree import ProcSample, sample_tree
from rig.cluster.signals import INTERRUPTED, install_signal_handlers
from rig.cluster.startup import READY, StartupDisplay, StartupWatch, load_text
from rig.cluster.startup_profile import StartupProfile
from rig.config.deployment import ATTACH_CONNECT_S
from rig.errors import ClusterError
from rig.plan.spec import Plan, ProcessSpec

# What callers (the CLI, the runner, tests) import from the cluster's module, wherever it is defined.
__all__ = ["INTERRUPTED", "Cluster", "ClusterError", "Running", "backend_for", "install_signal_handlers",
           "processes_of_run", "startup_affinity"]



def backend_for(plan: Plan, grace_s: float, attach: bool = False, containers: ComposeContainers | None = None,
                connect_s: float | None = ATTACH_CONNECT_S) -> Backend:
    """The deployment behind a cluster: processes launched from ``plan`` (the default), the
    Compose services of ``containers`` (with ``attach``), or endpoints someone else started
    (``attach`` alone; ``connect_s`` is how long one may stay unanswered, ``attach.connect_s``).
    ``containers`` without ``attach`` is ignored, as the runner passes it."""
    if not attach:
        return Local(plan, grace_s)
    return Attached(connect_s) if containers is None else Compose(containers, grace_s)


class Cluster:
    """Start, watch and stop the instances of a :class:`~rig.plan.processes.Plan`.

    Use as a context manager; ``stop_all`` is also registered with ``atexit``. ``start`` may be
    called several times with different names: the edge suite keeps the prefill instance and
    swaps decode instances between phases.
    """

    def __init__(self, plan: Plan, startup_timeout_s: float, grace_s: float = 10.0, attach: bool = False,
                 log_sources: Mapping[str, LogSource] | None = None, startup_stall_s: float | None = None,
                 display: str = "off", display_stream: TextIO | None = None,
                 containers: ComposeContainers | None = None, backend: Backend | None = None,
                 attach_connect_s: float | None = ATTACH_CONNECT_S):
        self.plan = plan
        # startup_timeout_s: the hard ceiling of one start (timeouts.startup_s); startup_stall_s:
        # fail a start that showed no progress (log, CPU, phase) this long (timeouts.startup_stall_s;
        # None: only the ceiling). display: rig.cluster.startup.StartupDisplay's mode while starting.
        self.startup_stall_s = startup_stall_s
        self.display, self.display_stream = display, display_stream
        # The latest start of each instance (phase, seconds, CPU-s, load): the report's figures.
        self.startups: dict[str, StartupWatch] = {}
        # Where attached instances' logs are read (Compose, Kubernetes, a declared path); else the
        # backend's own (a launched instance's plan log file).
        self._log_sources: dict[str, LogSource] = dict(log_sources or {})
        unknown = sorted(set(self._log_sources) - {p.name for p in plan.processes})
        if unknown:
            raise ClusterError(f"log sources given for instances the plan does not have: {unknown}; "
                               f"known: {[p.name for p in plan.processes]}")
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        # attach / containers / attach_connect_s choose the backend (backend_for) unless one is given.
        self.backend = backend if backend is not None else \
            backend_for(plan, grace_s, attach, containers, attach_connect_s)
        self.procs: dict[str, Running] = {}
        # Instances held with SIGSTOP (:meth:`freeze`): started and ready, not in use.
        self.frozen: set[str] = set()
        atexit.register(self.stop_all)

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()

    def start(self, names: list[str], startup_cpus: Mapping[str, tuple[int, ...]] | None = None,
              freeze_when_ready: Collection[str] = ()) -> dict[str, float]:
        """Start the named processes together and wait until all are ready.

        ``startup_cpus`` (``{name: cpus}``, from :func:`startup_affinity`): the CPUs a process
        runs on until it is ready, instead of its spec's ``cpus``; once ready, every thread of it
        is pinned to its spec's ``cpus`` (and nothing else), so the affinity the scenarios see is
        the configured one. ``freeze_when_ready``: names whose process group is SIGSTOPped as soon
        as it is ready (:meth:`freeze`), so an idle instance (which spins on a CPU host) does not
        take CPU from those still starting; never one the others need while starting (a
        Mooncake master).

        Returns ``{name: seconds to ready}``. Raises the first ClusterError of
        :meth:`start_each` (after every start has ended one way or the other); the processes
        already started stay registered for teardown.
        """
        outcome = self.start_each(names, startup_cpus, freeze_when_ready)
        errors = [e for e in outcome.values() if isinstance(e, ClusterError)]
        if errors:
            raise errors[0]
        return {n: v for n, v in outcome.items() if not isinstance(v, ClusterError)}

    def start_each(self, names: list[str], startup_cpus: Mapping[str, tuple[int, ...]] | None = None,
                   freeze_when_ready: Collection[str] = ()) -> dict[str, float | ClusterError]:
        """:meth:`start`, but each instance's outcome on its own: ``{name: seconds to ready, or
        the ClusterError that ended its start}``, so one instance that does not start does not
        stop the others. An instance that made no progress or hit the ceiling is stopped (it
        would take CPU from the rest); one that exited stays registered (:meth:`dead` shows its
        code). Raises ClusterError only for what concerns every name (CPUs or ports unavailable)."""
        todo = [n for n in names if n not in self.procs]
        problem = self.backend.refusal([self.plan.by_name(n) for n in todo])
        if problem:
            raise ClusterError(problem)
        for name in todo:
            self._spawn(self.plan.by_name(name), (startup_cpus or {}).get(name))

        def wait(n: str) -> float | ClusterError:
            try:
                return self._wait_ready(n, n in freeze_when_ready)
            except ClusterError as e:
                return e

        # Never "starting" for instances the rig did not start: it waits for them.
        title = "starting" if self.backend.launches else "waiting for"
        shown = StartupDisplay({n: self.startups[n] for n in todo}, self.display, self.display_stream,
                               title=title).start() if todo and self.display != "off" else None
        try:
            with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
                results = list(pool.map(wait, todo))
        finally:
            if shown is not None:
                shown.stop()
        hung = [n for n, r in zip(todo, results, strict=True)
                if isinstance(r, ClusterError) and r.exit_code is None and n in self.procs]
        if hung:
            self.stop(hung)
        return dict(zip(todo, results, strict=True))

    def _spawn(self, spec: ProcessSpec, startup_cpus: tuple[int, ...] | None = None) -> None:
        """Spawn one instance through the backend and begin watching its start."""
        run = self.procs[spec.name] = self.backend.spawn(spec, startup_cpus)
        self.startups[spec.name] = self.backend.watch(run)

    def _wait_ready(self, name: str, freeze: bool = False) -> float:
        """Wait for instance ``name`` while it progresses (rig.cluster.startup); returns seconds to
        ready. Raises ClusterError at once when it exits (``exit_code`` set) or the backend says it
        can never be ready (an attached endpoint that does not answer), when a launched one showed
        no progress for ``startup_stall_s`` (stuck in the phase it names), at the
        ``startup_timeout_s`` ceiling, or when the rig is interrupted; each names the phase, the
        host load and the ``--set`` that gives more time."""
        run = self.procs[name]
        watch = self.startups[name]
        deadline = run.started_at + self.startup_timeout_s
        with httpx.Client(timeout=3.0) as http:
            while True:
                now = time.monotonic()
                watch.look(now)
                rc = self.backend.exit_code(run)
                if rc is not None:
                    watch.finish("exited")
                    watch.reason = (f"{name} exited with code {rc} before it was ready (phase {watch.phase}, "
                                    f"{watch.elapsed_s():.0f} s after spawn)")
                    raise ClusterError(watch.reason, name, self.backend.tail(run), exit_code=rc)
                probe = self._look(run, watch, http, now)
                if probe.ready:
                    watch.finish(READY)
                    run.ready_after_s = time.monotonic() - run.started_at
                    self.backend.settle(run)
                    if freeze:
                        self.freeze([name])
                    return run.ready_after_s
                stall = self.startup_stall_s
                if stall is not None and self.backend.launches and watch.idle_s(now) > stall:
                    msg = (f"{name} made no progress for {watch.idle_s(now):.0f} s in start-up phase "
                           f"{watch.phase!r} (no log output, no CPU use, no phase change: timeouts.startup_stall_s "
                           f"= {stall:g}), {watch.elapsed_s(now):.0f} s after spawn; {load_text()}. If it is "
                           f"only slow, give it longer: --set timeouts.startup_stall_s={_more(stall)}")
                    raise _gave_up(watch, "stuck", msg, self.backend.tail(run))
                if now > deadline:
                    raise self._past_ceiling(run, watch, probe, now)
                # The runner waits here in a worker thread, which a signal cannot interrupt; an
                # interrupted rig would otherwise wait for the server to become ready (minutes).
                if INTERRUPTED.wait(0.5):
                    watch.finish("interrupted")
                    raise ClusterError(f"start of {name} interrupted", name)

    def _look(self, run: Running, watch: StartupWatch, http: httpx.Client, now: float) -> Probe:
        """One readiness look through the backend. An instance the rig did not launch has no log
        phases: its watch's phase is what the probe waits for ('connecting', 'waiting for
        /health', ...), timed as phases are (rig.cluster.startup.StartupWatch.phase_s)."""
        try:
            probe = self.backend.ready(run, http)
        except ClusterError as e:
            watch.finish("failed", e.summary)
            raise
        if not self.backend.launches and probe.phase and probe.phase != watch.phase:
            watch.phase_s[watch.phase] = now - watch.phase_since
            watch.phase, watch.phase_since = probe.phase, now
        return probe

    def _past_ceiling(self, run: Running, watch: StartupWatch, probe: Probe, now: float) -> ClusterError:
        """The error of a start that reached ``startup_timeout_s``, its watch closed."""
        spec, name = run.spec, run.spec.name
        if not self.backend.launches:  # nothing of ours to show: name where we looked
            msg = (f"{name} at {spec.base_url} (attached: the rig did not start it) did not answer "
                   f"{spec.health_path} with the model listed within {self.startup_timeout_s:.0f} s "
                   f"(timeouts.startup_s; last: {probe.missing}); {load_text()}. Is the deployment up at that "
                   f"address (--endpoint NAME=URL)? If it is still starting: --set "
                   f"timeouts.startup_s={_more(self.startup_timeout_s)}")
            return _gave_up(watch, "timeout", msg)
        msg = (f"{name} was not ready within {self.startup_timeout_s:.0f} s (timeouts.startup_s, the "
               f"ceiling), in start-up phase {watch.phase!r} for {now - watch.phase_since:.0f} s, last "
               f"progress {watch.idle_s(now):.0f} s ago ({watch.progress_sign}); {load_text()}. To "
               f"wait longer: --set timeouts.startup_s={_more(self.startup_timeout_s)}")
        return _gave_up(watch, "timeout", msg, self.backend.tail(run))

    def stop(self, names: list[str]) -> None:
        """Stop the named instances and forget them: a launched process gets SIGTERM to its group,
        SIGKILL after the grace period; a container is paused (the deployment's owner removes
        it, and :meth:`start` continues a paused one); an attached endpoint is left alone."""
        self.frozen -= set(names)  # a stopped group is continued so it sees the SIGTERM
        runs = [self.procs.pop(n) for n in names if n in self.procs]
        if runs:
            self.backend.stop(runs)

    def startup_record(self) -> tuple[dict[str, dict[str, Any]], dict[str, StartupProfile]]:
        """Every instance's latest start: its figures (StartupWatch.figures) and, for a vLLM server
        whose start ended and whose log the rig reads, its profile (rig.cluster.startup_profile)."""
        return ({n: w.figures() for n, w in self.startups.items()},
                {n: w.profile for n, w in self.startups.items() if w.profile is not None})

    def stop_all(self) -> None:
        """Stop every instance and close the backend (the watchdog reaper; containers this
        cluster paused are unpaused, so their owner finds them as it left them); safe to call
        more than once."""
        self.stop(list(self.procs))
        self.backend.close()
        atexit.unregister(self.stop_all)

    def _running(self, name: str) -> Running:
        """The record of ``name``; ClusterError when it is not running under this cluster."""
        run = self.procs.get(name)
        if run is None:
            raise ClusterError(f"cannot signal {name}: not started by this cluster")
        return run

    def freeze(self, names: list[str]) -> None:
        """SIGSTOP the process groups of the named running instances (API server, EngineCore,
        workers at once, so none sees another stop answering) and remember them as frozen.

        Used to hold instances started ahead of their phase: an idle vLLM CPU instance with
        NIXL spins about two cores. A frozen instance is continued by :meth:`thaw` or by
        teardown (:func:`~rig.cluster.reaper.kill_groups` sends SIGCONT after SIGTERM).
        vLLM 0.32.0 survives a stop of the whole group: docs/measurements.md
        (``fault-sigstop-d-past-lease``). Raises ClusterError in attach
        mode or for an instance this cluster did not start (:meth:`signal`). A container the engine
        cannot pause (after the retries of rig.cluster.containers) is left running, with a
        warning on stderr: holding is a saving of CPU, not something a verdict rests on."""
        for n in names:
            if self.backend.hold(self._running(n)):
                self.frozen.add(n)

    def thaw(self, names: list[str]) -> None:
        """SIGCONT the named frozen instances (others are left alone)."""
        for n in [n for n in names if n in self.frozen]:
            self.signal(n, signal.SIGCONT)
            self.frozen.discard(n)

    # -- faults (rig/workload/faults.py) -----------------------------------------------------------------

    def signal(self, name: str, sig: int) -> int:
        """Send ``sig`` to instance ``name``'s whole process group (API server, EngineCore,
        workers: each server runs in its own session, pgid == pid); returns the pgid.

        A container gets the matching action instead (rig/cluster/containers.py: docker kill /
        pause / unpause) and the result is its init's host PID. Raises ClusterError for an
        attached endpoint (the rig does not own those processes) or when ``name`` is not running
        under this cluster; a group that is already gone is not an error (a SIGKILL on a crashed
        instance is a no-op)."""
        return self.backend.signal(self._running(name), sig)

    def restart(self, name: str) -> float:
        """Stop instance ``name`` (whatever state it is in: killed, stopped, alive) and start it
        again from the same :class:`~rig.plan.processes.ProcessSpec`: the same HTTP port, NIXL side-channel
        port, env and log file (appended). A container is restarted in place (``docker restart``).
        Returns seconds to ready; raises ClusterError as :meth:`start` does."""
        spec = self.plan.by_name(name)
        if self.backend.restart_in_place(spec):
            self.frozen.discard(name)
            self.procs.pop(name, None)
            self._spawn(spec)  # a fresh start record
            return self._wait_ready(name)
        self.stop([name])
        return self.start([name])[name]

    # -- observation -------------------------------------------------------------------------

    def exit_codes(self) -> dict[str, int | None]:
        """``{name: None while alive, else the exit code}`` of every started instance (an
        attached one is alive while ``/health`` answers 200, else -1)."""
        return {n: self.backend.poll(r) for n, r in self.procs.items()}

    def dead(self) -> dict[str, int]:
        """The started processes that have exited, with their exit codes."""
        return {n: rc for n, rc in self.exit_codes().items() if rc is not None}

    def cpu_s(self, name: str) -> float | None:
        """CPU seconds (user + system) used so far by every process of instance ``name`` (API
        server, EngineCore, workers); None when the rig did not launch it, it has exited or /proc
        is unreadable."""
        run = self.procs.get(name)
        return None if run is None else self.backend.cpu_s(run)

    def exit_code(self, name: str) -> int | None:
        """Instance ``name``'s exit code, None while it runs (or is attached, or not started); a
        container's from ``docker inspect``."""
        run = self.procs.get(name)
        return None if run is None else self.backend.exit_code(run)

    def engine_cpu_s(self, name: str) -> float | None:
        """Cumulative CPU seconds (user + system) of instance ``name``'s EngineCore process, the
        child vLLM titles ``VLLM::EngineCore`` (vllm/v1/engine/core.py ``set_process_title``);
        None when the rig did not launch it, it has no such child (yet) or /proc is unreadable.

        EngineCore steps in a busy loop while a request waits, so this grows with scheduler
        iterations (rig.judge.early_verdict). The worker is not counted: it spins while idle."""
        sample = self.proc_sample(name)
        return None if sample is None else sample.engine_cpu_s

    def proc_sample(self, name: str) -> ProcSample | None:
        """What instance ``name``'s process tree is doing (:func:`rig.cluster.proctree.sample_tree`:
        EngineCore and worker CPU seconds, compilers running); None when no process of it is
        known on this host or /proc is unreadable. The stall watcher's evidence (rig.observe.stall)."""
        run = self.procs.get(name)
        root = None if run is None else self.backend.pid(run)
        return sample_tree(root) if root else None

    def how(self, name: str) -> str:
        """What :meth:`signal` acts on for ``name``, for fault reports: 'process group N' or
        'container <id>'."""
        return self.backend.how(name, self.procs.get(name))

    def url(self, name: str) -> str:
        """Base URL of process ``name``."""
        return self.plan.by_name(name).base_url

    def log_source(self, name: str) -> LogSource | None:
        """Where instance ``name``'s log is read: the source given to the constructor, else the
        backend's (a :class:`~rig.cluster.logs.FileLog` on a launched process's ``log_path``); None
        for an attached one when no source was given: the log checks are then "not checked" ("no
        log source given"), never ok. Raises KeyError for a name the plan does not have."""
        if name in self._log_sources:
            return self._log_sources[name]
        return self.backend.log_source(self.plan.by_name(name))


def _gave_up(watch: StartupWatch, outcome: str, msg: str, tail: str = "") -> ClusterError:
    """Close ``watch`` with ``outcome`` and ``msg``; the ClusterError to raise for it."""
    watch.finish(outcome, msg)
    return ClusterError(msg, watch.name, tail)


def _more(seconds: float) -> int:
    """The value a "give it longer" hint suggests: twice ``seconds``, rounded up to 60 s."""
    return int(-(-2 * seconds // 60) * 60)


def startup_affinity(cpus_of: Mapping[str, tuple[int, ...]], allowed: Iterable[int]) -> dict[str, tuple[int, ...]]:
    """CPUs for each pinned instance while the suite's instances start at once.

    ``cpus_of``: ``{name: configured cpus}`` in start order (``()`` = unpinned: left out, it
    runs on every CPU); ``allowed``: the CPUs the rig may use. Each pinned instance gets as many
    CPUs as it is configured with (vLLM and torch size their thread pools to the CPUs they see
    at start, ``vllm/platforms/cpu.py`` ``get_max_threads``), the least loaded ones, its own
    configured CPUs first on a tie: start-up is CPU-bound, so spreading the instances over
    every CPU is what makes starting them together faster than one pair after another.
    After ready, :meth:`Cluster.start` pins each to its configured CPUs."""
    pool = sorted(set(allowed))
    load = dict.fromkeys(pool, 0)
    out: dict[str, tuple[int, ...]] = {}
    for name, cpus in cpus_of.items():
        if not cpus:
            continue
        want = min(len(cpus), len(pool))
        pick = sorted(pool, key=lambda c: (load[c], c not in cpus, c))[:want]
        for c in pick:
            load[c] += 1
        out[name] = tuple(sorted(pick))
    return out

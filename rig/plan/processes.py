"""Step 2 of the rig's flow: the plan, a pure function from config to processes.

``build_plan`` turns a :class:`~rig.config.schema.RigConfig` into the exact argv, environment, ports and
log path of every process the cluster will start. It reads no files and starts nothing, so
``pdrig plan`` can print it and the GPU profiles can be unit-tested argument by argument on a
machine without GPUs. ``busy_ports`` is the one impure helper: it asks the OS which of the
plan's ports are taken before anything is launched.
"""

from __future__ import annotations

import json
import shlex
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rig.config.schema import InstanceConfig, RigConfig

# Environment every CPU server needs (measured; docs/vllm-cpu-facts.md "Environment every CPU server gets"):
CPU_ENV = {
    # Without it vLLM loads AVX-512 kernels and dies with SIGILL on AVX2-only hosts.
    "VLLM_TARGET_DEVICE": "cpu",
    # GiB of KV space; without it start-up fails vLLM's memory-utilization check.
    # --num-gpu-blocks-override then caps the blocks as on GPU.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # The default binds every server's OpenMP threads to core 0.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
COMMON_ENV = {
    "HF_HUB_OFFLINE": "1",  # the CPU machines reach no model hub; GPU profiles may override
    "PYTHONUNBUFFERED": "1",  # log lines reach the log file when written
}


@dataclass(frozen=True)
class ProcessSpec:
    """Everything needed to start and check one process.

    ``env`` holds only what the rig adds to the inherited environment. ``ready_ports`` are TCP
    ports that must accept a connection before the process counts as ready (the NIXL side
    channel of a vLLM instance).
    """

    name: str
    role: str  # "prefill" | "decode" | "mooncake-master"
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
        """What :mod:`rig.cluster.processes` does to the process after spawning it, in words ('' if nothing):
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

    def by_name(self, name: str) -> ProcessSpec:
        """The process called ``name``; raises KeyError if there is none."""
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of the plan (what ``pdrig plan --json`` prints)."""
        return {"name": self.name, "run_dir": self.run_dir, "model_path": self.model_path,
                "processes": [asdict(p) for p in self.processes]}


def side_channel_port(cfg: RigConfig, inst: InstanceConfig) -> int:
    """The NIXL side-channel port of ``inst``: explicit, or base port + the instance's index."""
    if inst.side_channel_port is not None:
        return inst.side_channel_port
    index = [i.name for _, i in cfg.instances()].index(inst.name)
    return cfg.nixl.side_channel_base_port + index


def kv_transfer_config(cfg: RigConfig, role: str, inst: InstanceConfig) -> dict[str, Any]:
    """The ``--kv-transfer-config`` JSON for ``inst``.

    Prefill is the KV producer and decode the consumer: decode pulls the KV from prefill
    (NixlConnector's pull mode). Mooncake modes are built by ``rig.plan.mooncake``.
    """
    kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
    mode = inst.connector or cfg.connector
    if mode != "nixl":
        from rig.plan import mooncake  # only the store modes need it

        index = [i.name for _, i in cfg.instances()].index(inst.name)
        return mooncake.kv_transfer_config(
            mode=mode, kv_role=kv_role, device=cfg.device,
            lookup_rpc_port=cfg.mooncake.lookup_rpc_base_port + index,
            kv_buffer_device=cfg.nixl.kv_buffer_device,
            nixl_extra=_nixl_extra(cfg))
    out: dict[str, Any] = {"kv_connector": "NixlConnector", "kv_role": kv_role,
                           "kv_buffer_device": cfg.nixl.kv_buffer_device}
    if inst.kv_load_failure_policy is not None:
        out["kv_load_failure_policy"] = inst.kv_load_failure_policy
    if _nixl_extra(cfg):
        out["kv_connector_extra_config"] = _nixl_extra(cfg)
    return out


def _nixl_extra(cfg: RigConfig) -> dict[str, Any]:
    """The NIXL ``kv_connector_extra_config`` keys the config sets (None = vLLM's default)."""
    extra = {"num_threads": cfg.nixl.num_threads, "kv_lease_duration": cfg.nixl.kv_lease_duration}
    return {k: v for k, v in extra.items() if v is not None}


def vllm_argv(cfg: RigConfig, role: str, inst: InstanceConfig, model_path: str, python: str) -> list[str]:
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
        "--max-model-len", str(cfg.max_model_len),
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
        if "model" in spec:  # "{model}": the served model is its own draft (draft_model on CPU, docs/vllm-cpu-facts.md)
            spec["model"] = spec["model"].replace("{model}", model_path)
        argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    argv += ["--enable-prefix-caching" if inst.enable_prefix_caching else "--no-enable-prefix-caching"]
    if cfg.launch.enforce_eager:
        argv += ["--enforce-eager"]
    return argv + list(cfg.launch.extra_args) + list(inst.extra_args)


def instance_env(cfg: RigConfig, inst: InstanceConfig) -> dict[str, str]:
    """Environment the rig adds for ``inst`` (device defaults < launch.env < instance env)."""
    env = dict(COMMON_ENV)
    if cfg.device == "cpu":
        env.update(CPU_ENV)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in inst.gpu_ids)
    env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = cfg.nixl.side_channel_host
    env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_channel_port(cfg, inst))
    if cfg.nixl.ucx_tls:
        env["UCX_TLS"] = cfg.nixl.ucx_tls
    if cfg.nixl.ucx_net_devices:
        env["UCX_NET_DEVICES"] = cfg.nixl.ucx_net_devices
    env.update(cfg.launch.env)
    env.update(inst.env)
    return env


def build_plan(cfg: RigConfig, run_dir: str | Path, model_path: str, python: str) -> Plan:
    """Config -> the processes of the topology (pure: no I/O).

    ``model_path`` is the resolved model (the tiny model's directory or a real model id);
    ``python`` is substituted for ``{python}`` in ``launch.command``.
    """
    run_dir = str(run_dir)
    procs: list[ProcessSpec] = []
    if any((i.connector or cfg.connector) in ("mooncake-store", "nixl+store") for _, i in cfg.instances()):
        from rig.plan import mooncake

        procs.append(mooncake.master_process(cfg, run_dir))
    for role, inst in cfg.instances():
        env = instance_env(cfg, inst)
        files: dict[str, str] = {}
        if (inst.connector or cfg.connector) in ("mooncake-store", "nixl+store"):
            from rig.plan import mooncake

            path, content = mooncake.instance_store_file(cfg, run_dir, inst.name)
            env.update(mooncake.instance_store_env(cfg, run_dir, inst.name))  # config path, MC_* ports, IPC dir
            files[path] = content
        procs.append(ProcessSpec(
            name=inst.name, role=role,
            argv=tuple(vllm_argv(cfg, role, inst, model_path, python)),
            env=env,
            log_path=str(Path(run_dir) / "logs" / f"{inst.name}.log"),
            host=cfg.launch.host, port=inst.port,
            served_model=cfg.model.served_name,
            ready_ports=(side_channel_port(cfg, inst),),
            nice=cfg.launch.nice,
            gpu_ids=tuple(inst.gpu_ids),
            cpus=tuple(inst.cpus or ()),
            files=files,
            dirs=tuple(d for d in (env.get("VLLM_RPC_BASE_PATH"),) if d),
        ))
    return Plan(name=cfg.name, run_dir=run_dir, model_path=model_path, processes=tuple(procs))


def with_endpoints(plan: Plan, endpoints: dict[str, str]) -> Plan:
    """The plan of an attached deployment (``pdrig e2e --attach``, ``attach.endpoints``): each
    named process answers at its ``http://HOST:PORT`` instead of the config's host and port.

    Such a process's ``ready_ports`` are dropped: its NIXL side channel is between its peers
    (a pod's or container's own address) and need not be reachable from the rig; the deployment's
    own readiness covers it. Raises KeyError for a name the plan does not have, ValueError for a
    URL that is not ``http://HOST:PORT``.
    """
    from dataclasses import replace
    from urllib.parse import urlsplit

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


def _port_ports(spec: ProcessSpec) -> list[int]:
    return [spec.port, *spec.ready_ports]


def probe_host(host: str) -> str:
    """The address that reaches a server bound to ``host``: 127.0.0.1 for a wildcard bind."""
    return "127.0.0.1" if host in ("0.0.0.0", "::") else host


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

"""The plan as a Docker Compose project (``make e2e-docker``): one service per plan process.

The compose file is a projection of :class:`~rig.plan.processes.Plan`, not a second source of truth: each
service runs the plan's argv (exec form, never a shell) with the plan's environment. Only what a
container network forces is rewritten, and every rewrite is listed here and in
:func:`container_argv` / :func:`container_env`:

- bind addresses (``--host`` etc.) become ``0.0.0.0``: inside its own network namespace a server
  bound to 127.0.0.1 is unreachable from the other containers and from Docker's port publishing.
  Exposure to the outside is limited instead by publishing each HTTP port on the *host's*
  127.0.0.1 only (``ports[].host_ip``), so nothing listens on the host's external interfaces.
- ``VLLM_NIXL_SIDE_CHANNEL_HOST`` becomes the instance's own service name: vLLM's NixlConnector
  binds its ZMQ handshake listener to that host and *advertises the same value* as
  ``remote_host`` in the ``kv_transfer_params`` P returns (nixl/base_scheduler.py,
  pull_scheduler.py); D connects there to pull. So P's value must be a name that both resolves
  to P's own address inside P (``hostname:`` is set to it) and from D (Compose DNS). The store
  modes' ``VLLM_HOST_IP`` / ``MC_TCP_BIND_ADDRESS`` (the address a Mooncake store client binds
  and advertises, rig/connectors/mooncake.py) follow the same rule.
- ``CUDA_VISIBLE_DEVICES`` is renumbered from 0: the NVIDIA runtime exposes only the reserved
  ``device_ids`` to the container, as devices 0..n-1.
- ``UCX_NET_DEVICES=lo`` (the CPU profile's loopback pin) becomes ``eth0``: a container's
  loopback cannot reach its peer; its one network interface can.

Build the plan with :func:`container_plan` so paths and the interpreter are the container's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

import yaml

from rig.config import RigConfig
from rig.connectors.mooncake import MASTER_ROLE
from rig.plan.processes import build_plan
from rig.plan.spec import Plan, ProcessSpec

CONTAINER_RUN_DIR = "/rig/run"  # the host run directory is mounted here (logs, connector files)
CONTAINER_MODEL_DIR = "/rig/model"  # a local model (tiny / path) is mounted here, read-only
CONTAINER_HF_CACHE = "/root/.cache/huggingface"  # hub models: HF cache of root, both images
CONTAINER_PYTHON = "python3"  # replaces {python} in launch.command
CONTAINER_NIC = "eth0"  # the interface of a container attached to exactly one network
BIND_ALL = "0.0.0.0"
PUBLISH_IP = "127.0.0.1"
NETWORK = "pdrig"
HF_CACHE_VOLUME = "hf-cache"
# Flags whose value is a bind address: vLLM's OpenAI server and mooncake_master (rig/connectors/mooncake.py).
HOST_FLAGS = ("--host", "--rpc_address", "--http_metadata_server_host", "--metrics_host")
# Variables naming the address a process binds *and* advertises to its peers: its service name.
ADVERTISED_HOST_ENV = ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_HOST_IP", "MC_TCP_BIND_ADDRESS")
ENGINE_ROLES = ("prefill", "decode")


def container_model_path(cfg: RigConfig) -> str:
    """Where the model is inside a container: the hub id itself, or the read-only mount point."""
    return str(cfg.model.path) if cfg.model.source == "hub" else CONTAINER_MODEL_DIR


def container_plan(cfg: RigConfig, names: list[str] | None = None) -> Plan:
    """The plan as the containers see it: run dir, model path and interpreter of the image.

    With ``names``, only those processes (and any Mooncake master, which the engines need):
    on a small host all of a config's instances at once starve each other (docs/explanation/cpu-default.md).
    Ports and side-channel ports stay those of the whole config. No host binary is passed to
    build_plan, so an unset ``mooncake.master_binary`` is ``mooncake_master`` on the image's PATH,
    not a binary found in the host's venv.
    """
    plan = build_plan(cfg, CONTAINER_RUN_DIR, container_model_path(cfg), CONTAINER_PYTHON)
    if names is None:
        return plan
    return replace(plan, processes=tuple(p for p in plan.processes
                                         if p.name in names or p.role == MASTER_ROLE))


def container_argv(spec: ProcessSpec) -> list[str]:
    """The plan's argv with every bind address (``HOST_FLAGS``) set to ``0.0.0.0``.

    Both ``--host VALUE`` and ``--host=VALUE`` are rewritten; nothing else changes.
    """
    argv = list(spec.argv)
    for i, arg in enumerate(argv):
        if arg in HOST_FLAGS and i + 1 < len(argv):
            argv[i + 1] = BIND_ALL
        elif "=" in arg and arg.split("=", 1)[0] in HOST_FLAGS:
            argv[i] = f"{arg.split('=', 1)[0]}={BIND_ALL}"
    return argv


def container_env(spec: ProcessSpec, advertised_host: str | None = None) -> dict[str, str]:
    """The plan's environment with the container rewrites of the module docstring applied.

    ``advertised_host`` is the name peers resolve to this container (default: the service name,
    ``spec.name``; Kubernetes passes its Service name, rig/plan/k8s.py)."""
    env = dict(spec.env)
    for key in ADVERTISED_HOST_ENV:
        if key in env:
            env[key] = advertised_host or spec.name
    if spec.gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(spec.gpu_ids)))
    if env.get("UCX_NET_DEVICES") == "lo":
        env["UCX_NET_DEVICES"] = CONTAINER_NIC
    return env


def readiness_code(spec: ProcessSpec, side_channel_host: str) -> str:
    """The cluster's readiness rule (rig/cluster/backends/base.py ``probe_ready``) as a Python one-liner
    run inside the container: exit 0 when ``GET http://127.0.0.1:<port><health_path>`` answers
    200, ``/v1/models`` lists the served model, and every ``ready_ports`` port (the NIXL side
    channel) accepts a TCP connection on ``side_channel_host``, where the listener is bound.
    Python, not curl: curl is not in every image. Shared by Compose and Kubernetes (rig/plan/k8s.py).
    """
    base = f"http://127.0.0.1:{spec.port}"
    ports = [(side_channel_host, p) for p in spec.ready_ports]
    model = (f"m=json.load(u.urlopen('{base}/v1/models',timeout=4)); "
             f"ok=ok and {spec.served_model!r} in [d.get('id') for d in m.get('data',[])]; "
             if spec.served_model else "")
    return ("import json,socket,urllib.request as u; "
            f"ok=u.urlopen('{base}{spec.health_path}',timeout=4).status==200; "
            f"{model}"
            f"[socket.create_connection(a,4).close() for a in {ports!r}]; "
            "raise SystemExit(0 if ok else 1)")


def healthcheck(cfg: RigConfig, spec: ProcessSpec) -> dict[str, Any]:
    """The cluster's readiness rule (:func:`readiness_code`) as a Compose healthcheck, the side
    channel checked on the service's own name. Times are Compose durations; ``start_period`` is
    ``timeouts.startup_s``, during which failures do not count.
    """
    code = readiness_code(spec, spec.name)
    return {"test": ["CMD", "python3", "-c", code], "interval": "5s", "timeout": "5s",
            "retries": 3, "start_period": f"{int(cfg.timeouts.startup_s)}s"}


def _esc(value: str) -> str:
    """Compose interpolates ``$VAR`` in every string; ``$$`` is a literal ``$``."""
    return value.replace("$", "$$")


def _depends_on(plan: Plan, index: int) -> dict[str, dict[str, str]]:
    """Start order. Engines wait for a Mooncake master to be healthy (they connect at init).

    Decode -> every prefill: ``service_started`` only. D does not need P to start, but a D alone
    is useless, so ``up decode`` also brings up P; the suite runner waits for every service to
    be healthy anyway, and not waiting keeps P and D start-ups (tens of seconds each) parallel.
    Instance -> the previous instance sharing one of its GPUs: ``service_healthy``. vLLM sizes
    its KV cache from a memory profile taken at start-up; a neighbour starting at the same time
    on the same GPU skews it, so starts on one GPU are serialised.
    """
    spec = plan.processes[index]
    deps: dict[str, dict[str, str]] = {}
    if spec.role not in ENGINE_ROLES:
        return deps
    for other in plan.processes[:index]:
        if other.role == MASTER_ROLE:
            deps[other.name] = {"condition": "service_healthy"}
        elif spec.role == "decode" and other.role == "prefill":
            deps[other.name] = {"condition": "service_started"}
    shared = [o for o in plan.processes[:index] if set(o.gpu_ids) & set(spec.gpu_ids)]
    if shared:
        deps[shared[-1].name] = {"condition": "service_healthy"}
    return deps


def _volumes(cfg: RigConfig, plan: Plan, spec: ProcessSpec, run_dir_host: str,
             model_dir_host: str | None, hf_cache_host: str | None) -> list[dict[str, Any]]:
    vols: list[dict[str, Any]] = [
        {"type": "bind", "source": _esc(run_dir_host), "target": plan.run_dir}]
    if spec.role not in ENGINE_ROLES:
        return vols
    if cfg.model.source == "hub":
        if hf_cache_host:
            vols.append({"type": "bind", "source": _esc(hf_cache_host), "target": CONTAINER_HF_CACHE})
        else:
            vols.append({"type": "volume", "source": HF_CACHE_VOLUME, "target": CONTAINER_HF_CACHE})
    else:
        vols.append({"type": "bind", "source": _esc(str(model_dir_host)), "target": plan.model_path,
                     "read_only": True})
    return vols


def _service(cfg: RigConfig, plan: Plan, index: int, image: str, run_dir_host: str,
             model_dir_host: str | None, hf_cache_host: str | None, cpuset: bool = True) -> dict[str, Any]:
    spec = plan.processes[index]
    env: dict[str, Any] = {k: _esc(v) for k, v in container_env(spec).items()}
    if spec.role in ENGINE_ROLES and cfg.model.source == "hub":
        env.setdefault("HF_TOKEN", None)  # no value: passed through from the invoking shell
    log_host = str(PurePosixPath(run_dir_host) / PurePosixPath(spec.log_path).relative_to(plan.run_dir))
    svc: dict[str, Any] = {
        "image": image,
        "hostname": spec.name,  # resolves to the container's own address (side-channel bind)
        "entrypoint": [],  # the image's own (vllm serve) would prefix our argv
        "command": [_esc(a) for a in container_argv(spec)],
        "environment": env,
        "init": True,  # forwards SIGTERM to the server, reaps its engine-core child
        "stop_grace_period": f"{cfg.timeouts.shutdown_grace_s:g}s",
        "restart": "no",  # a crash must fail the run, not be hidden by a restart
        "networks": [NETWORK],
        "ports": [{"target": spec.port, "published": str(spec.port), "host_ip": PUBLISH_IP,
                   "protocol": "tcp"}],
        "volumes": _volumes(cfg, plan, spec, run_dir_host, model_dir_host, hf_cache_host),
        "healthcheck": healthcheck(cfg, spec),
        "labels": {"pdrig.role": spec.role, "pdrig.log": _esc(log_host)},
    }
    deps = _depends_on(plan, index)
    if deps:
        svc["depends_on"] = deps
    if spec.cpus and cpuset:
        svc["cpuset"] = ",".join(map(str, spec.cpus))  # the instance's `cpus` (CPU affinity)
    if spec.gpu_ids:
        svc["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "device_ids": [str(g) for g in spec.gpu_ids],
             "capabilities": ["gpu"]}]}}}
        svc["ipc"] = "host"  # CUDA IPC (UCX cuda_ipc) between P and D containers; vLLM's docs
        svc["ulimits"] = {"memlock": -1}  # RDMA memory registration (UCX rc/ib)
    else:
        svc["shm_size"] = "2gb"  # vLLM's shared-memory queues; Docker's default is 64 MB
    return svc


def render_compose(cfg: RigConfig, plan: Plan, image: str, run_dir_host: str, *,
                   model_dir_host: str | None = None, hf_cache_host: str | None = None,
                   project: str | None = None, cpuset: bool = True) -> dict:
    """The Compose project (a dict following the Compose specification) for ``plan``.

    ``plan`` should come from :func:`container_plan` (container paths). ``run_dir_host`` (absolute)
    is mounted at ``plan.run_dir``, so the plan's file paths are valid inside and the runner finds
    them on the host; container output goes to ``docker compose logs``, and the host path each
    service's log belongs at is its ``pdrig.log`` label. A local model (source tiny/path) needs
    ``model_dir_host``, mounted read-only at ``plan.model_path``; a hub model uses
    ``hf_cache_host`` if given, else the named volume ``hf-cache``, and ``HF_TOKEN`` is passed
    through. ``launch.nice`` is not applied (no exec-form way to renice). ``project``: the
    Compose project name (default ``pdrig-<plan name>``; one per run keeps concurrent runs'
    containers and networks apart). ``cpuset=False`` leaves the instances' ``cpus`` out: the rig
    pins a container once it is ready (``docker update``, rig/cluster/containers.py), so start-ups
    share every CPU as on the host (``launch.start_all_at_once``).

    Raises ValueError for a relative ``run_dir_host`` or ``plan.run_dir``, or a local model
    without ``model_dir_host``.
    """
    if not PurePosixPath(run_dir_host).is_absolute() or not PurePosixPath(plan.run_dir).is_absolute():
        raise ValueError(
            f"run_dir_host {run_dir_host!r} and plan.run_dir {plan.run_dir!r} must be absolute "
            "(Compose resolves relative bind sources against the compose file's folder); "
            "build the plan with rig.plan.compose.container_plan")
    if cfg.model.source != "hub" and not model_dir_host:
        raise ValueError(f"model.source {cfg.model.source!r} is a local directory: pass "
                         "model_dir_host (the host directory mounted at the plan's model path)")
    services = {spec.name: _service(cfg, plan, i, image, run_dir_host, model_dir_host, hf_cache_host, cpuset)
                for i, spec in enumerate(plan.processes)}
    doc: dict[str, Any] = {"name": project or f"pdrig-{plan.name}", "services": services,
                           "networks": {NETWORK: {"driver": "bridge"}}}
    if any(v["type"] == "volume" for s in services.values() for v in s["volumes"]):
        doc["volumes"] = {HF_CACHE_VOLUME: {}}
    return doc


HEADER = """\
# Generated by pdrig (rig/plan/compose.py) from the plan of config {name!r}. Do not edit; re-render.
# Servers bind 0.0.0.0 inside their containers (127.0.0.1 there is unreachable from the other
# containers and from port publishing); each HTTP port is published on the host's 127.0.0.1 only.
# VLLM_NIXL_SIDE_CHANNEL_HOST is each instance's service name: P advertises it to D as remote_host.
"""


def compose_yaml(cfg: RigConfig, plan: Plan, image: str, run_dir_host: str, **kwargs: Any) -> str:
    """:func:`render_compose` as YAML text with an explanatory header (same arguments, errors)."""
    doc = render_compose(cfg, plan, image, run_dir_host, **kwargs)
    body = yaml.safe_dump(doc, sort_keys=False, width=1_000_000, default_flow_style=False)
    return HEADER.format(name=cfg.name) + body


def container_files(cfg: RigConfig, plan: Plan, run_dir_host: str) -> dict[str, str]:
    """Files the runner writes before ``docker compose up``: host path -> content.

    The plan's ``files`` (connector configs, e.g. Mooncake's) with their paths moved from
    ``plan.run_dir`` to ``run_dir_host`` and the Mooncake master's address
    (``mooncake.host:PORT``) pointed at the master's service name. Raises ValueError for a
    file outside ``plan.run_dir`` (it would not be visible in the container).
    """
    master = next((p.name for p in plan.processes if p.role == MASTER_ROLE), None)
    out: dict[str, str] = {}
    for spec in plan.processes:
        for path, content in spec.files.items():
            try:
                rel = PurePosixPath(path).relative_to(plan.run_dir)
            except ValueError:
                raise ValueError(
                    f"{spec.name}: file {path} is outside the run dir {plan.run_dir}") from None
            if master:
                content = content.replace(f"{cfg.mooncake.host}:", f"{master}:")
            out[str(PurePosixPath(run_dir_host) / rel)] = content
    return out

"""The Mooncake store's part of a plan: the ``mooncake_master`` process and, for each instance in
a store mode, its ``MOONCAKE_CONFIG_PATH`` file and store-client environment.

Topology glue only: the argv, JSON and environment come from the pure builders in
rig.connectors.mooncake, the ports from the config's rules (``RigConfig.store_client_ports``),
the binary from the caller (rig.cluster.mooncake finds it on the host). The config's Mooncake
checks are in rig.config.topology, the host preflight in rig.cluster.mooncake.
docs/explanation/mooncake.md has the measurements behind each rule.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rig.config import RigConfig
from rig.connectors.mooncake import MASTER_ROLE, ipc_dir, master_argv, store_client_env, store_config, store_file_path
from rig.plan.spec import ProcessSpec, probe_host


def master_process(cfg: RigConfig, run_dir: str | os.PathLike[str], master_binary: str) -> ProcessSpec:
    """The :class:`~rig.plan.spec.ProcessSpec` of ``mooncake_master`` for ``cfg`` (name and role
    :data:`~rig.connectors.mooncake.MASTER_ROLE`), started from ``master_binary`` (a path or a
    name resolved on PATH).

    Argv from master_argv (RPC, HTTP metadata and metrics/admin ports on ``mooncake.host``); log
    ``<run_dir>/logs/mooncake-master.log`` (``GLOG_logtostderr=1`` keeps glog's files out of
    /tmp); readiness = ``GET /health`` 200 on the metrics port (measured:
    ``{"status":"ok",...,"service_ready":true}`` about 1 s after start) plus the RPC and metadata
    ports accepting connections; no ``/v1/models`` check (``served_model`` None). Nice 0: the
    master is idle most of the time and every put/get of both engines goes through it, so it is
    not pushed below the servers (under CPU starvation its metadata PUTs were seen timing out).
    Raises ValueError as master_argv does (empty binary, bad or equal ports).
    """
    mc = cfg.mooncake
    return ProcessSpec(
        name=MASTER_ROLE, role=MASTER_ROLE,
        argv=tuple(master_argv(master_binary, mc.host, mc.rpc_port, mc.http_metadata_port,
                               mc.metrics_port)),
        env={"GLOG_logtostderr": "1", "PYTHONUNBUFFERED": "1"},
        log_path=str(Path(run_dir) / "logs" / f"{MASTER_ROLE}.log"),
        host=mc.host, port=mc.metrics_port, health_path="/health", served_model=None,
        ready_ports=(mc.rpc_port, mc.http_metadata_port), nice=0,
    )


def instance_store_file(cfg: RigConfig, run_dir: str | os.PathLike[str], inst_name: str) -> tuple[str, str]:
    """``(path, JSON text)`` of instance ``inst_name``'s MOONCAKE_CONFIG_PATH file.

    The text is store_config for the config's master with the instance's segment
    (``mooncake.global_segment_size_mb``) and staging buffer (``local_buffer_size_mb``), MiB
    written as bytes. Raises KeyError for an unknown instance, ValueError as store_config does.
    """
    cfg.instance(inst_name)  # KeyError for a name that is not in the topology
    mc = cfg.mooncake
    content = store_config(mc.host, mc.rpc_port, mc.http_metadata_port,
                           mc.global_segment_size_mb << 20, mc.local_buffer_size_mb << 20, mc.protocol)
    return store_file_path(run_dir, inst_name), json.dumps(content, indent=1) + "\n"


def instance_store_env(cfg: RigConfig, run_dir: str | os.PathLike[str], inst_name: str) -> dict[str, str]:
    """Environment of a store-mode instance: store_client_env for its config file and port
    ranges (``RigConfig.store_client_ports``), with ``VLLM_RPC_BASE_PATH`` = ipc_dir (this run's
    IPC sockets live there, not in a /tmp shared with other rigs). ``VLLM_HOST_IP`` /
    ``MC_TCP_BIND_ADDRESS`` are :func:`~rig.plan.spec.probe_host` of ``mooncake.host``.
    Includes ``MOONCAKE_CONFIG_PATH``. Raises KeyError for an unknown instance.
    """
    rpc, seg = cfg.store_client_ports(inst_name)
    return store_client_env(store_file_path(run_dir, inst_name), probe_host(cfg.mooncake.host), rpc, seg,
                            rpc_base_path=ipc_dir(run_dir))

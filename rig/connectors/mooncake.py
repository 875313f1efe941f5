"""The Mooncake store's pieces of a topology, as plain values: the ``mooncake_master`` argv, the
store config JSON every instance reads (``MOONCAKE_CONFIG_PATH``), a store client's
environment and TCP port layout, and the per-run file locations.

Nothing here imports vLLM, torch or the ``mooncake`` package (importing ``mooncake.store``
already needs ``libibverbs.so.1``) or anything from the rig; the host probes (shared libraries,
the master binary) are in rig.cluster.mooncake, the config's Mooncake checks in rig.config.
The rules were read from vLLM 0.32.0's source (``vllm/distributed/mooncake_store.py``,
``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/``) and checked with live CPU servers
and ``mooncake-transfer-engine-non-cuda==0.3.13.post1``; docs/explanation/mooncake.md has the
measurements (commands, ports, bytes, metric names).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from rig.connectors.kv_transfer import check_port

MASTER_BINARY_NAME = "mooncake_master"
# Process name and role of the master in a plan; rig.plan.compose, the runner, the pytest
# plugin and the store workload find the master by this role.
MASTER_ROLE = "mooncake-master"
STORE_PROTOCOLS: tuple[str, ...] = ("tcp", "rdma")

# TCP ports of each instance's store client, derived from the master's RPC port so the config
# needs no extra field: instance i (index in RigConfig.instances(), prefill first) gets
#   [b, b+3]  MC_MIN_RPC_PORT..MC_MAX_RPC_PORT  (transfer-engine RPC + TcpTransport listeners; 2 spare)
#   [b+4, b+5] MC_STORE_CLIENT_MIN_PORT..MAX    (the port in the segment name; not a listener)
# with b = mooncake.rpc_port + CLIENT_PORT_OFFSET + CLIENT_PORT_STRIDE * i. Keep rpc_port below
# the kernel's ephemeral range (32768+) so no outgoing connection holds one of them.
CLIENT_PORT_OFFSET = 10
CLIENT_PORT_STRIDE = 8
CLIENT_RPC_PORTS = 4
CLIENT_SEGMENT_PORTS = 2


def client_port_ranges(rpc_port: int, index: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(rpc_range, segment_range)``, inclusive ``(low, high)`` TCP ports, of the store client of
    the instance at ``index`` (0-based, prefill first) when the master's RPC port is ``rpc_port``
    (layout above :data:`CLIENT_PORT_OFFSET`). Ports may pass 65535; the config check refuses that."""
    base = rpc_port + CLIENT_PORT_OFFSET + CLIENT_PORT_STRIDE * index
    rpc = (base, base + CLIENT_RPC_PORTS - 1)
    seg = (rpc[1] + 1, rpc[1] + CLIENT_SEGMENT_PORTS)
    return rpc, seg


def master_argv(
    master_bin: str,
    host: str,
    rpc_port: int,
    http_metadata_port: int,
    metrics_port: int,
) -> list[str]:
    """Argv that starts ``mooncake_master`` with its built-in HTTP metadata server.

    ``master_bin`` is the path of the binary (see rig.cluster.mooncake.find_master_binary); ``host`` is the
    address to bind (``127.0.0.1`` on a test machine); the three ports are TCP ports.

    The master then listens on three ports (measured with ``ss -ltnp``, mooncake 0.3.13.post1):

    * ``rpc_port`` on ``host`` (``--rpc_address``; its default is ``0.0.0.0``). Clients reach
      it through ``master_server_address`` in :func:`store_config`.
    * ``metrics_port`` on ``host``: only because ``--metrics_host`` is passed; without it the
      admin server binds ``0.0.0.0``. It serves ``/metrics`` (Prometheus text, ``master_*``),
      ``/metrics/summary`` and ``/health`` (JSON with ``"status": "ok"``).
    * ``http_metadata_port`` on ``0.0.0.0`` whatever ``--http_metadata_server_host`` says: the
      master logs "HTTP metadata server started on 127.0.0.1:PORT" but binds all interfaces.
      The flag is passed anyway so a fixed build binds where asked.

    It is ready in about 1 s (poll ``http://host:metrics_port/health``) and uses ~55 MiB PSS.

    Raises ``ValueError`` for an empty path or host, a port outside 1..65535, or two equal ports
    (the second bind would fail at start-up).
    """
    if not master_bin:
        raise ValueError("master_bin is empty: install mooncake-transfer-engine(-non-cuda)")
    if not host:
        raise ValueError("host is empty")
    ports = {"rpc_port": rpc_port, "http_metadata_port": http_metadata_port,
             "metrics_port": metrics_port}
    for name, port in ports.items():
        check_port(name, port)
    if len(set(ports.values())) != len(ports):
        raise ValueError(f"mooncake_master ports must be distinct, got {ports}")
    return [
        master_bin,
        "--rpc_port", str(rpc_port),
        "--rpc_address", host,
        "--enable_http_metadata_server=true",
        "--http_metadata_server_host", host,
        "--http_metadata_server_port", str(http_metadata_port),
        "--metrics_port", str(metrics_port),
        "--metrics_host", host,
    ]


def store_config(
    host: str,
    rpc_port: int,
    http_metadata_port: int,
    global_segment_size_bytes: int,
    local_buffer_size_bytes: int,
    protocol: str = "tcp",
) -> dict[str, Any]:
    """The JSON object that ``MOONCAKE_CONFIG_PATH`` must point to, for every vLLM instance.

    ``host``/``rpc_port``/``http_metadata_port`` are those given to :func:`master_argv`. Sizes
    are in bytes and written as JSON integers: vLLM's ``MooncakeStoreConfig.from_file``
    (``vllm/distributed/mooncake_store.py``) accepts ints as bytes as well as strings such as
    ``"256MB"`` (its ``MB`` means MiB). Each instance mounts ``global_segment_size_bytes`` of its
    own RAM into the shared pool ("embedded" mode, the default) -- the consumer (D) too -- and
    the master may place any key in any mounted segment, so killing an instance loses the keys
    that lived in its segment. ``local_buffer_size_bytes`` is the per-instance staging buffer.
    Measured: 64 MiB segment + 32 MiB buffer per instance serve the tiny model (a 96-token
    prompt puts 3 keys, 98,304 B).

    ``protocol`` is ``"tcp"`` (the only one usable without an RDMA NIC, and the only one
    verified here) or ``"rdma"``; ``device_name`` stays ``""`` (auto-detect). vLLM defaults the
    protocol to ``rdma`` when the key is missing, so it is always written.

    Raises ``ValueError`` for a non-positive size (vLLM rejects ``local_buffer_size <= 0`` and, in
    embedded mode, ``global_segment_size == 0``), a bad port or an unknown protocol.
    """
    if not host:
        raise ValueError("host is empty")
    check_port("rpc_port", rpc_port)
    check_port("http_metadata_port", http_metadata_port)
    for name, size in (("global_segment_size_bytes", global_segment_size_bytes),
                       ("local_buffer_size_bytes", local_buffer_size_bytes)):
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"{name} must be a positive int (bytes), got {size!r}")
    if protocol not in STORE_PROTOCOLS:
        raise ValueError(f"protocol must be one of {STORE_PROTOCOLS}, got {protocol!r}")
    return {
        "metadata_server": f"http://{host}:{http_metadata_port}/metadata",
        "master_server_address": f"{host}:{rpc_port}",
        "protocol": protocol,
        "device_name": "",
        "global_segment_size": global_segment_size_bytes,
        "local_buffer_size": local_buffer_size_bytes,
    }


def store_client_env(
    config_path: str,
    host: str,
    rpc_port_range: tuple[int, int],
    client_port_range: tuple[int, int],
    rpc_base_path: str | None = None,
) -> dict[str, str]:
    """Environment for a vLLM instance that runs a Mooncake store client (store modes).

    ``config_path`` is the file holding :func:`store_config`'s JSON. Without the ``MC_*``
    variables each store client (in the vLLM worker process) binds a transfer-engine RPC port
    and a TcpTransport port at random (seen: 15xxx/16xxx) on all interfaces and advertises the
    machine's external IP. Measured with mooncake 0.3.13.post1:

    * ``MC_MIN_RPC_PORT``/``MC_MAX_RPC_PORT`` confine BOTH the RPC and the TcpTransport
      listener (range 8582-8585 gave 8585 and 8582), so the range needs >= 2 ports;
    * ``MC_STORE_CLIENT_MIN_PORT``/``MC_STORE_CLIENT_MAX_PORT`` set the port in the segment
      name (``127.0.0.1:8586``; not a listener);
    * with these variables (``MC_TCP_BIND_ADDRESS`` among them; which one did it was not
      isolated) the RPC address was advertised as ``host`` instead of the external IP; the
      sockets still listen on ``0.0.0.0``/``*`` (no variable changed that).

    Give every instance on one machine disjoint ranges. ``VLLM_HOST_IP`` makes vLLM's
    ``get_ip()`` (the store client's local hostname) ``host``. ``rpc_base_path`` (optional) sets
    ``VLLM_RPC_BASE_PATH``, the directory of the store connector's lookup IPC socket
    (``lookup_rpc_port_<n>_host_<hostname>_dp_rank0``; default the temp dir, i.e. ``/tmp``):
    a per-run directory keeps two rigs on one host from sharing sockets, and the socket files
    are left behind when vLLM is killed.

    Ranges are inclusive ``(low, high)``; raises ``ValueError`` for an empty config path, bad
    ports, ``low > high`` or an RPC range of fewer than 2 ports.
    """
    if not config_path:
        raise ValueError("config_path is empty")
    if not host:
        raise ValueError("host is empty")
    for name, (low, high) in (("rpc_port_range", rpc_port_range),
                              ("client_port_range", client_port_range)):
        check_port(f"{name}[0]", low)
        check_port(f"{name}[1]", high)
        if low > high:
            raise ValueError(f"{name} low > high: {(low, high)}")
    if rpc_port_range[1] - rpc_port_range[0] < 1:
        raise ValueError("rpc_port_range needs >= 2 ports (RPC + TcpTransport listeners)")
    return {
        "MOONCAKE_CONFIG_PATH": config_path,
        "VLLM_HOST_IP": host,
        "MC_TCP_BIND_ADDRESS": host,
        "MC_MIN_RPC_PORT": str(rpc_port_range[0]),
        "MC_MAX_RPC_PORT": str(rpc_port_range[1]),
        "MC_STORE_CLIENT_MIN_PORT": str(client_port_range[0]),
        "MC_STORE_CLIENT_MAX_PORT": str(client_port_range[1]),
        **({"VLLM_RPC_BASE_PATH": rpc_base_path} if rpc_base_path else {}),
    }


def store_file_path(run_dir: str | os.PathLike[str], inst_name: str) -> str:
    """``<run_dir>/mooncake/<inst_name>.json``: the instance's MOONCAKE_CONFIG_PATH."""
    return str(Path(run_dir) / "mooncake" / f"{inst_name}.json")


def ipc_dir(run_dir: str | os.PathLike[str]) -> str:
    """A short per-run directory for IPC sockets: ``<tmp>/pdrig-<10 hex of the run dir>``.

    ``VLLM_RPC_BASE_PATH`` holds the store connector's lookup socket *and* vLLM's own engine
    IPC sockets (``<dir>/<uuid4>``); a Unix socket path has at most 107 characters, which a run
    directory under pytest's temp tree exceeded ("ipc path ... is longer than 107 characters").
    Hashing the run directory (made absolute with ``Path.resolve``) keeps it per run, so
    concurrent rigs do not share sockets.
    """
    digest = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:10]
    return str(Path(tempfile.gettempdir()) / f"pdrig-{digest}")

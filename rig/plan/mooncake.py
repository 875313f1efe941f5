"""Mooncake pieces of a P/D topology: master argv, store config, kv-transfer-config JSON, and
the master process / per-instance files and environment that rig.plan.processes puts into a topology.

Nothing here imports vLLM, torch or the ``mooncake`` package (importing ``mooncake.store``
already needs ``libibverbs.so.1``); the builders are pure, :func:`master_binary` looks for the
binary on disk and :func:`preflight` / :func:`missing_system_libraries` probe the machine. The
rules below were read from vLLM 0.32.0's source (``vllm/distributed/mooncake_store.py``,
``vllm/distributed/kv_transfer/kv_connector/v1/{multi_connector.py,mooncake/,nixl/}``,
``vllm/config/kv_transfer.py``) and checked with live CPU servers and
``mooncake-transfer-engine-non-cuda==0.3.13.post1``; docs/mooncake-notes.md has the
measurements (commands, ports, bytes, metric names).

Modes of :func:`kv_transfer_config`:

* ``nixl``            -- ``NixlConnector``; P->D pull over NIXL/UCX.
* ``mooncake-store``  -- ``MooncakeStoreConnector``; P puts full blocks into the Mooncake store,
  any instance that later sees the same prefix gets them back (D loads only full blocks and
  never the block holding the last prompt token: a 96-token prompt loads 64 tokens).
* ``nixl+store``      -- ``MultiConnector`` [NixlConnector, MooncakeStoreConnector]; NIXL carries
  P->D, P also writes the store.
* ``mooncake-p2p``    -- ``MooncakeConnector`` (direct transfer-engine P2P); refused on CPU.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

MASTER_BINARY_NAME = "mooncake_master"

# Shared objects the mooncake wheel needs but does not ship. ``mooncake_master``,
# ``mooncake/store.so`` and ``mooncake/engine.so`` link ``libibverbs.so.1`` directly; it in turn
# needs the two libnl libraries. Without them: "mooncake_master: error while loading shared
# libraries: libibverbs.so.1: cannot open shared object file: No such file or directory" (and
# ``ImportError: libibverbs.so.1: ...`` from ``import mooncake.store``), measured on Debian 12.
REQUIRED_SYSTEM_LIBRARIES: tuple[str, ...] = (
    "libibverbs.so.1",
    "libnl-3.so.200",
    "libnl-route-3.so.200",
)

# Debian/Ubuntu package that provides each library (Debian 12 package names, verified with
# ``apt-get install -y libibverbs1 libnl-3-200 libnl-route-3-200``).
DEBIAN_PACKAGE_FOR_LIBRARY: dict[str, str] = {
    "libibverbs.so.1": "libibverbs1",
    "libnl-3.so.200": "libnl-3-200",
    "libnl-route-3.so.200": "libnl-route-3-200",
}

MODES: tuple[str, ...] = ("nixl", "mooncake-store", "nixl+store", "mooncake-p2p")
KV_ROLES: tuple[str, ...] = ("kv_producer", "kv_consumer", "kv_both")

# vllm/distributed/kv_transfer/kv_connector/v1/nixl/utils.py: _NIXL_SUPPORTED_DEVICE, i.e.
# which kv_buffer_device NIXL accepts on which platform device.
NIXL_BUFFER_DEVICES: dict[str, tuple[str, ...]] = {
    "cuda": ("cuda", "cpu"),
    "tpu": ("cpu",),
    "xpu": ("cpu", "xpu"),
    "cpu": ("cpu",),
}

STORE_PROTOCOLS: tuple[str, ...] = ("tcp", "rdma")

MOONCAKE_P2P_CPU_REFUSAL = (
    "mode 'mooncake-p2p' (MooncakeConnector) needs an accelerator: its worker calls "
    "torch.accelerator.current_device_index(), which fails on a CPU torch with "
    "'Cannot access accelerator device when none is available.'; "
    "use 'mooncake-store' or 'nixl+store' on device cpu"
)


def _check_port(name: str, port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{name} must be an int TCP port in 1..65535, got {port!r}")


def master_argv(
    master_bin: str,
    host: str,
    rpc_port: int,
    http_metadata_port: int,
    metrics_port: int,
) -> list[str]:
    """Argv that starts ``mooncake_master`` with its built-in HTTP metadata server.

    ``master_bin`` is the path of the binary (see :func:`find_master_binary`); ``host`` is the
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

    Poll ``http://host:metrics_port/health`` for readiness (its start-up time and memory:
    docs/mooncake-notes.md).

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
        _check_port(name, port)
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
    _check_port("rpc_port", rpc_port)
    _check_port("http_metadata_port", http_metadata_port)
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
        _check_port(f"{name}[0]", low)
        _check_port(f"{name}[1]", high)
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


def _nixl_child(kv_role: str, device: str, kv_buffer_device: str,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
    allowed = NIXL_BUFFER_DEVICES.get(device)
    if allowed is None:
        raise ValueError(
            f"NixlConnector does not support device {device!r} "
            f"(known: {sorted(NIXL_BUFFER_DEVICES)})"
        )
    if kv_buffer_device not in allowed:
        raise ValueError(
            f"NixlConnector on device {device!r} needs kv_buffer_device in {allowed}, "
            f"got {kv_buffer_device!r} (vLLM raises '{device} with {kv_buffer_device} "
            "kv_buffer is not supported.')"
        )
    out: dict[str, Any] = {"kv_connector": "NixlConnector", "kv_role": kv_role,
                           "kv_buffer_device": kv_buffer_device}
    if extra:
        out["kv_connector_extra_config"] = dict(extra)
    return out


def _store_child(kv_role: str, lookup_rpc_port: int | None) -> dict[str, Any]:
    if lookup_rpc_port is None:
        raise ValueError(
            "MooncakeStoreConnector needs lookup_rpc_port: it names the lookup ZMQ IPC socket "
            "($VLLM_RPC_BASE_PATH/lookup_rpc_port_<port>_host_<hostname>_dp_rank<n>; no TCP "
            "port is bound), so two instances on one host must use different values (the "
            "default 0 would collide)"
        )
    _check_port("lookup_rpc_port", lookup_rpc_port)
    return {"kv_connector": "MooncakeStoreConnector", "kv_role": kv_role,
            "kv_connector_extra_config": {"lookup_rpc_port": lookup_rpc_port}}


def kv_transfer_config(
    mode: str,
    kv_role: str,
    device: str,
    lookup_rpc_port: int | None,
    kv_buffer_device: str,
    nixl_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``--kv-transfer-config`` JSON object for one vLLM instance.

    ``mode`` is one of :data:`MODES`; ``kv_role`` is ``kv_producer`` (P), ``kv_consumer`` (D)
    or ``kv_both``; ``device`` is the platform device (``cpu``, ``cuda``, ``xpu``, ``tpu``);
    ``lookup_rpc_port`` is the store connector's per-instance ID, an int that only names an IPC
    socket (required by the store modes, distinct per instance on a host; ignored by ``nixl``
    and ``mooncake-p2p``); ``kv_buffer_device`` is NIXL's staging device
    (``cpu`` on a CPU machine; ignored by the store-only and p2p modes); ``nixl_extra`` is the
    NIXL connector's ``kv_connector_extra_config`` (e.g. ``{"num_threads": 4}``; rig.plan.processes passes
    ``nixl.num_threads``), added to the NIXL child of ``nixl`` / ``nixl+store`` when non-empty and
    ignored by the other modes.

    Role semantics (vLLM 0.32.0 source, verified live for nixl, mooncake-store, nixl+store):
    the store connector puts blocks only for ``kv_producer``/``kv_both`` (or with
    ``save_decode_cache``) and looks them up for every role, so P = ``kv_producer`` and
    D = ``kv_consumer`` is the layout that writes once and reads on D. NIXL logs a deprecation
    warning for ``kv_both``. In ``nixl+store`` both children carry the same role as the
    top-level ``MultiConnector`` (each child is built into its own ``KVTransferConfig``, which
    requires a role); NIXL comes first so P->D hand-off goes over NIXL.

    Raises ``ValueError`` naming the reason for: an unknown mode or role; a NIXL
    ``device``/``kv_buffer_device`` pair that NIXL rejects; a store mode without
    ``lookup_rpc_port``; ``mooncake-p2p`` on ``cpu`` (:data:`MOONCAKE_P2P_CPU_REFUSAL`);
    ``mooncake-p2p`` with ``kv_both`` (MooncakeConnector only tests for ``kv_producer`` and
    ``kv_consumer``, so ``kv_both`` would be neither).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known modes: {', '.join(MODES)}")
    if kv_role not in KV_ROLES:
        raise ValueError(f"unknown kv_role {kv_role!r}; vLLM accepts {', '.join(KV_ROLES)}")
    if mode == "nixl":
        return _nixl_child(kv_role, device, kv_buffer_device, nixl_extra)
    if mode == "mooncake-store":
        return _store_child(kv_role, lookup_rpc_port)
    if mode == "nixl+store":
        children = [_nixl_child(kv_role, device, kv_buffer_device, nixl_extra),
                    _store_child(kv_role, lookup_rpc_port)]
        return {"kv_connector": "MultiConnector", "kv_role": kv_role,
                "kv_connector_extra_config": {"connectors": children}}
    # mooncake-p2p
    if device == "cpu":
        raise ValueError(MOONCAKE_P2P_CPU_REFUSAL)
    if kv_role == "kv_both":
        raise ValueError(
            "mode 'mooncake-p2p' (MooncakeConnector) needs kv_role kv_producer or kv_consumer: "
            "it only checks for those two, so kv_both would be neither"
        )
    # Read from source only (not run: no accelerator here). The transfer engine protocol
    # defaults to rdma; its bootstrap port comes from VLLM_MOONCAKE_BOOTSTRAP_PORT.
    return {"kv_connector": "MooncakeConnector", "kv_role": kv_role,
            "kv_connector_extra_config": {"mooncake_protocol": "rdma"}}


def missing_system_libraries(
    libraries: Iterable[str] = REQUIRED_SYSTEM_LIBRARIES,
) -> list[str]:
    """Names (sonames) of the shared libraries Mooncake needs that the dynamic loader cannot load.

    Each name is ``dlopen``-ed through ``ctypes`` (the same search the loader does for
    ``mooncake_master`` and ``store.so``: ``LD_LIBRARY_PATH``, the ld.so cache, default
    directories); when that fails, ``ldconfig -p`` is not consulted further, since a library
    listed there but not loadable is still unusable. A library whose own dependency is missing
    (``libibverbs.so.1`` without ``libnl-3.so.200``) is reported too. Order follows
    ``libraries``; an empty list means all load. Loading is a side effect only on success and
    harmless for these libraries. Never raises for a missing library.

    Turn the result into an install hint with :func:`describe_missing_libraries`.
    """
    missing = []
    for name in libraries:
        try:
            ctypes.CDLL(name, mode=getattr(os, "RTLD_LOCAL", 0))
        except OSError:
            missing.append(name)
    return missing


def describe_missing_libraries(missing: Sequence[str]) -> str:
    """One-line, human-readable report of :func:`missing_system_libraries`' result.

    Names each missing soname with its Debian package and the ``apt-get`` command that
    installs them all; returns ``""`` when ``missing`` is empty. Unknown names are listed
    without a package.
    """
    if not missing:
        return ""
    parts = []
    packages = []
    for name in missing:
        pkg = DEBIAN_PACKAGE_FOR_LIBRARY.get(name)
        parts.append(f"{name} (Debian package {pkg})" if pkg else name)
        if pkg and pkg not in packages:
            packages.append(pkg)
    text = "Mooncake needs shared libraries that cannot be loaded: " + ", ".join(parts)
    if packages:
        text += f"; install with: apt-get install -y {' '.join(packages)}"
    return text


def _site_packages_candidates(prefix: Path) -> list[Path]:
    lib = prefix / "lib"
    if not lib.is_dir():
        return []
    return sorted(lib.glob("python3*/site-packages/mooncake"))


def find_master_binary(venv: str | os.PathLike[str] | None = None) -> str | None:
    """Path of the ``mooncake_master`` ELF binary, or ``None`` when Mooncake is not installed.

    Looks, in order, in: ``<venv>/lib/python3*/site-packages/mooncake/`` (when ``venv`` is
    given -- the venv that serves vLLM need not be the rig's interpreter); the ``mooncake``
    package of the running interpreter (located with ``importlib.util.find_spec``, which does
    not import it); ``<venv>/bin`` or ``sys.prefix/bin``; then ``PATH``.

    The ELF inside the package is preferred over ``bin/mooncake_master``: the latter is a
    Python console script (``mooncake.cli``) that ``execv``s the ELF, so the PID stays the
    same but the first one avoids a Python start. Only existing, executable regular files are
    returned. It does not check that the binary's libraries load -- see
    :func:`missing_system_libraries`.
    """
    candidates: list[Path] = []
    prefixes = [Path(venv)] if venv is not None else []
    for prefix in prefixes:
        candidates += [d / MASTER_BINARY_NAME for d in _site_packages_candidates(prefix)]
    if venv is None:
        try:
            spec = importlib.util.find_spec("mooncake")
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            candidates += [Path(p) / MASTER_BINARY_NAME for p in spec.submodule_search_locations]
        prefixes = [Path(sys.prefix)]
    candidates += [p / "bin" / MASTER_BINARY_NAME for p in prefixes]
    for cand in candidates:
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    if venv is None:
        found = shutil.which(MASTER_BINARY_NAME)
        if found:
            return found
    return None


# ------------------------------------------------------------------ topology pieces (issue #3)
#
# What rig.plan.processes asks of this module when an instance uses a store mode: the master as a
# supervised process (:func:`master_process`), each instance's MOONCAKE_CONFIG_PATH file
# (:func:`instance_store_file`) and store-client environment (:func:`instance_store_env`), plus
# the checks the config validator and the CLI's preflight run (:func:`config_problems`,
# :func:`preflight`). Still no import of vLLM, torch or ``mooncake``.

MASTER_NAME = "mooncake-master"  # process name and role in the plan (rig.plan.compose keys on the role)
MASTER_ROLE = "mooncake-master"
STORE_MODES: tuple[str, ...] = ("mooncake-store", "nixl+store")

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

PIP_INSTALL_HINT = ("pip install mooncake-transfer-engine-non-cuda==0.3.13.post1 msgpack "
                    "(`make setup`; on GPU nodes mooncake-transfer-engine)")


def instance_mode(cfg: Any, inst: Any) -> str:
    """The connector mode of ``inst`` (its own, else the config's top-level ``connector``)."""
    return inst.connector or cfg.connector


def uses_store(cfg: Any) -> bool:
    """True when any instance of ``cfg`` runs a store mode (the topology then has a master)."""
    return any(instance_mode(cfg, i) in STORE_MODES for _, i in cfg.instances())


def master_url(cfg: Any) -> str:
    """``http://host:metrics_port`` of the master's admin server (/health, /metrics)."""
    host = "127.0.0.1" if cfg.mooncake.host in ("0.0.0.0", "::") else cfg.mooncake.host
    return f"http://{host}:{cfg.mooncake.metrics_port}"


def master_binary(cfg: Any) -> str:
    """``mooncake.master_binary``, else the ELF found by :func:`find_master_binary`, else the
    bare name ``mooncake_master`` (resolved on PATH at start; :func:`preflight` refuses a run
    where it cannot be found, so ``pdrig plan`` still works on a machine without Mooncake)."""
    return cfg.mooncake.master_binary or find_master_binary() or MASTER_BINARY_NAME


def master_process(cfg: Any, run_dir: str | os.PathLike[str]) -> Any:
    """The :class:`~rig.plan.processes.ProcessSpec` of ``mooncake_master`` for ``cfg`` (role ``mooncake-master``).

    Argv from :func:`master_argv` (RPC, HTTP metadata and metrics/admin ports on
    ``mooncake.host``); log ``<run_dir>/logs/mooncake-master.log`` (``GLOG_logtostderr=1`` keeps
    glog's files out of /tmp); readiness = ``GET /health`` 200 on the metrics port (measured:
    ``{"status":"ok",...,"service_ready":true}`` about 1 s after start) plus the RPC and metadata
    ports accepting connections; no ``/v1/models`` check (``served_model`` None). Nice 0: the
    master is idle most of the time and every put/get of both engines goes through it, so it is
    not pushed below the servers (under CPU starvation its metadata PUTs were seen timing out).
    Only the binary lookup touches the file system (see :func:`master_binary`).
    """
    from rig.plan.processes import ProcessSpec

    mc = cfg.mooncake
    return ProcessSpec(
        name=MASTER_NAME, role=MASTER_ROLE,
        argv=tuple(master_argv(master_binary(cfg), mc.host, mc.rpc_port, mc.http_metadata_port,
                               mc.metrics_port)),
        env={"GLOG_logtostderr": "1", "PYTHONUNBUFFERED": "1"},
        log_path=str(Path(run_dir) / "logs" / f"{MASTER_NAME}.log"),
        host=mc.host, port=mc.metrics_port, health_path="/health", served_model=None,
        ready_ports=(mc.rpc_port, mc.http_metadata_port), nice=0,
    )


def store_file_path(run_dir: str | os.PathLike[str], inst_name: str) -> str:
    """``<run_dir>/mooncake/<inst_name>.json``: the instance's MOONCAKE_CONFIG_PATH."""
    return str(Path(run_dir) / "mooncake" / f"{inst_name}.json")


def instance_store_file(cfg: Any, run_dir: str | os.PathLike[str], inst_name: str) -> tuple[str, str]:
    """``(path, JSON text)`` of instance ``inst_name``'s MOONCAKE_CONFIG_PATH file.

    The text is :func:`store_config` for the config's master with the instance's segment
    (``mooncake.global_segment_size_mb``) and staging buffer (``local_buffer_size_mb``), MiB
    written as bytes. Raises KeyError for an unknown instance, ValueError as store_config does.
    """
    cfg.instance(inst_name)  # KeyError for a name that is not in the topology
    mc = cfg.mooncake
    content = store_config(mc.host, mc.rpc_port, mc.http_metadata_port,
                           mc.global_segment_size_mb << 20, mc.local_buffer_size_mb << 20, mc.protocol)
    return store_file_path(run_dir, inst_name), json.dumps(content, indent=1) + "\n"


def client_port_ranges(cfg: Any, inst_name: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(rpc_range, segment_range)`` of ``inst_name``'s store client (layout above
    :data:`CLIENT_PORT_OFFSET`). Raises KeyError for an unknown instance."""
    names = [i.name for _, i in cfg.instances()]
    if inst_name not in names:
        raise KeyError(inst_name)
    base = cfg.mooncake.rpc_port + CLIENT_PORT_OFFSET + CLIENT_PORT_STRIDE * names.index(inst_name)
    rpc = (base, base + CLIENT_RPC_PORTS - 1)
    seg = (rpc[1] + 1, rpc[1] + CLIENT_SEGMENT_PORTS)
    return rpc, seg


def instance_store_env(cfg: Any, run_dir: str | os.PathLike[str], inst_name: str) -> dict[str, str]:
    """Environment of a store-mode instance: :func:`store_client_env` for its config file and
    port ranges, with ``VLLM_RPC_BASE_PATH`` = :func:`ipc_dir` (this run's IPC sockets live
    there, not in a /tmp shared with other rigs). ``VLLM_HOST_IP`` /
    ``MC_TCP_BIND_ADDRESS`` are ``mooncake.host``. Includes ``MOONCAKE_CONFIG_PATH``.
    """
    rpc, seg = client_port_ranges(cfg, inst_name)
    host = "127.0.0.1" if cfg.mooncake.host in ("0.0.0.0", "::") else cfg.mooncake.host
    return store_client_env(store_file_path(run_dir, inst_name), host, rpc, seg,
                            rpc_base_path=ipc_dir(run_dir))


def ipc_dir(run_dir: str | os.PathLike[str]) -> str:
    """A short per-run directory for IPC sockets: ``<tmp>/pdrig-<10 hex of the run dir>``.

    ``VLLM_RPC_BASE_PATH`` holds the store connector's lookup socket *and* vLLM's own engine
    IPC sockets (``<dir>/<uuid4>``); a Unix socket path has at most 107 characters, which a run
    directory under pytest's temp tree exceeded ("ipc path ... is longer than 107 characters").
    Hashing the run directory keeps it per run, so concurrent rigs do not share sockets.
    """
    import hashlib
    import tempfile

    digest = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:10]
    return str(Path(tempfile.gettempdir()) / f"pdrig-{digest}")


def port_map(cfg: Any) -> dict[str, int]:
    """Every TCP port the Mooncake side of ``cfg`` uses, ``{label: port}`` (empty without a
    store mode): the master's three and each store instance's client ranges (label e.g.
    ``"decode's store client (MC_MIN_RPC_PORT..MC_MAX_RPC_PORT 8518-8521)"``)."""
    if not uses_store(cfg):
        return {}
    mc = cfg.mooncake
    out = {"mooncake.rpc_port": mc.rpc_port, "mooncake.http_metadata_port": mc.http_metadata_port,
           "mooncake.metrics_port": mc.metrics_port}
    for _, inst in cfg.instances():
        if instance_mode(cfg, inst) not in STORE_MODES:
            continue
        rpc, seg = client_port_ranges(cfg, inst.name)
        for (lo, hi), what in ((rpc, "MC_MIN_RPC_PORT..MC_MAX_RPC_PORT"),
                               (seg, "MC_STORE_CLIENT_MIN_PORT..MC_STORE_CLIENT_MAX_PORT")):
            for port in range(lo, hi + 1):
                out[f"{inst.name}'s store client port {port} ({what} {lo}-{hi})"] = port
    return out


def config_problems(cfg: Any) -> list[str]:
    """What makes ``cfg`` unusable for Mooncake, one message per problem (empty = fine).

    Checked at config time (rig.config.schema's RigConfig validator): ``mooncake-p2p`` on a CPU
    device (:data:`MOONCAKE_P2P_CPU_REFUSAL`); Mooncake ports that collide with each other or
    with an instance's HTTP / NIXL side-channel port, or fall outside 1..65535; store scenarios
    (``store-roundtrip``, ``prefix-wave-store``, ``long-generation``) whose prefill or decode
    does not run a store mode (there would be no store traffic to judge); a ``store:`` section on
    another kind; a ``store-roundtrip`` prompt without one full block before its last token (D
    loads only full blocks and always computes the block holding the last prompt token).
    """
    problems: list[str] = []
    if cfg.device == "cpu":
        where = (["connector"] if cfg.connector == "mooncake-p2p" and
                 any(i.connector is None for _, i in cfg.instances()) else [])
        where += [f"{i.name}.connector" for _, i in cfg.instances() if i.connector == "mooncake-p2p"]
        if where:
            problems.append(f"{', '.join(where)}: {MOONCAKE_P2P_CPU_REFUSAL}")
    if uses_store(cfg):
        taken: dict[int, str] = {}
        for index, (_, inst) in enumerate(cfg.instances()):
            taken[inst.port] = f"{inst.name}.port"
            side = inst.side_channel_port if inst.side_channel_port is not None \
                else cfg.nixl.side_channel_base_port + index
            taken.setdefault(side, f"{inst.name}.side_channel_port")
        reported: set[str] = set()
        for label, port in port_map(cfg).items():
            group = label.split(" (", 1)[-1]  # one message per client range
            if not 1 <= port <= 65535:
                if group not in reported:
                    reported.add(group)
                    problems.append(f"{label}: outside 1..65535; lower mooncake.rpc_port")
            elif port in taken:
                if group not in reported:
                    reported.add(group)
                    problems.append(
                        f"{label} collides with {taken[port]} ({port}); change mooncake ports (store "
                        f"clients use mooncake.rpc_port+{CLIENT_PORT_OFFSET} onwards, "
                        f"{CLIENT_PORT_STRIDE} ports per instance) or the other port")
            else:
                taken[port] = label
    from rig.config.schema import STORE_KINDS

    for sc in cfg.scenarios:
        if sc.kind not in STORE_KINDS:
            if getattr(sc, "store", None) is not None:
                problems.append(f"scenario {sc.name}: store: is only for kinds {', '.join(STORE_KINDS)}")
            continue
        plain = []
        for role, ref, pool in (("prefill", sc.prefill, cfg.prefill), ("decode", sc.decode, cfg.decode)):
            inst = next((i for i in pool if i.name == ref), pool[0] if ref is None else None)
            if inst is not None and instance_mode(cfg, inst) not in STORE_MODES:
                plain.append(f"{role} {inst.name} ({instance_mode(cfg, inst)})")
        if plain:
            problems.append(f"scenario {sc.name} (kind {sc.kind}) needs a store connector "
                            f"({' or '.join(STORE_MODES)}) on prefill and decode; not on {', '.join(plain)}")
        if sc.kind == "store-roundtrip" and sc.prompt_tokens <= cfg.block_size:
            problems.append(
                f"scenario {sc.name}: prompt_tokens {sc.prompt_tokens} must exceed block_size "
                f"{cfg.block_size}: D loads only full blocks before the last prompt token "
                f"(floor((n-1)/{cfg.block_size}) x {cfg.block_size} tokens)")
        st = getattr(sc, "store", None)
        if sc.kind == "prefix-wave-store" and (st.prefix_tokens if st else 96) >= sc.prompt_tokens:
            problems.append(f"scenario {sc.name}: store.prefix_tokens {st.prefix_tokens if st else 96} must be "
                            f"below prompt_tokens {sc.prompt_tokens} (each prompt = shared prefix + unique suffix)")
    return problems


def preflight(cfg: Any) -> None:
    """Refuse, before anything starts, a store topology this machine cannot run.

    Raises :class:`rig.config.schema.ConfigError` naming each missing shared library with its Debian
    package and the apt-get line (:func:`describe_missing_libraries`), or the missing
    ``mooncake_master`` with the pip line. Does nothing when no instance uses a store mode.
    """
    from rig.config.schema import ConfigError

    if not uses_store(cfg):
        return
    missing = missing_system_libraries()
    if missing:
        raise ConfigError(describe_missing_libraries(missing) +
                          f" (config {cfg.name!r} uses the Mooncake store)")
    binary = master_binary(cfg)
    found = (os.path.isfile(binary) and os.access(binary, os.X_OK)) if os.sep in binary \
        else shutil.which(binary) is not None
    if not found:
        raise ConfigError(f"mooncake_master not found ({binary!r}; mooncake.master_binary); "
                          f"install it with: {PIP_INSTALL_HINT}")

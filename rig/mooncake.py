"""Mooncake pieces of a P/D topology: master argv, store config, kv-transfer-config JSON.

Pure functions only: nothing here imports vLLM, torch or the ``mooncake`` package (importing
``mooncake.store`` already needs ``libibverbs.so.1``). The rules below were read from vLLM
0.32.0's source (``vllm/distributed/mooncake_store.py``,
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


def _nixl_child(kv_role: str, device: str, kv_buffer_device: str) -> dict[str, Any]:
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
    return {"kv_connector": "NixlConnector", "kv_role": kv_role,
            "kv_buffer_device": kv_buffer_device}


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
) -> dict[str, Any]:
    """The ``--kv-transfer-config`` JSON object for one vLLM instance.

    ``mode`` is one of :data:`MODES`; ``kv_role`` is ``kv_producer`` (P), ``kv_consumer`` (D)
    or ``kv_both``; ``device`` is the platform device (``cpu``, ``cuda``, ``xpu``, ``tpu``);
    ``lookup_rpc_port`` is the store connector's per-instance ID, an int that only names an IPC
    socket (required by the store modes, distinct per instance on a host; ignored by ``nixl``
    and ``mooncake-p2p``); ``kv_buffer_device`` is NIXL's staging device
    (``cpu`` on a CPU machine; ignored by the store-only and p2p modes).

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
        return _nixl_child(kv_role, device, kv_buffer_device)
    if mode == "mooncake-store":
        return _store_child(kv_role, lookup_rpc_port)
    if mode == "nixl+store":
        children = [_nixl_child(kv_role, device, kv_buffer_device),
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

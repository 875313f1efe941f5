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
    if extra:
        out["kv_connector_extra_config"] = dict(extra)
    return out


def _store_child(kv_role: str, lookup_rpc_port: int | None) -> dict[str, Any]:
    """The ``MooncakeStoreConnector`` object (alone, or a ``MultiConnector`` child)."""
    if lookup_rpc_port is None:
        raise ValueError(
            "MooncakeStoreConnector needs lookup_rpc_port: it names the lookup ZMQ IPC socket "
            "($VLLM_RPC_BASE_PATH/lookup_rpc_port_<port>_host_<hostname>_dp_rank<n>; no TCP "
            "port is bound), so two instances on one host must use different values (the "
            "default 0 would collide)"
        )
    check_port("lookup_rpc_port", lookup_rpc_port)
    return {"kv_connector": "MooncakeStoreConnector", "kv_role": kv_role,
            "kv_connector_extra_config": {"lookup_rpc_port": lookup_rpc_port}}


def kv_transfer_config(
    mode: str,
    kv_role: str,
    device: str,
    lookup_rpc_port: int | None,
    kv_buffer_device: str,
    nixl_extra: dict[str, Any] | None = None,
    kv_load_failure_policy: str | None = None,
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
    ``nixl+store`` when non-empty and ignored by the other modes. ``kv_load_failure_policy``
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
    ``lookup_rpc_port``; ``mooncake-p2p`` on ``cpu`` (:data:`MOONCAKE_P2P_CPU_REFUSAL`);
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
        out = _store_child(kv_role, lookup_rpc_port)
    elif mode == "nixl+store":
        children = [_nixl_child(kv_role, device, kv_buffer_device, nixl_extra),
                    _store_child(kv_role, lookup_rpc_port)]
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

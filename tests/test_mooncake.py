"""Unit tests of rig.mooncake: argv, JSON shapes and refusals (no server, no vLLM import)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from rig import mooncake as mc


# --- master_argv -------------------------------------------------------------------------------


def test_master_argv_exact():
    argv = mc.master_argv("/x/mooncake_master", "127.0.0.1", 50051, 8580, 8581)
    assert argv == [
        "/x/mooncake_master",
        "--rpc_port", "50051",
        "--rpc_address", "127.0.0.1",
        "--enable_http_metadata_server=true",
        "--http_metadata_server_host", "127.0.0.1",
        "--http_metadata_server_port", "8580",
        "--metrics_port", "8581",
        "--metrics_host", "127.0.0.1",
    ]
    assert all(isinstance(a, str) for a in argv)


@pytest.mark.parametrize("ports", [(50051, 50051, 8581), (8580, 8581, 8580)])
def test_master_argv_rejects_equal_ports(ports):
    with pytest.raises(ValueError, match="distinct"):
        mc.master_argv("/x/mooncake_master", "127.0.0.1", *ports)


@pytest.mark.parametrize("bad", [0, 65536, -1, "8580", True, None])
def test_master_argv_rejects_bad_port(bad):
    with pytest.raises(ValueError, match="metrics_port"):
        mc.master_argv("/x/mooncake_master", "127.0.0.1", 50051, 8580, bad)


def test_master_argv_rejects_empty_binary_and_host():
    with pytest.raises(ValueError, match="master_bin"):
        mc.master_argv("", "127.0.0.1", 50051, 8580, 8581)
    with pytest.raises(ValueError, match="host"):
        mc.master_argv("/x/m", "", 50051, 8580, 8581)


# --- store_config ------------------------------------------------------------------------------


def test_store_config_shape_and_json_round_trip():
    cfg = mc.store_config("127.0.0.1", 50051, 8580, 64 * 1024**2, 32 * 1024**2)
    assert cfg == {
        "metadata_server": "http://127.0.0.1:8580/metadata",
        "master_server_address": "127.0.0.1:50051",
        "protocol": "tcp",
        "device_name": "",
        "global_segment_size": 67108864,
        "local_buffer_size": 33554432,
    }
    assert json.loads(json.dumps(cfg)) == cfg


def test_store_config_rdma_allowed_and_unknown_protocol_refused():
    assert mc.store_config("10.0.0.1", 50051, 8080, 1, 1, protocol="rdma")["protocol"] == "rdma"
    with pytest.raises(ValueError, match="protocol"):
        mc.store_config("127.0.0.1", 50051, 8580, 1, 1, protocol="udp")


@pytest.mark.parametrize("seg,buf,name", [
    (0, 1, "global_segment_size_bytes"),
    (1, 0, "local_buffer_size_bytes"),
    (-5, 1, "global_segment_size_bytes"),
    ("256MB", 1, "global_segment_size_bytes"),
    (1, 1.5, "local_buffer_size_bytes"),
])
def test_store_config_rejects_bad_sizes(seg, buf, name):
    with pytest.raises(ValueError, match=name):
        mc.store_config("127.0.0.1", 50051, 8580, seg, buf)


# --- store_client_env --------------------------------------------------------------------------


def test_store_client_env():
    env = mc.store_client_env("/tmp/s.json", "127.0.0.1", (8582, 8585), (8586, 8590))
    assert env == {
        "MOONCAKE_CONFIG_PATH": "/tmp/s.json",
        "VLLM_HOST_IP": "127.0.0.1",
        "MC_TCP_BIND_ADDRESS": "127.0.0.1",
        "MC_MIN_RPC_PORT": "8582",
        "MC_MAX_RPC_PORT": "8585",
        "MC_STORE_CLIENT_MIN_PORT": "8586",
        "MC_STORE_CLIENT_MAX_PORT": "8590",
    }
    assert all(isinstance(v, str) for v in env.values())
    env2 = mc.store_client_env("/tmp/s.json", "127.0.0.1", (8582, 8585), (8586, 8590),
                               rpc_base_path="/tmp/run1")
    assert env2 == {**env, "VLLM_RPC_BASE_PATH": "/tmp/run1"}


def test_store_client_env_rejects_tiny_or_inverted_ranges():
    with pytest.raises(ValueError, match=">= 2 ports"):
        mc.store_client_env("/tmp/s.json", "127.0.0.1", (8582, 8582), (8586, 8590))
    with pytest.raises(ValueError, match="low > high"):
        mc.store_client_env("/tmp/s.json", "127.0.0.1", (8582, 8585), (8590, 8586))
    with pytest.raises(ValueError, match="config_path"):
        mc.store_client_env("", "127.0.0.1", (8582, 8585), (8586, 8590))


# --- kv_transfer_config ------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["kv_producer", "kv_consumer"])
def test_nixl_config(role):
    assert mc.kv_transfer_config("nixl", role, "cpu", None, "cpu") == {
        "kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}


def test_nixl_ignores_lookup_port_and_accepts_cuda_buffers_on_cuda():
    assert "kv_connector_extra_config" not in mc.kv_transfer_config(
        "nixl", "kv_producer", "cpu", 50052, "cpu")
    cfg = mc.kv_transfer_config("nixl", "kv_consumer", "cuda", None, "cuda")
    assert cfg["kv_buffer_device"] == "cuda"


def test_nixl_rejects_device_buffer_on_cpu():
    with pytest.raises(ValueError, match=r"kv_buffer_device in \('cpu',\)"):
        mc.kv_transfer_config("nixl", "kv_producer", "cpu", None, "cuda")
    with pytest.raises(ValueError, match="does not support device 'npu'"):
        mc.kv_transfer_config("nixl", "kv_producer", "npu", None, "cpu")


@pytest.mark.parametrize("role,port", [("kv_producer", 50052), ("kv_consumer", 50053)])
def test_store_config_json(role, port):
    cfg = mc.kv_transfer_config("mooncake-store", role, "cpu", port, "cpu")
    assert cfg == {
        "kv_connector": "MooncakeStoreConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"lookup_rpc_port": port},
    }
    assert "kv_buffer_device" not in cfg


def test_store_needs_lookup_rpc_port():
    for mode in ("mooncake-store", "nixl+store"):
        with pytest.raises(ValueError, match="lookup_rpc_port"):
            mc.kv_transfer_config(mode, "kv_producer", "cpu", None, "cpu")
    with pytest.raises(ValueError, match="lookup_rpc_port"):
        mc.kv_transfer_config("mooncake-store", "kv_producer", "cpu", 70000, "cpu")


@pytest.mark.parametrize("role,port", [("kv_producer", 50052), ("kv_consumer", 50053)])
def test_multi_connector_nixl_first(role, port):
    cfg = mc.kv_transfer_config("nixl+store", role, "cpu", port, "cpu")
    assert cfg == {
        "kv_connector": "MultiConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"connectors": [
            {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"},
            {"kv_connector": "MooncakeStoreConnector", "kv_role": role,
             "kv_connector_extra_config": {"lookup_rpc_port": port}},
        ]},
    }
    # the CLI flag takes JSON text
    assert json.loads(json.dumps(cfg)) == cfg


def test_multi_connector_validates_nixl_child():
    with pytest.raises(ValueError, match="kv_buffer_device"):
        mc.kv_transfer_config("nixl+store", "kv_producer", "cpu", 50052, "cuda")


def test_mooncake_p2p_refused_on_cpu_with_reason():
    with pytest.raises(ValueError) as exc:
        mc.kv_transfer_config("mooncake-p2p", "kv_producer", "cpu", None, "cpu")
    msg = str(exc.value)
    assert "needs an accelerator" in msg
    assert "torch.accelerator.current_device_index()" in msg
    assert "Cannot access accelerator device when none is available" in msg
    assert msg == mc.MOONCAKE_P2P_CPU_REFUSAL


def test_mooncake_p2p_on_accelerator():
    cfg = mc.kv_transfer_config("mooncake-p2p", "kv_consumer", "cuda", None, "cuda")
    assert cfg["kv_connector"] == "MooncakeConnector"
    assert cfg["kv_role"] == "kv_consumer"
    with pytest.raises(ValueError, match="kv_producer or kv_consumer"):
        mc.kv_transfer_config("mooncake-p2p", "kv_both", "cuda", None, "cuda")


def test_unknown_mode_and_role():
    with pytest.raises(ValueError, match="unknown mode 'lmcache'.*nixl\\+store"):
        mc.kv_transfer_config("lmcache", "kv_producer", "cpu", None, "cpu")
    with pytest.raises(ValueError, match="unknown kv_role 'prefill'"):
        mc.kv_transfer_config("nixl", "prefill", "cpu", None, "cpu")


def test_kv_both_allowed_for_store_and_nixl():
    assert mc.kv_transfer_config("nixl+store", "kv_both", "cpu", 50052, "cpu")["kv_role"] == (
        "kv_both")


# --- system libraries / binary -----------------------------------------------------------------


def test_missing_system_libraries_reports_by_name():
    assert mc.missing_system_libraries(["libc.so.6"]) == []
    assert mc.missing_system_libraries(["libc.so.6", "libpdrig-nope.so.9"]) == [
        "libpdrig-nope.so.9"]
    result = mc.missing_system_libraries()
    assert isinstance(result, list)
    assert set(result) <= set(mc.REQUIRED_SYSTEM_LIBRARIES)


def test_describe_missing_libraries():
    assert mc.describe_missing_libraries([]) == ""
    text = mc.describe_missing_libraries(["libibverbs.so.1", "libnl-route-3.so.200", "libx.so"])
    assert "libibverbs.so.1 (Debian package libibverbs1)" in text
    assert "libx.so" in text
    assert text.endswith("apt-get install -y libibverbs1 libnl-route-3-200")


def test_required_libraries_have_packages():
    assert set(mc.REQUIRED_SYSTEM_LIBRARIES) == set(mc.DEBIAN_PACKAGE_FOR_LIBRARY)


def _make_exe(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_find_master_binary_prefers_package_elf(tmp_path):
    venv = tmp_path / "venv"
    elf = venv / "lib" / "python3.11" / "site-packages" / "mooncake" / "mooncake_master"
    script = venv / "bin" / "mooncake_master"
    _make_exe(script)
    assert mc.find_master_binary(venv) == str(script)
    _make_exe(elf)
    assert mc.find_master_binary(venv) == str(elf)


def test_find_master_binary_ignores_non_executable(tmp_path):
    venv = tmp_path / "venv"
    f = venv / "bin" / "mooncake_master"
    f.parent.mkdir(parents=True)
    f.write_text("")
    os.chmod(f, 0o644)
    assert mc.find_master_binary(venv) is None
    assert mc.find_master_binary(tmp_path / "absent") is None

"""Unit tests of the Mooncake pieces: the pure builders (rig.connectors), the host probes
(rig.cluster.mooncake), the plan glue (rig.plan.mooncake) and the config checks: argv, JSON
shapes and refusals (no server, no vLLM import)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from rig.cluster import mooncake as host
from rig.connectors import kv_transfer as kvt
from rig.connectors import mooncake as mc
from rig.plan import mooncake as topo

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
    assert kvt.kv_transfer_config("nixl", role, "cpu", None, "cpu") == {
        "kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}


def test_nixl_ignores_lookup_port_and_accepts_cuda_buffers_on_cuda():
    assert "kv_connector_extra_config" not in kvt.kv_transfer_config(
        "nixl", "kv_producer", "cpu", 50052, "cpu")
    cfg = kvt.kv_transfer_config("nixl", "kv_consumer", "cuda", None, "cuda")
    assert cfg["kv_buffer_device"] == "cuda"


def test_nixl_rejects_device_buffer_on_cpu():
    with pytest.raises(ValueError, match=r"kv_buffer_device in \('cpu',\)"):
        kvt.kv_transfer_config("nixl", "kv_producer", "cpu", None, "cuda")
    with pytest.raises(ValueError, match="does not support device 'npu'"):
        kvt.kv_transfer_config("nixl", "kv_producer", "npu", None, "cpu")


@pytest.mark.parametrize("role,port", [("kv_producer", 50052), ("kv_consumer", 50053)])
def test_store_config_json(role, port):
    cfg = kvt.kv_transfer_config("mooncake-store", role, "cpu", port, "cpu")
    assert cfg == {
        "kv_connector": "MooncakeStoreConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"lookup_rpc_port": port},
    }
    assert "kv_buffer_device" not in cfg


def test_store_needs_lookup_rpc_port():
    for mode in ("mooncake-store", "nixl+store"):
        with pytest.raises(ValueError, match="lookup_rpc_port"):
            kvt.kv_transfer_config(mode, "kv_producer", "cpu", None, "cpu")
    with pytest.raises(ValueError, match="lookup_rpc_port"):
        kvt.kv_transfer_config("mooncake-store", "kv_producer", "cpu", 70000, "cpu")


@pytest.mark.parametrize("role,port", [("kv_producer", 50052), ("kv_consumer", 50053)])
def test_multi_connector_nixl_first(role, port):
    cfg = kvt.kv_transfer_config("nixl+store", role, "cpu", port, "cpu")
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
        kvt.kv_transfer_config("nixl+store", "kv_producer", "cpu", 50052, "cuda")


def test_mooncake_p2p_refused_on_cpu_with_reason():
    with pytest.raises(ValueError) as exc:
        kvt.kv_transfer_config("mooncake-p2p", "kv_producer", "cpu", None, "cpu")
    msg = str(exc.value)
    assert "needs an accelerator" in msg
    assert "torch.accelerator.current_device_index()" in msg
    assert "Cannot access accelerator device when none is available" in msg
    assert msg == kvt.MOONCAKE_P2P_CPU_REFUSAL


def test_mooncake_p2p_on_accelerator():
    cfg = kvt.kv_transfer_config("mooncake-p2p", "kv_consumer", "cuda", None, "cuda")
    assert cfg["kv_connector"] == "MooncakeConnector"
    assert cfg["kv_role"] == "kv_consumer"
    with pytest.raises(ValueError, match="kv_producer or kv_consumer"):
        kvt.kv_transfer_config("mooncake-p2p", "kv_both", "cuda", None, "cuda")


def test_unknown_mode_and_role():
    with pytest.raises(ValueError, match="unknown mode 'lmcache'.*nixl\\+store"):
        kvt.kv_transfer_config("lmcache", "kv_producer", "cpu", None, "cpu")
    with pytest.raises(ValueError, match="unknown kv_role 'prefill'"):
        kvt.kv_transfer_config("nixl", "prefill", "cpu", None, "cpu")


def test_kv_both_allowed_for_store_and_nixl():
    assert kvt.kv_transfer_config("nixl+store", "kv_both", "cpu", 50052, "cpu")["kv_role"] == (
        "kv_both")


# --- system libraries / binary -----------------------------------------------------------------


def test_missing_system_libraries_reports_by_name():
    assert host.missing_system_libraries(["libc.so.6"]) == []
    assert host.missing_system_libraries(["libc.so.6", "libpdrig-nope.so.9"]) == [
        "libpdrig-nope.so.9"]
    result = host.missing_system_libraries()
    assert isinstance(result, list)
    assert set(result) <= set(host.REQUIRED_SYSTEM_LIBRARIES)


def test_describe_missing_libraries():
    assert host.describe_missing_libraries([]) == ""
    text = host.describe_missing_libraries(["libibverbs.so.1", "libnl-route-3.so.200", "libx.so"])
    assert "libibverbs.so.1 (Debian package libibverbs1)" in text
    assert "libx.so" in text
    assert text.endswith("apt-get install -y libibverbs1 libnl-route-3-200")


def test_required_libraries_have_packages():
    assert set(host.REQUIRED_SYSTEM_LIBRARIES) == set(host.DEBIAN_PACKAGE_FOR_LIBRARY)


def _make_exe(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_find_master_binary_prefers_package_elf(tmp_path):
    venv = tmp_path / "venv"
    elf = venv / "lib" / "python3.11" / "site-packages" / "mooncake" / "mooncake_master"
    script = venv / "bin" / "mooncake_master"
    _make_exe(script)
    assert host.find_master_binary(venv) == str(script)
    _make_exe(elf)
    assert host.find_master_binary(venv) == str(elf)


def test_find_master_binary_ignores_non_executable(tmp_path):
    venv = tmp_path / "venv"
    f = venv / "bin" / "mooncake_master"
    f.parent.mkdir(parents=True)
    f.write_text("")
    os.chmod(f, 0o644)
    assert host.find_master_binary(venv) is None
    assert host.find_master_binary(tmp_path / "absent") is None


# --- the topology: master process, per-instance files and env, plan ------------------

from pathlib import Path  # noqa: E402

import jsonschema  # noqa: E402
import yaml  # noqa: E402

from rig.config import ConfigError, load_config  # noqa: E402
from rig.plan import compose  # noqa: E402
from rig.plan.processes import build_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CPU_MC = ROOT / "configs" / "cpu-tiny-mooncake.yaml"
H200_MC = ROOT / "configs" / "h200-mooncake.yaml"
CPU_TINY = ROOT / "configs" / "cpu-tiny.yaml"
RUN = "/runs/r1"


def mc_cfg(overrides=None, path=CPU_MC):
    return load_config(path, overrides)


def mc_plan(overrides=None, path=CPU_MC):
    return build_plan(mc_cfg(overrides, path), RUN, "/m/tiny", "/venv/bin/python")


def test_master_process_spec():
    cfg = mc_cfg(["mooncake.master_binary=/opt/mc/mooncake_master"])
    spec = topo.master_process(cfg, RUN, host.master_binary(cfg))
    assert spec.name == spec.role == mc.MASTER_ROLE == "mooncake-master"
    assert list(spec.argv) == mc.master_argv("/opt/mc/mooncake_master", "127.0.0.1", 8540, 8541, 8542)
    assert spec.port == 8542 and spec.health_path == "/health" and spec.base_url == "http://127.0.0.1:8542"
    assert spec.served_model is None  # cluster readiness skips /v1/models
    assert spec.ready_ports == (8540, 8541)
    assert spec.log_path == f"{RUN}/logs/mooncake-master.log"
    assert spec.env["GLOG_logtostderr"] == "1"
    assert spec.nice == 0 and spec.files == {}


def test_master_binary_found_or_bare_name(monkeypatch):
    cfg = mc_cfg()
    monkeypatch.setattr(host, "find_master_binary", lambda venv=None: "/found/mooncake_master")
    assert host.master_binary(cfg) == "/found/mooncake_master"
    assert build_plan(cfg, RUN, "/m", "py", host.master_binary(cfg)).processes[0].argv[0] == "/found/mooncake_master"
    monkeypatch.setattr(host, "find_master_binary", lambda venv=None: None)
    assert host.master_binary(cfg) == "mooncake_master"  # `pdrig plan` still works
    assert host.master_binary(mc_cfg(["mooncake.master_binary=/opt/mc/m"])) == "/opt/mc/m"
    # Without a binary from the host (a container image): the config's, else the bare name.
    assert build_plan(cfg, RUN, "/m", "py").processes[0].argv[0] == "mooncake_master"


def test_instance_store_file_is_store_config_json():
    cfg = mc_cfg()
    path, text = topo.instance_store_file(cfg, RUN, "decode")
    assert path == f"{RUN}/mooncake/decode.json"
    assert json.loads(text) == mc.store_config("127.0.0.1", 8540, 8541, 64 << 20, 32 << 20, "tcp")
    with pytest.raises(KeyError):
        topo.instance_store_file(cfg, RUN, "nope")


def test_client_port_ranges_disjoint_and_documented():
    cfg = mc_cfg()
    assert cfg.store_client_ports("prefill") == mc.client_port_ranges(8540, 0) == ((8550, 8553), (8554, 8555))
    assert cfg.store_client_ports("decode") == ((8558, 8561), (8562, 8563))
    with pytest.raises(KeyError):
        cfg.store_client_ports("nope")
    ports = list(cfg.mooncake_ports().values())
    assert len(ports) == len(set(ports)) == 3 + 2 * 6


def test_instance_store_env():
    env = topo.instance_store_env(mc_cfg(), RUN, "prefill")
    assert env == {
        "MOONCAKE_CONFIG_PATH": f"{RUN}/mooncake/prefill.json", "VLLM_HOST_IP": "127.0.0.1",
        "MC_TCP_BIND_ADDRESS": "127.0.0.1", "MC_MIN_RPC_PORT": "8550", "MC_MAX_RPC_PORT": "8553",
        "MC_STORE_CLIENT_MIN_PORT": "8554", "MC_STORE_CLIENT_MAX_PORT": "8555",
        "VLLM_RPC_BASE_PATH": mc.ipc_dir(RUN)}


def test_kv_transfer_config_nixl_extra():
    out = kvt.kv_transfer_config("nixl+store", "kv_producer", "cpu", 5840, "cpu", nixl_extra={"num_threads": 4})
    assert out["kv_connector_extra_config"]["connectors"][0] == {
        "kv_connector": "NixlConnector", "kv_role": "kv_producer", "kv_buffer_device": "cpu",
        "kv_connector_extra_config": {"num_threads": 4}}
    assert "kv_connector_extra_config" not in kvt.kv_transfer_config(
        "nixl+store", "kv_producer", "cpu", 5840, "cpu", nixl_extra={})["kv_connector_extra_config"]["connectors"][0]
    assert kvt.kv_transfer_config("mooncake-store", "kv_consumer", "cpu", 5841, "cpu",
                                 nixl_extra={"num_threads": 4}) == kvt.kv_transfer_config(
        "mooncake-store", "kv_consumer", "cpu", 5841, "cpu")


def _kv(spec) -> dict:
    argv = list(spec.argv)
    return json.loads(argv[argv.index("--kv-transfer-config") + 1])


def test_plan_of_cpu_tiny_mooncake():
    plan = mc_plan()
    assert [(p.name, p.role) for p in plan.processes] == [
        ("mooncake-master", "mooncake-master"), ("prefill", "prefill"), ("decode", "decode")]
    for name, role, lookup in (("prefill", "kv_producer", 5840), ("decode", "kv_consumer", 5841)):
        spec = plan.by_name(name)
        assert _kv(spec) == {
            "kv_connector": "MultiConnector", "kv_role": role,
            "kv_connector_extra_config": {"connectors": [
                {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"},
                {"kv_connector": "MooncakeStoreConnector", "kv_role": role,
                 "kv_connector_extra_config": {"lookup_rpc_port": lookup}}]}}
        path = f"{RUN}/mooncake/{name}.json"
        assert spec.env["MOONCAKE_CONFIG_PATH"] == path and list(spec.files) == [path]
        assert json.loads(spec.files[path])["master_server_address"] == "127.0.0.1:8540"
        assert spec.env["MC_TCP_BIND_ADDRESS"] == spec.env["VLLM_HOST_IP"] == "127.0.0.1"
        assert spec.env["VLLM_RPC_BASE_PATH"] == mc.ipc_dir(RUN)
        assert spec.dirs == (mc.ipc_dir(RUN),)
    d = plan.by_name("decode")
    argv = list(d.argv)
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "9"
    assert argv[argv.index("--max-model-len") + 1] == "256"
    assert "--speculative-config" not in argv


def test_plan_mooncake_store_only_and_mixed_modes():
    plan = mc_plan(["connector=mooncake-store"])
    assert _kv(plan.by_name("prefill")) == {
        "kv_connector": "MooncakeStoreConnector", "kv_role": "kv_producer",
        "kv_connector_extra_config": {"lookup_rpc_port": 5840}}
    # A per-instance mode: the master still comes first; a NIXL-only instance gets no store env.
    plan = build_plan(load_config(CPU_TINY, ["decode.decode-6blk.connector=nixl+store"]), RUN, "/m", "py")
    assert plan.processes[0].role == "mooncake-master"
    assert "MOONCAKE_CONFIG_PATH" not in plan.by_name("decode").env
    assert _kv(plan.by_name("decode-6blk"))["kv_connector"] == "MultiConnector"
    assert _kv(plan.by_name("decode"))["kv_connector"] == "NixlConnector"


def test_plan_passes_nixl_threads_to_the_nixl_child():
    kv = _kv(mc_plan(["nixl.num_threads=3", "nixl.kv_lease_duration=7"]).by_name("decode"))
    assert kv["kv_connector_extra_config"]["connectors"][0]["kv_connector_extra_config"] == {
        "num_threads": 3, "kv_lease_duration": 7}  # the lease too: NIXL's keys go to the NIXL child


def test_h200_mooncake_plan():
    plan = mc_plan(path=H200_MC)
    kv = _kv(plan.by_name("decode"))
    assert kv["kv_connector_extra_config"]["connectors"][0]["kv_buffer_device"] == "cuda"
    assert plan.by_name("decode").env["CUDA_VISIBLE_DEVICES"] == "0"
    assert json.loads(plan.by_name("prefill").files[f"{RUN}/mooncake/prefill.json"])["global_segment_size"] == 1 << 30
    assert [s.name for s in mc_cfg(path=H200_MC).scenarios] == [s.name for s in mc_cfg().scenarios]


def test_compose_renders_the_mooncake_profile():
    cfg = mc_cfg()
    plan = compose.container_plan(cfg)
    doc = compose.render_compose(cfg, plan, "pdrig:test", "/srv/run", model_dir_host="/srv/tiny")
    schema = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text())
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(doc)) == []
    assert doc["services"]["mooncake-master"]["command"][0] == "mooncake_master"
    assert doc["services"]["decode"]["depends_on"]["mooncake-master"] == {"condition": "service_healthy"}
    files = compose.container_files(cfg, plan, "/srv/run")
    assert json.loads(files["/srv/run/mooncake/decode.json"])["master_server_address"] == "mooncake-master:8540"


# --- refusals at config time ---------------------------------------------------------------------


def test_mooncake_p2p_refused_on_cpu_at_config_time():
    with pytest.raises(ConfigError) as e:
        load_config(CPU_TINY, ["connector=mooncake-p2p"])
    assert kvt.MOONCAKE_P2P_CPU_REFUSAL in str(e.value) and "connector:" in str(e.value)
    assert str(e.value).count("needs an accelerator") == 1  # once, not per instance
    with pytest.raises(ConfigError, match=r"decode-6blk\.connector: mode 'mooncake-p2p'"):
        load_config(CPU_TINY, ["decode.decode-6blk.connector=mooncake-p2p"])


def test_mooncake_p2p_allowed_on_cuda():
    cfg = load_config(ROOT / "configs" / "h200.yaml", ["connector=mooncake-p2p"])
    kv = _kv(build_plan(cfg, RUN, "m", "py").by_name("decode"))
    assert kv["kv_connector"] == "MooncakeConnector"


def test_mooncake_port_collisions_refused():
    with pytest.raises(ConfigError, match=r"prefill's store client port 8230 .* collides with decode\.port"):
        mc_cfg(["mooncake.rpc_port=8220"])
    with pytest.raises(ConfigError, match="mooncake.metrics_port collides with mooncake.rpc_port"):
        mc_cfg(["mooncake.metrics_port=8540"])
    with pytest.raises(ConfigError, match="outside 1..65535"):
        mc_cfg(["mooncake.rpc_port=65530"])
    load_config(CPU_TINY, ["mooncake.rpc_port=8200"])  # no store mode: Mooncake ports unused


def test_store_scenarios_need_store_connectors():
    with pytest.raises(ConfigError, match=r"store-roundtrip \(kind store-roundtrip\) needs a store connector"):
        mc_cfg(["connector=nixl"])
    with pytest.raises(ConfigError, match=r"not on decode decode \(nixl\)"):
        mc_cfg(["decode.decode.connector=nixl"])


def test_store_section_only_on_store_kinds_and_roundtrip_length(tmp_path):
    data = yaml.safe_load(CPU_MC.read_text())
    data["suite"] = None
    data["scenarios"] = [{"name": "e", "prompt_tokens": 40, "max_tokens": 2, "store": {"requests": 1}}]
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="store: not used by kind 'edge'"):
        load_config(p)
    data["scenarios"] = [{"name": "r", "kind": "store-roundtrip", "prompt_tokens": 32, "max_tokens": 2}]
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="prompt_tokens 32 must exceed block_size 32"):
        load_config(p)
    data["scenarios"] = [{"name": "w", "kind": "prefix-wave-store", "prompt_tokens": 96, "max_tokens": 2}]
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="prefix_tokens 96 must be below prompt_tokens 96"):
        load_config(p)
    data["scenarios"] = [{"name": "x", "kind": "store-roundtrip", "prompt_tokens": 40, "max_tokens": 2,
                          "store": {"bogus": 1}}]
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"store\.bogus: unknown field"):
        load_config(p)


def test_mooncake_suite_loads():
    cfg = mc_cfg()
    assert [(s.name, s.kind) for s in cfg.scenarios] == [
        ("store-roundtrip", "store-roundtrip"), ("prefix-wave-store", "prefix-wave-store"),
        ("long-generation", "long-generation")]
    assert cfg.scenarios[0].store.requests == 2


# --- preflight ---------------------------------------------------------------------------------------


def test_preflight_names_missing_libraries(monkeypatch):
    monkeypatch.setattr(host, "missing_system_libraries", lambda *a: ["libibverbs.so.1", "libnl-3.so.200"])
    with pytest.raises(ConfigError) as e:
        host.preflight(mc_cfg())
    msg = str(e.value)
    assert "libibverbs.so.1 (Debian package libibverbs1)" in msg and "libnl-3.so.200" in msg
    assert "apt-get install -y libibverbs1 libnl-3-200" in msg
    host.preflight(load_config(CPU_TINY))  # NIXL only: no Mooncake check


def test_preflight_missing_master(monkeypatch, tmp_path):
    monkeypatch.setattr(host, "missing_system_libraries", lambda *a: [])
    with pytest.raises(ConfigError, match="mooncake_master not found.*pip install mooncake-transfer-engine-non-cuda"):
        host.preflight(mc_cfg([f"mooncake.master_binary={tmp_path}/absent"]))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="mooncake_master not found"):
        host.preflight(mc_cfg(["mooncake.master_binary=mooncake_master"]))
    _make_exe(tmp_path / "mooncake_master")
    host.preflight(mc_cfg(["mooncake.master_binary=mooncake_master"]))
    host.preflight(mc_cfg([f"mooncake.master_binary={tmp_path}/mooncake_master"]))


def test_ipc_dir_fits_a_unix_socket_path_even_for_deep_run_dirs(tmp_path):
    """vLLM puts <VLLM_RPC_BASE_PATH>/<uuid4> sockets there; Unix socket paths max 107 chars.
    A run directory under pytest's temp tree broke that when the dir was inside the run dir."""
    deep = tmp_path / ("x" * 60) / "runs" / "20261129-192525-cpu-tiny-mooncake"
    d = mc.ipc_dir(deep)
    assert len(d) + 1 + 36 <= 107
    assert d == mc.ipc_dir(deep) and d != mc.ipc_dir(tmp_path / "other-run")

"""The cpu-tiny plan, argument by argument, and busy_ports against a port the test holds."""

from __future__ import annotations

import json
import shlex
import socket
from dataclasses import asdict
from pathlib import Path

import pytest

from rig.cluster.probes import busy_ports
from rig.config import ConfigError, load_config
from rig.plan.processes import build_plan
from tests.helpers.fake_rig import free_ports

CPU_TINY = Path(__file__).resolve().parents[2] / "configs" / "cpu-tiny.yaml"
RUN_DIR = "/runs/20261129-000000-cpu-tiny"
MODEL = "/cache/models/tiny-qwen3-abc"
PYTHON = "/venv/bin/python"
NGRAM = '{"method":"ngram","num_speculative_tokens":1,"prompt_lookup_max":4,"prompt_lookup_min":2}'


def plan_of(overrides: list[str] | None = None):
    return build_plan(load_config(CPU_TINY, overrides), RUN_DIR, MODEL, PYTHON)


def kv_config(role: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"},
                      separators=(",", ":"))


def expected_argv(port: int, role: str, blocks: int, spec: bool) -> list[str]:
    argv = [PYTHON, "-m", "vllm.entrypoints.openai.api_server",
            "--model", MODEL, "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
            "--block-size", "32", "--max-model-len", "128", "--dtype", "float32", "--seed", "0",
            "--kv-transfer-config", kv_config(role), "--num-gpu-blocks-override", str(blocks)]
    if spec:
        argv += ["--speculative-config", NGRAM]
    return argv + ["--enable-prefix-caching", "--enforce-eager"]


EXPECTED = {
    # name: (role, http port, side channel port, blocks, speculative)
    "prefill": ("prefill", 8100, 5600, 64, False),
    "decode": ("decode", 8200, 5601, 5, True),
    "decode-6blk": ("decode", 8201, 5602, 6, True),
    "decode-nospec": ("decode", 8202, 5603, 5, False),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_argv_exactly(name):
    role, port, _, blocks, spec = EXPECTED[name]
    p = plan_of().by_name(name)
    assert p.role == role
    kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
    assert list(p.argv) == expected_argv(port, kv_role, blocks, spec)


def _kv(p) -> dict:
    return json.loads(p.argv[p.argv.index("--kv-transfer-config") + 1])


def test_kv_lease_duration_reaches_both_roles_and_null_leaves_vllms_default():
    # cpu-tiny keeps vLLM's default lease (no key); `make lease` sets 5 s on P and D.
    assert all("kv_connector_extra_config" not in _kv(p) for p in plan_of().processes)
    plan = plan_of(["nixl.kv_lease_duration=5", "nixl.num_threads=2"])
    assert {json.dumps(_kv(p)["kv_connector_extra_config"]) for p in plan.processes} == {
        '{"num_threads": 2, "kv_lease_duration": 5}'}
    with pytest.raises(ConfigError, match="nixl.kv_lease_duration"):
        plan_of(["nixl.kv_lease_duration=0"])


def test_cpus_pin_p_and_d_apart_and_are_validated():
    plan = plan_of()
    assert {p.name: p.cpus for p in plan.processes} == {
        "prefill": (0,), "decode": (1,), "decode-6blk": (1,), "decode-nospec": (1,)}
    assert plan_of(["decode.decode.cpus=null"]).by_name("decode").cpus == ()
    for bad in ("[-1]", "[1, 1]", "[]"):
        with pytest.raises(ConfigError, match="decode.0.cpus|decode.*cpus"):
            plan_of([f"decode.decode.cpus={bad}"])


def test_order_and_roles():
    plan = plan_of()
    assert [(p.name, p.role) for p in plan.processes] == [(n, e[0]) for n, e in EXPECTED.items()]
    assert plan.name == "cpu-tiny" and plan.run_dir == RUN_DIR and plan.model_path == MODEL


def test_kv_transfer_roles():
    roles = {p.name: json.loads(p.argv[p.argv.index("--kv-transfer-config") + 1])["kv_role"]
             for p in plan_of().processes}
    assert roles == {"prefill": "kv_producer", "decode": "kv_consumer",
                     "decode-6blk": "kv_consumer", "decode-nospec": "kv_consumer"}


def test_spec_config_only_on_decode_and_6blk():
    plan = plan_of()
    with_spec = {p.name for p in plan.processes if "--speculative-config" in p.argv}
    assert with_spec == {"decode", "decode-6blk"}
    for name in with_spec:
        a = plan.by_name(name).argv
        assert json.loads(a[a.index("--speculative-config") + 1]) == {
            "method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_env(name):
    side = EXPECTED[name][2]
    assert plan_of().by_name(name).env == {
        "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
        "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1200", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side),
        "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"}


def test_side_channel_ports_distinct_and_ready_ports():
    plan = plan_of()
    side = [p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for p in plan.processes]
    assert len(set(side)) == 4
    for p in plan.processes:
        assert p.ready_ports == (int(p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]),)
        assert p.port not in p.ready_ports


def test_explicit_side_channel_port_and_base():
    plan = plan_of(["decode.decode-6blk.side_channel_port=6000", "nixl.side_channel_base_port=7000"])
    got = {p.name: p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for p in plan.processes}
    assert got == {"prefill": "7000", "decode": "7001", "decode-6blk": "6000", "decode-nospec": "7003"}


def test_explicit_side_channel_port_colliding_with_a_derived_one_is_rejected():
    # decode-6blk's derived port is base + 2 = 5602; giving it to decode must not plan a clash.
    with pytest.raises(ConfigError, match=r"decode-6blk.side_channel_port .*5602 is already used by decode"):
        plan_of(["decode.decode.side_channel_port=5602"])


def test_log_paths_under_run_dir():
    for p in plan_of().processes:
        assert p.log_path == f"{RUN_DIR}/logs/{p.name}.log"
        assert Path(p.log_path).parent.parent == Path(RUN_DIR)


def test_nice_and_host():
    for p in plan_of().processes:
        assert p.nice == 10 and p.host == "127.0.0.1"
        assert p.base_url == f"http://127.0.0.1:{p.port}"
        assert p.health_path == "/health" and p.served_model == "tiny" and p.gpu_ids == () and p.files == {}
    assert {p.nice for p in plan_of(["launch.nice=0"]).processes} == {0}


def test_env_precedence_launch_then_instance():
    plan = plan_of(["launch.env={UCX_TLS: tcp, FOO: launch}", "decode.decode.env={FOO: inst}"])
    assert plan.by_name("prefill").env["UCX_TLS"] == "tcp"  # launch.env over the device default
    assert plan.by_name("prefill").env["FOO"] == "launch"
    assert plan.by_name("decode").env["FOO"] == "inst"  # instance env over launch.env


def test_extra_args_order_and_flags_follow_config():
    plan = plan_of(["launch.extra_args=[--max-num-seqs, '4']", "decode.decode.extra_args=[--x]",
                    "decode.decode-nospec.enable_prefix_caching=false", "launch.enforce_eager=false",
                    "launch.seed=7"])
    d = plan.by_name("decode").argv
    assert list(d[-3:]) == ["--max-num-seqs", "4", "--x"]
    assert "--enforce-eager" not in d and d[d.index("--seed") + 1] == "7"
    n = plan.by_name("decode-nospec").argv
    assert "--no-enable-prefix-caching" in n and "--enable-prefix-caching" not in n


def test_model_placeholder_replaces_model_flag():
    plan = plan_of(['launch.command=["{python}", "serve.py", "{model}"]'])
    a = plan.by_name("prefill").argv
    assert a[:3] == (PYTHON, "serve.py", MODEL) and "--model" not in a


def test_shell_line_round_trips():
    p = plan_of().by_name("decode")
    line = p.shell_line()
    words = shlex.split(line)
    n_env = len(p.env)
    assert dict(w.split("=", 1) for w in words[:n_env]) == p.env
    # the argv exactly, with no taskset/nice wrapper: the rig applies those after spawn
    assert tuple(words[n_env:]) == p.argv
    assert "CPU(s) 1" in p.applied_after_spawn() and "nice 10" in p.applied_after_spawn()


def test_plan_as_a_dict_is_json():
    d = json.loads(json.dumps(asdict(plan_of())))
    assert [p["name"] for p in d["processes"]] == list(EXPECTED)
    assert d["processes"][1]["env"]["VLLM_TARGET_DEVICE"] == "cpu"


def test_build_plan_is_pure(tmp_path):
    run_dir = tmp_path / "run"
    build_plan(load_config(CPU_TINY), run_dir, MODEL, PYTHON)
    assert not run_dir.exists()


# ------------------------------------------------------------------ busy_ports


def free_port_overrides(skip: str) -> list[str]:
    """Free HTTP and side-channel ports for every instance but ``skip``'s HTTP port (live CPU
    runs may hold cpu-tiny's 8100/8200/5600 ports while the tests run)."""
    ports = free_ports(8)
    out = []
    for i, name in enumerate(EXPECTED):
        role = "prefill" if name == "prefill" else "decode"
        if name != skip:
            out.append(f"{role}.{name}.port={ports[2 * i]}")
        out.append(f"{role}.{name}.side_channel_port={ports[2 * i + 1]}")
    return out


def test_busy_ports_detects_a_listening_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        plan = plan_of([*free_port_overrides("decode-6blk"), f"decode.decode-6blk.port={port}"])
        assert busy_ports(plan) == [("decode-6blk", port)]
        assert busy_ports(plan, ["prefill", "decode"]) == []
        assert busy_ports(plan, ["decode-6blk"]) == [("decode-6blk", port)]
    assert busy_ports(plan) == []  # released


def test_busy_ports_checks_the_side_channel_port_too():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        plan = plan_of([*free_port_overrides(""), f"decode.decode.side_channel_port={port}"])
        assert busy_ports(plan) == [("decode", port)]

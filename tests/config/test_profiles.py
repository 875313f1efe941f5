"""Every profile's plan, argument by argument (no GPU or vLLM needed: build_plan is pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rig.config import ConfigError, load_config
from rig.plan.processes import build_plan
from rig.plan.spec import Plan

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MODEL = "/models/m"
PYTHON = "/venv/bin/python"
NGRAM = {"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
INSTANCES = ["prefill", "decode", "decode-6blk", "decode-nospec"]

# profile -> expected per instance: (gpu ids, gpu_memory_utilization, num_gpu_blocks_override, spec)
GPU_PROFILES = {
    "l4x2": {"prefill": ("0", 0.8, None, None), "decode": ("1", 0.25, 5, NGRAM),
             "decode-6blk": ("1", 0.25, 6, NGRAM), "decode-nospec": ("1", 0.25, 5, None)},
    "h200": {"prefill": ("0", 0.4, None, None), "decode": ("0", 0.15, 5, NGRAM),
             "decode-6blk": ("0", 0.15, 6, NGRAM), "decode-nospec": ("0", 0.15, 5, None)},
    "h200-2gpu": {"prefill": ("0", 0.8, None, None), "decode": ("1", 0.25, 5, NGRAM),
                  "decode-6blk": ("1", 0.25, 6, NGRAM), "decode-nospec": ("1", 0.25, 5, None)},
}
CPU_BLOCKS = {"prefill": 64, "decode": 5, "decode-6blk": 6, "decode-nospec": 5}


def plan_of(profile: str, overrides: list[str] | None = None) -> Plan:
    return build_plan(load_config(CONFIGS / f"{profile}.yaml", overrides), "/runs/r1", MODEL, PYTHON)


def flag(argv: tuple[str, ...], name: str) -> str | None:
    """The value after ``name`` (None if absent); a flag given twice is an error."""
    assert argv.count(name) <= 1, f"{name} given twice in {argv}"
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize("profile", ["cpu-tiny", *GPU_PROFILES])
def test_common_shape(profile):
    plan = plan_of(profile)
    assert [p.name for p in plan.processes] == INSTANCES  # the edge suite's instance names
    assert [p.role for p in plan.processes] == ["prefill", "decode", "decode", "decode"]
    cfg = load_config(CONFIGS / f"{profile}.yaml")
    assert {s.decode for s in cfg.scenarios} <= set(INSTANCES) and len(cfg.scenarios) == 9
    for p in plan.processes:
        a = p.argv
        assert flag(a, "--host") == "127.0.0.1" and p.host == "127.0.0.1"
        assert flag(a, "--port") == str(p.port)
        assert flag(a, "--block-size") == "32" and flag(a, "--max-model-len") == "128"
        assert flag(a, "--seed") == "0"
        assert p.log_path == f"/runs/r1/logs/{p.name}.log"
        kv = json.loads(flag(a, "--kv-transfer-config"))
        assert kv["kv_connector"] == "NixlConnector"
        assert kv["kv_role"] == ("kv_producer" if p.role == "prefill" else "kv_consumer")
        assert p.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
        assert p.ready_ports == (int(p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]),)
    side = [int(p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for p in plan.processes]
    http = [p.port for p in plan.processes]
    assert len(set(side)) == len(side) and len(set(http)) == len(http)
    assert not set(side) & set(http)


def test_cpu_tiny_arguments():
    plan = plan_of("cpu-tiny")
    for p in plan.processes:
        a = p.argv
        assert a[:3] == (PYTHON, "-m", "vllm.entrypoints.openai.api_server")
        assert flag(a, "--model") == MODEL and flag(a, "--served-model-name") == "tiny"
        assert flag(a, "--dtype") == "float32"
        assert json.loads(flag(a, "--kv-transfer-config"))["kv_buffer_device"] == "cpu"
        assert flag(a, "--num-gpu-blocks-override") == str(CPU_BLOCKS[p.name])
        assert "--gpu-memory-utilization" not in a and "--enforce-eager" in a
        assert p.env["VLLM_TARGET_DEVICE"] == "cpu" and p.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
        assert p.env["UCX_TLS"] == "tcp,self" and p.env["UCX_NET_DEVICES"] == "lo"
        assert p.env["HF_HUB_OFFLINE"] == "1" and "CUDA_VISIBLE_DEVICES" not in p.env
        assert p.gpu_ids == () and p.nice == 10
    spec = {p.name: flag(p.argv, "--speculative-config") for p in plan.processes}
    assert json.loads(spec["decode"]) == NGRAM and json.loads(spec["decode-6blk"]) == NGRAM
    assert spec["prefill"] is None and spec["decode-nospec"] is None


@pytest.mark.parametrize("profile", list(GPU_PROFILES))
def test_gpu_profile_arguments(profile):
    plan = plan_of(profile)
    for p in plan.processes:
        gpus, util, blocks, spec = GPU_PROFILES[profile][p.name]
        a = p.argv
        assert a[:3] == ("vllm", "serve", MODEL) and "--model" not in a  # {model} is positional
        assert flag(a, "--served-model-name") == "qwen3-0.6b" and flag(a, "--dtype") == "bfloat16"
        assert json.loads(flag(a, "--kv-transfer-config"))["kv_buffer_device"] == "cuda"
        assert float(flag(a, "--gpu-memory-utilization")) == util
        assert flag(a, "--num-gpu-blocks-override") == (None if blocks is None else str(blocks))
        got_spec = flag(a, "--speculative-config")
        assert (json.loads(got_spec) if got_spec else None) == spec
        assert "--tensor-parallel-size" not in a and "--enforce-eager" not in a
        assert "--enable-prefix-caching" in a
        assert p.env["CUDA_VISIBLE_DEVICES"] == gpus and p.gpu_ids == (int(gpus),)
        assert p.env["HF_HUB_OFFLINE"] == "0"  # GPU nodes may download the model
        assert "UCX_TLS" not in p.env and "UCX_NET_DEVICES" not in p.env  # UCX chooses
        assert not any(k.startswith("VLLM_CPU") or k == "VLLM_TARGET_DEVICE" for k in p.env)
        assert p.nice == 0


@pytest.mark.parametrize("profile", list(GPU_PROFILES))
def test_gpu_memory_split_leaves_headroom(profile):
    cfg = load_config(CONFIGS / f"{profile}.yaml")
    per_gpu: dict[int, float] = {}
    for _, inst in cfg.instances():
        for g in inst.gpu_ids:
            per_gpu[g] = per_gpu.get(g, 0.0) + inst.gpu_memory_utilization
    assert all(total <= 0.9 for total in per_gpu.values()), per_gpu


def test_gpu_overlap_without_split_is_rejected():
    with pytest.raises(ConfigError, match=r"GPU 1 is used by decode and decode-6blk; set gpu_memory_utilization"):
        plan_of("l4x2", ["decode.decode.gpu_memory_utilization=null"])
    with pytest.raises(ConfigError, match=r"GPU 0 is used by prefill and decode"):
        plan_of("h200", ["prefill.prefill.gpu_memory_utilization=null"])


def test_tensor_parallel_size_must_match_gpu_ids():
    with pytest.raises(ConfigError, match=r"prefill.*gpu_ids has 1 GPUs but tensor_parallel_size is 2"):
        plan_of("l4x2", ["prefill.prefill.tensor_parallel_size=2"])
    plan = plan_of("l4x2", ["prefill.prefill.tensor_parallel_size=2", "prefill.prefill.gpu_ids=[0, 2]"])
    p = plan.by_name("prefill")
    assert flag(p.argv, "--tensor-parallel-size") == "2" and p.env["CUDA_VISIBLE_DEVICES"] == "0,2"
    with pytest.raises(ConfigError, match=r"lists a GPU twice"):
        plan_of("l4x2", ["prefill.prefill.tensor_parallel_size=2", "prefill.prefill.gpu_ids=[0, 0]"])


def test_device_mismatches_are_rejected():
    with pytest.raises(ConfigError, match=r"decode.gpu_ids is empty"):
        plan_of("l4x2", ["decode.decode.gpu_ids=[]"])
    with pytest.raises(ConfigError, match=r"gpu_ids is set but device is cpu"):
        plan_of("cpu-tiny", ["decode.decode.gpu_ids=[0]"])
    with pytest.raises(ConfigError, match=r"kv_buffer_device must be 'cpu'"):
        plan_of("l4x2", ["device=cpu", *(f"{r}.{n}.gpu_ids=[]" for r, n in
                                          [("prefill", "prefill"), ("decode", "decode"),
                                           ("decode", "decode-6blk"), ("decode", "decode-nospec")])])

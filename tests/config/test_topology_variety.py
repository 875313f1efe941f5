"""Topology variety: per-instance block size and kv_load_failure_policy reach
vLLM's argv (configs/cpu-regressions.yaml), and a CPU block size that is not a multiple of 32 is
refused naming the instance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rig.config import ConfigError, load_config
from rig.plan.processes import build_plan

ROOT = Path(__file__).resolve().parents[2]


def _argv(plan, name: str) -> list[str]:
    return list(plan.by_name(name).argv)


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_block_size_and_failure_policy_per_instance(tmp_path):
    cfg = load_config(ROOT / "configs" / "cpu-regressions.yaml")
    plan = build_plan(cfg, tmp_path, "/m", "/py")
    assert _after(_argv(plan, "prefill-bs64"), "--block-size") == "64"
    assert _after(_argv(plan, "prefill"), "--block-size") == "32"  # the top-level value
    kv = json.loads(_after(_argv(plan, "decode-recompute"), "--kv-transfer-config"))
    assert kv["kv_load_failure_policy"] == "recompute" and kv["kv_role"] == "kv_consumer"
    assert "kv_load_failure_policy" not in json.loads(_after(_argv(plan, "decode-nospec"), "--kv-transfer-config"))


def test_cpu_block_size_per_instance_must_be_a_multiple_of_32():
    with pytest.raises(ConfigError,
                       match="prefill-bs64.block_size 48: the CPU attention backend needs a multiple of 32"):
        load_config(ROOT / "configs" / "cpu-regressions.yaml", ["prefill.prefill-bs64.block_size=48"])
    with pytest.raises(ConfigError, match="kv_load_failure_policy"):
        load_config(ROOT / "configs" / "cpu-regressions.yaml", ["decode.decode-nospec.kv_load_failure_policy=retry"])


def test_draft_model_decode_uses_the_served_model_as_its_own_draft(tmp_path):
    cfg = load_config(ROOT / "configs" / "cpu-regressions.yaml")
    plan = build_plan(cfg, tmp_path, "/models/tiny", "/py")
    spec = json.loads(_after(_argv(plan, "decode-draft"), "--speculative-config"))
    assert spec == {"method": "draft_model", "model": "/models/tiny", "num_speculative_tokens": 2}
    assert "--speculative-config" not in _argv(plan, "decode-nospec")
    # a draft named by path is passed unchanged
    other = load_config(ROOT / "configs" / "cpu-regressions.yaml", ["decode.decode-draft.speculative.model=/d/draft"])
    spec = json.loads(_after(_argv(build_plan(other, tmp_path, "/models/tiny", "/py"), "decode-draft"),
                             "--speculative-config"))
    assert spec["model"] == "/d/draft"

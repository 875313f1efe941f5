"""launch.layout: the process layout of every vLLM server, computed in the plan.

``fast`` (the CPU profiles' default) adds VLLM_ENABLE_V1_MULTIPROCESSING=0 to each server's
environment and nothing else; ``production`` (the GPU profiles') starts each server exactly as vLLM
does by default; ``pdrig plan`` names the layout in its header and ``--json`` carries it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rig import cli
from rig.config import ConfigError, RigConfig, load_config
from rig.plan.processes import build_plan
from tests.helpers.fake_rig import fake_config, write_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
FLAG = "VLLM_ENABLE_V1_MULTIPROCESSING"


def plan_of(profile: str, overrides: list[str] | None = None):
    return build_plan(load_config(CONFIGS / profile, overrides), "/runs/x", "/models/m", "/venv/bin/python")


@pytest.mark.parametrize("profile", sorted(p.name for p in CONFIGS.glob("*.yaml") if p.name != "builds.yaml"))
def test_every_profile_names_its_layout_cpu_fast_gpu_production(profile):
    cfg = load_config(CONFIGS / profile)
    assert cfg.launch.layout == ("fast" if cfg.device == "cpu" else "production")
    plan = plan_of(profile)
    assert plan.layout == cfg.launch.layout
    for spec in plan.processes:
        if spec.role in ("prefill", "decode"):
            assert (spec.env.get(FLAG) == "0") == (cfg.device == "cpu"), spec.name


def test_production_differs_from_fast_by_the_one_flag_only():
    fast, prod = plan_of("cpu-tiny.yaml"), plan_of("cpu-tiny.yaml", ["launch.layout=production"])
    assert (fast.layout, prod.layout) == ("fast", "production")
    for f, p in zip(fast.processes, prod.processes, strict=True):
        assert f.argv == p.argv
        assert f.env == {**p.env, FLAG: "0"}
        assert FLAG not in p.env


def test_fast_on_a_gpu_profile_adds_the_flag():
    assert all(s.env[FLAG] == "0" for s in plan_of("h200.yaml", ["launch.layout=fast"]).processes)


def test_unset_layout_follows_the_device(tmp_path: Path):
    data = fake_config(tmp_path)
    assert "layout" not in data["launch"]
    cpu = RigConfig.model_validate(data)
    assert (cpu.launch.layout, cpu.layout()) == (None, "fast")
    gpu = load_config(CONFIGS / "h200.yaml", ["launch.layout=null"])
    assert (gpu.launch.layout, gpu.layout()) == (None, "production")
    assert plan_of("cpu-tiny.yaml", ["launch.layout=null"]).layout == "fast"


def test_launch_env_overrides_the_layout():
    plan = plan_of("cpu-tiny.yaml", [f"launch.env.{FLAG}=1"])
    assert plan.layout == "fast" and all(s.env[FLAG] == "1" for s in plan.processes)


def test_unknown_layout_is_one_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"launch\.layout.*'fast', 'zygote', 'zygote-fork' or 'production'"):
        load_config(CONFIGS / "cpu-tiny.yaml", ["launch.layout=slow"])


@pytest.mark.parametrize("layout", ["fast", "production"])
def test_pdrig_plan_shows_the_layout(tmp_path: Path, capsys, layout):
    path = write_config(tmp_path, fake_config(tmp_path))
    assert cli.main(["plan", "--config", str(path), "--set", f"launch.layout={layout}"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"# launch.layout: {layout}: ")
    assert (f"{FLAG}=0" in out) == (layout == "fast")
    assert cli.main(["plan", "--config", str(path), "--set", f"launch.layout={layout}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layout"] == layout

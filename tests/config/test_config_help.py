"""Config errors a newcomer can act on: the nearest valid field, the valid choices, advice that
fits a wrong key vs a wrong value, `pdrig config --explain`, and a copied profile's suite."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from rig import cli
from rig.config import ConfigError, RigConfig, load_config
from rig.config.help import explain, model_at, nearest, scenarios_by_suite

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CPU_TINY = CONFIGS / "cpu-tiny.yaml"


def error_of(overrides: list[str], path: Path = CPU_TINY) -> str:
    with pytest.raises(ConfigError) as ei:
        load_config(path, overrides)
    return str(ei.value)


def test_nearest():
    assert nearest("kv_lease", ["kv_buffer_device", "kv_lease_duration"]) == "kv_lease_duration"
    assert nearest("stall_windw_s", ["stall_window_s", "startup_s"]) == "stall_window_s"
    assert nearest("zzz", ["stall_window_s"]) is None


def test_model_at_walks_lists_and_optionals():
    from rig.config import InstanceConfig, SpeculativeConfig, WaveConfig

    assert model_at(RigConfig, ["decode", 0]) is InstanceConfig
    assert model_at(RigConfig, ["decode", 1, "speculative"]) is SpeculativeConfig
    assert model_at(RigConfig, ["scenarios", 3, "wave"]) is WaveConfig
    assert model_at(RigConfig, ["block_size"]) is None


def test_wrong_key_names_the_nearest_field_and_says_fix_the_path():
    msg = error_of(["nixl.kv_lease=5"])
    assert "unknown field 'kv_lease'; did you mean 'kv_lease_duration'?" in msg
    assert "fields of nixl: kv_buffer_device," in msg and "pdrig config --explain nixl" in msg
    assert msg.rstrip().endswith("fix the path (the part before =)")
    assert "fix the value" not in msg


def test_wrong_key_in_an_instance_lists_its_fields():
    msg = error_of(["decode.decode-6blk.cpu=[1]"])
    assert "unknown field 'cpu'; did you mean 'cpus'?" in msg and "fields of decode: name, port" in msg


def test_wrong_key_in_the_file_itself(tmp_path):
    data = yaml.safe_load(CPU_TINY.read_text())
    data["timeouts"]["stall_windw_s"] = 5
    data["suite"] = str(CONFIGS / "suites" / "edge.yaml")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    msg = error_of([], tmp_path / "c.yaml")
    assert "timeouts.stall_windw_s: unknown field 'stall_windw_s'; did you mean 'stall_window_s'?" in msg


def test_wrong_value_keeps_value_advice_and_lists_literal_choices():
    msg = error_of(["dtype=float64"])
    assert "'auto', 'float32', 'bfloat16' or 'float16'" in msg and "fix the value or drop that --set" in msg


def test_a_scalar_where_a_list_belongs_shows_the_list_syntax():
    # --set values are YAML: `cpus=1` or `cpus=1,2` is not a list; the error shows the form that is
    assert "write a YAML list, e.g. [1]" in error_of(["decode.decode-6blk.cpus=1"])
    assert "write a YAML list, e.g. [1,2]" in error_of(["decode.decode-6blk.cpus=1,2"])
    assert load_config(CPU_TINY, ["decode.decode-6blk.cpus=[1]"]).instance("decode-6blk").cpus == [1]


def test_wrong_instance_name_lists_the_instances():
    msg = error_of(["decode.decode-7blk.port=9000"])
    assert "decode has no item 'decode-7blk'; did you mean 'decode-6blk'?" in msg
    assert "items: decode, decode-6blk, decode-nospec" in msg


def test_unknown_scenario_points_at_the_suite_that_has_it(capsys, restore_signals):
    assert cli.main(["e2e", "--scenario", "pressure-wave-2048"]) == 2
    err = capsys.readouterr().err
    assert "'pressure-wave-2048' is in " in err and "pressure.yaml: add --set suite=suites/pressure.yaml" in err
    assert "edge-126" in err  # this config's own names


def test_unknown_scenario_in_no_suite_gets_the_nearest_name(capsys, restore_signals):
    assert cli.main(["e2e", "--scenario", "edge-96-blok-boundary"]) == 2
    assert "did you mean 'edge-96-block-boundary'?" in capsys.readouterr().err


def test_scenarios_by_suite_covers_every_suite_file():
    found = scenarios_by_suite([CONFIGS / "suites"])
    assert found["edge-126"][0].endswith("edge.yaml")
    assert found["lease-expired-read"][0].endswith("lease.yaml")


def test_explain_lists_type_default_and_description(capsys, restore_signals):
    assert cli.main(["config", "--explain", "nixl"]) == 0
    out = capsys.readouterr().out
    assert "nixl.kv_lease_duration: int | None = None\n    kv_connector_extra_config.kv_lease_duration (s)" in out
    assert "nixl.side_channel_base_port: int = 5600" in out
    whole = explain(RigConfig)
    assert "decode.<item>.num_gpu_blocks_override: int | None = None" in whole
    assert "timeouts.stall_window_s: float = 8" in whole  # defaults come from the models
    assert any(line.startswith("scenarios.<item>.wave.concurrency: int = 64") for line in whole)


def test_explain_accepts_set_style_paths_with_item_names():
    assert explain(RigConfig, "decode.decode-6blk.cpus") == explain(RigConfig, "decode.cpus")
    assert explain(RigConfig, "scenarios.0.wave.concurrency")[0].startswith("scenarios.wave.concurrency: int = 64")


def test_explain_takes_a_scenario_field_as_a_suite_spells_it(capsys, restore_signals):
    assert cli.main(["config", "--explain", "expect.prompt_source"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("scenarios.expect.prompt_source: 'pulled' | 'recomputed'")
    assert cli.main(["config", "--explain", "expect.bogus"]) == 2  # neither a profile nor a scenario field
    assert "--explain expect: no such field" in capsys.readouterr().err


def test_explain_unknown_path_suggests(capsys, restore_signals):
    assert cli.main(["config", "--explain", "decode.cpu"]) == 2
    assert "did you mean 'cpus'?" in capsys.readouterr().err


def test_copied_profile_finds_the_repo_suite(tmp_path):
    shutil.copy(CPU_TINY, tmp_path / "mine.yaml")
    cfg = load_config(tmp_path / "mine.yaml")
    assert "edge-126" in [s.name for s in cfg.scenarios]


def test_copied_profile_with_a_missing_suite_says_where_it_looked(tmp_path):
    shutil.copy(CPU_TINY, tmp_path / "mine.yaml")
    msg = error_of(["suite=suites/mine.yaml"], tmp_path / "mine.yaml")
    assert str(tmp_path / "suites" / "mine.yaml") in msg and str(CONFIGS / "suites" / "mine.yaml") in msg
    assert "relative to the config file" in msg and "--set suite=/path/to/suite.yaml" in msg


def test_absolute_suite_path(tmp_path):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump([{"name": "x", "prompt_tokens": 8, "max_tokens": 2}]))
    cfg = load_config(CPU_TINY, [f"suite={tmp_path / 's.yaml'}"])
    assert [s.name for s in cfg.scenarios] == ["x"]


def test_the_default_config_resolves_to_the_repository_outside_it(tmp_path, monkeypatch):
    """`.venv/bin/pdrig e2e` run from another directory finds the repo's CPU default; a path the user
    typed is never rewritten (load_config names it when missing)."""
    from rig.cli import build_parser
    from rig.config.help import REPO_CONFIGS

    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["plan"])
    assert args.config == str(REPO_CONFIGS / "cpu-tiny.yaml")
    assert build_parser().parse_args(["plan", "-c", "mine.yaml"]).config == "mine.yaml"
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "cpu-tiny.yaml").write_text("name: local\n")
    assert build_parser().parse_args(["plan"]).config == "configs/cpu-tiny.yaml"  # a local copy wins

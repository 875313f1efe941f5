"""Config loading: every error names its field; --set by index and by name; the suite include."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from rig.config import ConfigError, RigConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CPU_TINY = CONFIGS / "cpu-tiny.yaml"


@pytest.fixture()
def base() -> dict:
    """cpu-tiny.yaml as raw data, without its suite include (scenarios added per test)."""
    data = yaml.safe_load(CPU_TINY.read_text())
    data.pop("suite")
    return data


def load(tmp_path: Path, data: dict, overrides: list[str] | None = None) -> RigConfig:
    p = tmp_path / "rig.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config(p, overrides)


def error_of(tmp_path: Path, data: dict, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, data, overrides)
    return str(ei.value)


def test_cpu_tiny_loads_with_its_suite():
    cfg = load_config(CPU_TINY)
    assert cfg.name == "cpu-tiny" and cfg.device == "cpu"
    assert [i.name for _, i in cfg.instances()] == ["prefill", "decode", "decode-6blk", "decode-nospec"]
    assert [s.name for s in cfg.scenarios] == [
        "edge-126", "edge-127", "edge-96-block-boundary", "edge-96-pair",
        "edge-126-6blk", "edge-127-6blk", "edge-126-nospec", "edge-127-nospec", "canary-swapped-prompt"]
    e126 = cfg.scenarios[0]
    assert (e126.decode, e126.prompt_tokens, e126.max_tokens) == ("decode", 126, 2)
    assert (e126.expect.completion_tokens, e126.expect.total_tokens) == (2, 128)
    # The YAML anchor gives edge-127 the same known issue.
    assert e126.known_issue is not None and cfg.scenarios[1].known_issue == e126.known_issue
    assert e126.known_issue.applies_to("0.32.0") and e126.known_issue.applies_to("0.32.0+cpu")
    assert e126.known_issue.applies_to("0.33.0") and not e126.known_issue.applies_to("0.30.0")  # measured on 0.33.0
    assert all(s.known_issue is None for s in cfg.scenarios[2:])


def test_unknown_field_is_named(tmp_path, base):
    base["timeouts"]["stall_windw_s"] = 5
    msg = error_of(tmp_path, base)
    assert "timeouts.stall_windw_s: unknown field" in msg


def test_unknown_field_in_list_item_names_the_item(tmp_path, base):
    base["decode"][1]["blocks"] = 6
    msg = error_of(tmp_path, base)
    assert "decode[1](decode-6blk).blocks: unknown field" in msg


def test_wrong_type_is_named(tmp_path, base):
    base["prefill"][0]["port"] = "eighty"
    msg = error_of(tmp_path, base)
    assert "prefill[0](prefill).port:" in msg and "valid integer" in msg


def test_wrong_type_nested(tmp_path, base):
    base["timeouts"]["stall_window_s"] = "fast"
    assert "timeouts.stall_window_s: Input should be a valid number" in error_of(tmp_path, base)


def test_missing_required_field(tmp_path, base):
    del base["decode"][0]["port"]
    assert "decode[0](decode).port: required field is missing" in error_of(tmp_path, base)


def test_duplicate_ports(tmp_path, base):
    base["decode"][1]["port"] = 8100  # prefill's port
    msg = error_of(tmp_path, base)
    assert "decode-6blk.port 8100 is already used by prefill.port" in msg


def test_duplicate_side_channel_port(tmp_path, base):
    base["prefill"][0]["side_channel_port"] = 5700
    base["decode"][0]["side_channel_port"] = 5700
    assert "decode.side_channel_port 5700 is already used by prefill.side_channel_port" in error_of(tmp_path, base)


def test_duplicate_instance_names(tmp_path, base):
    base["decode"][1]["name"] = "decode"
    assert "instance names must be unique; repeated: ['decode']" in error_of(tmp_path, base)


def test_scenario_naming_unknown_decode(tmp_path, base):
    base["scenarios"] = [{"name": "x", "decode": "decode-7blk", "prompt_tokens": 4, "max_tokens": 1}]
    msg = error_of(tmp_path, base)
    assert "scenarios[0] (x).decode names 'decode-7blk', which is not a decode instance" in msg
    assert "'decode-6blk'" in msg  # the valid choices are listed


def test_scenario_naming_a_prefill_as_decode(tmp_path, base):
    base["scenarios"] = [{"name": "x", "decode": "prefill", "prompt_tokens": 4, "max_tokens": 1}]
    assert "(x).decode names 'prefill', which is not a decode instance" in error_of(tmp_path, base)


def test_scenario_prompt_not_below_max_model_len(tmp_path, base):
    base["scenarios"] = [{"name": "x", "prompt_tokens": 128, "max_tokens": 1}]
    assert "scenarios[0] (x).prompt_tokens 128 must be below max_model_len 128" in error_of(tmp_path, base)


@pytest.mark.parametrize("bs", [16, 48, 100])
def test_cpu_block_size_must_be_multiple_of_32(tmp_path, base, bs):
    base["block_size"] = bs
    assert f"block_size {bs}: the CPU attention backend needs a multiple of 32" in error_of(tmp_path, base)


def test_block_size_64_is_fine_on_cpu(tmp_path, base):
    base["block_size"] = 64
    assert load(tmp_path, base).block_size == 64


def test_cuda_allows_block_size_16(tmp_path, base):
    base["device"] = "cuda"
    base["block_size"] = 16
    base["nixl"]["kv_buffer_device"] = "cuda"
    for i, inst in enumerate(base["prefill"] + base["decode"]):
        inst["gpu_ids"] = [i]
    assert load(tmp_path, base).block_size == 16


def test_gpu_ids_on_cpu_rejected(tmp_path, base):
    base["decode"][0]["gpu_ids"] = [0]
    assert "decode.gpu_ids is set but device is cpu" in error_of(tmp_path, base)


def test_missing_file():
    with pytest.raises(ConfigError) as ei:
        load_config("configs/does-not-exist.yaml")
    assert "'configs/does-not-exist.yaml' not found" in str(ei.value)


def test_bad_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nprefill: [\n  - {name: p\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert f"{p}:3: not valid YAML" in str(ei.value)  # the line of the problem


def test_top_level_not_a_mapping(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(p)


@pytest.mark.parametrize("spec", ["0.32", "~=0", "version 0.32", "=<0.32"])
def test_known_issue_affects_must_be_a_specifier(tmp_path, base, spec):
    base["scenarios"] = [{"name": "x", "prompt_tokens": 4, "max_tokens": 1,
                          "known_issue": {"id": "a", "title": "b", "affects": spec,
                                          "symptom": {"kind": "wrong-output"}}}]
    msg = error_of(tmp_path, base)
    assert "scenarios[0](x).known_issue.affects: not a PEP 440 version specifier" in msg


def test_known_issue_applies_to_versions(tmp_path, base):
    base["scenarios"] = [{"name": "x", "prompt_tokens": 4, "max_tokens": 1,
                          "known_issue": {"id": "a", "title": "b", "affects": ">=0.32.0,<0.33",
                                          "symptom": {"kind": "wrong-output"}}}]
    ki = load(tmp_path, base).scenarios[0].known_issue
    assert ki.applies_to("0.32.0") and ki.applies_to("0.32.5") and ki.applies_to("0.32.1rc1")
    assert not ki.applies_to("0.31.9") and not ki.applies_to("0.33.0")


# ------------------------------------------------------------------ --set overrides


def test_set_by_list_index(tmp_path, base):
    cfg = load(tmp_path, base, ["decode.1.port=8300"])
    assert cfg.instance("decode-6blk").port == 8300
    assert cfg.instance("decode").port == 8200  # the others are untouched


def test_set_by_list_name(tmp_path, base):
    cfg = load(tmp_path, base, ["decode.decode-nospec.num_gpu_blocks_override=7",
                                "decode.decode.speculative.num_speculative_tokens=2"])
    assert cfg.instance("decode-nospec").num_gpu_blocks_override == 7
    assert cfg.instance("decode").speculative.num_speculative_tokens == 2
    assert cfg.instance("decode-6blk").speculative.num_speculative_tokens == 1


def test_set_values_are_yaml(tmp_path, base):
    cfg = load(tmp_path, base, ["timeouts.stall_window_s=2.5", "launch.extra_args=[--a, b]",
                                "decode.decode.speculative=null", "launch.enforce_eager=false"])
    assert cfg.timeouts.stall_window_s == 2.5
    assert cfg.launch.extra_args == ["--a", "b"]
    assert cfg.instance("decode").speculative is None
    assert cfg.launch.enforce_eager is False


def test_set_creates_missing_section(tmp_path, base):
    del base["timeouts"]
    cfg = load(tmp_path, base, ["timeouts.drain_s=3"])
    assert cfg.timeouts.drain_s == 3 and cfg.timeouts.startup_s == 1200


@pytest.mark.parametrize("override, expected", [
    ("decode.decode-7blk.port=9000", "--set decode.decode-7blk.port=9000: decode has no item 'decode-7blk'"),
    ("decode.9.port=9000", "--set decode.9.port=9000: decode has no item '9'"),
    ("block_size.x=5", "--set block_size.x=5: 'x' is inside a value that is not a section"),
    ("block_size", "--set 'block_size': expected dotted.path=value"),
])
def test_bad_set_path(tmp_path, base, override, expected):
    assert expected in error_of(tmp_path, base, [override])


def test_set_unknown_field_is_a_validation_error_naming_it(tmp_path, base):
    msg = error_of(tmp_path, base, ["timeouts.stall_windw_s=5"])
    assert "--set timeouts.stall_windw_s=5 (timeouts.stall_windw_s): unknown field" in msg


def test_set_wrong_type_names_field(tmp_path, base):
    msg = error_of(tmp_path, base, ["decode.decode-6blk.port=high"])
    assert "--set decode.decode-6blk.port=high (decode[1](decode-6blk).port):" in msg
    assert "(got 'high'); fix the value or drop that --set" in msg


def test_set_can_break_consistency(tmp_path, base):
    assert "block_size 40" in error_of(tmp_path, base, ["block_size=40"])


# ------------------------------------------------------------------ suite include


def test_suite_include_relative_to_config_and_prepended(tmp_path, base):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "s.yaml").write_text(yaml.safe_dump([
        {"name": "from-suite", "decode": "decode-6blk", "prompt_tokens": 10, "max_tokens": 2}]))
    base["suite"] = "suites/s.yaml"
    base["scenarios"] = [{"name": "inline", "prompt_tokens": 5, "max_tokens": 1}]
    cfg = load(tmp_path, base)
    assert [s.name for s in cfg.scenarios] == ["from-suite", "inline"]
    assert cfg.scenarios[0].decode == "decode-6blk"


def test_set_reaches_suite_scenarios_by_name(tmp_path):
    cfg = load_config(CPU_TINY, ["scenarios.edge-127.max_tokens=3", "scenarios.0.deadline_s=9"])
    assert cfg.scenarios[1].name == "edge-127" and cfg.scenarios[1].max_tokens == 3
    assert cfg.scenarios[0].deadline_s == 9


def test_suite_missing_file(tmp_path, base):
    base["suite"] = "suites/nope.yaml"
    msg = error_of(tmp_path, base)
    assert "suite: 'suites/nope.yaml' not found; looked at " in msg and "nope.yaml" in msg


def test_suite_not_a_list(tmp_path, base):
    (tmp_path / "s.yaml").write_text("name: x\n")
    base["suite"] = "s.yaml"
    assert "a suite file is a YAML list of scenarios" in error_of(tmp_path, base)


def test_suite_scenario_errors_are_named(tmp_path, base):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump([
        {"name": "ok", "prompt_tokens": 5, "max_tokens": 1},
        {"name": "bad", "prompt_tokens": 5, "max_tokens": 0}]))
    base["suite"] = "s.yaml"
    assert "scenarios[1](bad).max_tokens: Input should be greater than or equal to 1" in error_of(tmp_path, base)


def test_gpu_profiles_share_the_suite():
    cpu = load_config(CPU_TINY)
    for name in ("l4x2", "h200", "h200-2gpu"):
        gpu = load_config(CONFIGS / f"{name}.yaml")
        assert [s.model_dump() for s in gpu.scenarios] == [s.model_dump() for s in cpu.scenarios]


def test_load_does_not_mutate_overrides_between_loads(tmp_path, base):
    data = copy.deepcopy(base)
    a = load(tmp_path, data, ["decode.0.port=8301"])
    b = load(tmp_path, data)
    assert a.instance("decode").port == 8301 and b.instance("decode").port == 8200


def test_a_stall_window_at_or_above_the_request_deadline_is_refused_naming_both(tmp_path):
    with pytest.raises(ConfigError, match=r"timeouts.stall_window_s 60 must be below timeouts.request_s 60"):
        load_config(CONFIGS / "cpu-tiny.yaml", ["timeouts.stall_window_s=60"])
    assert load_config(CONFIGS / "cpu-tiny.yaml", ["timeouts.stall_window_s=59"])


def test_drain_below_the_nixl_lease_is_a_warning_naming_the_fix():
    cfg = load_config(CONFIGS / "cpu-tiny.yaml", ["timeouts.drain_s=10"])
    (w,) = cfg.wait_warnings()
    assert "timeouts.drain_s 10 s is below the NIXL lease 30 s" in w and "raise drain_s to 30" in w
    assert load_config(CONFIGS / "cpu-tiny.yaml",
                       ["timeouts.drain_s=10", "nixl.kv_lease_duration=5"]).wait_warnings() == []
    assert load_config(CONFIGS / "cpu-tiny.yaml").wait_warnings() == []


def _regressions_with(tmp_path, scenario: dict):
    suite = tmp_path / "one.yaml"
    suite.write_text(yaml.safe_dump([scenario]))
    return load_config(CONFIGS / "cpu-regressions.yaml", [f"suite={suite}"])


def test_edge_over_decodes_own_max_model_len_is_refused_where_parity_would_fail(tmp_path):
    # decode-mml112 has max_model_len 112, prefill 128: D clamps 110 + 4 to 2 tokens, the reference
    # on P does not, so parity would fail a correct decode.
    base = {"name": "clamp", "decode": "decode-mml112", "prompt_tokens": 110, "max_tokens": 4}
    with pytest.raises(ConfigError) as e:
        _regressions_with(tmp_path, base)
    msg = str(e.value)
    assert "exceeds decode's max_model_len 112 (prefill's is 128)" in msg and "lower max_tokens to 2" in msg
    assert _regressions_with(tmp_path, {**base, "max_tokens": 2}).scenarios[0].max_tokens == 2
    clamp = {**base, "parity": False, "expect": {"completion_tokens": 2}}
    assert _regressions_with(tmp_path, clamp).scenarios[0].parity is False

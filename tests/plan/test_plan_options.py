"""Options as fields: a per-instance ``max_model_len`` and per-connector-child
``kv_connector_extra_config`` reach the argv exactly, with the rig's ports kept; bad keys and
values are one error naming the field and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rig.config import ConfigError, load_config
from rig.config.help import explain
from rig.config.topology import RigConfig
from rig.plan.processes import build_plan

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MOONCAKE = CONFIGS / "cpu-regressions-mooncake.yaml"
CPU_TINY = CONFIGS / "cpu-tiny.yaml"


def argv_of(profile: Path, name: str, overrides: list[str]) -> list[str]:
    return list(build_plan(load_config(profile, overrides), "/r", "/m", "/py").by_name(name).argv)


def test_store_and_nixl_children_get_their_keys_after_the_rigs_ports():
    argv = argv_of(MOONCAKE, "decode", [
        "decode.decode.kv_connector_extra_config={store: {load_async: false, lookup_async: true}, "
        "nixl: {kv_lease_duration: 9}}", "decode.decode.max_model_len=200"])
    assert argv == [
        "/py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", "8250", "--block-size", "32", "--max-model-len", "200",
        "--dtype", "float32", "--seed", "0", "--kv-transfer-config",
        '{"kv_connector":"MultiConnector","kv_role":"kv_consumer","kv_connector_extra_config":{"connectors":['
        '{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_buffer_device":"cpu",'
        '"kv_connector_extra_config":{"kv_lease_duration":9}},'
        '{"kv_connector":"MooncakeStoreConnector","kv_role":"kv_consumer",'
        '"kv_connector_extra_config":{"lookup_rpc_port":5861,"load_async":false,"lookup_async":true}}]}}',
        "--num-gpu-blocks-override", "9", "--enable-prefix-caching", "--enforce-eager"]
    # prefill untouched: the profile's 5 s lease and max_model_len 256, its own lookup port.
    p = argv_of(MOONCAKE, "prefill", ["decode.decode.kv_connector_extra_config={store: {load_async: false}}"])
    assert p[p.index("--max-model-len") + 1] == "256"
    kv = json.loads(p[p.index("--kv-transfer-config") + 1])
    nixl, store = kv["kv_connector_extra_config"]["connectors"]
    assert nixl["kv_connector_extra_config"] == {"kv_lease_duration": 5}
    assert store["kv_connector_extra_config"] == {"lookup_rpc_port": 5860}


def test_an_instances_nixl_keys_win_over_the_top_level_nixl_settings():
    argv = argv_of(CPU_TINY, "decode", ["nixl.kv_lease_duration=5", "nixl.num_threads=2",
                                        "decode.decode.kv_connector_extra_config={nixl: {kv_lease_duration: 7}}"])
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer", "kv_buffer_device": "cpu",
                  "kv_connector_extra_config": {"num_threads": 2, "kv_lease_duration": 7}}


@pytest.mark.parametrize(("override", "message"), [
    ("{store: {load_asnyc: false}}",
     "store.load_asnyc: not a key the store connector reads; did you mean 'load_async'"),
    ("{store: {lookup_rpc_port: 5}}", "store.lookup_rpc_port: the rig assigns it per instance"),
    ("{store: {load_async: 1}}", "store.load_async: give a bool"),
    ("{nixl: {kv_lease_duration: 0}}", "nixl.kv_lease_duration: give a positive number"),
    ("{nixl: {kv_lease_duration: true}}", "nixl.kv_lease_duration: give a int"),
    ("{gds: {x: 1}}", "gds"),
])
def test_bad_extra_config_is_one_error_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(MOONCAKE, [f"decode.decode.kv_connector_extra_config={override}"])


def test_a_child_the_connector_does_not_run_is_refused_with_the_fix():
    message = "connector 'nixl' has no store child.*set decode.connector to 'nixl\\+store'"
    with pytest.raises(ConfigError, match=message):
        load_config(CPU_TINY, ["decode.decode.kv_connector_extra_config={store: {load_async: false}}"])


def test_per_instance_max_model_len_and_the_prompt_rules_it_feeds():
    over = ["suite=null", "decode.decode-6blk.max_model_len=112"]
    cfg = load_config(CPU_TINY, over)
    assert cfg.max_model_len_of("decode-6blk") == 112 and cfg.max_model_len_of("decode") == 128
    argv = argv_of(CPU_TINY, "decode-6blk", over)
    assert argv[argv.index("--max-model-len") + 1] == "112"
    # A prompt over decode's own limit is refused unless the scenario expects decode's HTTP 400.
    sc = {"name": "over", "decode": "decode-6blk", "prompt_tokens": 120, "max_tokens": 4}
    base = cfg.model_dump()
    with pytest.raises(ValueError, match="not below decode's max_model_len 112.*expect.http_status: 400"):
        RigConfig.model_validate({**base, "suite": None, "scenarios": [sc]})
    ok = RigConfig.model_validate({**base, "suite": None, "scenarios": [{**sc, "expect": {"http_status": 400}}]})
    assert ok.scenarios[0].expect.http_status == 400


def test_explain_lists_the_new_fields():
    text = "\n".join(explain(RigConfig))
    for field in ("max_model_len", "kv_connector_extra_config.store", "kv_connector_extra_config.nixl"):
        assert field in text, field


def test_an_instances_own_lease_is_the_one_its_bounds_use():
    cfg = load_config(CPU_TINY, ["nixl.kv_lease_duration=5",
                                 "prefill.prefill.kv_connector_extra_config={nixl: {kv_lease_duration: 9}}"])
    assert cfg.lease_s_of("prefill") == 9 and cfg.lease_s_of("decode") == 5
    assert load_config(CPU_TINY).lease_s_of("prefill") == 30  # vLLM's default

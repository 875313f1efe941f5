"""The token-in generate endpoint (bug record R21, vllm PR #42644): the rig's request bodies for both hops
and the reference, and the answers of vLLM 0.32.0 recorded from live instances (tests/data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rig.transport.answers import fill_from_answer
from rig.transport.bodies import PREFILL_PARAMS, ROUTE, decode_body, prefill_body, request_body
from rig.transport.records import Hop, classify, prefill_failure

DATA = Path(__file__).resolve().parents[1] / "data"


def recorded(name: str) -> dict:
    return json.loads((DATA / f"vllm-0.32.0-generate-{name}.json").read_text())


def test_route_and_body_shape_of_generate_request():
    assert ROUTE["generate"] == "/inference/v1/generate"
    b = request_body("generate", "tiny", [5, 6, 7], 8, sampling_params={"seed": 3}, cache_salt="s")
    assert b == {"model": "tiny", "token_ids": [5, 6, 7], "cache_salt": "s",
                 "sampling_params": {"max_tokens": 8, "temperature": 0, "ignore_eos": True, "seed": 3}}


def test_prefill_hop_puts_max_tokens_1_in_sampling_params_and_rigs_kv_params():
    b = prefill_body(request_body("generate", "tiny", [5, 6, 7], 8))
    assert b["sampling_params"]["max_tokens"] == 1 and "max_tokens" not in b
    assert b["kv_transfer_params"] == PREFILL_PARAMS
    d = decode_body(request_body("generate", "tiny", [5, 6, 7], 8), {"remote_block_ids": [[1]]})
    assert d["sampling_params"]["max_tokens"] == 8 and d["kv_transfer_params"] == {"remote_block_ids": [[1]]}


@pytest.mark.parametrize(("prompt", "says"), [("hello", "token IDs, not text"), ([[1], [2]], "one token-ID list")])
def test_generate_refuses_text_and_several_prompts(prompt, says):
    with pytest.raises(ValueError, match=says):
        request_body("generate", "tiny", prompt, 2)


def test_recorded_prefill_answer_carries_kv_transfer_params():
    hop = Hop(instance="prefill", status=200)
    fill_from_answer(hop, recorded("prefill"))
    ktp = hop.kv_transfer_params
    assert ktp["do_remote_prefill"] is True and ktp["remote_block_ids"] == [[1, 2]] and ktp["remote_num_tokens"] == 40
    assert hop.token_ids == [752] and hop.usage["prompt_tokens"] == 40 and hop.finish_reason == "length"
    assert classify(hop) == "ok" and prefill_failure(hop) is None


def test_recorded_decode_answer_equals_the_reference_tokens():
    dec, ref = Hop(instance="decode", status=200), Hop(instance="prefill", status=200)
    fill_from_answer(dec, recorded("decode"))
    fill_from_answer(ref, recorded("reference"))
    assert dec.token_ids == ref.token_ids == [752, 24, 904, 733, 217, 752, 740, 1008]
    assert dec.usage["completion_tokens"] == 8 and dec.kv_transfer_params is None and dec.text == ""
    assert classify(dec) == "ok"


def test_prefill_answer_with_null_kv_transfer_params_is_the_r21_diagnosis():
    hop = Hop(instance="prefill", status=200)
    fill_from_answer(hop, {**recorded("prefill"), "kv_transfer_params": None})
    outcome, why = prefill_failure(hop)
    assert outcome == "http_error"
    assert "without kv_transfer_params (null)" in why and "vllm PR #42644" in why and "bug record R21" in why

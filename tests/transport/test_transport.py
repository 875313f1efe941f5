"""The one client for the two hops (rig.transport): bodies for completions and chat, answers and
streams read the same by both implementations, and P/D exchanges against fake P and D servers
for the chat endpoint and several prompts in one request."""

from __future__ import annotations

import asyncio
import json

import pytest

from rig.judge.checks import several_prompts_usage
from rig.observe.parity import compare_hops
from rig.transport.answers import StreamReader, fill_from_answer
from rig.transport.bodies import PREFILL_PARAMS, chat_body, decode_body, prefill_body, request_body
from rig.transport.client import CLIENTS, make_transport
from rig.transport.records import OUTCOMES, Hop, PDRecord, WaveRecord, WaveRecordLine, classify
from tests.helpers.fake_pd import MODEL, fake_pd


def test_request_body_by_endpoint():
    c = request_body("completions", "m", [5, 6], 3, n=2)
    assert c == {"model": "m", "prompt": [5, 6], "max_tokens": 3, "temperature": 0, "ignore_eos": True,
                 "return_token_ids": True, "n": 2}
    chat = request_body("chat", "m", [5, 6], 3)
    assert chat["messages"] == [{"role": "user", "content": "5 6"}] and "prompt" not in chat
    assert chat_body("m", "hello", 1)["messages"][0]["content"] == "hello"
    with pytest.raises(ValueError, match="one conversation"):
        request_body("chat", "m", [[1], [2]], 3)
    with pytest.raises(ValueError, match="unknown"):
        request_body("responses", "m", [1], 3)


def test_prefill_and_decode_bodies_of_a_chat_request():
    body = request_body("chat", "m", [7], 9, max_completion_tokens=9, stream=True, kv_transfer_params={"x": 1})
    p = prefill_body(body)
    assert p["max_tokens"] == p["max_completion_tokens"] == 1 and "stream" not in p
    assert p["kv_transfer_params"] == PREFILL_PARAMS and p["messages"] == body["messages"]
    d = decode_body(body, {"remote_block_ids": [[1]]})
    assert d["kv_transfer_params"] == {"remote_block_ids": [[1]]} and d["stream"] is True


def test_fill_from_a_chat_answer_and_several_choices():
    hop = Hop("d")
    fill_from_answer(hop, {"choices": [{"index": 1, "message": {"content": "b"}, "token_ids": [3]},
                                       {"index": 0, "message": {"content": "a"}, "token_ids": [1, 2],
                                        "finish_reason": "length"}],
                           "usage": {"completion_tokens": 3}})
    assert hop.choices == [[1, 2], [3]] and hop.token_ids == [1, 2, 3] and hop.text == "ab"


def _chunk(i: int, ids: list[int], finish: str | None = None, chat: bool = False) -> dict:
    c = {"index": i, "token_ids": ids, "finish_reason": finish}
    c.update({"delta": {"content": "x"}} if chat else {"text": "x"})
    return {"choices": [c]}


@pytest.mark.parametrize("chat", [False, True])
def test_stream_reader_complete_and_in_order(chat):
    r = StreamReader(Hop("d"), 0.0)
    for ch in (_chunk(0, [1], chat=chat), _chunk(1, [5], chat=chat), _chunk(0, [2], "length", chat),
               _chunk(1, [6], "length", chat)):
        assert r.feed_obj(ch) is False
    r.feed(b"[DONE]")
    hop = r.finish()
    assert hop.choices == [[1, 2], [5, 6]] and hop.stream_problem == "" and hop.ttft_s is not None


def test_stream_reader_names_what_is_wrong():
    r = StreamReader(Hop("d"), 0.0)
    r.feed_obj(_chunk(0, [1], "length"))
    r.feed_obj(_chunk(0, [2]))
    r.feed_obj(_chunk(1, [3]))
    problem = r.finish().stream_problem
    assert "choice 0 got tokens after finish_reason 'length'" in problem
    assert "choice(s) [1] ended without a finish_reason" in problem and "no [DONE]" in problem


def test_stream_reader_stops_after_tokens_as_a_cancel():
    r = StreamReader(Hop("d"), 0.0, stop_after=2)
    assert r.feed_obj(_chunk(0, [1])) is False
    assert r.feed_obj(_chunk(0, [2])) is True
    hop = r.finish()
    assert hop.finish_reason == "cancelled" and hop.stream_problem == "" and classify(hop) == "ok"
    done = StreamReader(Hop("d"), 0.0, stop_after=1)  # a one-token answer then its usage chunk
    assert done.feed_obj(_chunk(0, [1], "length")) is False
    assert done.feed_obj({"choices": [], "usage": {"completion_tokens": 1}}) is False
    assert done.finish().finish_reason == "length"


def test_one_outcome_vocabulary_for_both_records():
    assert set(OUTCOMES) >= {"ok", "timeout", "http_error", "connection_error", "empty", "cancelled",
                             "stalled", "parity_mismatch", "pending"}
    w = WaveRecord(request_id="w", prompt_len=4, max_tokens=2, index=0, stream=False, p_instance="prefill")
    p = PDRecord("p", 4, 2)
    assert w.outcome == p.outcome == "pending" and w.diagnosis == p.diagnosis == ""
    line = WaveRecordLine.of(w).model_dump()
    assert line["outcome"] == "pending" and "status" not in line and line["hops"] == []


def test_a_wave_record_line_lists_its_hops_rounds_its_seconds_and_reads_back():
    w = WaveRecord(request_id="w", prompt_len=4, max_tokens=2, index=3, stream=True, outcome="ok",
                   p_instance="prefill", p_status=200, p_latency_s=0.0123456789, d_instance="decode",
                   d_status=200, d_latency_s=1.5, latency_s=1.512345678, token_ids=[1, 2])
    text = WaveRecordLine.of(w).model_dump_json()
    line = json.loads(text)
    assert "token_ids" not in line and line["latency_s"] == 1.51235 and line["p_latency_s"] == 0.01235
    assert line["hops"] == [{"instance": "prefill", "status": 200, "latency_s": 0.01235},
                            {"instance": "decode", "status": 200, "latency_s": 1.5}]
    assert WaveRecordLine.model_validate_json(text).index == 3
    with pytest.raises(ValueError, match="token_ids"):
        WaveRecordLine.model_validate({**line, "token_ids": [1]})


def test_several_prompts_usage_names_a_wrong_count():
    rec = PDRecord("r", 2, 2, prompt=[[1, 2], [3, 4]], outcome="ok",
                   decode=Hop("d", token_ids=[9, 9, 8, 8], choices=[[9, 9], [8, 8]],
                              usage={"prompt_tokens": 4, "completion_tokens": 4}))
    assert several_prompts_usage(rec) == []
    rec.decode.usage = {"prompt_tokens": 2, "completion_tokens": 4}
    rec.decode.choices = [[9, 9, 8]]
    assert several_prompts_usage(rec) == ["usage.prompt_tokens 2 != 4 (2 prompts)", "1 choices for 2 prompts"]
    assert several_prompts_usage(PDRecord("s", 2, 2, prompt=[1, 2], decode=Hop("d"))) == []


async def _exchange(client: str, p, d, prompt, endpoint: str, stream: bool = False):
    tr = make_transport(client, MODEL, 10)
    try:
        ph = await tr.prefill(p, prompt, endpoint=endpoint)
        dh = await tr.decode(d, prompt, 4, ph.kv_transfer_params or {}, stream, endpoint=endpoint)
        ref = await tr.direct(p, prompt, 4, endpoint=endpoint)
    finally:
        await tr.aclose()
    return ph, dh, ref


@pytest.mark.parametrize("client", CLIENTS)
def test_chat_and_several_prompts_through_both_hops_against_fakes(client):
    with fake_pd() as (p, d):
        ph, dh, ref = asyncio.run(_exchange(client, p, d, [11, 12, 13, 14], "chat"))
        assert ph.status == 200 and ph.kv_transfer_params["do_remote_prefill"] is True
        assert classify(dh) == "ok" and len(dh.token_ids) == 4 and dh.token_ids == ref.token_ids
        _, sh, _ = asyncio.run(_exchange(client, p, d, [11, 12, 13, 14], "chat", stream=True))
        assert sh.token_ids == ref.token_ids and sh.stream_problem == "" and sh.ttft_s is not None
        prompts = [[21, 22, 23], [31, 32, 33], [41, 42, 43]]
        ph, dh, ref = asyncio.run(_exchange(client, p, d, prompts, "completions"))
        assert len(dh.choices) == 3 and compare_hops(dh, ref, 4, 4).status == "equal"
        assert dh.usage["prompt_tokens"] == 9 and dh.usage["completion_tokens"] == 12
        assert dh.choices[0] != dh.choices[1]  # each prompt its own answer


def test_a_hop_failure_is_its_kind_not_its_words():
    # the outcome comes from the kind the transport recorded, whatever the message says
    from rig.transport.records import HopFailure, classify

    assert classify(Hop("d").fail(HopFailure.TIMEOUT, "the deadline passed")) == "timeout"
    assert classify(Hop("d", status=200).fail(HopFailure.CONNECTION_ERROR, "answer is not JSON")) == "connection_error"
    assert classify(Hop("d", status=503).fail(HopFailure.HTTP_ERROR, "timeout: vLLM's own words")) == "http_error"
    assert classify(Hop("d", error="timeout: built by hand, no kind")) == "connection_error"

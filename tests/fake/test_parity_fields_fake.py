"""Answer-field parity and the prompt-source expectation end to end against fake vLLM servers
(tests/fake_vllm.py; bug record R23): a decode that makes up prompt_logprobs fails parity at the first
made-up value; one that recomputes the prompt passes where the scenario declares it and fails
``kv-pulled`` where it does not; logprobs within the tolerance pass and beyond it fail; a field
only the P/D answer carries is not compared, and the parity detail says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from rig.config import load_config
from rig.run.runner import SuiteRunner, new_run_dir
from tests.helpers.fake_rig import fake_config, scenario, write_config
from tests.helpers.survivors import kill_pids, wait_no_survivors

PLP = {"decode": {"prompt_logprobs": 1}, "reference": {"prompt_logprobs": 1}}
RECOMPUTE = [{"vllm": ">=0.32", "prompt_source": "recomputed", "completion_tokens": 4, "total_tokens": 44}]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fake-parity-fields")


@pytest.fixture(autouse=True)
def no_survivors(base_dir):
    yield
    left = wait_no_survivors(str(base_dir), within_s=10)
    kill_pids(left)
    assert left == {}, f"fake servers survived the run: {left}"


def declared(name: str, decode: str, request: dict | None = None) -> dict:
    sc = scenario(name, decode, request=request or PLP)
    sc["expect"]["by_version"] = RECOMPUTE
    return sc


@pytest.fixture(scope="module")
def suite(base_dir):
    decodes = {"decode": {},
               "decode-fabricates": {"env": {"FAKE_VLLM_FAULT": "fabricate-prompt-logprobs"}},
               "decode-jitter": {"env": {"FAKE_VLLM_FAULT": "logprob-jitter", "FAKE_VLLM_FAULT_ARG": "0.0005"}}}
    scenarios = [
        declared("recompute-declared", "decode"),
        scenario("recompute-silent", "decode", request=PLP),
        declared("fabricated", "decode-fabricates"),
        scenario("jitter-within", "decode-jitter", request={"decode": {"logprobs": 2}, "reference": {"logprobs": 2}},
                 parity_tolerance=0.001),
        scenario("jitter-beyond", "decode-jitter", request={"decode": {"logprobs": 2}, "reference": {"logprobs": 2}},
                 parity_tolerance=0.0004),
        scenario("only-in-answer", "decode", request={"decode": {"logprobs": 2}}),
        scenario("streamed-logprobs", "decode", request={"decode": {"logprobs": 2, "stream": True},
                                                         "reference": {"logprobs": 2}}),
        declared("echo-declared", "decode", request={"decode": {"echo": True, "logprobs": 1},
                                                      "reference": {"echo": True, "logprobs": 1}}),
    ]
    tmp = base_dir / "suite"
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = load_config(write_config(tmp, fake_config(tmp, decodes=decodes, scenarios=scenarios)))
    result = SuiteRunner(cfg, list(cfg.scenarios), new_run_dir(cfg), quiet=True).run()
    return {v.scenario: v for v in result.verdicts}, {o.scenario: o for o in result.observations}


def checks(v) -> dict[str, tuple[bool | None, str]]:
    return {c.name: (c.ok, c.detail) for c in v.checks}


def test_declared_recompute_passes_with_exact_sources(suite):
    v = suite[0]["recompute-declared"]
    assert v.verdict == "PASS", v.reason
    ok, detail = checks(v)["kv-pulled"]
    assert ok is True
    assert "external_kv_transfer +0, local_cache_hit +0, local_compute +40, nixl 0 B" in detail
    assert "expected recomputed (declared)" in detail and "per request (recompute-declared-0 ran alone)" in detail
    # the prompt logprobs were compared with the reference's, not skipped
    assert "floats within 0 of the reference" in checks(v)["parity"][1]
    assert "prompt_logprobs" not in checks(v)["parity"][1]


def test_silent_recompute_fails_kv_pulled(suite):
    v = suite[0]["recompute-silent"]
    assert v.verdict == "FAIL" and v.reason.startswith("kv-pulled"), v.reason
    assert "local_compute +40" in v.reason and "expected pulled" in v.reason
    assert checks(v)["parity"][0] is True  # a correct answer: only where it came from is wrong


def test_fabricated_prompt_logprobs_fail_parity_at_the_first_made_up_value(suite):
    v = suite[0]["fabricated"]
    assert v.verdict == "FAIL", v.reason
    ok, detail = checks(v)["parity"]
    assert ok is False and "diverged at choices[0].prompt_logprobs[1]" in detail, detail
    assert ".logprob" in detail
    # it pulled the KV although the scenario declares the recompute this version does
    assert checks(v)["kv-pulled"][0] is False
    rec = suite[1]["fabricated"].records[0]
    assert rec.decode.answer_fields["choices"][0]["prompt_logprobs"][1] != \
        rec.reference.answer_fields["choices"][0]["prompt_logprobs"][1]


def test_logprobs_within_the_tolerance_pass_and_beyond_it_fail(suite):
    within, beyond = suite[0]["jitter-within"], suite[0]["jitter-beyond"]
    assert within.verdict == "PASS", within.reason
    assert "floats within 0.0005 of the reference, tolerance 0.001" in checks(within)["parity"][1]
    assert beyond.verdict == "FAIL"
    detail = checks(beyond)["parity"][1]
    assert "diverged at choices[0].logprobs.token_logprobs[0]" in detail and "float tolerance 0.0004" in detail


def test_a_field_only_in_the_answer_is_not_compared_and_said_so(suite):
    v = suite[0]["only-in-answer"]
    assert v.verdict == "PASS", v.reason
    assert "not compared: choices[0].logprobs (P/D only)" in checks(v)["parity"][1]


def test_streamed_logprobs_are_merged_and_compared(suite):
    v = suite[0]["streamed-logprobs"]
    assert v.verdict == "PASS", v.reason
    rec = suite[1]["streamed-logprobs"].records[0]
    lps = rec.decode.answer_fields["choices"][0]["logprobs"]
    assert len(lps["token_logprobs"]) == 4 and lps["text_offset"] == [0, 1, 2, 3]
    assert "floats within 0 of the reference" in checks(v)["parity"][1]


def test_echo_with_logprobs_recomputes_where_declared(suite):
    v = suite[0]["echo-declared"]
    assert v.verdict == "PASS", v.reason
    rec = suite[1]["echo-declared"].records[0]
    echoed = rec.reference.answer_fields["choices"][0]["text"]
    assert len(echoed) == 44 and rec.decode.answer_fields["choices"][0]["text"] == echoed  # 40 prompt + 4 tokens


def test_report_json_keeps_the_answer_fields_and_the_reference(suite):
    from rig.report.build import observation_report

    rec = observation_report(suite[1]["recompute-declared"]).model_dump(mode="json")["records"][0]
    assert rec["decode"]["answer_fields"]["choices"][0]["prompt_logprobs"][0] is None
    assert len(rec["reference"]["answer_fields"]["choices"][0]["prompt_logprobs"]) == 40

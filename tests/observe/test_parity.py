"""Token-by-token parity of a P/D answer with its non-disaggregated reference."""

from __future__ import annotations

import pytest

from rig.observe.parity import ParityResult, compare, compare_fields, compare_hops, summarize
from rig.transport.answers import StreamReader, fill_from_answer
from rig.transport.records import Hop


def test_equal():
    r = compare([517, 12, 9], [517, 12, 9], 3, 3)
    assert r == ParityResult("equal")
    assert r.describe() == "equal" and r.position is None


def test_diverged_at_k_with_tokens():
    r = compare([517, 13, 9], [517, 12, 9], 3, 3)
    assert (r.status, r.position, r.pd_token, r.ref_token) == ("diverged", 1, 13, 12)
    assert r.describe() == "diverged at 1: 13 != 12"


def test_diverged_at_first_token():
    r = compare([1, 2], [3, 2], 2, 2)
    assert r.position == 0 and r.describe() == "diverged at 0: 1 != 3"


def test_only_first_divergence_is_reported():
    r = compare([1, 9, 9, 9], [1, 2, 3, 4], 4, 4)
    assert (r.position, r.pd_token, r.ref_token) == (1, 9, 2)


def test_length_mismatch_pd_shorter():
    r = compare([517], [517, 12], 2, 2)
    assert (r.status, r.position, r.pd_token, r.ref_token) == ("diverged", 1, None, 12)
    assert r.describe() == "diverged at 1: None != 12"


def test_length_mismatch_reference_shorter():
    r = compare([517, 12, 4], [517, 12], 3, 3)
    assert (r.status, r.position, r.pd_token, r.ref_token) == ("diverged", 2, 4, None)


def test_empty_against_tokens():
    assert compare([], [5], 1, 1).position == 0
    assert compare([], [], 1, 1).status == "equal"


def test_refused_for_different_max_tokens():
    r = compare([517, 12], [517, 12], 2, 3)
    assert r.status == "refused" and r.position is None
    assert r.reason == "max_tokens differ (P/D 2, reference 3)"
    assert r.describe() == "refused: max_tokens differ (P/D 2, reference 3)"
    # Refused even when the tokens differ: a comparison under different caps means nothing.
    assert compare([1], [2], 1, 2).status == "refused"


def test_summarize():
    results = [compare([1], [1], 1, 1), compare([1], [2], 1, 1), compare([1], [1], 1, 2), None,
               compare([4, 5], [4, 5], 2, 2)]
    assert summarize(results) == {"compared": 3, "equal": 2, "diverged": 1, "refused": 1}
    assert summarize([]) == {"compared": 0, "equal": 0, "diverged": 0, "refused": 0}


# --- answer fields beyond the token IDs (compare_fields, compare_hops) ---

def _plp(*lps):
    return [None] + [{"17": {"logprob": lp, "rank": 1, "decoded_token": "a"}} for lp in lps]


def test_floats_at_the_tolerance_are_equal_and_just_beyond_are_not():
    # binary-exact values, so the difference is exactly the tolerance
    at = compare_fields({"x": [-1.0, -2.25]}, {"x": [-1.0, -2.5]}, tolerance=0.25)
    assert at.status == "equal" and at.max_float_diff == 0.25
    beyond = compare_fields({"x": [-1.0, -2.25]}, {"x": [-1.0, -2.5]}, tolerance=0.125)
    assert (beyond.status, beyond.field, beyond.pd_value, beyond.ref_value) == ("diverged", "x[1]", "-2.25", "-2.5")
    assert beyond.describe() == "diverged at x[1]: -2.25 != -2.5 (float tolerance 0.125)"


def test_the_first_differing_position_and_field_are_named():
    r = compare_fields({"choices": [{"text": "ab", "prompt_logprobs": _plp(-1.0, -3.0, -9.0)}]},
                       {"choices": [{"text": "ab", "prompt_logprobs": _plp(-1.0, -2.0, -8.0)}]})
    assert r.field == "choices[0].prompt_logprobs[2]['17'].logprob"
    assert (r.pd_value, r.ref_value) == ("-3.0", "-2.0")


def test_integers_strings_and_none_must_be_equal_exactly():
    assert compare_fields({"rank": 1}, {"rank": 2}, tolerance=5).field == "rank"
    assert compare_fields({"finish_reason": "stop"}, {"finish_reason": "length"}).field == "finish_reason"
    # a build that drops a field the reference has: None where the reference has a value
    r = compare_fields({"prompt_logprobs": None}, {"prompt_logprobs": _plp(-1.0)})
    assert r.status == "diverged" and r.field == "prompt_logprobs" and r.pd_value == "None"
    assert compare_fields({"x": [1, 2]}, {"x": [1]}).field == "x[1]"


def test_infinities_equal_themselves_and_nan_never_passes():
    inf = float("inf")
    assert compare_fields({"x": -inf}, {"x": -inf}, tolerance=0).status == "equal"
    assert compare_fields({"x": -inf}, {"x": -1e30}, tolerance=1e40).status == "diverged"
    assert compare_fields({"x": float("nan")}, {"x": -1.0}, tolerance=1e9).status == "diverged"


def test_a_field_only_in_the_answer_is_not_compared_and_named():
    r = compare_fields({"choices": [{"text": "a", "logprobs": {"token_logprobs": [-9.0]}}]},
                       {"choices": [{"text": "a", "logprobs": None}]})
    assert r.status == "equal" and r.not_compared == ("choices[0].logprobs (P/D only)",)
    assert r.describe() == "equal" and r.notes() == " (not compared: choices[0].logprobs (P/D only))"
    # a key the (streamed) answer never sent is not compared either
    r = compare_fields({"choices": [{"text": "a"}]}, {"usage": {"prompt_tokens": 3}, "choices": [{"text": "a"}]})
    assert r.status == "equal" and r.not_compared == ("usage (reference only)",)


def test_cached_tokens_are_not_an_answer_field():
    pd = {"usage": {"prompt_tokens": 64, "prompt_tokens_details": {"cached_tokens": 64}}}
    ref = {"usage": {"prompt_tokens": 64, "prompt_tokens_details": {"cached_tokens": 32}}}
    assert compare_fields(pd, ref).status == "equal"
    assert compare_fields({"usage": {"prompt_tokens": 63}}, ref).field == "usage.prompt_tokens"


def test_a_negative_tolerance_is_refused():
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        compare_fields({}, {}, tolerance=-1)


def _answer(lps, text="ab", finish="length"):
    return {"choices": [{"index": 0, "text": text, "token_ids": [1, 2], "finish_reason": finish, "stop_reason": None,
                         "logprobs": {"tokens": ["a", "b"], "token_logprobs": lps, "text_offset": [0, 1],
                                      "top_logprobs": [{"a": lps[0]}, {"b": lps[1]}]}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


def test_compare_hops_checks_fields_after_equal_tokens_and_names_the_choice():
    pd, ref = Hop("d"), Hop("p")
    fill_from_answer(pd, _answer([-1.0, -2.5]))
    fill_from_answer(ref, _answer([-1.0, -2.0]))
    r = compare_hops(pd, ref, 2, 2)
    assert r.status == "diverged" and r.field == "choices[0].logprobs.token_logprobs[1]" and r.choice == 0
    assert "index" not in pd.answer_fields["choices"][0] and "token_ids" not in pd.answer_fields["choices"][0]
    fill_from_answer(pd, _answer([-1.0, -2.0], finish="stop"))
    assert compare_hops(pd, ref, 2, 2).field == "choices[0].finish_reason"


def test_a_stream_is_merged_into_the_shape_of_a_whole_answer():
    pd, ref = Hop("d"), Hop("p")
    reader = StreamReader(pd, 0.0)
    for i, (tok, lp) in enumerate(((1, -1.0), (2, -2.0))):
        reader.feed_obj({"choices": [{"index": 0, "text": "ab"[i], "token_ids": [tok],
                                      "finish_reason": "length" if i else None, "stop_reason": None,
                                      "logprobs": {"tokens": ["ab"[i]], "token_logprobs": [lp], "text_offset": [i],
                                                   "top_logprobs": [{"ab"[i]: lp}]}}]})
    reader.feed("[DONE]")
    reader.finish()
    fill_from_answer(ref, _answer([-1.0, -2.0]))
    r = compare_hops(pd, ref, 2, 2)
    assert r.status == "equal", r.describe()
    assert r.not_compared == ("usage (reference only)",) and r.max_float_diff == 0.0


def test_a_chat_stream_is_merged_as_a_message_with_its_logprobs():
    pd, ref = Hop("d"), Hop("p")
    reader = StreamReader(pd, 0.0)
    reader.feed_obj({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}]})
    for i, word in enumerate(("a", "b")):
        reader.feed_obj({"choices": [{"index": 0, "delta": {"content": word}, "token_ids": [i],
                                      "logprobs": {"content": [{"token": word, "logprob": -0.5 * (i + 1)}]},
                                      "finish_reason": "length" if i else None}]})
    reader.feed("[DONE]")
    reader.finish()
    whole = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ab"}, "token_ids": [0, 1],
                          "logprobs": {"content": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -1.0}]},
                          "finish_reason": "length"}]}
    fill_from_answer(ref, whole)
    assert pd.answer_fields["choices"][0]["message"] == {"role": "assistant", "content": "ab"}
    assert compare_hops(pd, ref, 2, 2).status == "equal"
    whole["choices"][0]["logprobs"]["content"][1]["logprob"] = -1.5
    fill_from_answer(ref, whole)
    assert compare_hops(pd, ref, 2, 2).field == "choices[0].logprobs.content[1].logprob"

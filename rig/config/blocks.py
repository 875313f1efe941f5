"""KV block facts: what a pool of blocks holds, written once for the workloads, the judge and the explorer.

vLLM reserves block 0 of every KV pool as the *null block*: ``BlockPool.__init__`` pops it off the
free queue first ("a placeholder block with block_id=0", vllm/v1/core/block_pool.py) and never
hands it to a request. So a pool of ``N`` blocks (``--num-gpu-blocks-override N``, or
``num_gpu_blocks`` in ``vllm:cache_config_info``) has ``N - 1`` usable blocks: with 5 blocks of 32
tokens, 4 usable blocks hold 128 tokens and ``remote_block_ids`` come back as ``[[1, 2, 3, 4]]``.
A request of ``t`` tokens needs ``cdiv(t, block_size)`` blocks (vllm/v1/core/kv_cache_utils.py
``cdiv``).
"""

from __future__ import annotations

from dataclasses import dataclass

# Blocks of each pool that no request may use: block 0, the null block (vllm/v1/core/block_pool.py).
NULL_BLOCKS = 1


def usable_in_pool(num_gpu_blocks: int | None) -> int | None:
    """Blocks requests may use in a pool of ``num_gpu_blocks`` (the null block taken off); None when
    the pool size is unknown (None or 0: vLLM sized the cache itself and did not say)."""
    return num_gpu_blocks - NULL_BLOCKS if num_gpu_blocks else None


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks ``tokens`` tokens occupy: ``cdiv(tokens, block_size)``."""
    return -(-tokens // block_size)


@dataclass(frozen=True)
class BlockFacts:
    """One instance's KV arithmetic: ``block_size`` tokens per block, ``usable_blocks`` (the pool
    less vLLM's null block, :func:`usable_in_pool`; None when unknown), ``num_speculative_tokens``
    (k, 0 without spec decode) and ``max_model_len`` tokens."""

    block_size: int
    usable_blocks: int | None
    num_speculative_tokens: int
    max_model_len: int

    @property
    def tokens_that_fit(self) -> int | None:
        """Tokens the usable blocks hold (``usable_blocks x block_size``); None when unknown."""
        return None if self.usable_blocks is None else self.usable_blocks * self.block_size

    def blocks_for(self, tokens: int) -> int:
        """Blocks a prompt (or any run of tokens) of ``tokens`` tokens needs (:func:`blocks_for`)."""
        return blocks_for(tokens, self.block_size)

"""Which weights a topology serves (:class:`ModelConfig`) and the recipe of the rig's own tiny
model (:class:`TinyModelRecipe`); rig.cluster.tiny_model builds the model from the recipe.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rig.config.base import SERVED_NAME_PATTERN, StrictModel

# Bumped when rig.cluster.tiny_model's output format changes, so cached models are rebuilt (it
# enters cache_key, which rig.plan.k8s and the cluster both use to name the model directory).
BUILDER_VERSION = 3
MAX_TINY_PARAMS = 200_000_000  # 800 MB of float32 weights; the default recipe has about 0.6 million


class TinyModelRecipe(BaseModel):
    """Shape and seed of the tiny model; every field enters the cache key.

    The CPU attention backend accepts head sizes 32, 64, 80, 96, ... (docs/explanation/vllm-cpu-facts.md), hence
    ``head_dim`` 32 by default.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    # The upper bounds (le=, MAX_TINY_PARAMS) keep it tiny: a typo such as hidden_size 100000000 would
    # otherwise build a model of terabytes before any server starts.

    hidden_size: int = Field(128, gt=0, le=8_192, description="model width (elements)")
    intermediate_size: int = Field(256, gt=0, le=32_768, description="MLP width (elements)")
    num_hidden_layers: int = Field(2, gt=0, le=64)
    num_attention_heads: int = Field(4, gt=0, le=256)
    num_key_value_heads: int = Field(2, gt=0, le=256)
    head_dim: int = Field(32, gt=0, le=1_024, description="per-head size; CPU backend needs 32, 64, 80, 96, ...")
    vocab_size: int = Field(1024, ge=300, le=262_144, description="tokens; also the BPE target vocabulary")
    max_position_embeddings: int = Field(4096, gt=0, le=1_048_576, description="tokens")
    weight_std: float = Field(0.3, gt=0, description="std of every projection/embedding weight")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="seed of the weights (numpy's seed range)")

    def parameters(self) -> int:
        """Weights of the model this recipe builds (embedding and head, attention, MLP; norms left
        out), for the bound :data:`MAX_TINY_PARAMS`."""
        attn = self.hidden_size * self.head_dim * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        return 2 * self.vocab_size * self.hidden_size + self.num_hidden_layers * (attn + mlp)

    @model_validator(mode="after")
    def _tiny(self) -> TinyModelRecipe:
        if self.parameters() > MAX_TINY_PARAMS:
            raise ValueError(f"{self.parameters():,} weights, more than the {MAX_TINY_PARAMS:,} of a tiny model "
                             "(4 bytes each, built in memory before any server starts); make it smaller "
                             "(hidden_size, intermediate_size, num_hidden_layers, vocab_size)")
        return self

    def cache_key(self) -> str:
        """Return a short hex digest of the recipe and ``BUILDER_VERSION``."""
        payload = json.dumps({"v": BUILDER_VERSION, **self.model_dump()}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


class ModelConfig(StrictModel):
    """Which weights to serve: the rig's own tiny model, a local path, or a hub id (GPU nodes)."""

    source: Literal["tiny", "path", "hub"] = "tiny"
    path: str | None = Field(None, description="local directory (source=path) or hub id (source=hub)")
    served_name: str = Field("tiny", pattern=SERVED_NAME_PATTERN,
                             description="the model's name in the OpenAI API (vLLM --served-model-name): "
                                         "letters, digits and ._/:@+- (e.g. qwen3-0.6b, org/model)")
    tiny: TinyModelRecipe = Field(default_factory=TinyModelRecipe)

    @model_validator(mode="after")
    def _path_given(self) -> ModelConfig:
        if self.source != "tiny" and not self.path:
            raise ValueError(f"source={self.source!r} needs model.path (a directory or hub id)")
        return self

"""Which weights a topology serves (:class:`ModelConfig`) and the recipe of the rig's own tiny
model (:class:`TinyModelRecipe`); rig.cluster.tiny_model builds the model from the recipe.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rig.config.base import StrictModel

# Bumped when rig.cluster.tiny_model's output format changes, so cached models are rebuilt (it
# enters cache_key, which rig.plan.k8s and the cluster both use to name the model directory).
BUILDER_VERSION = 3


class TinyModelRecipe(BaseModel):
    """Shape and seed of the tiny model; every field enters the cache key.

    The CPU attention backend accepts head sizes 32, 64, 80, 96, ... (docs/explanation/vllm-cpu-facts.md), hence
    ``head_dim`` 32 by default.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    hidden_size: int = Field(128, gt=0, description="model width (elements)")
    intermediate_size: int = Field(256, gt=0, description="MLP width (elements)")
    num_hidden_layers: int = Field(2, gt=0)
    num_attention_heads: int = Field(4, gt=0)
    num_key_value_heads: int = Field(2, gt=0)
    head_dim: int = Field(32, gt=0, description="per-head size; CPU backend needs 32, 64, 80, 96, ...")
    vocab_size: int = Field(1024, ge=300, description="tokens; also the BPE target vocabulary")
    max_position_embeddings: int = Field(4096, gt=0, description="tokens")
    weight_std: float = Field(0.3, gt=0, description="std of every projection/embedding weight")
    seed: int = 0

    def cache_key(self) -> str:
        """Return a short hex digest of the recipe and ``BUILDER_VERSION``."""
        payload = json.dumps({"v": BUILDER_VERSION, **self.model_dump()}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


class ModelConfig(StrictModel):
    """Which weights to serve: the rig's own tiny model, a local path, or a hub id (GPU nodes)."""

    source: Literal["tiny", "path", "hub"] = "tiny"
    path: str | None = Field(None, description="local directory (source=path) or hub id (source=hub)")
    served_name: str = "tiny"
    tiny: TinyModelRecipe = Field(default_factory=TinyModelRecipe)

    @model_validator(mode="after")
    def _path_given(self) -> ModelConfig:
        if self.source != "tiny" and not self.path:
            raise ValueError(f"source={self.source!r} needs model.path (a directory or hub id)")
        return self

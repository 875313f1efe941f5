"""Typed request schemas of vLLM 0.32.0's completions and chat models, for explorer tests: the
stored dump (tests/data/vllm-0.32.0-request-schemas.json) has the field names only, so each name the
explorer may draw gets the type its model gives it."""

from __future__ import annotations

import json
from pathlib import Path

# vLLM 0.32.0's field names (the stored dump has no types): each with the type its model gives it
NAMES = json.loads((Path(__file__).parents[1] / "data" / "vllm-0.32.0-request-schemas.json").read_text())["schemas"]
TYPES = {**dict.fromkeys(("add_special_tokens", "echo", "return_token_ids", "return_tokens_as_token_ids",
                          "skip_special_tokens", "spaces_between_special_tokens"), {"type": "boolean"}),
         **dict.fromkeys(("logprobs", "min_tokens", "n", "prompt_logprobs", "top_k", "seed"), {"type": "integer"}),
         **dict.fromkeys(("frequency_penalty", "presence_penalty", "repetition_penalty", "temperature"),
                         {"type": "number"}),
         "allowed_token_ids": {"type": "array", "items": {"type": "integer"}},
         "cache_salt": {"type": "string"}, "user": {"type": "string"},
         "truncation_side": {"enum": ["left", "right"], "type": "string"}}
SCHEMAS = {ep: {"properties": {k: t for k, t in TYPES.items() if k in NAMES[ep]["properties"]}}
           for ep in ("completions", "chat")}

"""Request fields per hop (issue #12 item 1): OpenAI ``/v1/completions`` fields a scenario adds to
the prefill hop, the decode hop, the non-disaggregated reference, or all three.

Validated as data (a field name the completions endpoint of vLLM 0.32.0 does not know, or one the
rig owns, is one error naming it and the fix) and passed through unchanged. The rig owns
``model``, ``prompt`` and ``kv_transfer_params`` and ``max_tokens`` on every hop (the scenario's ``max_tokens``; 1 on
the prefill hop: P computes the prompt and one token, as vLLM's proxy asks,
tests/v1/kv_connector/nixl_integration/toy_proxy_server.py); on the prefill hop also ``stream``
(a streamed answer carries no ``kv_transfer_params``, so D would have nothing to pull).

Field names: the OpenAI completions API plus vLLM's extensions
(vllm/entrypoints/openai/completion/protocol.py ``CompletionRequest``, 0.32.0). The chat
endpoint is not driven yet: the rig's prompts are token-ID lists, which chat messages cannot carry.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

OPENAI_FIELDS = frozenset({
    "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n", "presence_penalty",
    "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user"})
VLLM_FIELDS = frozenset({
    "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids", "include_stop_str_in_output",
    "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
    "allowed_token_ids", "prompt_logprobs", "bad_words", "use_beam_search", "add_special_tokens", "response_format",
    "structured_outputs", "priority", "request_id", "logits_processors", "return_tokens_as_token_ids",
    "return_token_ids", "cache_salt", "vllm_xargs"})
COMPLETIONS_FIELDS = OPENAI_FIELDS | VLLM_FIELDS
RIG_OWNED = {"model": "the served model name", "prompt": "the scenario's prompt (prompt_tokens, seed)",
             "kv_transfer_params": "the P/D handshake the rig builds",
             "max_tokens": "the scenario's max_tokens (1 on the prefill hop, as vLLM's proxy asks)"}
PREFILL_OWNED = {"stream": "a streamed answer carries no kv_transfer_params, so D would have nothing to pull"}
HOPS = ("prefill", "decode", "reference")


def _check(fields: dict[str, Any], where: str, owned: dict[str, str]) -> dict[str, Any]:
    unknown = sorted(k for k in fields if k not in COMPLETIONS_FIELDS and k not in owned)
    if unknown:
        raise ValueError(f"request.{where}: unknown completions field(s) {unknown}; give OpenAI / vLLM "
                         "CompletionRequest fields (e.g. n, logprobs, stop, stream, top_k)")
    mine = sorted(k for k in fields if k in owned)
    if mine:
        raise ValueError(f"request.{where}: {', '.join(mine)} set by the rig ({'; '.join(owned[k] for k in mine)}); "
                         "remove it")
    return fields


class RequestFields(BaseModel):
    """Extra completions fields per hop; ``all`` applies to every hop, a hop's own fields win.

    ``for_hop(hop)`` returns the merged fields of ``hop`` (prefill / decode / reference)."""

    model_config = ConfigDict(extra="forbid")

    all: dict[str, Any] = Field(default_factory=dict, description="fields for every hop")
    prefill: dict[str, Any] = Field(default_factory=dict, description="fields for the prefill hop only")
    decode: dict[str, Any] = Field(default_factory=dict, description="fields for the decode hop only")
    reference: dict[str, Any] = Field(default_factory=dict,
                                      description="fields for the non-disaggregated reference only")

    @field_validator("all", "decode", "reference")
    @classmethod
    def _known(cls, v: dict[str, Any], info) -> dict[str, Any]:
        return _check(v, info.field_name, RIG_OWNED if info.field_name != "all" else {**RIG_OWNED, **PREFILL_OWNED})

    @field_validator("prefill")
    @classmethod
    def _known_prefill(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check(v, "prefill", {**RIG_OWNED, **PREFILL_OWNED})

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> RequestFields:
        for hop in HOPS:
            f = self.for_hop(hop)
            if "stream_options" in f and not f.get("stream"):
                raise ValueError(f"request.{hop}: stream_options needs stream: true on that hop")
        return self

    def for_hop(self, hop: str) -> dict[str, Any]:
        """The fields of ``hop`` ('prefill' | 'decode' | 'reference'): ``all`` then the hop's own."""
        return {**self.all, **getattr(self, hop)}

    def streamed(self, hop: str) -> bool:
        """True when ``hop`` asks for a streamed (SSE) answer."""
        return bool(self.for_hop(hop).get("stream"))

"""Request fields per hop: OpenAI ``/v1/completions`` or
``/v1/chat/completions`` fields a scenario adds to the prefill hop, the decode hop, the
non-disaggregated reference, or all three; which endpoint a scenario's requests use; and how
many prompts one completions request carries.

Validated as data (a field name the completions endpoint of vLLM 0.32.0 does not know, or one the
rig owns, is one error naming it and the fix) and passed through unchanged. The rig owns
``model``, ``prompt`` and ``kv_transfer_params`` and ``max_tokens`` on every hop (the scenario's ``max_tokens``; 1 on
the prefill hop: P computes the prompt and one token, as vLLM's proxy asks,
tests/v1/kv_connector/nixl_integration/toy_proxy_server.py); on the prefill hop also ``stream``
(a streamed answer carries no ``kv_transfer_params``, so D would have nothing to pull).

Field names: the OpenAI completions and chat APIs plus vLLM's extensions
(vllm/entrypoints/openai/completion/protocol.py ``CompletionRequest`` and
chat_completion/protocol.py ``ChatCompletionRequest``, 0.32.0). On the chat endpoint the rig also
owns ``messages`` (one user message carrying the prompt's token IDs as decimal words,
rig.transport.bodies.chat_text) and ``max_completion_tokens``. Several prompts in one request
(``prompts: N``) is a completions feature: chat takes one conversation per request.

``endpoint: generate`` is vLLM's token-in generate endpoint ``/inference/v1/generate``
(entrypoints/scale_out/token_in_token_out/protocol.py ``GenerateRequest``, 0.32.0; bug record R21): the
fields are its top-level ones, sampling fields go in a nested ``sampling_params`` mapping
(vllm/sampling_params.py ``SamplingParams``), and the rig owns ``token_ids`` and
``sampling_params.max_tokens``. The servers must run with ``--enable-scale-out`` (or
``--tokens-only``), else vLLM answers 403 "Scale-out endpoints are disabled".
"""

from __future__ import annotations

import math
from typing import Any, Literal

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
CHAT_FIELDS = frozenset({
    "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "n", "presence_penalty", "response_format",
    "seed", "stop", "stream", "stream_options", "temperature", "top_p", "tools", "tool_choice", "reasoning_effort",
    "include_reasoning", "parallel_tool_calls", "user", "use_beam_search", "top_k", "min_p", "repetition_penalty",
    "length_penalty", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
    "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens", "allowed_token_ids",
    "prompt_logprobs", "bad_words", "echo", "add_generation_prompt", "continue_final_message", "add_special_tokens",
    "documents", "chat_template", "chat_template_kwargs", "structured_outputs", "priority", "request_id",
    "return_tokens_as_token_ids", "return_token_ids", "cache_salt", "vllm_xargs"})
GENERATE_FIELDS = frozenset({
    "request_id", "sampling_params", "cache_salt", "priority", "stream", "stream_options", "output_mode",
    "return_token_ids", "token_offsets", "reasoning_ended"})
SAMPLING_FIELDS = frozenset({
    "n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens",
    "logprobs", "prompt_logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty", "bad_words",
    "allowed_token_ids", "logit_bias", "include_stop_str_in_output", "skip_special_tokens",
    "spaces_between_special_tokens", "detokenize", "structured_outputs", "extra_args", "thinking_token_budget",
    "flat_logprobs", "skip_reading_prefix_cache"})
RIG_OWNED = {"model": "the served model name", "prompt": "the scenario's prompt (prompt_tokens, seed)",
             "kv_transfer_params": "the P/D handshake the rig builds",
             "max_tokens": "the scenario's max_tokens (1 on the prefill hop, as vLLM's proxy asks)"}
CHAT_OWNED = {**RIG_OWNED, "messages": "one user message with the scenario's prompt",
              "max_completion_tokens": "the scenario's max_tokens (sent as max_tokens)"}
GENERATE_OWNED = {**RIG_OWNED, "token_ids": "the scenario's prompt (prompt_tokens, seed)"}
PREFILL_OWNED = {"stream": "a streamed answer carries no kv_transfer_params, so D would have nothing to pull"}
HOPS = ("prefill", "decode", "reference")


def _check_sampling(fields: dict[str, Any], where: str) -> None:
    """The nested ``sampling_params`` of a generate-endpoint hop: a mapping of SamplingParams
    fields, ``max_tokens`` excepted (the rig's)."""
    sp = fields.get("sampling_params")
    if sp is None:
        return
    if not isinstance(sp, dict):
        raise ValueError(f"request.{where}.sampling_params: give a mapping of SamplingParams fields, e.g. {{seed: 7}}")
    if "max_tokens" in sp:
        raise ValueError(f"request.{where}.sampling_params.max_tokens set by the rig ({RIG_OWNED['max_tokens']}); "
                         "remove it")
    unknown = sorted(k for k in sp if k not in SAMPLING_FIELDS)
    if unknown:
        raise ValueError(f"request.{where}.sampling_params: unknown field(s) {unknown}; give vLLM SamplingParams "
                         "fields (e.g. temperature, seed, stop_token_ids, logprobs)")


def _finite(value: Any, where: str) -> None:
    """Raise ValueError naming the field for a NaN or infinite number anywhere in ``value``: JSON
    has no such number, so a request carrying one would not be valid JSON."""
    stack = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{at}: {v} is not a number JSON can carry; give a finite number")
        if isinstance(v, dict):
            stack.extend((x, f"{at}.{k}") for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v))


def _check(fields: dict[str, Any], where: str, owned: dict[str, str], endpoint: str = "completions") -> dict[str, Any]:
    _finite(fields, f"request.{where}")
    known = {"chat": CHAT_FIELDS, "generate": GENERATE_FIELDS}.get(endpoint, COMPLETIONS_FIELDS)
    if endpoint == "chat":
        owned = {**owned, **CHAT_OWNED}
    if endpoint == "generate":
        owned = {**owned, **GENERATE_OWNED}
        _check_sampling(fields, where)
    unknown = sorted(k for k in fields if k not in known and k not in owned)
    if unknown:
        what = {"chat": "ChatCompletionRequest", "generate": "GenerateRequest"}.get(endpoint, "CompletionRequest")
        example = ("sampling_params, cache_salt, priority" if endpoint == "generate"
                   else "n, logprobs, stop, stream, top_k")
        raise ValueError(f"request.{where}: unknown {endpoint} field(s) {unknown}; give OpenAI / vLLM "
                         f"{what} fields (e.g. {example})")
    mine = sorted(k for k in fields if k in owned)
    if mine:
        raise ValueError(f"request.{where}: {', '.join(mine)} set by the rig ({'; '.join(owned[k] for k in mine)}); "
                         "remove it")
    return fields


class RequestFields(BaseModel):
    """Extra request fields per hop; ``all`` applies to every hop, a hop's own fields win.

    ``for_hop(hop)`` returns the merged fields of ``hop`` (prefill / decode / reference).
    ``endpoint``: the endpoint of every hop (``completions``, ``chat`` or ``generate``). ``prompts``:
    prompts in one completions request (distinct, each ``prompt_tokens`` long); vLLM answers one
    choice per prompt (and per ``n``), so parity and usage are checked per choice."""

    model_config = ConfigDict(extra="forbid")

    endpoint: Literal["completions", "chat", "generate"] = Field(
        default="completions", description="completions (/v1/completions), chat (/v1/chat/completions) or "
                                           "generate (/inference/v1/generate: token IDs in and out; the servers "
                                           "need --enable-scale-out)")
    prompts: int = Field(default=1, ge=1, le=64,
                         description="prompts in one completions request (a list of token-ID lists)")

    all: dict[str, Any] = Field(default_factory=dict, description="fields for every hop")
    prefill: dict[str, Any] = Field(default_factory=dict, description="fields for the prefill hop only")
    decode: dict[str, Any] = Field(default_factory=dict, description="fields for the decode hop only")
    reference: dict[str, Any] = Field(default_factory=dict,
                                      description="fields for the non-disaggregated reference only")

    @field_validator("all", "decode", "reference")
    @classmethod
    def _known(cls, v: dict[str, Any], info) -> dict[str, Any]:
        return _check(v, info.field_name, RIG_OWNED if info.field_name != "all" else {**RIG_OWNED, **PREFILL_OWNED},
                      info.data.get("endpoint", "completions"))

    @field_validator("prefill")
    @classmethod
    def _known_prefill(cls, v: dict[str, Any], info) -> dict[str, Any]:
        return _check(v, "prefill", {**RIG_OWNED, **PREFILL_OWNED}, info.data.get("endpoint", "completions"))

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> RequestFields:
        if self.endpoint != "completions" and self.prompts > 1:
            raise ValueError(f"request.prompts: {self.prompts} prompts in one request needs endpoint: completions "
                             f"({self.endpoint} takes one prompt per request); set prompts: 1 or endpoint: completions")
        if self.endpoint == "generate" and any(self.streamed(h) for h in HOPS):
            raise ValueError("request: stream on the generate endpoint is not supported by the rig yet (its stream "
                             "chunks are not read); remove stream, or use endpoint: completions")
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

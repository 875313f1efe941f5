"""What a router does between the hops, as data: the transform from the prompt and P's answer to
D's request(s) (:class:`Transform`), and the router a scenario's traffic goes through instead of
the rig's own two hops (:class:`RouterConfig`).

A transform describes what real routers do to the decode hop's body, so a scenario can reproduce
it: append P's first generated token to D's prompt (bug record R26; vllm PR #50558, #51505: D then
allocates its blocks for one token more than P exported), strip fields of D's body or rewrite
them, send several decode hops from one P answer. The rig's one implementation is the pure
function rig.transport.hops.derive_decode (``(transform, prompt, P's answer) -> D's requests``);
parity is computed for the prompt D actually got.

A router route sends the whole request to a router (``pdrig proxy`` the rig starts on a port it
reserves, or a router the user runs, ``url``); the client sees only the router's answer, and the
rig judges that answer (status, body, streams ending with ``[DONE]``) together with P's and D's own
evidence (kv pulled from /metrics deltas, alive, logs).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from rig.config.base import StrictModel

# Fields of D's body a transform may not rewrite with ``set``: the prompt is the transform's own
# business (``append_first_token``), the model is the served one, and P's kv_transfer_params are
# what D pulls (strip them to model a router that forgets them).
_NOT_SETTABLE = {"prompt": "use append_first_token to change D's prompt",
                 "messages": "use append_first_token to change D's prompt",
                 "token_ids": "use append_first_token to change D's prompt",
                 "model": "the served model name is the rig's",
                 "kv_transfer_params": "P's answer gives them; strip them to model a router that drops them"}
_NOT_STRIPPABLE = {"prompt": "D needs a prompt", "messages": "D needs a prompt", "token_ids": "D needs a prompt",
                   "model": "vLLM refuses a body without model"}


class Transform(StrictModel):
    """How a router derives D's request(s) from the prompt and P's answer (module docstring).

    ``append_first_token``: D's prompt = the prompt + P's first generated token (token-ID prompts;
    as some routers send it, bug record R26). ``strip``: top-level field names removed from D's body
    (after the rig built it, ``kv_transfer_params`` included). ``set``: fields written into D's body
    (overriding the rig's, e.g. ``{max_tokens: 4}``); the reference gets the same fields, so parity
    is computed for the request D got. ``decode_hops``: decode hops sent, together, with the one
    P answer (each a request of its own)."""

    append_first_token: bool = Field(
        False, description="D's prompt = the prompt + P's first generated token, as some routers send it "
                           "(vllm PR #50558, #51505); parity against the reference of that longer prompt")
    strip: list[str] = Field(default_factory=list,
                             description="top-level fields removed from D's body, e.g. [kv_transfer_params]")
    set: dict[str, Any] = Field(default_factory=dict,
                                description="fields written into D's body (and the reference's), e.g. {max_tokens: 4}")
    decode_hops: int = Field(1, ge=1, le=16, description="decode hops sent together with the one P answer")

    @field_validator("set")
    @classmethod
    def _settable(cls, v: dict[str, Any]) -> dict[str, Any]:
        bad = sorted(k for k in v if k in _NOT_SETTABLE)
        if bad:
            raise ValueError(f"transform.set: {bad[0]} cannot be set ({_NOT_SETTABLE[bad[0]]}); remove it")
        return v

    @field_validator("strip")
    @classmethod
    def _strippable(cls, v: list[str]) -> list[str]:
        bad = sorted(k for k in v if k in _NOT_STRIPPABLE)
        if bad:
            raise ValueError(f"transform.strip: {bad[0]} cannot be stripped ({_NOT_STRIPPABLE[bad[0]]}); remove it")
        return v

    @model_validator(mode="after")
    def _no_overlap(self) -> Transform:
        both = sorted(set(self.strip) & set(self.set))
        if both:
            raise ValueError(f"transform: {both[0]} is both stripped and set; keep one")
        return self

    @property
    def identity(self) -> bool:
        """True when the transform changes nothing (D gets the rig's own decode body, once)."""
        return not (self.append_first_token or self.strip or self.set) and self.decode_hops == 1

    def describe(self) -> str:
        """'append-first-token, strip [x], set {y}, x2' style label ('' for the identity)."""
        parts = (["append-first-token"] if self.append_first_token else []) + \
            ([f"strip {self.strip}"] if self.strip else []) + ([f"set {self.set}"] if self.set else []) + \
            ([f"x{self.decode_hops} decode hops"] if self.decode_hops > 1 else [])
        return ", ".join(parts)


class RouterConfig(StrictModel):
    """The router a scenario's ``router`` route goes through: ``url`` None = ``pdrig proxy``
    (rig/proxy.py) started by the rig for the run over the scenario's prefill and decode, on a
    port it reserves; else the base URL of a router the user runs (it must serve
    ``/v1/completions`` and pick the scenario's P and D)."""

    url: str | None = Field(None, description="None = pdrig proxy started by the rig; else a router's base URL, "
                                              "e.g. http://127.0.0.1:8000")

    @field_validator("url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"router.url {v!r}: give a base URL like http://127.0.0.1:8000 (or omit it: the rig "
                             "starts pdrig proxy)")
        return v.rstrip("/") if v else v

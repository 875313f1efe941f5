"""The request models of the vLLM build the servers will run, read without importing vLLM here.

The rig's core never imports vLLM, so a subprocess of the build's interpreter (``launch.command``'s
python) does it: it dumps the JSON schema of each endpoint's request model and runs the bodies the
rig will send through the same validation the server applies before it answers, so a body the
build refuses is one clear error in seconds, before any server starts (vLLM 0.32.0 refuses
``n: 2`` with greedy sampling with HTTP 400 only after a ~70 s start-up).

Endpoints (:data:`MODELS`, vLLM 0.32.0):

- ``completions``: ``vllm.entrypoints.openai.completion.protocol.CompletionRequest``;
- ``chat``: ``vllm.entrypoints.openai.chat_completion.protocol.ChatCompletionRequest``;
- ``generate``: ``vllm.entrypoints.scale_out.token_in_token_out.protocol.GenerateRequest`` (the
  token-in endpoint ``/inference/v1/generate``);
- ``sampling_params``: the fields of ``vllm.sampling_params.SamplingParams`` (a msgspec struct,
  no pydantic schema: ``{"properties": {field: {}}}``), the generate body's nested object.

A server's validation of a body: ``model_validate`` (a generate body's ``sampling_params`` is built
there, and ``SamplingParams.__post_init__`` raises e.g. "n must be 1 when using greedy sampling"),
then, for completions and chat, ``to_sampling_params(max_tokens, {})`` as the serving layer does
(vllm/entrypoints/openai/completion/serving.py). The OpenAI models accept unknown fields (they only
log them), so a misspelled field is found from the schema's ``properties`` instead
(:func:`unknown_fields`).

Results are cached under ``<cache_dir>/request-schemas/``: the schemas per vLLM version
(``vllm-<version>.json``), each validation per version and bodies (``checked-<version>-<sha>.json``),
so only the first run against a build pays the interpreter's vLLM import (~16 s on a loaded 2-core
box). Nothing is cached when the version is unknown.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rig.cluster.builds import launch_vllm_version

MODELS: dict[str, str] = {
    "completions": "vllm.entrypoints.openai.completion.protocol:CompletionRequest",
    "chat": "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest",
    "generate": "vllm.entrypoints.scale_out.token_in_token_out.protocol:GenerateRequest",
}
CACHE_SUBDIR = "request-schemas"
TIMEOUT_S = 600  # the subprocess imports vLLM and torch: minutes on a loaded host

# Run by the build's interpreter: stdin {"models": MODELS, "bodies": [[endpoint, body, max_tokens]]};
# stdout one JSON line {"schemas": {endpoint: schema}, "missing": {endpoint: why}, "errors": [msg|null]}.
_SCRIPT = r'''
import importlib, json, sys
req = json.load(sys.stdin)
out = {"schemas": {}, "missing": {}, "errors": []}
classes = {}
for ep, where in req["models"].items():
    mod, _, name = where.partition(":")
    try:
        classes[ep] = getattr(importlib.import_module(mod), name)
    except Exception as e:
        out["missing"][ep] = f"{where}: {type(e).__name__}: {e}"
        continue
    try:
        out["schemas"][ep] = classes[ep].model_json_schema()
    except Exception as e:  # a model pydantic cannot render: its field names still catch misspellings
        out["schemas"][ep] = {"properties": {f: {} for f in classes[ep].model_fields}}
        out["missing"][ep + ".types"] = f"{where}: no JSON schema ({type(e).__name__}: {e}); field names only"
try:
    from vllm.sampling_params import SamplingParams
    out["schemas"]["sampling_params"] = {"properties": {
        f: {} for f in getattr(SamplingParams, "__struct_fields__", ()) if not f.startswith("_")}}
except Exception as e:
    out["missing"]["sampling_params"] = f"vllm.sampling_params:SamplingParams: {type(e).__name__}: {e}"
for ep, body, max_tokens in req["bodies"]:
    cls = classes.get(ep)
    if cls is None:
        out["errors"].append(None)
        continue
    try:
        r = cls.model_validate(body)
        if hasattr(r, "to_sampling_params"):
            r.to_sampling_params(max_tokens, {})
        out["errors"].append("")
    except Exception as e:
        text = str(e).strip().splitlines()
        out["errors"].append(f"{type(e).__name__}: {' '.join(t.strip() for t in text)[:600]}")
print(json.dumps(out))
'''


@dataclass(frozen=True)
class HopBody:
    """One body the rig will send: ``where`` names it for people ("scenario r16, prefill hop"),
    ``endpoint`` is a key of :data:`MODELS`, ``max_tokens`` the tokens the serving layer passes to
    ``to_sampling_params``; ``fields`` the scenario's own fields in it (only those are looked up in
    the schema: the rig's own are its business)."""

    where: str
    endpoint: str
    body: dict[str, Any]
    max_tokens: int
    fields: dict[str, Any]


def build_python(command: list[str], rig_python: str) -> str | None:
    """The interpreter of ``launch.command``: ``rig_python`` for ``{python}``, a ``python*`` path
    as given, None for anything else (``vllm serve`` from PATH: nothing to ask)."""
    first = command[0] if command else ""
    if "{python}" in first:
        return rig_python
    return first if Path(first).name.startswith("python") else None


def _run(python: str, bodies: list[HopBody]) -> dict[str, Any]:
    """Run :data:`_SCRIPT` under ``python``. Raises RuntimeError with the interpreter's last
    error line when it fails or does not answer within :data:`TIMEOUT_S`."""
    req = {"models": MODELS, "bodies": [[b.endpoint, b.body, b.max_tokens] for b in bodies]}
    try:
        r = subprocess.run([python, "-c", _SCRIPT], input=json.dumps(req), capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"{python}: {type(e).__name__}: {e}") from None
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{python} exited {r.returncode}: {last}")
    return json.loads(lines[-1])


def _cache(cache_dir: Path, name: str) -> Path:
    return Path(cache_dir) / CACHE_SUBDIR / name


def request_schemas(python: str, cache_dir: Path) -> dict[str, dict]:
    """``{endpoint: JSON schema}`` of the request models of the vLLM build ``python`` runs
    (:data:`MODELS` plus ``sampling_params``); an endpoint the build lacks is left out. Cached per
    vLLM version under ``cache_dir``. Raises RuntimeError when the interpreter cannot answer."""
    version = launch_vllm_version([python])
    path = _cache(cache_dir, f"vllm-{version}.json")
    if version and path.exists():
        return json.loads(path.read_text())["schemas"]
    out = _run(python, [])
    if version:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"version": version, "schemas": out["schemas"], "missing": out["missing"]}))
    return out["schemas"]


def unknown_fields(schemas: dict[str, dict], endpoint: str, body: dict[str, Any]) -> list[str]:
    """One message per field of ``body`` that the ``endpoint`` schema has no property for (a
    generate body's ``sampling_params`` keys against ``sampling_params``), with the nearest known
    name: "logprob: not a completions field; did you mean `logprobs`?". Empty when the schema is
    missing (not checked) or every field is known."""
    out = []
    for ep, fields, prefix in ((endpoint, body, ""),
                               ("sampling_params", body.get("sampling_params") if endpoint == "generate" else None,
                                "sampling_params.")):
        known = set((schemas.get(ep) or {}).get("properties") or ())
        if not known or not isinstance(fields, dict):
            continue
        for name in fields:
            if name not in known:
                near = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f"; did you mean `{near[0]}`?" if near else ""
                out.append(f"{prefix}{name}: not a {ep} field of this vLLM build{hint}")
    return out


def validate_bodies(python: str, cache_dir: Path, bodies: list[HopBody]) -> tuple[list[str], list[str]]:
    """``(problems, not_checked)`` of ``bodies`` against the vLLM build ``python`` runs: a
    problem per body the build would refuse, "<where>: <field>: not a <endpoint> field ...; did you
    mean ...?" (:func:`unknown_fields`) or "<where>: <the build's exception>", and the endpoints it
    could not check (the build lacks their model). Cached per vLLM version and bodies. Raises
    RuntimeError when the interpreter cannot answer."""
    version = launch_vllm_version([python])
    key = hashlib.sha256(json.dumps([[b.endpoint, b.body, b.max_tokens] for b in bodies], sort_keys=True)
                         .encode()).hexdigest()[:16]
    path = _cache(cache_dir, f"checked-{version}-{key}.json")
    if version and path.exists():
        cached = json.loads(path.read_text())
        return cached["problems"], cached["not_checked"]
    out = _run(python, bodies)
    schemas, errors = out["schemas"], out["errors"]
    problems = [f"{b.where}: {msg}" for b in bodies for msg in unknown_fields(schemas, b.endpoint, b.fields)]
    problems += [f"{b.where}: vLLM {version or ''} refuses the body: {err}".replace("  ", " ")
                 for b, err in zip(bodies, errors, strict=True) if err]
    not_checked = sorted({f"{b.endpoint} ({out['missing'].get(b.endpoint, 'no model')})"
                          for b, err in zip(bodies, errors, strict=True) if err is None})
    if version:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"problems": problems, "not_checked": not_checked}))
        schema_path = _cache(cache_dir, f"vllm-{version}.json")
        if not schema_path.exists():
            schema_path.write_text(json.dumps({"version": version, "schemas": schemas, "missing": out["missing"]}))
    return problems, not_checked

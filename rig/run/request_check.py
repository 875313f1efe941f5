"""Request fields validated as the build will validate them, before any server starts.

Every hop body the selected scenarios will send (prefill, decode, the non-disaggregated reference;
each sequence step's) is built as the workload builds it (rig.transport.bodies) and checked against
the request models of the vLLM build in ``launch.command`` (rig.cluster.request_schemas): a
misspelled field ("logprob: ... did you mean `logprobs`?") or a body the build refuses ("n must be 1
when using greedy sampling, got 2.") is one :class:`~rig.config.ConfigError` in seconds, instead of
an HTTP 400 after a minute of start-up. The prompt is a fixed short token list: validation does
not depend on its length (``max_model_len`` is the config's rule), and equal bodies are checked once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from rig.cluster.request_schemas import HopBody, build_python, validate_bodies
from rig.config import ConfigError, RigConfig, ScenarioConfig
from rig.config.request_fields import HOPS
from rig.transport.bodies import decode_body, prefill_body, request_body

PROMPT = [3, 4, 5, 6]  # token IDs every vocabulary has (rig.workload.prompts.DEFAULT_LO on)


def _hops(where: str, model: str, fields_of: Callable[[str], dict], endpoint: str, prompts: int,
          max_tokens: int) -> list[HopBody]:
    out = []
    prompt = PROMPT if prompts == 1 else [PROMPT] * prompts
    for hop in HOPS:
        fields = fields_of(hop)
        body = request_body(endpoint, model, prompt, max_tokens, **json.loads(json.dumps(fields)))
        if hop == "prefill":
            out.append(HopBody(f"{where}, prefill hop", endpoint, prefill_body(body), 1, fields))
        elif hop == "decode":
            out.append(HopBody(f"{where}, decode hop", endpoint, decode_body(body, {"do_remote_prefill": True}),
                               max_tokens, fields))
        else:
            out.append(HopBody(f"{where}, reference", endpoint, body, max_tokens, fields))
    return out


def hop_bodies(cfg: RigConfig, scenarios: list[ScenarioConfig]) -> list[HopBody]:
    """The bodies of every hop of ``scenarios`` that carry request fields (edge and fault
    ``request``, sequence steps' ``request`` / ``ignore_eos``), one per distinct body."""
    model = cfg.model.served_name
    out: list[HopBody] = []
    for sc in scenarios:
        if sc.request is not None:
            rf = sc.request
            out += _hops(f"scenario {sc.name}", model, rf.for_hop, rf.endpoint, rf.prompts, sc.max_tokens)
        for st in sc.sequence.steps if sc.sequence else []:
            if st.request is not None or st.ignore_eos:
                out += _hops(f"scenario {sc.name} step {st.id}", model, st.fields_for, st.endpoint, st.prompts,
                             st.max_tokens)
    seen, unique = set(), []
    for b in out:
        key = json.dumps([b.endpoint, b.body, b.max_tokens], sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(b)
    return unique


def check_request_fields(cfg: RigConfig, scenarios: list[ScenarioConfig],
                         log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> None:
    """Raise ConfigError listing every body of ``scenarios`` the vLLM build of ``launch.command``
    would refuse (module docstring). When it cannot look (``launch.command`` is no python, the
    interpreter cannot import vLLM) it says so through ``log`` and returns: not checked, not ok."""
    bodies = hop_bodies(cfg, scenarios)
    if not bodies:
        return
    python = build_python(cfg.launch.command, sys.executable)
    if python is None:
        log(f"[pdrig] request fields not checked against the build: launch.command {cfg.launch.command[0]!r} "
            "is no python interpreter to ask")
        return
    try:
        problems, not_checked = validate_bodies(python, Path(cfg.cache_dir), bodies)
    except RuntimeError as e:
        log(f"[pdrig] request fields not checked against the build: {e}")
        return
    if not_checked:
        log(f"[pdrig] request fields not checked for endpoint(s) the build lacks: {', '.join(not_checked)}")
    if problems:
        raise ConfigError("request fields the vLLM build of launch.command refuses (fix them in the scenario's "
                          "request: block; the rig's requests are greedy, temperature 0):\n  " + "\n  ".join(problems))
    log(f"[pdrig] request fields of {len(bodies)} hop bodies checked against the build's request models")


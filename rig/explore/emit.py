"""An action as a scenario of the rig's own language, and a finding as a suite YAML.

:func:`scenario_of` is the one conversion: the executor runs every action as the scenario it
returns, and a minimal failing action is written as that same scenario, so ``pdrig e2e --config
<profile> --set suite=<file>`` reruns exactly what the explorer ran. A single P/D step started at
once (not cancelled) is ``kind: edge`` (its stall is decided with the block arithmetic of
rig/judge/early_verdict.py and known issues with ``admission`` match it); a nemesis phase is
``kind: fault`` (rig/config/faults.py: its requests, the fault, recovery on); anything else is
``kind: sequence`` (rig/config/sequence.py).
"""

from __future__ import annotations

from typing import Any

import yaml

from rig.explore.grammar import Action, Topology, step_dict


def resource_scenarios(action: Action, name: str, origin: bool = False) -> list[dict[str, Any]]:
    """The scenarios that must come before ``action``'s (called ``name``) for its prompt resources:
    with ``origin`` the earlier actions' scenarios as they ran (exploration: the prompt is the one
    that action sent, in the instances' caches since then), else one primer per resource
    (``<name>-r<k>``: re-runs and the emitted YAML send it again first)."""
    if origin:
        seen: dict[str, dict[str, Any]] = {}
        for r in action.resources:
            seen.setdefault(r.origin["name"], r.origin)
        return list(seen.values())
    return [r.primer(f"{name}-{r.name}") for r in action.resources]


def _resolve_refs(action: Action, name: str, origin: bool) -> list[Any]:
    """The steps with their ``@r<k>`` prompt names replaced by the names the resource has in
    :func:`resource_scenarios`' scenarios."""
    names = {f"@{r.name}": (r.ref_in_origin() if origin else f"{name}-{r.name}/s0") for r in action.resources}
    out = []
    for s in action.steps:
        upd = {f: names[getattr(s, f)] for f in ("same_as", "head_of") if getattr(s, f) in names}
        out.append(s.model_copy(update=upd) if upd else s)
    return out


def scenario_of(action: Action, topo: Topology, name: str, known_issue: dict[str, Any] | None = None,
                description: str = "", origin: bool = False) -> dict[str, Any]:
    """The scenario mapping of ``action`` on ``topo`` called ``name`` (a scenario name), with
    ``known_issue`` (a KnownIssue mapping) when given; its prompt resources named as in
    :func:`resource_scenarios` (``origin``: the earlier actions' scenarios, else the primers).
    Validated by the caller's config loader."""
    steps = _resolve_refs(action, name, origin)
    base: dict[str, Any] = {"name": name, "description": description or f"explore: {action.describe()}",
                            "prefill": topo.prefill, "decode": topo.decode}
    sc: dict[str, Any]
    if action.nemesis is not None:
        s, nem = steps[0], action.nemesis
        sc = {**base, "kind": "fault", "prompt_tokens": s.prompt_tokens, "max_tokens": s.max_tokens,
              "fault": {"requests": nem.requests, "faults": [f.model_dump(mode="json", exclude_defaults=True)
                                                              for f in nem.faults],
                        "recovery": True, "idle_margin_s": nem.heal_s},
              # every request may wait out a stop or a delay, then the restart of a killed instance
              "deadline_s": 90.0 + sum((f.stop_s or 0) + (f.delay_s or 0) for f in nem.faults)}
        if s.request is not None:
            sc["request"] = s.request.model_dump(mode="json", exclude_defaults=True)
    elif len(steps) == 1 and steps[0].route == "pd" and steps[0].start is None and steps[0].cancel_after_ms is None \
            and not (steps[0].same_as or steps[0].head_of):
        s = steps[0]
        sc = {**base, "prompt_tokens": s.prompt_tokens, "max_tokens": s.max_tokens}
        if s.count > 1:
            sc["concurrent"] = s.count
        if s.request is not None:
            sc["request"] = s.request.model_dump(mode="json", exclude_defaults=True)
        if s.ignore_eos:
            sc.setdefault("request", {}).setdefault("all", {})["ignore_eos"] = True
        if action.hold_s:
            # the hold plus the flush and the answer, with room on a loaded host
            sc.update(hold_between_s=action.hold_s, flush_prefill=action.flush_prefill,
                      deadline_s=max(90.0, action.hold_s + 60))
    else:
        sc = {**base, "kind": "sequence", "sequence": {"steps": [step_dict(s) for s in steps], "idle_margin_s": 2}}
    if known_issue is not None:
        sc["known_issue"] = known_issue
    return sc


def suite_yaml(scenarios: list[dict[str, Any]], header: str) -> str:
    """A suite file: ``header`` as ``#`` comment lines, then the scenarios as a YAML list."""
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + yaml.safe_dump(scenarios, sort_keys=False, width=120)

"""JSON Schema of the rig's YAML files, made from the pydantic models (never written by hand).

Two documents: a *profile* (``configs/*.yaml``: :class:`rig.config.topology.RigConfig`) and a
*suite* (``configs/suites/*.yaml``: a list of :class:`rig.config.scenarios.ScenarioConfig`).
``pdrig schema`` writes them to ``schema/``; the shipped YAML files name them in a first line
``# yaml-language-server: $schema=...`` so editors with the YAML language server complete and
check them; tests/repo/test_schema.py validates every shipped YAML against them.

Scenario kinds: one scenario model serves every kind and a load-time rule refuses a field its kind
does not use (``KIND_FIELDS``). The schema states the same rule per kind (``if kind == K then
only K's fields``), so an editor flags a wave field on an edge scenario as the loader would.
Cross-field rules that need the topology (instance names, max_model_len) stay in the loader.
"""

from __future__ import annotations

import copy
from typing import Any

from rig.config.scenarios import KIND_FIELDS, WAVE_KINDS, ScenarioConfig
from rig.config.topology import RigConfig

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
# Kinds whose prompt_tokens / max_tokens the loader fills in (waves: their defaults; sequence: its
# longest step's), so the schema requires them only of the other kinds.
TOKENS_DEFAULTED = ("sequence", *WAVE_KINDS)
TOKEN_FIELDS = ["prompt_tokens", "max_tokens"]
PROFILE_FILE, SUITE_FILE = "profile.schema.json", "suite.schema.json"


def _kind_rules() -> list[dict[str, Any]]:
    """One ``if kind == K then propertyNames in K's fields`` rule per kind (the default kind is
    edge, so a scenario without ``kind`` gets edge's rule)."""
    rules = []
    for kind, fields in sorted(KIND_FIELDS.items()):
        cond: dict[str, Any] = {"properties": {"kind": {"const": kind}}}
        if kind == "edge":
            cond = {"anyOf": [cond | {"required": ["kind"]}, {"not": {"required": ["kind"]}}]}
        else:
            cond["required"] = ["kind"]
        then: dict[str, Any] = {"propertyNames": {"enum": sorted(fields)}}
        if kind not in TOKENS_DEFAULTED:
            then["required"] = TOKEN_FIELDS
        rules.append({"if": cond, "then": then})
    return rules


def _with_kind_rules(scenario: dict[str, Any]) -> None:
    """Add the per-kind rules to a scenario schema in place (``required`` moves into them)."""
    scenario["required"] = [f for f in scenario.get("required", []) if f not in TOKEN_FIELDS]
    scenario["allOf"] = scenario.get("allOf", []) + _kind_rules()


def scenario_schema() -> dict[str, Any]:
    """The JSON Schema of one scenario (dict; ``$defs`` holds its nested models)."""
    schema = ScenarioConfig.model_json_schema()
    _with_kind_rules(schema)
    return schema


def suite_schema() -> dict[str, Any]:
    """The JSON Schema of a suite file: a list of scenarios."""
    item = scenario_schema()
    defs = item.pop("$defs", {})
    return {"$schema": SCHEMA_DIALECT, "title": "pdrig suite",
            "description": "A pdrig suite: a YAML list of scenarios (configs/suites/*.yaml).",
            "type": "array", "items": item, "$defs": defs}


def profile_schema() -> dict[str, Any]:
    """The JSON Schema of a profile (``configs/*.yaml``); its ``scenarios`` items carry the same
    per-kind rules as a suite's."""
    schema = copy.deepcopy(RigConfig.model_json_schema())
    scen = schema.get("$defs", {}).get("ScenarioConfig")
    if scen is not None:
        _with_kind_rules(scen)
    schema["$schema"] = SCHEMA_DIALECT
    schema["title"] = "pdrig profile"
    return schema


def schemas() -> dict[str, dict[str, Any]]:
    """File name -> schema, as ``pdrig schema`` writes them."""
    return {PROFILE_FILE: profile_schema(), SUITE_FILE: suite_schema()}

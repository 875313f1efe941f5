"""Every shipped YAML names its JSON Schema and validates against it; the schema refuses what the
loader refuses (a field the scenario's kind does not use, a missing prompt length), and the
generated reference pages and schema files match the code (scripts/gen_reference.py --check)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from rig.cli import all_schemas

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "configs" / "suites").glob("*.yaml"))
HEADER = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_yaml_names_its_schema_and_validates(path: Path):
    first = path.read_text().splitlines()[0]
    m = HEADER.match(first)
    assert m, f"{path.name}: first line must be '# yaml-language-server: $schema=...'"
    schema_path = (path.parent / m.group(1)).resolve()
    assert schema_path.is_file(), f"{path.name} names {m.group(1)}, which does not exist"
    schema = all_schemas()[schema_path.name]
    errors = [f"{list(e.path)}: {e.message}" for e in
              jsonschema.Draft202012Validator(schema).iter_errors(yaml.safe_load(path.read_text()))]
    assert not errors, errors


def _suite_errors(scenarios: list[dict]) -> list[str]:
    validator = jsonschema.Draft202012Validator(all_schemas()["suite.schema.json"])
    return [e.message for e in validator.iter_errors(scenarios)]


def test_schema_refuses_a_field_the_kind_does_not_use():
    edge_with_wave = {"name": "a", "prompt_tokens": 40, "max_tokens": 2, "wave": {}}
    assert any("'wave'" in m for m in _suite_errors([edge_with_wave]))
    wave_with_tamper = {"name": "a", "kind": "pressure-wave", "tamper": "swap-prompt"}
    assert any("'tamper'" in m for m in _suite_errors([wave_with_tamper]))
    assert not _suite_errors([{"name": "a", "kind": "pressure-wave", "wave": {"requests": 4}}])


def test_schema_requires_prompt_lengths_only_where_the_loader_does():
    assert any("prompt_tokens" in m for m in _suite_errors([{"name": "a", "kind": "edge"}]))
    assert any("max_tokens" in m for m in _suite_errors([{"name": "a"}]))
    assert not _suite_errors([{"name": "a", "kind": "prefix-wave"}])


def test_schema_refuses_unknown_fields_and_bad_types():
    misspelled = {"name": "a", "prompt_tokens": 4, "max_tokens": 2, "logprob": 1}
    assert any("logprob" in m for m in _suite_errors([misspelled]))
    assert _suite_errors([{"name": "a", "prompt_tokens": "many", "max_tokens": 2}])


def test_generated_reference_and_schemas_match_the_code():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_reference.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr

"""docs/measurements.md is rendered from its data (docs/bench/measurements/*.yaml) and is up to date;
each measurement carries its date, machine, load, command and figures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("measurements", ROOT / "scripts" / "measurements.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_page_is_rendered_from_its_data():
    mod = _script()
    assert (ROOT / "docs" / "measurements.md").read_text() == mod.render(mod.load()), \
        "docs/measurements.md is stale: run scripts/measurements.py"


def test_every_measurement_has_its_facts_and_its_guides_exist():
    items = _script().load()
    assert len(items) >= 20
    orders = [m.order for _, m in items]
    assert len(set(orders)) == len(orders), "two measurements share an order"
    for name, m in items:
        assert m.date[:4].isdigit() and m.figures.strip(), name
        assert all((ROOT / u).is_file() for u in m.used_by), (name, m.used_by)


def test_a_measurement_without_its_command_is_refused_naming_the_file_and_field(tmp_path: Path):
    (tmp_path / "m.yaml").write_text("order: 1\ntitle: t\ndate: 2026-12-02\nmachine: box\nload: 1.0\n"
                                     "summary: s\nfigures: f\n")
    with pytest.raises(ValueError, match=r"m\.yaml: command: Field required"):
        _script().load(tmp_path)
    (tmp_path / "m.yaml").write_text("order: 1\ntitle: t\ndate: 2026-12-02\nmachine: box\nload: 1.0\n"
                                     "command: [make e2e]\nsummary: s\nfigures: f\nwho: me\n")
    with pytest.raises(ValueError, match="who: Extra inputs are not permitted"):
        _script().load(tmp_path)

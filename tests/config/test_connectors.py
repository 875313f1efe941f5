"""The pure kv-connector builders (rig.connectors): a leaf that imports nothing from the rig, and
the ``--kv-transfer-config`` shapes the plan relies on."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from rig.config.base import ConnectorMode
from rig.connectors import kv_transfer as kvt
from rig.plan.spec import probe_host

CONNECTORS = Path(__file__).resolve().parents[2] / "rig" / "connectors"


def _rig_imports(path: Path) -> list[str]:
    """Modules outside rig.connectors that ``path`` imports from the rig (at any depth)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        out += [n for n in names if n.split(".")[0] == "rig" and not n.startswith("rig.connectors")]
    return out


def test_connectors_import_nothing_from_the_rig():
    files = sorted(CONNECTORS.glob("*.py"))
    assert len(files) >= 3
    assert {f.name: _rig_imports(f) for f in files} == {f.name: [] for f in files}


def test_config_modes_are_the_builders_modes():
    assert typing.get_args(ConnectorMode) == kvt.MODES


def test_failure_policy_on_the_top_level_object():
    nixl = kvt.kv_transfer_config("nixl", "kv_consumer", "cpu", None, "cpu", {"num_threads": 2}, "recompute")
    assert list(nixl) == ["kv_connector", "kv_role", "kv_buffer_device", "kv_load_failure_policy",
                          "kv_connector_extra_config"]
    multi = kvt.kv_transfer_config("nixl+store", "kv_consumer", "cpu", 5841, "cpu", None, "fail")
    assert multi["kv_load_failure_policy"] == "fail"
    assert all("kv_load_failure_policy" not in c for c in multi["kv_connector_extra_config"]["connectors"])
    assert "kv_load_failure_policy" not in kvt.kv_transfer_config("nixl", "kv_consumer", "cpu", None, "cpu")
    with pytest.raises(ValueError, match="unknown kv_load_failure_policy 'retry'"):
        kvt.kv_transfer_config("nixl", "kv_consumer", "cpu", None, "cpu", None, "retry")


@pytest.mark.parametrize("host, reached", [("0.0.0.0", "127.0.0.1"), ("::", "127.0.0.1"),
                                           ("127.0.0.1", "127.0.0.1"), ("10.0.0.5", "10.0.0.5")])
def test_probe_host_is_the_one_wildcard_rule(host, reached):
    assert probe_host(host) == reached

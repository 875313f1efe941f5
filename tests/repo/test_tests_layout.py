"""The tests' own layout holds: test modules share helpers through tests/helpers/ only (never by
importing one another), no test file is named after the mutation round that found its tests, and
every test file and test the mutmut selection of pyproject.toml names exists (a renamed file would
silently drop its tests from `make mutation`)."""

from __future__ import annotations

import ast
import tomllib

from tests.helpers.fake_rig import ROOT

TESTS = ROOT / "tests"


def suite_files():
    """Every test file of the suite (tests/**/test_*.py), the helpers package left out."""
    return sorted(p for p in TESTS.rglob("test_*.py") if "helpers" not in p.parts)


def test_no_test_module_imports_another_or_conftest():
    borrowed = []
    for p in [*suite_files(), *(TESTS / "helpers").glob("*.py"), TESTS / "conftest.py"]:
        for node in ast.walk(ast.parse(p.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            borrowed += [f"{p.relative_to(ROOT)}: {n}" for n in names
                         if n.split(".")[-1].startswith("test_") or n == "conftest"]
    assert borrowed == []


def test_no_test_file_is_named_after_a_mutation_round():
    assert [p.name for p in suite_files() if p.name.startswith("test_mut_")] == []


def test_the_mutmut_selection_names_existing_files_and_tests():
    args = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"][
        "pytest_add_cli_args_test_selection"]
    files = [a for a in args if a.startswith("tests/") and "::" not in a]
    deselected = [a for a in args if "::" in a]
    assert files and deselected
    assert [f for f in files if not (ROOT / f).is_file()] == []
    assert len(files) == len(set(files))
    missing = []
    for d in deselected:
        path, name = d.split("::", 1)
        defined = {n.name for n in ast.walk(ast.parse((ROOT / path).read_text()))
                   if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)} if (ROOT / path).is_file() else set()
        if name.split("[")[0] not in defined:
            missing.append(d)
    assert missing == []

"""Sizes: no module in rig/ over 500 lines, no function (or method, nested ones included) over 80.

A module's size is its line count (``wc -l``); a function's runs from its ``def`` line to its last
line (decorators not counted). :func:`offenders` lists every one over the limit; the test fails
naming each, with the limit it breaks. ``ALLOWED`` is the list of known exceptions, each with its
size today: an exception may shrink, never grow, and an entry that no longer offends must be
removed (so the list only ever gets shorter). ``make lint`` runs this file too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.fake_rig import ROOT

MODULE_LINES = 500
FUNCTION_LINES = 80

# Known exceptions: "path" (a module) or "path::qualified.name" (a function) -> its size today, lines.
ALLOWED: dict[str, int] = {}


def offenders(root: Path) -> dict[str, int]:
    """``{"path": lines}`` for each module under ``root/rig`` over :data:`MODULE_LINES` and
    ``{"path::Class.method": lines}`` for each function over :data:`FUNCTION_LINES` (paths relative
    to ``root``, with ``/``)."""
    found: dict[str, int] = {}
    for path in sorted((root / "rig").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        if text.count("\n") > MODULE_LINES:
            found[rel] = text.count("\n")
        for name, lines in _functions(ast.parse(text, filename=rel)):
            if lines > FUNCTION_LINES:
                found[f"{rel}::{name}"] = lines
    return found


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of every function and method in ``tree``, nested ones included."""
    out: list[tuple[str, int]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + node.name
            out.append((name, (node.end_lineno or node.lineno) - node.lineno + 1))
            out += _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            out += _functions(node, prefix + node.name + ".")
        else:
            out += _functions(node, prefix)
    return out


def test_no_module_over_500_lines_and_no_function_over_80():
    found = offenders(ROOT)
    over = {k: v for k, v in found.items() if k not in ALLOWED or v > ALLOWED[k]}
    assert not over, "over the size limits (a module 500 lines, a function 80; split them): " + "; ".join(
        f"{k} {v} lines" + (f" (allowed {ALLOWED[k]})" if k in ALLOWED else "") for k, v in sorted(over.items()))
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"no longer over the limit, remove from ALLOWED in tests/repo/test_sizes.py: {stale}"


def test_the_size_check_names_a_long_module_and_a_long_method(tmp_path: Path):
    rig = tmp_path / "rig" / "pkg"
    rig.mkdir(parents=True)
    body = "\n".join(f"        x{i} = {i}" for i in range(FUNCTION_LINES))
    (rig / "long.py").write_text(f"class C:\n    async def m(self):\n{body}\n\n    def short(self):\n        pass\n"
                                 + "\n" * MODULE_LINES)
    (rig / "ok.py").write_text("def f():\n    def inner():\n        return 1\n    return inner\n")
    assert offenders(tmp_path) == {"rig/pkg/long.py": FUNCTION_LINES + 5 + MODULE_LINES,
                                   "rig/pkg/long.py::C.m": FUNCTION_LINES + 1}

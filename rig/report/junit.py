"""The one JUnit writer: a suite of test cases as data in, junit.xml out.

A run's scenarios (rig/report/render.py), the matrix's cells (rig/report/grid.py) and the
explorer's findings (rig/explore/report.py) each say what their cases are; this module writes
them the way CI systems read them: ``failure`` / ``error`` / ``skipped`` elements with a message
(cut to 1,000 characters) and a text, ``properties`` per case and per suite, and the suite's
``tests`` / ``failures`` / ``errors`` / ``skipped`` counts computed from the cases.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["passed", "failure", "error", "skipped"]
MESSAGE_CHARS = 1000  # a message longer than this is cut: CI front-ends show one line


@dataclass(frozen=True)
class Case:
    """One testcase: ``outcome`` passed (no element), failure, error or skipped (that element with
    ``message`` and ``text``); ``time_s`` seconds (None: no ``time`` attribute); ``properties``
    (name, value) pairs in order; ``system_out`` the case's output ('' for none)."""

    classname: str
    name: str
    outcome: Outcome = "passed"
    message: str = ""
    text: str | None = None
    time_s: float | None = None
    properties: tuple[tuple[str, str], ...] = ()
    system_out: str | None = None


@dataclass(frozen=True)
class Suite:
    """A testsuite: its ``name``, ``cases`` and suite-level ``properties``."""

    name: str
    cases: list[Case] = field(default_factory=list)
    properties: tuple[tuple[str, str], ...] = ()


def _properties(parent: ET.Element, props: tuple[tuple[str, str], ...]) -> None:
    if props:
        el = ET.SubElement(parent, "properties")
        for name, value in props:
            ET.SubElement(el, "property", name=name, value=value[:MESSAGE_CHARS])


def render_junit(suite: Suite) -> str:
    """junit.xml of ``suite`` (with the XML declaration); the counts are the cases'."""
    root = ET.Element("testsuite", name=suite.name)
    _properties(root, suite.properties)
    counts = {"failure": 0, "error": 0, "skipped": 0}
    for c in suite.cases:
        attrs = {"classname": c.classname, "name": c.name}
        if c.time_s is not None:
            attrs["time"] = f"{c.time_s:.3f}"
        case = ET.SubElement(root, "testcase", attrs)
        _properties(case, c.properties)
        if c.outcome != "passed":
            counts[c.outcome] += 1
            ET.SubElement(case, c.outcome, message=c.message[:MESSAGE_CHARS]).text = c.text
        if c.system_out is not None:
            ET.SubElement(case, "system-out").text = c.system_out
    root.set("tests", str(len(suite.cases)))
    root.set("failures", str(counts["failure"]))
    root.set("errors", str(counts["error"]))
    root.set("skipped", str(counts["skipped"]))
    return ET.tostring(root, encoding="unicode", xml_declaration=True)

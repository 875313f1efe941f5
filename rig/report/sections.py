"""One summary.md section renderer per scenario kind: adding a kind's report is one entry here.

A renderer takes the scenario's report (rig.report.model: its kind's own result, its
observation and verdict) and its ``description``, and returns markdown, or None when there is
nothing to show (the kind did not run). Kinds without an entry (``edge``) have no section of
their own: the report's scenario table shows them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rig.report.fault_section import fault_section
from rig.report.model import RetrievalReport, ScenarioReport
from rig.report.sequence_section import sequence_section
from rig.report.store_section import store_section
from rig.report.wave_section import wave_section

Section = Callable[[Any, str], "str | None"]


def retrieval_section(name: str, result: RetrievalReport) -> str:
    """The retrieval rates of P/D and of the reference over the compared requests."""
    n = max(result.compared, 1)
    pd, ref = result.pd_hits / n, result.ref_hits / n
    return (f"### Retrieval `{name}`\n\n| requests compared | P/D retrieved | reference retrieved |\n"
            f"|---|---|---|\n| {result.compared} | {result.pd_hits} ({pd:.0%}) | {result.ref_hits} ({ref:.0%}) |\n")


def _wave(s: Any, description: str) -> str | None:
    return wave_section(s.wave, s.verdict) if s.wave is not None else None


def _store(s: Any, description: str) -> str | None:
    return store_section(s.verdict.scenario, description, s.observation, s.store, s.verdict) \
        if s.store is not None else None


def _retrieval(s: Any, description: str) -> str | None:
    return retrieval_section(s.verdict.scenario, s.retrieval) if s.retrieval is not None else None


def _fault(s: Any, description: str) -> str | None:
    return fault_section(s.verdict.scenario, s.fault) if s.fault is not None else None


def _sequence(s: Any, description: str) -> str | None:
    return sequence_section(s.verdict.scenario, s.sequence) if s.sequence is not None else None


SECTIONS: dict[str, Section] = {
    "prefix-wave": _wave,
    "pressure-wave": _wave,
    "store-roundtrip": _store,
    "prefix-wave-store": _store,
    "long-generation": _store,
    "retrieval": _retrieval,
    "fault": _fault,
    "sequence": _sequence,
}


def section_of(scenario: ScenarioReport, description: str = "") -> str | None:
    """The summary.md section of ``scenario`` (:data:`SECTIONS` by its kind), or None."""
    render = SECTIONS.get(scenario.kind)
    return render(scenario, description) if render is not None else None

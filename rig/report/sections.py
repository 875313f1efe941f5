"""One summary.md section renderer per scenario kind: adding a kind's report is one entry here.

A renderer takes the scenario, its observation, the kind's result (what ``Kind.run`` returned,
rig/run/kinds.py) and the verdict, and returns markdown, or None when there is nothing to show
(the kind did not run). Kinds without an entry (``edge``) have no section of their own: the
report's scenario table shows them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rig.config import ScenarioConfig
from rig.judge.verdict import ScenarioVerdict
from rig.observe.observations import ScenarioObservation
from rig.observe.store_metrics import StoreObservation
from rig.report.fault_section import fault_section
from rig.report.sequence_section import sequence_section
from rig.report.store_section import store_section
from rig.report.wave_section import wave_section
from rig.workload.faults import FaultResult
from rig.workload.retrieval import RetrievalResult
from rig.workload.sequence import SequenceResult
from rig.workload.wave_result import WaveResult

Section = Callable[[ScenarioConfig, ScenarioObservation, Any, ScenarioVerdict], "str | None"]


def _wave(sc: ScenarioConfig, obs: ScenarioObservation, result: WaveResult | None, v: ScenarioVerdict) -> str | None:
    return wave_section(result, v) if result is not None else None


def _store(sc: ScenarioConfig, obs: ScenarioObservation, result: StoreObservation | None,
           v: ScenarioVerdict) -> str | None:
    return store_section(sc, obs, result, v) if result is not None else None


def retrieval_section(sc: ScenarioConfig, obs: ScenarioObservation, result: RetrievalResult | None,
                      v: ScenarioVerdict) -> str | None:
    """The retrieval rates of P/D and of the reference (rig.workload.retrieval.RetrievalResult)."""
    if result is None:
        return None
    pd, ref = result.rates()
    return (f"### Retrieval `{sc.name}`\n\n| requests compared | P/D retrieved | reference retrieved |\n"
            f"|---|---|---|\n| {result.compared} | {result.pd_hits} ({pd:.0%}) | {result.ref_hits} ({ref:.0%}) |\n")


def _fault(sc: ScenarioConfig, obs: ScenarioObservation, result: FaultResult | None, v: ScenarioVerdict) -> str | None:
    return fault_section(sc.name, result) if result is not None else None


def _sequence(sc: ScenarioConfig, obs: ScenarioObservation, result: SequenceResult | None,
              v: ScenarioVerdict) -> str | None:
    return sequence_section(sc.name, result) if result is not None else None


SECTIONS: dict[str, Section] = {
    "prefix-wave": _wave,
    "pressure-wave": _wave,
    "store-roundtrip": _store,
    "prefix-wave-store": _store,
    "long-generation": _store,
    "retrieval": retrieval_section,
    "fault": _fault,
    "sequence": _sequence,
}


def section_of(sc: ScenarioConfig, obs: ScenarioObservation, result: Any, verdict: ScenarioVerdict) -> str | None:
    """The summary.md section of scenario ``sc`` (:data:`SECTIONS` by its kind), or None."""
    render = SECTIONS.get(sc.kind)
    return render(sc, obs, result, verdict) if render is not None else None

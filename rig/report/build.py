"""The run as the runner accumulates it (:class:`RunResult`) and its report (:func:`build_report`).

The runner fills a :class:`RunResult` with the rig's own objects as the run goes (observations,
verdicts, what each kind returned); :func:`build_report` turns it into the plain
:class:`rig.report.model.Report`, the one thing the renderers read. Each converter reads only
the fields the model declares, so what report.json holds is what the model says, not whatever a
dataclass happens to carry. :func:`write_report` is called on every exit path, also for a failed
or interrupted run, with whatever was observed so far.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError
from rich.console import Console

from rig.cluster.startup_profile import StartupProfile
from rig.judge.checks import Check
from rig.judge.store_checks import cancel_summary
from rig.judge.verdict import ScenarioVerdict, run_passed
from rig.observe.observations import ScenarioObservation
from rig.report.model import (
    BaselineReport,
    CheckReport,
    DrainReport,
    EdgeScenario,
    FaultReport,
    FaultScenario,
    ObservationReport,
    ParityReport,
    RecordReport,
    Report,
    ReportModel,
    RetrievalReport,
    RetrievalScenario,
    ScenarioReport,
    SequenceReport,
    SequenceScenario,
    StoreReport,
    StoreScenario,
    TransferEvidenceReport,
    VerdictReport,
    WaveReport,
    WaveScenario,
)
from rig.report.render import print_report, write_files
from rig.transport.records import PDRecord
from rig.workload.baseline import RequestBaseline

M = TypeVar("M", bound=ReportModel)


@dataclass
class RunResult:
    """A whole run as the runner accumulates it: its scenarios' observations, verdicts and kind
    results plus run-level facts (:class:`rig.report.model.Report` documents each field).

    ``timings`` are seconds; ``status`` is ``running`` until :meth:`finish_status`, then
    ``passed`` | ``failed``, or ``interrupted`` | ``error`` when the run stopped."""

    name: str
    run_dir: str
    config: dict[str, Any]
    plan: dict[str, Any] = field(default_factory=dict)
    vllm_version: str = ""
    observations: list[ScenarioObservation] = field(default_factory=list)
    verdicts: list[ScenarioVerdict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    status: str = "running"
    error: str = ""
    # Scenarios of the suite that never started because the run stopped first (Ctrl-C, a cluster
    # error): listed as NOT RUN so an interrupted run cannot read as "every scenario passed".
    not_run: list[str] = field(default_factory=list)
    # Per instance, its (latest) start: rig.cluster.startup.StartupWatch.figures().
    startup: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Per instance, its (latest) start's profile: StartupWatch.profile (Report.startup_profiles).
    startup_profiles: dict[str, StartupProfile] = field(default_factory=dict)
    # scenario -> its ScenarioConfig.kind and what the kind returned (wave statistics, store
    # counters, fault events, ...): the kind's part of its scenario report (sections come from it).
    kinds: dict[str, str] = field(default_factory=dict)
    kind_results: dict[str, object] = field(default_factory=dict)
    # Per decode instance, its per-request baseline measured after the warm-up (rig.workload.baseline).
    baselines: dict[str, RequestBaseline] = field(default_factory=dict)

    def finish_status(self) -> str:
        """Set and return ``status`` from the verdicts unless the run was interrupted/errored."""
        if self.status == "running":
            self.status = "passed" if run_passed(self.verdicts) else "failed"
        return self.status

    def add(self, kind: str, obs: ScenarioObservation, verdict: ScenarioVerdict, kind_result: object = None) -> None:
        """Record one judged scenario: its ``kind``, observation, verdict and the kind's result."""
        self.observations.append(obs)
        self.verdicts.append(verdict)
        self.kinds[verdict.scenario] = kind
        self.kind_results[verdict.scenario] = kind_result

    def keep_last(self, n: int) -> None:
        """Forget all but the last ``n`` scenarios (a long exploration keeps its report small)."""
        del self.observations[:-n], self.verdicts[:-n]
        kept = {v.scenario for v in self.verdicts}
        for d in (self.kinds, self.kind_results):
            for name in [k for k in d if k not in kept]:
                del d[name]


def _plain(v: Any) -> Any:
    """A dataclass as a dict (as :func:`dataclasses.asdict`), also inside lists, tuples and dict
    values; anything else as is."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return dataclasses.asdict(v)
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def from_fields(model: type[M], obj: Any, **values: Any) -> M:
    """``model`` from the attributes of ``obj`` that it declares (nested dataclasses as dicts),
    with ``values`` taking precedence; pydantic validates the result (ValidationError if a value
    does not fit its field)."""
    data = {k: _plain(getattr(obj, k)) for k in model.model_fields if k not in values and hasattr(obj, k)}
    return model.model_validate({**data, **values})


def check_report(c: Check) -> CheckReport:
    """A check as the report holds it (``samples``: the ``/metrics`` samples it judged from, None
    for a check not built on samples)."""
    return CheckReport(name=c.name, ok=c.ok, state=c.state, detail=c.detail, requests=list(c.requests),
                       samples=c.samples)


def verdict_report(v: ScenarioVerdict) -> VerdictReport:
    """A verdict as the report holds it."""
    return VerdictReport(scenario=v.scenario, verdict=v.verdict, expectation=v.expectation,
                         reason=v.reason, checks=[check_report(c) for c in v.checks])


def record_report(r: PDRecord) -> RecordReport:
    """A request record as the report holds it: without its prompt (its length and the scenario's
    seed identify it)."""
    d = dataclasses.asdict(r)
    d.pop("prompt", None)
    return RecordReport.model_validate(d)


def observation_report(obs: ScenarioObservation) -> ObservationReport:
    """An observation as the report holds it (records without their prompts; the timeline is in
    metrics/timeline.jsonl)."""
    return from_fields(
        ObservationReport, obs, records=[record_report(r) for r in obs.records],
        parity=[ParityReport.model_validate(dataclasses.asdict(p)) if p else None for p in obs.parity],
        evidence=TransferEvidenceReport.model_validate(dataclasses.asdict(obs.evidence)) if obs.evidence else None,
        prefill_evidence=(TransferEvidenceReport.model_validate(dataclasses.asdict(obs.prefill_evidence))
                          if obs.prefill_evidence else None),
        drains=[DrainReport.model_validate(dataclasses.asdict(d)) for d in obs.drains])


def wave_report(wave: Any, obs: ScenarioObservation | None = None) -> WaveReport:
    """A rig.workload.wave_result.WaveResult as the report holds it (its records stay in
    ``records_path``); its ``drains`` are the scenario's (``obs.drains``, the lifecycle's, in a
    suite and in ``pdrig wave`` alike) when the wave has none of its own."""
    drains = wave.drains or (obs.drains if obs is not None else [])
    return from_fields(WaveReport, wave, summary=wave.summary(),
                       drains=[DrainReport.model_validate(dataclasses.asdict(d)) for d in drains])


def store_report(so: Any, obs: ScenarioObservation | None) -> StoreReport:
    """A rig.observe.store_metrics.StoreObservation with its derived facts and, when the
    scenario planned cancellations, their summary in words."""
    planned = obs is not None and any(r.cancel is not None for r in obs.records)
    return from_fields(StoreReport, so, cancel_summary=cancel_summary(obs.records) if obs and planned else "")


def _kind_part(kind: str, result: object, obs: ScenarioObservation | None) -> dict[str, Any]:
    """The kind's own field of its scenario report (``wave``, ``store``, ...), {} for ``edge``."""
    if result is None:
        return {}
    if kind in ("prefix-wave", "pressure-wave"):
        return {"wave": wave_report(result, obs)}
    if kind in ("store-roundtrip", "prefix-wave-store", "long-generation"):
        return {"store": store_report(result, obs)}
    if kind == "retrieval":
        return {"retrieval": from_fields(RetrievalReport, result)}
    if kind == "fault":
        return {"fault": from_fields(FaultReport, result)}
    if kind == "sequence":
        return {"sequence": from_fields(SequenceReport, result)}
    return {}


_SCENARIO: dict[str, type[ReportModel]] = {
    "edge": EdgeScenario, "prefix-wave": WaveScenario, "pressure-wave": WaveScenario,
    "store-roundtrip": StoreScenario, "prefix-wave-store": StoreScenario, "long-generation": StoreScenario,
    "retrieval": RetrievalScenario, "fault": FaultScenario, "sequence": SequenceScenario,
}


def _kind_of(result: RunResult, scenario: str) -> str:
    """The scenario's kind: as recorded when it was judged, else the config's, else ``edge``."""
    if scenario in result.kinds:
        return result.kinds[scenario]
    scs = [*(result.config.get("scenarios") or []), result.config.get("scenario") or {}]
    return next((sc.get("kind", "edge") for sc in scs if isinstance(sc, dict) and sc.get("name") == scenario), "edge")


def scenario_report(result: RunResult, v: ScenarioVerdict, obs: ScenarioObservation | None) -> ScenarioReport:
    """One judged scenario of ``result`` (its verdict ``v`` and observation ``obs``) as its kind's report."""
    kind = _kind_of(result, v.scenario)
    model = _SCENARIO.get(kind, EdgeScenario)
    return model.model_validate({"kind": kind, "verdict": verdict_report(v),  # type: ignore[return-value]
                                 "observation": observation_report(obs) if obs else None,
                                 **_kind_part(kind, result.kind_results.get(v.scenario), obs)})


def build_report(result: RunResult) -> Report:
    """The report of ``result`` as it stands (any time during the run, and at its end)."""
    return Report(name=result.name, run_dir=result.run_dir, status=result.status,
                  error=result.error, vllm_version=result.vllm_version, timings=dict(result.timings),
                  startup=result.startup, startup_profiles=result.startup_profiles,
                  not_run=list(result.not_run), config=result.config, plan=result.plan,
                  baselines={d: from_fields(BaselineReport, b) for d, b in result.baselines.items()},
                  scenarios=[scenario_report(result, v, o) for v, o in _paired(result)])


def _paired(result: RunResult) -> list[tuple[ScenarioVerdict, ScenarioObservation | None]]:
    """Each verdict with its observation: the k-th verdict of a scenario name with the k-th
    observation of that name (a name the explorer or a pytest session runs again), the last one
    when there are fewer, None when there is none."""
    by_name: dict[str, list[ScenarioObservation]] = {}
    for o in result.observations:
        by_name.setdefault(o.scenario, []).append(o)
    seen: dict[str, int] = {}
    out = []
    for v in result.verdicts:
        k, obs = seen.get(v.scenario, 0), by_name.get(v.scenario, [])
        seen[v.scenario] = k + 1
        out.append((v, obs[min(k, len(obs) - 1)] if obs else None))
    return out


def write_report(result: RunResult) -> Path:
    """Write report.json, junit.xml and summary.md of ``result`` into its run directory; returns it."""
    return write_files(report_of(result))


def report_of(result: RunResult) -> Report:
    """:func:`build_report`, but data the model refuses (a rig bug: a value of a type no field
    declares) must not cost the run its report: the run is then reported as ``error`` with the
    verdicts alone and the refusal in ``error`` (its traceback in ``rig-traceback.txt``)."""
    try:
        return build_report(result)
    except (ValidationError, TypeError, ValueError) as e:
        Path(result.run_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(result.run_dir) / "rig-traceback.txt", "a") as f:
            f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} writing the report ===\n{traceback.format_exc()}\n")
        bare = dataclasses.replace(result, observations=[], kind_results={}, plan={}, status="error",
                                   error=f"the report model refused the run's data: {type(e).__name__}: "
                                         f"{str(e)[:500]} (traceback in rig-traceback.txt)")
        return build_report(bare)


def print_summary(result: RunResult, console: Console | None = None) -> None:
    """The verdict table and the run directory of ``result`` on the terminal."""
    print_report(report_of(result), console)

"""One scenario's lifecycle, written once: :func:`run_scenario`.

Whatever started the servers (a suite's cluster, ``pdrig up`` for ``pdrig wave``, the explorer),
a scenario goes through the same steps: the instances it needs are alive; a ``/metrics`` snapshot
of each before; the kind's requests; snapshots after (the transfer evidence: decode's counter
deltas, prefill's); every instance back to idle (drains, decode first);
idle snapshots; the metrics timeline rows; deaths and the log lines written meanwhile; the
verdict. What differs between the callers is only *where* the instances are and how the rig
looks at them (:class:`Deployment`) and what the kind does (``run`` / ``judge`` of
:class:`ScenarioSteps`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Protocol

import httpx

from rig.cluster import proctree
from rig.cluster.processes import Cluster
from rig.config import ScenarioConfig
from rig.judge.checks import alive_check
from rig.judge.signatures import match
from rig.judge.verdict import ScenarioVerdict, decide, expectation_of
from rig.observe import metrics as m
from rig.observe.evidence import UNKNOWN_VERSION, LogScanner, MetricPresence, settle_deaths
from rig.observe.observations import ScenarioObservation, SnapshotStore, TransferEvidence, wait_idle
from rig.transport.endpoint import Endpoint
from rig.workload.baseline import RequestBaseline


class Deployment(Protocol):
    """The instances one scenario runs on and how the rig looks at them: ``prefills`` and
    ``decodes`` (one of each in a suite's phase; ``pdrig wave`` may send round robin to several)."""

    prefills: list[Endpoint]
    decodes: list[Endpoint]

    async def deaths(self, http: httpx.AsyncClient) -> dict[str, int]:
        """The instances the scenario needs that are dead (``{name: exit code}``, -1 when unknown),
        after giving one that stopped answering a moment to exit."""
        ...

    async def observe(self, http: httpx.AsyncClient, obs: ScenarioObservation) -> None:
        """Fill ``obs.dead``, ``death_lines``, ``stopped`` and the log lines written since the
        scenario began (``fatal_lines``, ``kv_integrity_lines``, ``unscanned_logs``)."""
        ...


@dataclass
class ScenarioSteps:
    """What a caller gives :func:`run_scenario` beside the scenario and the deployment (the context):

    ``observation``, the scenario's as the caller opened it (names, versions, block geometry; filled
    as the scenario runs); ``run(obs)`` sends the kind's requests, fills ``obs`` and returns the
    kind's result; ``judge(obs, result)`` returns the verdict; ``http`` (no keep-alive, for
    ``/metrics``) and the metrics archive ``store``; ``drain_s`` seconds for each instance to return
    to idle; ``rig_exception(scenario, doing, e)`` records a rig bug and returns the ERROR reason
    (rig.run.ledger.RunLedger.rig_exception); ``missing_error`` an ERROR reason known before running
    (metrics the checks read are absent)."""

    observation: ScenarioObservation
    run: Callable[[ScenarioObservation], Awaitable[object]]
    judge: Callable[[ScenarioObservation, object], ScenarioVerdict]
    http: httpx.AsyncClient
    store: SnapshotStore
    drain_s: float
    rig_exception: Callable[[str, str, Exception], str]
    missing_error: str = ""


@dataclass
class ScenarioOutcome:
    """One scenario's observation, verdict and what its kind returned (None when it did not run)."""

    observation: ScenarioObservation
    verdict: ScenarioVerdict
    kind_result: object = None


async def run_scenario(sc: ScenarioConfig, deployment: Deployment, steps: ScenarioSteps) -> ScenarioOutcome:
    """Run scenario ``sc`` on ``deployment`` and judge it (see the module docstring); ``steps`` is
    the context: the observation the caller opened, the kind's run and judge, the clients.

    Not run when an instance it needs is dead (its verdict: FAIL "died", :func:`died_verdict`) or
    ``steps.missing_error`` is set (ERROR). An instance that stops answering ``/metrics`` is an
    observation (the death's verdict), or ERROR "metrics unavailable" when it is not dead; a rig
    exception while running or judging is that scenario's ERROR (``steps.rig_exception``).
    Never raises for the system under test; KeyboardInterrupt and cancellation propagate."""
    t0 = time.monotonic()
    obs = steps.observation
    result: object = None
    if not await deployment.deaths(steps.http):
        if steps.missing_error:
            obs.error = steps.missing_error
        else:
            got: dict[str, object] = {}
            try:
                await _between_snapshots(sc, deployment, steps, obs, got)
            except httpx.HTTPError as e:
                # An instance that died is an observation (FAIL), not a rig error.
                if not await deployment.deaths(steps.http):
                    obs.error = f"metrics unavailable: {type(e).__name__}: {e}"
            except Exception as e:  # the rig's own bug: this scenario is ERROR, the run goes on
                obs.error = steps.rig_exception(sc.name, "running it", e)
            result = got.get("result")
    obs.timeline = steps.store.rows_of(sc.name)
    await deployment.observe(steps.http, obs)
    obs.wall_s = time.monotonic() - t0
    return ScenarioOutcome(obs, judge_scenario(sc, obs, result, steps), result)


def judge_scenario(sc: ScenarioConfig, obs: ScenarioObservation, result: object,
                   steps: ScenarioSteps) -> ScenarioVerdict:
    """The kind's verdict; a rig exception while judging is that scenario's ERROR. A scenario
    whose kind produced nothing because an instance it needs died (before it ran, or while it
    ran) gets the death's verdict (:func:`died_verdict`) in every kind, ``fault`` included: a
    fault scenario kills on purpose and judges those deaths itself, but only from the result its
    workload returns; with no result its fault never fired, so the death is not its own."""
    if obs.dead and result is None:
        return died_verdict(sc, obs)
    try:
        return steps.judge(obs, result)
    except Exception as e:
        return ScenarioVerdict(sc.name, "ERROR", "pass", steps.rig_exception(sc.name, "judging", e), [])


def died_verdict(sc: ScenarioConfig, obs: ScenarioObservation) -> ScenarioVerdict:
    """FAIL "<instance> died (exit N): <death line>" for a scenario that could not run because an
    instance it needs died (``obs.dead``, ``obs.death_lines``): the verdict engine
    (:func:`rig.judge.verdict.decide`) on the ``alive`` check alone, so a known issue whose
    signature is that death still gives XFAIL."""
    exp = replace(expectation_of(sc, obs), required=("alive",))
    found = match(sc.known_issue.symptom, obs, []) if sc.known_issue is not None and not exp.tamper else None
    return decide(sc.name, [alive_check(obs)], exp, found, obs.error, dead=True)


async def _between_snapshots(sc: ScenarioConfig, deployment: Deployment, steps: ScenarioSteps,
                             obs: ScenarioObservation, got: dict[str, object]) -> None:
    """The kind's requests between metric snapshots, then transfer evidence, drains and idle
    snapshots. The kind's result goes to ``got["result"]`` as soon as it exists (a failure after
    the kind ran keeps it). Raises httpx.HTTPError when a decode instance stops answering."""
    http, store = steps.http, steps.store
    endpoints = [*deployment.decodes, *deployment.prefills]  # D first: the subject
    before = {e.name: await m.scrape(http, e.url, e.name) for e in endpoints[::-1]}
    for s in before.values():
        store.save(f"{sc.name}-before", s)
        store.sample(sc.name, s)  # the timeline's first row per instance (counters-monotonic)
    load_before = proctree.host_load()  # through the module: tests give fake servers an idle host
    got["result"] = await steps.run(obs)
    # The highest 1-minute load around the requests (rig.judge.latency's host-load guard).
    loads = [x[0] for x in (load_before, proctree.host_load()) if x is not None]
    obs.host_load_1m = round(max(loads), 2) if loads else None
    obs.host_cpus = proctree.host_cpus()
    evidence: TransferEvidence | None = None
    for d in deployment.decodes:  # the decodes' deltas summed (one decode in a suite's phase)
        after_d = await m.scrape(http, d.url, d.name)
        store.save(f"{sc.name}-after", after_d)
        store.sample(sc.name, after_d)
        one = TransferEvidence.between(before[d.name], after_d)
        evidence = one if evidence is None else TransferEvidence(
            **{k: getattr(evidence, k) + getattr(one, k) for k in one.__dict__})
    obs.evidence = evidence
    # P's counters too (its preemptions: expect.min_preemptions_on prefill, bug record R11's P side).
    # P's metrics are not in the warm-up's presence list, so a counter P lacks is listed here:
    # the check that reads it is then "not checked", never a 0 that fails or passes. A P that a
    # fault killed answers nothing: no prefill evidence (not checked), and the drains still run.
    p = deployment.prefills[0]
    with contextlib.suppress(httpx.HTTPError, ValueError):
        after_p = await m.scrape(http, p.url, p.name)
        store.save(f"{sc.name}-after", after_p)
        store.sample(sc.name, after_p)
        obs.prefill_evidence = TransferEvidence.between(before[p.name], after_p)
        # Only the counter a check reads on P (expect.min_preemptions_on); a P without a spec
        # method has no spec_decode_* series at all, which is not a gap.
        if not after_p.has(m.PREEMPTIONS):
            obs.missing_metrics[p.name] = sorted({*obs.missing_metrics.get(p.name, []), m.PREEMPTIONS})
    # One after the other, D first: a P may hold blocks for an abandoned transfer until its
    # kv_lease_duration (30 s by default) expires, and its wait starts once D is idle.
    for e in endpoints:
        obs.drains.append(await wait_idle(http, e.name, e.url, before[e.name].get(m.KV_USAGE) or 0.0, steps.drain_s))
    for e in endpoints[::-1]:
        idle = await m.scrape(http, e.url, e.name)
        store.save(f"{sc.name}-idle", idle)
        store.sample(sc.name, idle)


class ClusterDeployment:
    """A suite phase's pair on a :class:`rig.cluster.processes.Cluster` (launched processes,
    Compose containers or attached endpoints): deaths from the cluster (after ``grace_s`` seconds
    for an instance that stopped answering to exit), log lines from ``logs``; ``attach``: an
    instance gone because its owner stopped it (`pdrig up` after another died) is no death."""

    def __init__(self, cluster: Cluster, prefill: str, decode: str, logs: LogScanner, attach: bool,
                 grace_s: float) -> None:
        self.cluster, self.logs, self.attach, self.grace_s = cluster, logs, attach, grace_s
        self.needed = [prefill, decode]
        self.prefills = [Endpoint(prefill, cluster.url(prefill))]
        self.decodes = [Endpoint(decode, cluster.url(decode))]

    async def deaths(self, http: httpx.AsyncClient) -> dict[str, int]:
        """The phase's instances that are dead."""
        dead = await settle_deaths(http, self.cluster, self.needed, self.grace_s)
        return {n: rc for n, rc in dead.items() if n in self.needed}

    async def observe(self, http: httpx.AsyncClient, obs: ScenarioObservation) -> None:
        """Every dead instance of the cluster, their death lines, the log lines since the last scan."""
        obs.dead = await settle_deaths(http, self.cluster, self.needed, self.grace_s)
        if self.attach:
            obs.stopped = {n: line for n in obs.dead if (line := self.logs.stop_line(self.cluster, n))}
            obs.dead = {n: rc for n, rc in obs.dead.items() if n not in obs.stopped}
        obs.death_lines = {n: self.logs.death_line(self.cluster, n) for n in obs.dead}
        self.logs.scan(self.cluster, obs)


@dataclass
class PhaseEvidence:
    """What the warm-up of a phase learnt: ``versions`` (``{instance: /version}``, "unknown" when
    it did not answer), which metrics the checks read each instance lacks, and the decode's
    measured per-request ``baseline`` (rig.workload.baseline; None when nothing measured it)."""

    versions: dict[str, str]
    presence: MetricPresence
    baseline: RequestBaseline | None = None


def decode_version(versions: dict[str, str], decode: str) -> str:
    """The version a known issue is matched against (``ScenarioObservation.vllm_version``): the
    ``decode`` instance's, the subject of the scenarios; '' when it did not answer ``/version``
    (never the prefill's instead: ``versions`` holds both, and unknown or different versions are
    the verdict engine's to judge)."""
    v = versions.get(decode, UNKNOWN_VERSION)
    return "" if v == UNKNOWN_VERSION else v

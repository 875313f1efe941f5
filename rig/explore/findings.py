"""A distinct finding of an exploration, and the report rows the explorer keeps.

A finding is identified by its mechanism (rig.explore.mechanism: what vLLM did), not by the list
of failed checks; it keeps the check-based signature too (what the verdict engine said), the
replays (stable / flaky), the minimal action, the emitted YAML and the known issue matched on the
mechanism with the reason (rig.explore.known), or "new".
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from rig.config import RigConfig
from rig.explore.excuses import Excuse, took_effect
from rig.explore.grammar import Action, Topology
from rig.explore.mechanism import Mechanism
from rig.judge.verdict import ScenarioVerdict
from rig.report.explore_model import (
    FindingReport,
    LivenessReport,
    MechanismReport,
    NemesisReport,
    TopologyReport,
    stability_of,
)


def finding_id(seed: int, n: int) -> str:
    """The id of an exploration's ``n``-th finding (1-based): ``explore-<seed>-<n>``, the name of its
    emitted scenario and its YAML's stem (rig.explore.reproduce)."""
    return f"explore-{seed}-{n}"


@dataclass
class Finding:
    """One distinct violation: its ``mechanism`` (the identity), ``signature`` (the failed checks
    and symptoms), the action that first showed it, how often the exploration saw it, its replays
    (mechanism keys seen), the minimal action and the shrink runs and seconds it took, the emitted
    YAML and the known issue it matches (id, or "new") with ``known_why``. A whole-history finding
    (rig.explore.whole_history, ``scope`` "whole-history") names its ``actions`` and ``requests``;
    ``note`` says why it was not replayed or shrunk."""

    mechanism: Mechanism
    signature: str
    topology: Topology
    action: Action
    reason: str
    seen: int = 1
    replays: list[str | None] = field(default_factory=list)
    minimal: Action | None = None
    shrink_runs: int = 0
    shrink_s: float = 0.0
    yaml_path: str = ""
    emitted_verdict: str = ""
    known_issue: str = "new"
    known_why: str = ""
    scope: str = "action"
    actions: list[int] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def stability(self) -> str:
        """'stable' (every replay showed it), 'flaky k/n', or 'not replayed'
        (rig.report.explore_model.stability_of)."""
        return stability_of(self.mechanism.key, self.replays)

    def to_report(self, finding_id: str) -> FindingReport:
        """The report's record of this finding, named ``finding_id`` (:func:`finding_id`)."""
        m = self.mechanism
        return FindingReport(
            id=finding_id, mechanism=MechanismReport(kind=m.kind, key=m.key, evidence=dict(m.evidence)),
            signature=self.signature, topology=TopologyReport(**{**self.topology.__dict__,
                                                                 "sets": list(self.topology.sets)}),
            first_action=self.action.index, action=self.action.model_dump(mode="json"), reason=self.reason,
            seen=self.seen, replays=list(self.replays), stability=self.stability,
            minimal=self.minimal.model_dump(mode="json") if self.minimal else None,
            minimal_requests=self.minimal.requests() if self.minimal else None,
            shrink_runs=self.shrink_runs, shrink_s=round(self.shrink_s, 1), yaml=self.yaml_path,
            emitted_verdict=self.emitted_verdict, known_issue=self.known_issue, known_why=self.known_why,
            scope=self.scope, actions=self.actions or [self.action.index], requests=list(self.requests),
            note=self.note)


def nemesis_row(action: Action, v: ScenarioVerdict, excused: list[Excuse] | None = None) -> NemesisReport:
    """The report's row of one nemesis phase: action index, the fault, requests under it, the
    verdict (after the excuses), whether the fault took effect (rig.explore.excuses.took_effect),
    the liveness oracle's checks (recovery-serves, idle-after within the named bound, alive) with
    their details, and what was excused as "caused by the nemesis (kind, window)"."""
    assert action.nemesis is not None
    live = {c.name: LivenessReport(state=c.state, detail=c.detail) for c in v.checks
            if c.name in ("fault-fired", "recovery-serves", "idle-after", "alive")}
    fired, how = took_effect(v)
    return NemesisReport(index=action.index, nemesis=action.nemesis.name,
                         faults=[f.describe() for f in action.nemesis.faults], requests=action.nemesis.requests,
                         heal_s=action.nemesis.heal_s, verdict=v.verdict, liveness=live, took_effect=fired,
                         effect=how if fired else f"fault NOT verified to have taken effect: {how}",
                         excused=[e.describe() for e in excused or []])


def sets_of(cfg: RigConfig, topo: Topology) -> str:
    """The ``--set`` arguments (shell-quoted) that reproduce a finding on ``topo``: a drawn
    topology's own, and the lease the exploration ran with unless that set it (a finding whose
    decode hop was held past the lease reproduces only with the same lease)."""
    sets = list(topo.sets)
    lease = cfg.nixl.kv_lease_duration
    if lease is not None and not any(s.startswith("nixl.kv_lease_duration=") for s in sets):
        sets.append(f"nixl.kv_lease_duration={lease}")
    return "".join(f" --set {shlex.quote(s)}" for s in sets)

"""The explorer's report model: one versioned, validated description of a ``pdrig explore`` run,
from which explore.json (its dump), explore.md and explore-junit.xml are rendered
(rig.report.explore_render) and which ``pdrig matrix --explore`` reads back with
:meth:`ExploreReport.model_validate_json` (rig.run.explore_matrix).

Plain data, like the suite's report model (rig.report.model): every model here is a
:class:`rig.report.model_base.ReportModel` (``extra="forbid"``: a field nobody declared is an error,
attribute docstrings are the JSON Schema's descriptions), and this module imports nothing of the rig
but that base, so the renderers that read it need neither the explorer nor the judge. rig.explore.report
turns the explorer's objects (findings, nemesis phases, the coverage table) into it. Field names carry
their unit (``_s`` seconds, ``_per_min``, ``minutes``); explore.json has always had these names. An
action (rig.explore.grammar.Action) is kept as its JSON mapping: the grammar, not the report, owns its
shape (``Action.model_validate`` reads it back). Its JSON Schema is ``schema/explore-report.schema.json``.

Where to add a field: here (with its docstring and unit), its value in rig/explore/report.py, its
reader in rig/report/explore_render.py, then ``scripts/gen_reference.py`` rewrites the schema. Bump
:data:`EXPLORE_REPORT_VERSION` when a field is renamed or removed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, model_validator

from rig.report.model_base import ReportModel

EXPLORE_REPORT_VERSION = "1.0"

ExploreStatus = Literal["done", "interrupted", "error"]


def stability_of(key: str, replays: list[str | None]) -> str:
    """A finding's stability from its replays' mechanism keys (None: a replay that passed):
    ``stable`` (every replay showed ``key``), ``flaky k/n`` (k of the n replays did), or
    ``not replayed``."""
    if not replays:
        return "not replayed"
    hits = sum(s == key for s in replays)
    return "stable" if hits == len(replays) else f"flaky {hits}/{len(replays)}"


class ExploreSettingsReport(ReportModel):
    """What ``pdrig explore`` was asked for (rig.explore.settings.ExploreSettings, field for field;
    its docstring says what each means and which None stands for the grammar's default)."""

    seed: int
    actions: int
    """The action budget over all topologies (count)."""
    minutes: float
    """Minutes of exploring actions allowed, start-ups excluded (0: no bound)."""
    decodes: list[str]
    replays: int
    """Replays per finding (count)."""
    shrink_runs: int
    """Live runs allowed per finding's shrinking (count)."""
    allow_logprobs: bool
    known: list[str]
    """Suite files whose known issues were tried on the findings, beside the config's own."""
    replay: str | None
    """The history.jsonl re-run instead of generating (None: generated)."""
    stop_at_first: bool
    routes: list[str]
    motifs: list[str] | None
    nemesis_every: int
    nemesis: list[str] | None
    cancel_share: float | None
    resource_share: float | None
    draw_topologies: int
    knobs: list[str] | None
    sample_share: float | None
    background_share: float | None
    swarm_every: int = 0
    """Actions per swarm segment of a topology (0: swarm off; rig.explore.swarm)."""


class TopologyReport(ReportModel):
    """The (prefill, decode) pair a finding was found on, with the knobs the grammar used
    (rig.explore.grammar.Topology, field for field)."""

    prefill: str
    decode: str
    block_size: int
    """Tokens per KV block on D."""
    max_model_len: int
    """Tokens."""
    usable_blocks: int | None
    """D's usable KV blocks (None: vLLM sized the pool itself)."""
    spec_tokens: int = 0
    """D's ``num_speculative_tokens`` (0: no speculative decoding)."""
    lease_s: float = 30.0
    """P's ``kv_lease_duration``, seconds."""
    variant: str = ""
    """A drawn topology's name (rig.explore.topologies), '' for the config as is."""
    sets: list[str] = []
    """The ``--set`` strings that make the config that topology."""
    chat_overhead: int = 0
    """Tokens P's chat template adds to a prompt (rig.explore.probe)."""
    caps: dict[str, int] = {}
    """``<side>.<cap>`` -> the scheduler cap that side was started with (rig.explore.topologies.caps_of)."""


class MechanismReport(ReportModel):
    """What vLLM did (rig.explore.mechanism.Mechanism): a finding's identity."""

    kind: str
    """death, stall, divergence, refusal, http, slow, leak, fatal-log, counters, stale-read or checks."""
    key: str
    """The identity replays and shrinking compare (``stall:decode:waiting=...``)."""
    evidence: dict[str, Any] = {}
    """Name -> value, what a vLLM engineer needs to file it (rig.explore.known matches on it)."""


class FindingReport(ReportModel):
    """One distinct violation (rig.explore.findings.Finding), with its replays, the minimal action
    and the known issue it matches (``known_issue``: its id, or ``new``; ``known_why``: why)."""

    id: str
    """``explore-<seed>-<n>``: the name of its emitted scenario and its YAML's stem."""
    mechanism: MechanismReport
    signature: str
    """The failed checks and symptoms, as the verdict engine named them."""
    topology: TopologyReport
    first_action: int
    """The index of the action that first showed it."""
    action: dict[str, Any]
    """That action (rig.explore.grammar.Action as JSON)."""
    reason: str
    """The verdict's diagnosis, in words."""
    seen: int = 1
    """Exploring actions that showed this mechanism (count)."""
    replays: list[str | None] = []
    """The mechanism key each replay showed (None: the replay passed)."""
    stability: str = "not replayed"
    """``stable``, ``flaky k/n`` (k of n replays showed it) or ``not replayed`` (:func:`stability_of`)."""
    minimal: dict[str, Any] | None = None
    """The shrunk action (rig.explore.grammar.Action as JSON; None: not shrunk)."""
    minimal_requests: int | None = None
    """Requests the minimal action sends (None: not shrunk)."""
    shrink_runs: int = 0
    """Live runs the shrinking took (count)."""
    shrink_s: float = 0.0
    """Seconds the shrinking took (to 0.1 s)."""
    yaml: str = ""
    """The emitted suite YAML's path ('' when not emitted yet)."""
    emitted_verdict: str = ""
    """The verdict of the emitted YAML run without a known issue (with the mechanism it showed when
    that differs)."""
    known_issue: str = "new"
    """The known issue that explains it (its id, with a note), or ``new``."""
    known_why: str = ""
    """Why it matched (field by field, how it was confirmed), or why none did."""
    scope: Literal["action", "whole-history"] = "action"
    """``whole-history``: found by a check over every action of a deployment life
    (rig.explore.whole_history), not by one action's verdict."""
    actions: list[int] = []
    """The indices of the actions it involves (one for an action's finding)."""
    requests: list[str] = []
    """The request ids a whole-history finding names."""
    note: str = ""
    """Why it was not replayed or shrunk (a whole-history finding), or ''."""

    @model_validator(mode="after")
    def _stability_says_replays(self) -> FindingReport:
        """``stability`` is the replays in words: a report where they disagree is refused (ValueError)."""
        want = stability_of(self.mechanism.key, self.replays)
        if self.stability != want:
            raise ValueError(f"finding {self.id}: stability {self.stability!r} but its replays say {want!r}")
        return self


class GoalReport(ReportModel):
    """One "sometimes" coverage goal (rig.explore.coverage.Goal) over the exploration."""

    goal: str
    description: str
    reached: bool
    """At least one action reached it."""
    count: int
    """Actions that reached it."""
    note: str = ""
    """Why it is reached another way, or cannot be yet ('' when nothing to say)."""


class LivenessReport(ReportModel):
    """One liveness check of a nemesis phase."""

    state: Literal["ok", "failed", "not checked"]
    detail: str


class NemesisReport(ReportModel):
    """One nemesis phase (rig.explore.findings.nemesis_row): inject, requests under the fault, heal,
    liveness."""

    index: int
    """The action's index."""
    nemesis: str
    faults: list[str]
    """Each fault in words (rig.explore.grammar's ``describe``)."""
    requests: int
    """P/D requests sent while the fault was on."""
    heal_s: float
    """After the heal, P and D must be idle within ``kv_lease_duration`` + this, seconds."""
    verdict: str
    """The verdict after the nemesis' excuses."""
    liveness: dict[str, LivenessReport] = {}
    """fault-fired, recovery-serves, idle-after, alive -> state and detail."""
    took_effect: bool
    """The fault-fired check held (the process stopped or killed, the hop held)."""
    effect: str
    """What fault-fired saw, or why the fault was not verified to have taken effect."""
    excused: list[str] = []
    """What was excused as caused by the nemesis (rig.explore.excuses.Excuse.describe)."""


class DrawnTopologyReport(ReportModel):
    """One topology drawn from vLLM's knobs (rig.explore.topologies.Variant)."""

    name: str
    decode: str
    knobs: dict[str, Any]
    """Knob -> the value drawn."""
    sets: list[str]
    """The ``--set`` strings that reproduce it."""


class NotJudgedReport(ReportModel):
    """An action the rig could not judge (rig.explore.oracles.could_not_judge): no finding."""

    action: int
    """The action's index."""
    reason: str


class SwarmSegmentReport(ReportModel):
    """One swarm segment (rig.explore.swarm.SwarmLog.segments): the features it kept."""

    segment: int
    topology: str
    actions: int
    """Actions run in the segment (count)."""
    first: int
    """Index of its first action."""
    last: int
    """Index of its last action."""
    full: bool
    """Every feature kept (a topology's first segment)."""
    on: list[str]
    off: list[str]
    """Features swarm removed in this segment (not those the flags turned off)."""
    failures: list[str]
    """The distinct mechanism keys of the violations seen in the segment."""


class SwarmFeatureReport(ReportModel):
    """One feature over the whole exploration (rig.explore.swarm.SwarmLog.features)."""

    feature: str
    actions_on: int
    actions_off: int
    findings_on: list[str]
    """Distinct mechanism keys seen in actions with the feature on."""
    findings_off: list[str]


class SwarmReport(ReportModel):
    """The swarm segments and the per-feature counts (rig.explore.swarm.SwarmLog.to_json)."""

    every: int
    """Actions per segment."""
    segments: list[SwarmSegmentReport]
    features: list[SwarmFeatureReport]


class HistoryFailureReport(ReportModel):
    """One failure a whole-history check found (rig.explore.whole_history.HistoryFailure)."""

    model_config = ConfigDict(extra="allow")  # the check's own evidence fields, named by each check
    actions: list[int] = []
    requests: list[str] = []


class HistoryCheckReport(ReportModel):
    """One whole-history check (rig.explore.whole_history.HistoryCheck) over the whole run."""

    check: str
    state: Literal["ok", "failed", "not checked"]
    detail: str
    samples: int = 0
    """The actions (or gaps between actions) it judged (count)."""
    failures: list[HistoryFailureReport] = []


class ExploreReport(ReportModel):
    """A whole exploration: explore.json. Written after every action and on every exit path."""

    # explore.json has always written a NaN or an infinity as such (json.dumps): keep it
    model_config = ConfigDict(ser_json_inf_nan="constants")

    version: Literal["1.0"] = "1.0"
    """The explore report model's version (:data:`EXPLORE_REPORT_VERSION`)."""
    config: str
    """The config's name."""
    seed: int
    run_dir: str
    settings: ExploreSettingsReport
    status: ExploreStatus = "done"
    """done (also while running: the report is rewritten after each action), interrupted or error."""
    error: str = ""
    """Why the exploration broke (status error)."""
    vllm_version: str = ""
    actions: int = 0
    """Actions run while exploring (count)."""
    runs: int = 0
    """Every live scenario run: actions, replays, shrink candidates, emitted checks (count)."""
    startups: int = 0
    """Deployment start-ups (count)."""
    startup_s: float = 0.0
    """Seconds spent starting each topology's pair before its first action."""
    action_s: float = 0.0
    """Wall seconds spent in exploring actions."""
    actions_per_min: float = 0.0
    """``actions`` per minute of ``action_s`` (start-ups excluded; 0 before any action)."""
    wall_s: float = 0.0
    """Seconds from the start to the end (start-ups, replays and shrinking included)."""
    first_failure_s: float | None = None
    """Seconds from the start (start-ups included) to the first violation (None: none)."""
    first_failure_actions: int | None = None
    """Actions run by the first violation."""
    fields: dict[str, list[str]] = {}
    """Endpoint -> the request fields drawn from vLLM's request models."""
    coverage: list[GoalReport] = []
    findings: list[FindingReport] = []
    nemeses: list[NemesisReport] = []
    topologies: list[DrawnTopologyReport] = []
    """The topologies drawn from vLLM's knobs ([] when the config's decode instances were explored)."""
    not_judged: list[NotJudgedReport] = []
    swarm: SwarmReport | None = None
    """The swarm segments and features (None: swarm off, or no action ran)."""
    history_checks: list[HistoryCheckReport] = []
    """The whole-history checks, run after exploring (or replaying)."""

    def new_findings(self) -> list[FindingReport]:
        """The findings no known issue explains (``pdrig explore`` exits 1 when there is one)."""
        return [f for f in self.findings if f.known_issue == "new"]

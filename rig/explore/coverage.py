"""Behaviour coverage: "sometimes" goals, as data, read from what an action produced.

A goal is a state the exploration should reach at least once (Antithesis' "sometimes"
assertions): read from D's and P's ``/metrics`` deltas over the action
(:class:`rig.observe.observations.TransferEvidence`), the request records, the log lines the rig
scans and the action itself. Each goal carries a *hint*, the grammar choices that make it likely,
which :class:`rig.explore.generate.Generator` applies to part of its actions while the goal is
not reached. Goals with no way to reach them yet say so in ``note`` (shown in the report).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rig.explore.background import is_background, over_caps
from rig.explore.grammar import Action, Topology
from rig.explore.sampling import choices_of, is_sampled
from rig.observe.observations import ScenarioObservation
from rig.report.explore_model import GoalReport
from rig.workload.sequence_result import SWALLOWED


@dataclass(frozen=True)
class Goal:
    """One "sometimes" goal: ``reached(action, obs, topo)`` says whether this action reached it;
    ``hint`` biases the generator (keys: route, length: edge|pool-exact|long, count, endpoint,
    stream, prompts, field, cancel, motif: a rig.explore.grammar.MOTIF_WEIGHTS name, sample: a
    step sampled with a seed, background: background bursts)."""

    name: str
    description: str
    reached: Callable[[Action, ScenarioObservation, Topology], bool]
    hint: dict[str, Any] = field(default_factory=dict)
    note: str = ""


def _ev(obs: ScenarioObservation, attr: str, prefill: bool = False) -> float:
    ev = obs.prefill_evidence if prefill else obs.evidence
    return float(getattr(ev, attr, 0.0) or 0.0) if ev is not None else 0.0


def _pool_exact(a: Action, obs: ScenarioObservation, t: Topology) -> bool:
    """A P/D step whose prompt + completion needs exactly the usable blocks, and a request of the
    action reached D (answered or left waiting)."""
    exact = t.usable_blocks and any(
        s.route == "pd" and t.blocks_needed(s.prompt_tokens, s.max_tokens) == t.usable_blocks for s in a.steps)
    return bool(exact) and any(r.decode is not None for r in obs.records)


def _ok(obs: ScenarioObservation) -> bool:
    return any(r.outcome == "ok" for r in obs.records)


def _status(obs: ScenarioObservation, lo: int, hi: int) -> bool:
    return any(r.decode is not None and r.decode.status is not None and lo <= r.decode.status < hi
               for r in obs.records)


GOALS: tuple[Goal, ...] = (
    Goal("pd-answered", "a P/D request answered with its KV pulled over NIXL",
         lambda a, o, t: _ev(o, "nixl_transfers") > 0 and any(r.outcome == "ok" for r in o.records),
         {"route": "pd"}),
    Goal("pool-exact", "a P/D request that needs exactly the decode's usable blocks",
         _pool_exact, {"route": "pd", "length": "pool-exact"}),
    Goal("waiting-remote-kv", "a request left waiting for its remote KV (a stall was diagnosed)",
         lambda a, o, t: any(r.outcome == "stalled" for r in o.records), {"route": "pd", "length": "long"}),
    Goal("refused", "a request refused with a 4xx and a message",
         lambda a, o, t: _status(o, 400, 500), {"field": True}),
    Goal("server-error", "a 5xx answer", lambda a, o, t: _status(o, 500, 600), {}),
    Goal("preempt-d", "a preemption on D", lambda a, o, t: _ev(o, "preemptions") > 0,
         {"route": "pd", "count": 3, "length": "long"}),
    Goal("preempt-p", "a preemption on P", lambda a, o, t: _ev(o, "preemptions", prefill=True) > 0,
         {"route": "pd", "count": 3, "length": "long"}),
    Goal("spec-drafts", "speculative drafts proposed on D", lambda a, o, t: _ev(o, "spec_drafts") > 0,
         {"route": "pd"}),
    Goal("d-prefix-hit", "a prefix-cache hit on D", lambda a, o, t: _ev(o, "cached_prompt_tokens") > 0,
         {"motif": "reuse"}),
    Goal("failed-transfer", "a failed NIXL transfer counted", lambda a, o, t: _ev(o, "failed_transfers") > 0, {}),
    Goal("lease-expired", "P logged a read of KV it had released (lease expired)",
         lambda a, o, t: any(o.kv_integrity_lines.values()), {"motif": "lease-hold"}),
    Goal("held-past-lease", "a decode hop held past P's lease while P's pool was cycled",
         lambda a, o, t: a.hold_s > t.lease_s and a.flush_prefill, {"motif": "lease-hold"}),
    Goal("n-on-prefill", "n > 1 on the prefill hop only",
         lambda a, o, t: any(int(s.fields_for("prefill").get("n") or 1) > 1 for s in a.steps), {"motif": "n-prefill"}),
    Goal("append-first-token", "a router appending P's first token to D's prompt",
         lambda a, o, t: any(s.appends for s in a.steps), {"motif": "append-first-token"}),
    Goal("prompt-reuse", "a prompt sent again or extended by a later step",
         lambda a, o, t: any(s.repeat_of or s.prefix_of for s in a.steps), {"motif": "reuse"}),
    Goal("abandoned", "a P/D request abandoned between the hops",
         lambda a, o, t: any(s.route == "pd-abandon" for s in a.steps), {"route": "pd-abandon"}),
    Goal("burst", "two or more P/D requests in flight together",
         lambda a, o, t: sum(s.count for s in a.steps if s.route == "pd") >= 2, {"route": "pd", "count": 3}),
    Goal("chat", "a request on the chat endpoint answered",
         lambda a, o, t: any(s.endpoint == "chat" for s in a.steps) and any(r.outcome == "ok" for r in o.records),
         {"endpoint": "chat"}),
    Goal("streamed-decode", "a streamed decode hop answered",
         lambda a, o, t: any(bool(s.fields_for("decode").get("stream")) for s in a.steps)
         and any(r.outcome == "ok" for r in o.records), {"stream": True}),
    Goal("cancelled", "a P/D request cut on purpose at a drawn time (cancel_after_ms)",
         lambda a, o, t: any(r.outcome == "cancelled" and not r.diagnosis.startswith("not sent:")
                             for r in o.records) and any(s.cancel_after_ms for s in a.steps),
         {"route": "pd", "cancel": True}),
    Goal("cancel-on-decode", "a P/D request cut while its decode hop was in flight",
         lambda a, o, t: any(r.outcome == "cancelled" and "decode hop closed" in r.diagnosis for r in o.records),
         {"route": "pd", "cancel": True}),
    Goal("nemesis-healed", "a nemesis phase healed: recovery served with P and D idle in the bound",
         lambda a, o, t: a.nemesis is not None and not o.dead and any(r.outcome == "ok" for r in o.records),
         {}, "nemesis phases come every --nemesis-every actions, not from hints"),
    Goal("several-prompts", "one request carrying several prompts",
         lambda a, o, t: any(s.prompts > 1 for s in a.steps), {"motif": "prompts"}),
    Goal("sampled-seed", "a request sampled with a fixed seed answered (parity against the same-seed reference)",
         lambda a, o, t: any(is_sampled(s) for s in a.steps) and _ok(o), {"sample": True}),
    Goal("sampled-choices", "several sampled choices answered in one request",
         lambda a, o, t: any(is_sampled(s) and choices_of(s) > 1 for s in a.steps) and _ok(o), {"sample": True}),
    Goal("background-over-caps", "a background burst past every scheduler cap beside the action's own steps",
         lambda a, o, t: any(is_background(s) and over_caps(t, s) for s in a.steps)
         and any(not is_background(s) for s in a.steps) and _ok(o), {"background": True}),
    Goal("retried", "a decode hop closed and sent again with the same kv_transfer_params, the retry judged",
         lambda a, o, t: any(r.first_decode is not None and r.outcome in ("ok", "http_error") for r in o.records),
         {}, "pd-retry steps are split off the drawn pd steps (their own stream), not steered by hints"),
    Goal("cancel-swallowed", "a client cancel the router did not forward: the hops read to their end",
         lambda a, o, t: any(r.outcome == "ok" and r.diagnosis.startswith(SWALLOWED) for r in o.records),
         {}, "pd-swallow-cancel steps are split off the drawn pd steps (their own stream), not steered by hints"),
)
GOAL_NAMES = tuple(g.name for g in GOALS)


class Coverage:
    """Counts per goal over the actions seen (``counts[name]``: actions that reached it)."""

    def __init__(self, goals: tuple[Goal, ...] = GOALS):
        self.goals = goals
        self.counts: dict[str, int] = {g.name: 0 for g in goals}

    def update(self, action: Action, obs: ScenarioObservation, topo: Topology) -> list[str]:
        """Count the goals ``action`` reached (a goal whose predicate raises is not reached);
        returns their names."""
        hit = []
        for g in self.goals:
            try:
                ok = bool(g.reached(action, obs, topo))
            except (AttributeError, TypeError, ValueError):
                ok = False
            if ok:
                self.counts[g.name] += 1
                hit.append(g.name)
        return hit

    def unreached(self) -> list[str]:
        """Names of the goals not reached yet, in declaration order."""
        return [g.name for g in self.goals if self.counts[g.name] == 0]

    def hint(self, name: str) -> dict[str, Any]:
        """The generator hint of goal ``name`` (``{}`` for an unknown one)."""
        return next((g.hint for g in self.goals if g.name == name), {})

    def table(self) -> list[GoalReport]:
        """The report's rows, one per goal in declaration order."""
        return [GoalReport(goal=g.name, description=g.description, reached=self.counts[g.name] > 0,
                           count=self.counts[g.name], note=g.note) for g in self.goals]

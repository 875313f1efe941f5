"""The exploration's report: explore.json (the data), explore.md (coverage table, each distinct
failure with its minimal YAML, stable/flaky, the build, the known issue it matches) and
explore-junit.xml (one testcase per finding, failed unless it matches a known issue)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rig.report.junit import Case, Suite, render_junit


@dataclass
class ExploreReport:
    """What an exploration produced. ``actions``: actions run while exploring; ``runs``: every
    live scenario run (actions, replays, shrink candidates, emitted checks); ``startup_s``: seconds
    spent starting each topology's pair before its first action (``startups`` of them); ``action_s``: wall
    seconds spent in exploring actions; ``first_failure_s``: seconds from the start (deployment
    start-up included) to the first violation, ``first_failure_actions`` the actions run by then;
    ``nemeses``: one row per nemesis phase (rig.explore.findings.nemesis_row); ``topologies``: the
    topologies drawn from vLLM's knobs (name, decode, knobs, the ``--set`` strings), [] when the
    config's decode instances were explored; ``swarm``: the swarm segments and the per-feature
    counts (rig.explore.swarm.SwarmLog.to_json: ``every``, ``segments``, ``features``), {} without swarm;
    ``history_checks``: the whole-history checks (rig.explore.whole_history.HistoryCheck.to_json)."""

    config: str
    seed: int
    run_dir: str
    status: str = "done"
    error: str = ""
    vllm_version: str = ""
    actions: int = 0
    runs: int = 0
    startups: int = 0
    startup_s: float = 0.0
    action_s: float = 0.0
    wall_s: float = 0.0
    first_failure_s: float | None = None
    first_failure_actions: int | None = None
    fields: dict[str, list[str]] = field(default_factory=dict)
    coverage: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    nemeses: list[dict[str, Any]] = field(default_factory=list)
    topologies: list[dict[str, Any]] = field(default_factory=list)
    # actions the rig could not judge (rig.explore.oracles.could_not_judge): {"action", "reason"}
    not_judged: list[dict[str, Any]] = field(default_factory=list)
    swarm: dict[str, Any] = field(default_factory=dict)
    history_checks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def actions_per_min(self) -> float:
        """Exploring actions per minute of action wall time (start-up excluded)."""
        return self.actions / self.action_s * 60 if self.action_s else 0.0


def render_md(r: ExploreReport) -> str:
    """explore.md."""
    ff = f"{r.first_failure_s:.0f} s ({r.first_failure_actions} actions)" if r.first_failure_s is not None else "-"
    out = [f"# pdrig explore: {r.config}, seed {r.seed}", "",
           f"status {r.status}{': ' + r.error if r.error else ''}; vLLM {r.vllm_version or 'unknown'}; "
           f"{r.actions} actions ({r.actions_per_min:.1f}/min on the deployment), {r.runs} live runs in all, "
           f"{r.wall_s:.0f} s wall of which {r.startup_s:.0f} s in {r.startups} start-up(s); "
           f"first failure after {ff}", "",
           "## Coverage (sometimes goals)", "", "| goal | reached | count | what | note |", "|---|---|---|---|---|"]
    out += [f"| {c['goal']} | {'yes' if c['reached'] else 'no'} | {c['count']} | {c['description']} | {c['note']} |"
            for c in r.coverage]
    if r.nemeses:
        out += ["", "## Nemesis phases (inject, requests under the fault, heal, liveness)", "",
                "| action | nemesis | fault | requests | took effect | verdict | liveness after heal | excused |",
                "|---|---|---|---|---|---|---|---|"]
        for n in r.nemeses:
            live = "; ".join(f"{k} {c['state']}: {c['detail']}"[:160] for k, c in n["liveness"].items())
            effect = "yes" if n.get("took_effect") else f"**no**: {n.get('effect', '')[:160]}"
            excused = "; ".join(n.get("excused") or []) or "-"
            out.append(f"| {n['index']} | {n['nemesis']} | {', '.join(n['faults'])} | {n['requests']} | {effect} | "
                       f"{n['verdict']} | {live} | {excused} |")
    if r.topologies:
        out += ["", "## Topologies drawn from vLLM's knobs", "", "| topology | decode | knobs | --set |",
                "|---|---|---|---|"]
        out += [f"| {t['name']} | {t['decode']} | {' '.join(f'{k}={v}' for k, v in t['knobs'].items()) or '-'} | "
                f"`{' '.join(t['sets']) or '-'}` |" for t in r.topologies]
    out += swarm_md(r.swarm)
    out += history_md(r.history_checks)
    out += ["", "## Failures", ""]
    if not r.findings:
        out.append("none found")
    out += ["| # | topology | mechanism | signature | seen | stability | minimal requests | shrink | known issue "
            "| why | emitted YAML, no known issue | YAML |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"] if r.findings else []
    for i, f in enumerate(r.findings, 1):
        topo = f["topology"]
        where = f"{topo.get('variant') or ''} {topo['prefill']}+{topo['decode']}".strip()
        out.append(f"| {i} | {where} | `{f['mechanism']['key']}` | `{f['signature']}` | {f['seen']} | "
                   f"{f['stability']} | {f['minimal_requests'] or '-'} | "
                   f"{_shrunk(f)} | {f['known_issue']} | {f['known_why'] or '-'} | "
                   f"{f['emitted_verdict'] or '-'} | {f['yaml'] or '-'} |")
    if r.not_judged:
        out += ["", "## Not judged (no failure: a check the verdict needed could not look; no finding)", "",
                "| action | why |", "|---|---|"]
        out += [f"| {n['action']} | {n['reason'][:300]} |" for n in r.not_judged]
    for i, f in enumerate(r.findings, 1):
        ev = "; ".join(f"{k}: {v}" for k, v in f["mechanism"]["evidence"].items())
        out += ["", f"### Finding {i}: `{f['mechanism']['key']}` ({f['known_issue']})", "", f["reason"][:400], "",
                f"Mechanism evidence: {ev[:1200]}"]
        if f.get("note"):
            out += ["", f["note"]]
        if f["yaml"] and Path(f["yaml"]).is_file():
            out += ["", "```yaml", Path(f["yaml"]).read_text().rstrip(), "```"]
    if r.fields:
        out += ["", "## Request fields drawn (from vLLM's request models)", ""]
        out += [f"- {ep}: {', '.join(names)}" for ep, names in r.fields.items()]
    return "\n".join(out) + "\n"


def _shrunk(f: dict[str, Any]) -> str:
    """The finding's shrink cell: runs and seconds, or 'unshrunk' for a whole-history finding."""
    if f.get("scope") == "whole-history":
        return f"unshrunk (actions {', '.join(map(str, f.get('actions') or []))})"
    return f"{f['shrink_runs']} runs, {f['shrink_s']:.0f} s"


def history_md(checks: list[dict[str, Any]]) -> list[str]:
    """explore.md's "Whole-history checks" table ([] when none ran): check, state, detail, samples
    (the actions, or gaps between actions, judged)."""
    if not checks:
        return []
    out = ["", "## Whole-history checks (over every action of each deployment life, after the run)", "",
           "| check | state | detail | samples |", "|---|---|---|---|"]
    out += [f"| {c['check']} | {c['state']} | {c['detail'][:600]} | {c['samples']} |" for c in checks]
    return out


def swarm_md(swarm: dict[str, Any]) -> list[str]:
    """explore.md's "Swarm segments" and "Swarm features" sections ([] without swarm): one row per
    segment (its actions, the features on, the distinct failures seen in it) and per feature (actions
    and distinct findings with it on and with it removed by swarm; not with a flag's feature off)."""
    if not swarm:
        return []
    out = ["", f"## Swarm segments (a random half of the features, every {swarm['every']} actions per topology)",
           "", "| segment | topology | actions | features on | off | failures found in it |",
           "|---|---|---|---|---|---|"]
    for g in swarm["segments"]:
        on = "every feature (a topology's first segment)" if g["full"] else ", ".join(g["on"])
        out.append(f"| {g['segment']} | {g['topology']} | {g['actions']} ({g['first']}-{g['last']}) | {on} | "
                   f"{', '.join(g['off']) or '-'} | {', '.join(f'`{k}`' for k in g['failures']) or '-'} |")
    out += ["", "## Swarm features (on: kept in the action's segment; off: removed by swarm)", "",
            "| feature | actions on | actions off | findings on | findings off |", "|---|---|---|---|---|"]
    out += [f"| {f['feature']} | {f['actions_on']} | {f['actions_off']} | {len(f['findings_on'])} | "
            f"{len(f['findings_off'])} |" for f in swarm["features"]]
    return out


def junit_suite(r: ExploreReport) -> Suite:
    """explore-junit.xml's cases: one per finding (a known issue's: skipped; a new one: failure)."""
    return Suite("pdrig-explore", [
        Case(f"explore.{r.config}", f"finding-{i}: {f['mechanism']['key']}", "skipped",
             f"known issue {f['known_issue']}: {f['known_why']}"[:2000])
        if f["known_issue"] != "new" else
        Case(f"explore.{r.config}", f"finding-{i}: {f['mechanism']['key']}", "failure", f["stability"],
             f"{f['signature']}: {f['reason']}"[:2000])
        for i, f in enumerate(r.findings, 1)])


def write_explore_report(r: ExploreReport, run_dir: Path) -> None:
    """Write explore.json, explore.md and explore-junit.xml into ``run_dir``."""
    data = {**asdict(r), "actions_per_min": r.actions_per_min}
    (run_dir / "explore.json").write_text(json.dumps(data, indent=1, default=str))
    (run_dir / "explore.md").write_text(render_md(r))
    (run_dir / "explore-junit.xml").write_text(render_junit(junit_suite(r)))

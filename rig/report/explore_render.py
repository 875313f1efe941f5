"""explore.md and explore-junit.xml, rendered from the explorer's report model alone
(rig.report.explore_model.ExploreReport): the coverage table, the nemesis phases, the drawn
topologies, each distinct failure with its minimal YAML, stable/flaky, the known issue it matches;
and one JUnit testcase per finding through the one JUnit writer (rig.report.junit), failed unless a
known issue explains it."""

from __future__ import annotations

from pathlib import Path

from rig.report.explore_model import ExploreReport, FindingReport
from rig.report.junit import Case, Suite

MESSAGE_CHARS = 2000  # a finding's JUnit message: its known issue's why, or its signature and reason


def _head(r: ExploreReport) -> list[str]:
    ff = f"{r.first_failure_s:.0f} s ({r.first_failure_actions} actions)" if r.first_failure_s is not None else "-"
    return [f"# pdrig explore: {r.config}, seed {r.seed}", "",
            f"status {r.status}{': ' + r.error if r.error else ''}; vLLM {r.vllm_version or 'unknown'}; "
            f"{r.actions} actions ({r.actions_per_min:.1f}/min on the deployment), {r.runs} live runs in all, "
            f"{r.wall_s:.0f} s wall of which {r.startup_s:.0f} s in {r.startups} start-up(s); "
            f"first failure after {ff}", ""]


def _coverage(r: ExploreReport) -> list[str]:
    out = ["## Coverage (sometimes goals)", "", "| goal | reached | count | what | note |", "|---|---|---|---|---|"]
    return out + [f"| {c.goal} | {'yes' if c.reached else 'no'} | {c.count} | {c.description} | {c.note} |"
                  for c in r.coverage]


def _nemeses(r: ExploreReport) -> list[str]:
    if not r.nemeses:
        return []
    out = ["", "## Nemesis phases (inject, requests under the fault, heal, liveness)", "",
           "| action | nemesis | fault | requests | took effect | verdict | liveness after heal | excused |",
           "|---|---|---|---|---|---|---|---|"]
    for n in r.nemeses:
        live = "; ".join(f"{k} {c.state}: {c.detail}"[:160] for k, c in n.liveness.items())
        effect = "yes" if n.took_effect else f"**no**: {n.effect[:160]}"
        excused = "; ".join(n.excused) or "-"
        out.append(f"| {n.index} | {n.nemesis} | {', '.join(n.faults)} | {n.requests} | {effect} | "
                   f"{n.verdict} | {live} | {excused} |")
    return out


def _topologies(r: ExploreReport) -> list[str]:
    if not r.topologies:
        return []
    out = ["", "## Topologies drawn from vLLM's knobs", "", "| topology | decode | knobs | --set |",
           "|---|---|---|---|"]
    return out + [f"| {t.name} | {t.decode} | {' '.join(f'{k}={v}' for k, v in t.knobs.items()) or '-'} | "
                  f"`{' '.join(t.sets) or '-'}` |" for t in r.topologies]


def _swarm(r: ExploreReport) -> list[str]:
    """The "Swarm segments" and "Swarm features" sections ([] without swarm): one row per segment
    (its actions, the features on, the distinct failures seen in it) and per feature (actions and
    distinct findings with it on and with it removed by swarm; not with a flag's feature off)."""
    sw = r.swarm
    if sw is None:
        return []
    out = ["", f"## Swarm segments (a random half of the features, every {sw.every} actions per topology)",
           "", "| segment | topology | actions | features on | off | failures found in it |",
           "|---|---|---|---|---|---|"]
    for g in sw.segments:
        on = "every feature (a topology's first segment)" if g.full else ", ".join(g.on)
        out.append(f"| {g.segment} | {g.topology} | {g.actions} ({g.first}-{g.last}) | {on} | "
                   f"{', '.join(g.off) or '-'} | {', '.join(f'`{k}`' for k in g.failures) or '-'} |")
    out += ["", "## Swarm features (on: kept in the action's segment; off: removed by swarm)", "",
            "| feature | actions on | actions off | findings on | findings off |", "|---|---|---|---|---|"]
    return out + [f"| {f.feature} | {f.actions_on} | {f.actions_off} | {len(f.findings_on)} | "
                  f"{len(f.findings_off)} |" for f in sw.features]


def _history(r: ExploreReport) -> list[str]:
    """The "Whole-history checks" table ([] when none ran): check, state, detail, samples (the
    actions, or gaps between actions, judged)."""
    if not r.history_checks:
        return []
    out = ["", "## Whole-history checks (over every action of each deployment life, after the run)", "",
           "| check | state | detail | samples |", "|---|---|---|---|"]
    return out + [f"| {c.check} | {c.state} | {c.detail[:600]} | {c.samples} |" for c in r.history_checks]


def _shrunk(f: FindingReport) -> str:
    """A finding's shrink cell: runs and seconds, or 'unshrunk' for a whole-history finding."""
    if f.scope == "whole-history":
        return f"unshrunk (actions {', '.join(map(str, f.actions))})"
    return f"{f.shrink_runs} runs, {f.shrink_s:.0f} s"


def _failures(r: ExploreReport) -> list[str]:
    out = ["", "## Failures", ""]
    if not r.findings:
        return [*out, "none found"]
    out += ["| # | topology | mechanism | signature | seen | stability | minimal requests | shrink | known issue "
            "| why | emitted YAML, no known issue | YAML |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, f in enumerate(r.findings, 1):
        where = f"{f.topology.variant} {f.topology.prefill}+{f.topology.decode}".strip()
        out.append(f"| {i} | {where} | `{f.mechanism.key}` | `{f.signature}` | {f.seen} | "
                   f"{f.stability} | {f.minimal_requests or '-'} | "
                   f"{_shrunk(f)} | {f.known_issue} | {f.known_why or '-'} | "
                   f"{f.emitted_verdict or '-'} | {f.yaml or '-'} |")
    return out


def _not_judged(r: ExploreReport) -> list[str]:
    if not r.not_judged:
        return []
    out = ["", "## Not judged (no failure: a check the verdict needed could not look; no finding)", "",
           "| action | why |", "|---|---|"]
    return out + [f"| {n.action} | {n.reason[:300]} |" for n in r.not_judged]


def _finding_section(i: int, f: FindingReport) -> list[str]:
    """A finding's own section: its reason, its mechanism's evidence and its emitted YAML (read from
    ``f.yaml`` when that file is there: the report keeps the path, the file keeps the scenario)."""
    ev = "; ".join(f"{k}: {v}" for k, v in f.mechanism.evidence.items())
    out = ["", f"### Finding {i}: `{f.mechanism.key}` ({f.known_issue})", "", f.reason[:400], "",
           f"Mechanism evidence: {ev[:1200]}"]
    if f.note:
        out += ["", f.note]
    if f.yaml and Path(f.yaml).is_file():
        out += ["", "```yaml", Path(f.yaml).read_text().rstrip(), "```"]
    return out


def render_md(r: ExploreReport) -> str:
    """explore.md of ``r`` (Markdown)."""
    out = [*_head(r), *_coverage(r), *_nemeses(r), *_topologies(r), *_swarm(r), *_history(r), *_failures(r),
           *_not_judged(r)]
    for i, f in enumerate(r.findings, 1):
        out += _finding_section(i, f)
    if r.fields:
        out += ["", "## Request fields drawn (from vLLM's request models)", ""]
        out += [f"- {ep}: {', '.join(names)}" for ep, names in r.fields.items()]
    return "\n".join(out) + "\n"


def junit_suite(r: ExploreReport) -> Suite:
    """explore-junit.xml's cases: one per finding, ``finding-<n>: <mechanism key>`` (a known issue's:
    skipped, with why it matched; a new one: failure, with its stability, signature and reason)."""
    return Suite("pdrig-explore", [
        Case(f"explore.{r.config}", f"finding-{i}: {f.mechanism.key}", "skipped",
             f"known issue {f.known_issue}: {f.known_why}"[:MESSAGE_CHARS])
        if f.known_issue != "new" else
        Case(f"explore.{r.config}", f"finding-{i}: {f.mechanism.key}", "failure", f.stability,
             f"{f.signature}: {f.reason}"[:MESSAGE_CHARS])
        for i, f in enumerate(r.findings, 1)])

"""Explore reports (rig.report.explore_model.ExploreReport) for tests that read explorations
without running one: findings with the fields a test cares about, the rest plausible, written as
``pdrig explore`` writes them (rig.explore.report.write_explore_report)."""

from __future__ import annotations

from pathlib import Path

from rig.explore.report import new_report, write_explore_report
from rig.explore.settings import ExploreSettings
from rig.report.explore_model import ExploreReport, FindingReport, MechanismReport, TopologyReport, stability_of


def finding_report(n: int, signature: str, yaml: str = "", known_issue: str = "new", *, sets: tuple[str, ...] = (),
                   replays: int = 1, shown: int | None = None, seed: int = 1) -> FindingReport:
    """Finding ``n`` of an exploration of ``seed`` (``explore-<seed>-<n>``): ``signature`` as the
    verdict engine named it, its emitted ``yaml`` ('' when none), ``known_issue``, the ``sets`` of its
    topology, ``replays`` of which ``shown`` (default: all) showed its mechanism."""
    key = f"checks:{signature}"
    runs: list[str | None] = [key if k < (replays if shown is None else shown) else None for k in range(replays)]
    return FindingReport(
        id=f"explore-{seed}-{n}", mechanism=MechanismReport(kind="checks", key=key, evidence={"checks": [signature]}),
        signature=signature, topology=TopologyReport(prefill="prefill", decode="decode", block_size=32,
                                                      max_model_len=128, usable_blocks=None, sets=list(sets)),
        first_action=n - 1, action={"index": n - 1, "steps": []}, reason=f"{signature}: as planted",
        replays=runs, stability=stability_of(key, runs), yaml=yaml, known_issue=known_issue,
        known_why="" if known_issue == "new" else f"matched by mechanism: {key}")


def write_exploration(run_dir: Path, vllm_version: str, findings: list[FindingReport], seed: int = 1) -> ExploreReport:
    """Write explore.json, explore.md and explore-junit.xml of an exploration that found ``findings``
    on ``vllm_version`` into ``run_dir`` (created); returns the report as written."""
    run_dir.mkdir(parents=True, exist_ok=True)
    r = new_report("fake", ExploreSettings(seed=seed), run_dir)
    r.vllm_version, r.findings = vllm_version, findings
    return write_explore_report(r, run_dir)

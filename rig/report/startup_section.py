"""summary.md's start-up profile: per server, the seconds of each start-up phase (from its own
log lines and the rig's clock, rig.cluster.startup_profile) and the processes it ran as, under the
layout the plan started it in (``launch.layout``)."""

from __future__ import annotations

from rig.cluster.startup_profile import PHASES
from rig.report.model import Report


def startup_profile_md(report: Report) -> list[str]:
    """The ``## Start-up profile`` lines of ``report`` ([] when no server's profile was recorded):
    one row per instance, one column per phase (seconds, ``-`` when not measured), the total to
    ready and the vLLM processes that logged (kind:pid)."""
    if not report.startup_profiles:
        return []
    layout = report.plan.get("layout")
    head = f"## Start-up profile (launch.layout {layout})" if layout else "## Start-up profile"
    out = [head, "", "Seconds per phase, each log boundary good to ~1 s (vLLM stamps its lines to the second).", "",
           "| instance | " + " | ".join(PHASES) + " | total (s) | processes |",
           "|---" * (len(PHASES) + 3) + "|"]
    for name, prof in report.startup_profiles.items():
        secs = prof.seconds()
        cells = ["-" if secs.get(p) is None else f"{secs[p]:.1f}" for p in PHASES]
        total = f"{prof.total_s:.1f}" if prof.total_s is not None else f"{prof.outcome} in {prof.reached or '?'}"
        procs = ", ".join(f"{k}:{v}" for k, v in prof.processes.items()) or "-"
        out.append(f"| {name} | " + " | ".join(cells) + f" | {total} | {procs} |")
    return [*out, ""]

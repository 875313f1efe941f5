"""The markdown section of a fault scenario for summary.md: each fault with its
event, action and completion times."""

from __future__ import annotations

from rig.report.model import FaultReport


def fault_section(scenario: str, result: FaultReport) -> str:
    """A summary.md section: each fault with its event, action and completion times (ms after
    the first event) and what was done."""
    t0 = min((e.event_at for e in result.events if e.event_at is not None), default=None)

    def ms(t: float | None) -> str:
        return "-" if t is None or t0 is None else f"{1000 * (t - t0):.0f}"

    rows = "".join(f"| {e.fault} | {e.target} | {ms(e.event_at)} | {ms(e.fired_at)} | {ms(e.done_at)} | "
                   f"{(e.error or e.detail).replace('|', '/')} |\n" for e in result.events)
    return (f"### Faults `{scenario}`\n\n| fault | target | event ms | fired ms | done ms | what happened |\n"
            f"|---|---|---|---|---|---|\n{rows}")

"""The markdown section of a sequence scenario for summary.md (bug record R02, R06): every request with
its step, route and event times (ms from the scenario's start), then the stall and the lease reap."""

from __future__ import annotations

from rig.report.model import SequenceReport


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def sequence_section(scenario: str, result: SequenceReport) -> str:
    """A summary.md section: one row per request (step, route, sent / prefill answered / decode
    sent / answered / ended in ms from the scenario's start, outcome, diagnosis), then the stall
    diagnosis and P's reaping of abandoned leases when there were any."""
    rows = "".join(
        f"| {e.request_id} | {e.step} | {e.route} | {_ms(e.sent_ms)} | {_ms(e.events_ms.get('prefill-answered'))} | "
        f"{_ms(e.events_ms.get('decode-sent'))} | {_ms(e.events_ms.get('answered'))} | {_ms(e.ended_ms)} | "
        f"{e.outcome} | {e.diagnosis[:160].replace('|', '/')} |\n" for e in result.entries)
    out = (f"### Sequence `{scenario}`\n\n| request | step | route | sent ms | P answered ms | D sent ms | "
           f"answered ms | ended ms | outcome | diagnosis |\n|---|---|---|---|---|---|---|---|---|---|\n{rows}")
    if result.stall:
        out += f"\nStall: {result.stall}\n"
    r = result.reap
    if r is not None:
        out += (f"\nAbandoned leases: {r['want']} request(s), last prefill answer at {_ms(r['last_abandoned_ms'])} ms; "
                f"P's expired counter rose by {r['rose']:g}"
                + (f", all reaped at {_ms(r['reaped_ms'])} ms (outstanding then: "
                   f"{', '.join(r['outstanding_then']) or 'none'})" if r['reaped_ms'] is not None
                   else ", not all reaped")
                + "\n")
    return out

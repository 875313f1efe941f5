"""The markdown section of a wave scenario for summary.md (parameters, outcome counts,
throughput and latency, per-instance peaks and counter deltas, checks, timeline plot)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from rig.report.model import VerdictReport, WaveReport


def _f(v: float | None, unit: str = "", scale: float = 1.0, digits: int = 0) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}{unit}"


def wave_section(wave: WaveReport, verdict: VerdictReport | None = None, link_base: str | Path | None = None) -> str:
    """The wave's markdown section for summary.md: parameters, outcome counts, throughput and
    latency, per-instance peaks and counter deltas, checks, and the timeline plot.

    Paths are written relative to ``link_base`` (default: the directory above ``waves/``, i.e.
    the run directory where summary.md lives).
    """
    s = wave.summary
    pr = wave.params
    # The heading names the scenario; its kind only when the name does not already say it.
    title = wave.scenario if wave.kind in wave.scenario else f"{wave.kind} `{wave.scenario}`"
    lines = [f"## {title}" + (f": {verdict.verdict}" if verdict else ""), ""]
    desc = (f"{pr.get('groups')} groups x {pr.get('per_group')} requests sharing a "
            f"{pr.get('prefix_tokens')}-token prefix"
            if wave.kind == "prefix-wave" else f"{pr.get('requests')} requests")
    lines.append(f"- {desc}; prompts {pr.get('prompt_tokens')} tokens, max_tokens {pr.get('max_tokens')}, "
                 f"concurrency {pr.get('concurrency')}, cancel fraction {pr.get('cancel_fraction')}, "
                 f"stream {pr.get('stream')}, client {wave.client}, seed {pr.get('seed')}")
    errs = ", ".join(f"{k} {v}" for k, v in s["errors"].items()) or "none"
    cps = ", ".join(f"{k} {v}" for k, v in s["cancel_points"].items()) or "none"
    lines.append(f"- outcome: {s['ok']} ok, {s['cancelled']} cancelled on purpose ({cps}), errors: {errs}, "
                 f"empty: {s['empty']}")
    lat, ttft = s["latency_s"], s["ttft_s"]
    lines.append(f"- wave {s['wall_s']:.1f} s; throughput {s['throughput_req_s']} req/s, "
                 f"{s['throughput_tok_s']} generated tok/s; latency p50/p95/p99 "
                 f"{_f(lat['p50'], '', 1000)}/{_f(lat['p95'], '', 1000)}/{_f(lat['p99'], ' ms', 1000)}; "
                 f"TTFT p50/p95 {_f(ttft['p50'], '', 1000)}/{_f(ttft['p95'], ' ms', 1000)}; "
                 f"rig client CPU {s['client_cpu_s']:.1f} s ({_f(s['client_cpu_share'], ' %', 100)} of one core: "
                 "near 100 % means the client, not the servers, set the pace)")
    if wave.kind == "prefix-wave":
        lines.append(f"- prefix cache: expected P hits {wave.expected_prefix_hits} tokens ({wave.prefix_note})")
    for st in wave.stalls:
        lines.append(f"- stall on {st['instance']} at {st['start_s']:g} s for {st['duration_s']:g} s: "
                     f"{st['diagnosis']}" + (f" (explained: {st['explained']})" if st["explained"] else
                                             " (**unexplained**)"))
    if wave.parity:
        lines.append(f"- parity sample: {wave.parity.get('equal', 0)}/{wave.parity.get('compared', 0)} equal"
                     + (f", {wave.parity['failed']} references failed" if wave.parity.get("failed") else ""))
    lines += ["", "| instance | role | peak running | peak waiting | peak KV | preemptions | prefix hits | "
                  "external hits | finished | usable blocks |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, role in wave.instances.items():
        pk, dl = wave.peaks.get(name, {}), wave.deltas.get(name, {})
        lines.append(f"| {name} | {role} | {pk.get('running', 0):g} | {pk.get('waiting', 0):g} | "
                     f"{100 * pk.get('kv_usage', 0):.0f}% | {dl.get('preemptions', 0):g} | "
                     f"{dl.get('prefix_hits', 0):g} | "
                     f"{dl.get('external_prefix_hits', 0):g} | {dl.get('request_success', 0):g} | "
                     f"{wave.usable_blocks.get(name) if wave.usable_blocks.get(name) is not None else '?'} |")
    if verdict is not None and verdict.checks:
        lines += ["", "| check | ok | detail |", "|---|---|---|"]
        for c in verdict.checks:
            lines.append(f"| {c.name} | {'yes' if c.ok else '**NO**'} | {c.detail.replace('|', '/')} |")
    base = Path(link_base) if link_base is not None else None
    for label, p in (("records", wave.records_path), ("timeline", wave.timeline_png)):
        if p:
            rel = Path(p)
            with contextlib.suppress(ValueError):
                rel = rel.relative_to(base if base is not None else Path(p).parent.parent)
            lines.append("")
            lines.append(f"![{wave.scenario} timeline]({rel.as_posix()})" if label == "timeline"
                         else f"- records: [{rel.as_posix()}]({rel.as_posix()})")
    return "\n".join(lines) + "\n"

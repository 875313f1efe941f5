"""The markdown section of a Mooncake store scenario for summary.md: its checks, the store
facts (bytes put/got, failed GETs, hit ratios, the master's counters) and per-request or
per-wave tables."""

from __future__ import annotations

from rig.report.model import ObservationReport, StoreReport, VerdictReport


def fmt_bytes(v: float) -> str:
    """``1,234 B``: a byte count as the store checks' details write it (rig.judge.store_checks)."""
    return f"{v:,.0f} B"


def _ratio(v: float | None) -> str:
    """A ratio with two decimals, ``-`` when unknown."""
    return "-" if v is None else f"{v:.2f}"


def store_section(name: str, description: str, obs: ObservationReport | None, so: StoreReport,
                  verdict: VerdictReport | None = None) -> str:
    """Markdown for summary.md: the store facts of scenario ``name``."""
    lines = [f"## Mooncake store: `{name}` ({so.kind})" + (f" - {verdict.verdict}" if verdict else ""), ""]
    if description:
        lines += [description.strip(), ""]
    if verdict and verdict.checks:
        lines.append("| check | ok | detail |")
        lines.append("|---|---|---|")
        for c in verdict.checks:
            lines.append(f"| {c.name} | {'yes' if c.ok else '**NO**'} | {c.detail.replace('|', '/')} |")
        lines.append("")
    ma = so.master_after
    dead = obs.dead if obs else {}
    facts = [
        ("master alive to the end", f"{'yes' if so.master_alive_end and so.master_name not in dead else 'NO'} "
                                    f"({so.master_health[:80]})"),
        ("failed GET keys (load_get)", f"{so.failed_load_keys:.0f}"),
        ("rejected PUT keys (save_put, allowed)", f"{so.rejected_put_keys:.0f}"),
        ("bytes put / got (ok)", f"{fmt_bytes(so.bytes_put)} / {fmt_bytes(so.bytes_got)}"),
        ("D prompt tokens from the store", f"{so.d_store_tokens:.0f}" +
         (f" (expected {so.expected_store_tokens})" if so.expected_store_tokens is not None else "")),
        ("store hit ratio (D store tokens / external-cache queries)", _ratio(so.store_hit_ratio)),
        ("master valid/total GETs", _ratio(so.master_get_ratio)),
        ("D preemptions (counter / running->waiting seen)", f"{so.d.get('preemptions', 0):.0f} / {so.requeues_seen}"),
        ("D NIXL bytes", f"{so.d.get('nixl_bytes', 0):,.0f}"),
        ("master keys / allocated / capacity",
         f"{ma.get('key_count', 0):.0f} / {fmt_bytes(ma.get('allocated_bytes', 0))}"
         f" / {fmt_bytes(ma.get('capacity_bytes', 0))}"),
        ("master put_end / get_replica_list items", f"+{so.master.get('put_end_items', 0):.0f} / "
                                                    f"+{so.master.get('get_replica_list_items', 0):.0f}"),
        ("master evicted keys / alloc failures", f"+{so.master.get('evicted_keys', 0):.0f} / "
                                                 f"+{so.master.get('put_start_alloc_failures', 0):.0f}"),
        ("P puts visible in the master after", ", ".join(f"{w:.2f} s" for w in so.put_waits) or "-"),
    ]
    if so.cancel_summary:  # the store wave's planned cancels (bug record R14)
        facts.append(("planned cancellations", so.cancel_summary))
    if so.resets:
        facts.append(("prefix-cache resets between rounds", "; ".join(
            f"round {r['round']} {r['instance']}: {'ok' if r['success'] else 'FAILED'} (HTTP {r['status']}, "
            f"{r['attempts']} attempt(s), {r['wait_s']:.1f} s)" for r in so.resets)))
    lines.append("| fact | value |")
    lines.append("|---|---|")
    lines += [f"| {k} | {v} |" for k, v in facts]
    if so.per_request:
        lines += ["", "| request | prompt | store tokens (expected) | D local hits | load_get bytes | NIXL bytes |",
                  "|---|---|---|---|---|---|"]
        for r in so.per_request:
            lines.append(f"| {r['request_id']} | {r['prompt_tokens']} | {r.get('store_tokens', 0):.0f} "
                         f"({r['expected_store_tokens']}) | {r.get('local_prefix_hits', 0):.0f} | "
                         f"{r.get('load_get_ok_bytes', 0):,.0f} | {r.get('nixl_bytes', 0):,.0f} |")
    if so.waves:
        lines += ["", "| wave | ok/requests | store-routed | store tokens | NIXL tokens | D local hits | "
                      "load_get bytes | preemptions | wall s |", "|---|---|---|---|---|---|---|---|---|"]
        rounds = any(w.get("round") for w in so.waves)
        for w in so.waves:
            label = f"round {w['round']} wave {w['wave']}" if rounds else f"{w['wave']}"
            ok = f"{w['ok']}/{w['requests']}" + (f" ({w['cancelled']} cancelled)" if w.get("cancelled") else "")
            lines.append(f"| {label} | {ok} | {w['store_routed']} | {w['store_tokens']:.0f} | "
                         f"{w['nixl_tokens']:.0f} | {w['local_prefix_hits']:.0f} | {w['load_get_ok_bytes']:,.0f} | "
                         f"{w['preemptions']:.0f} | {w['wall_s']:.1f} |")
    for note in so.notes:
        lines.append(f"\n- note: {note}")
    return "\n".join(lines) + "\n"

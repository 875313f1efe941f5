"""What the history records for the whole-history checks (rig.explore.whole_history): each
action's counter windows, the deployment life it ran on, and a prompt identity per request.

Per action and instance, three counter readings (:func:`reading`: wall time, the process's life,
the summed values of :data:`WATCHED`):

- ``pre``: the explorer's own scrape just before it hands the action to the runner
  (:meth:`rig.explore.deployment.Deployment.scrape`), before the runner's warm-up;
- ``start``: the scenario's first timeline row (the runner's "before" snapshot, after the warm-up:
  rig/run/lifecycle.py ``_between_snapshots``);
- ``end``: its last row (the "idle" snapshot, after the drain to idle).

Between one action's ``end`` and the next one's ``pre`` the rig has no request in flight (the
drain ended, the explorer only judges and writes), which is the window the quiet-counters check
reads. Between ``pre`` and ``start`` the runner sends its own warm-up and baseline requests
(rig.run.runner ``_warm_up``: every run), so that stretch is the rig's traffic and is judged by
no check.

A *life* is one deployment: the topology (drawn variant, prefill, decode) and each instance's
``process_start_time_seconds`` (vLLM's API server exposes prometheus_client's process collector);
a restart (nemesis kill, a death the runner restarted) or another topology starts a new life, and
counters restart with it. :class:`Lives` numbers them in order of first appearance. An instance
that exposes no start time gives a life whose restarts cannot be seen (``known`` False): the
counter checks then say "not checked".
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from rig.observe import metrics as m

# The counters the whole-history checks read, summed over their labels; the prompt-token sources
# are kept apart (``name{source=...}``).
WATCHED = (m.PROMPT_TOKENS, m.GENERATION_TOKENS, m.REQUEST_SUCCESS, m.PREEMPTIONS, m.NIXL_XFER_COUNT,
           m.NIXL_FAILED_TRANSFERS, m.NIXL_FAILED_NOTIFS, m.NIXL_EXPIRED, m.PREFIX_QUERIES)
SOURCES = ("external_kv_transfer", "local_cache_hit")
_SOURCE = re.compile(r'source="([^"]*)"')


def source_key(source: str) -> str:
    """The key of ``vllm:prompt_tokens_by_source_total`` for ``source`` in a reading's values."""
    return f'{m.PROMPT_TOKENS_BY_SOURCE}{{source="{source}"}}'


def watched_values(counters: dict[str, float]) -> dict[str, float]:
    """:data:`WATCHED` summed over labels, and the :data:`SOURCES` of prompt tokens, from a
    ``{'name{labels}': value}`` mapping (rig.observe.metrics.counter_values, a timeline row's
    ``counters``); a counter with no sample is left out (absent, never 0)."""
    out: dict[str, float] = {}
    for key, v in counters.items():
        base = key.split("{", 1)[0]
        if base in WATCHED:
            out[base] = out.get(base, 0.0) + v
        elif base == m.PROMPT_TOKENS_BY_SOURCE and (hit := _SOURCE.search(key)) and hit.group(1) in SOURCES:
            out[source_key(hit.group(1))] = out.get(source_key(hit.group(1)), 0.0) + v
    return out


def reading(wall: float, life: float | None, counters: dict[str, float]) -> dict[str, Any]:
    """One counter reading as the history keeps it: ``{"wall": unix s, "life": start time or None,
    "values": watched_values(counters)}``."""
    return {"wall": round(wall, 3), "life": life, "values": watched_values(counters)}


def snapshot_reading(s: m.MetricSnapshot) -> dict[str, Any]:
    """:func:`reading` of one scrape."""
    return reading(s.wall, s.get(m.PROCESS_START), m.counter_values(s))


def counter_windows(timeline: list[dict[str, Any]], pre: dict[str, m.MetricSnapshot | None],
                    roles: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``{instance: {"role", "pre", "start", "end"}}`` of one action (module docstring) from its
    timeline rows (rig.observe.observations.SnapshotStore rows, in sampling order) and the
    explorer's ``pre`` scrapes (None: that scrape failed); a reading the action lacks is None."""
    out: dict[str, dict[str, Any]] = {}
    for name, role in roles.items():
        rows = [r for r in timeline if r.get("instance") == name and "counters" in r]
        snap = pre.get(name)
        out[name] = {"role": role, "pre": snapshot_reading(snap) if snap is not None else None,
                     "start": reading(rows[0]["wall"], rows[0].get("life"), rows[0]["counters"]) if rows else None,
                     "end": reading(rows[-1]["wall"], rows[-1].get("life"), rows[-1]["counters"]) if rows else None}
    return out


def prompt_key(prompt: Any) -> str:
    """A short stable identity of a prompt (token IDs, text or chat messages): the first 16 hex
    digits of the SHA-256 of its JSON. Two requests with the same key sent the same prompt."""
    return hashlib.sha256(json.dumps(prompt, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Lives:
    """Numbers the deployment lives of an exploration (module docstring) from 1, in order of
    first appearance."""

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}

    def number(self, topology: tuple[str, ...], lives: dict[str, float | None]) -> int:
        """The life number of ``topology`` (variant, prefill, decode) with the instances' process
        start times ``lives``; a new key gets the next number."""
        key = (topology, tuple(sorted(lives.items())))
        return self._ids.setdefault(key, len(self._ids) + 1)

    def of_action(self, topology: tuple[str, ...], windows: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """``{"life", "life_end", "life_known"}`` of one action: the life of its ``start`` readings
        and of its ``end`` readings (another one when an instance restarted during it), and whether
        every instance exposed its start time (False: a restart cannot be told)."""
        def at(which: str) -> dict[str, float | None]:
            return {n: (w.get(which) or {}).get("life") for n, w in windows.items()}
        start, end = at("start"), at("end")
        known = all(v is not None for v in (*start.values(), *end.values()))
        return {"life": self.number(topology, start), "life_end": self.number(topology, end), "life_known": known}

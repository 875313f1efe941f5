"""``history.jsonl``: every action with its requests, answers, timings, verdict and metrics deltas,
one JSON object per line, appended (and flushed) as each action ends (Jepsen's history: recorded
first, checked by the oracles, kept whatever happens next). ``pdrig explore --replay`` reads it back.
Each exploring line also carries what the whole-history checks read (rig.explore.whole_history):
the deployment life, the counter windows and a prompt identity per request (rig.explore.lives)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rig.config.files import json_lines
from rig.explore.grammar import Action
from rig.explore.lives import Lives, counter_windows, prompt_key
from rig.observe.metrics import MetricSnapshot
from rig.observe.observations import ScenarioObservation
from rig.report.build import record_report


class History:
    """Appends entries to ``<run_dir>/history.jsonl``."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("a")

    def append(self, entry: dict[str, Any]) -> None:
        """Write one entry (JSON-able mapping) as a line and flush it to the file."""
        self._f.write(json.dumps(entry, default=str) + "\n")
        self._f.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if not self._f.closed:
            self._f.close()


def read_history(path: Path) -> list[dict[str, Any]]:
    """The entries of a history file that carry an action (``phase`` explore or nemesis), in order. Raises
    InputFileError (a ValueError) naming the line for a line that is not one JSON object, and for a
    file that cannot be read, is too big or is not UTF-8 (rig.config.files.json_lines)."""
    return [entry for _, entry in json_lines(path, "--replay", "give a history.jsonl written by pdrig explore")
            if entry.get("phase") in ("explore", "nemesis") and "action" in entry]


def action_of(entry: dict[str, Any]) -> Action:
    """The :class:`Action` recorded in a history entry (raises pydantic's ValidationError)."""
    return Action.model_validate(entry["action"])


def record_entries(obs: ScenarioObservation) -> list[dict[str, Any]]:
    """The action's records as the history keeps them (rig.report.build.record_report: no prompt),
    each with ``prompt_key`` (rig.explore.lives.prompt_key of the prompt D got: a router's
    transform's when it changed it) and ``prompt_count``: what the whole-history checks
    compare across actions without keeping the prompts."""
    return [{**record_report(r).model_dump(mode="json"),
             "prompt_key": prompt_key(r.decode_prompt if r.decode_prompt is not None else r.prompt),
             "prompt_count": r.prompt_count} for r in obs.records]


def counter_fields(obs: ScenarioObservation, pre: dict[str, MetricSnapshot | None], roles: dict[str, str],
                   lives: Lives, topology: tuple[str, ...]) -> dict[str, Any]:
    """The history fields of one action the whole-history checks read (rig.explore.lives):
    ``counters`` (each instance's pre/start/end readings), ``life``, ``life_end``,
    ``life_known`` and ``idle_after`` (every drain ended idle: nothing of the rig in flight after it)."""
    windows = counter_windows(obs.timeline, pre, roles)
    return {"counters": windows, **lives.of_action(topology, windows),
            "idle_after": bool(obs.drains) and all(d.idle is True for d in obs.drains)}

"""``history.jsonl``: every action with its requests, answers, timings, verdict and metrics deltas,
one JSON object per line, appended (and flushed) as each action ends (Jepsen's history: recorded
first, checked by the oracles, kept whatever happens next). ``pdrig explore --replay`` reads it back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rig.config.files import json_lines
from rig.explore.grammar import Action


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

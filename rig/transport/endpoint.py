"""An instance the rig talks to: its name (as in the plan and the run's logs) and base URL."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    """An instance by ``name`` and base ``url`` (``http://host:port``, no trailing slash)."""

    name: str
    url: str

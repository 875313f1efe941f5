"""An instance the rig talks to: its name (as in the plan and the run's logs) and base URL."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    """An instance by ``name`` and base ``url`` (``http://host:port``, no trailing slash); for
    one a ``pdrig up`` on this host started, its ``log`` file path and its ``pid`` (from
    ``endpoints.json``), so a command that did not start it can still scan its log and tell
    whether it is alive (rig.observe.endpoint_watch). None when unknown (a bare URL)."""

    name: str
    url: str
    log: str | None = None
    pid: int | None = None

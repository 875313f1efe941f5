"""``endpoints.json``, the file ``pdrig up`` writes into its run directory and ``pdrig e2e --attach
--endpoints``, ``pdrig wave --endpoints`` and ``pdrig proxy --endpoints`` read:
``{name: {"url": "http://127.0.0.1:8100", "role": "prefill", "log": PATH, "pid": N}}`` (``log`` and
``pid`` may be missing or null: an older ``pdrig up``, or an instance the rig did not start).

One reader for the three commands (:func:`read_endpoints`), through :mod:`rig.config.files`, so a
file that is not this shape is refused in one line naming the file, the entry and the fix.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rig.config.files import load_json
from rig.errors import InputFileError

FIX = "give the endpoints.json of a `pdrig up` run directory"


class EndpointEntry(BaseModel):
    """One instance of ``endpoints.json``: its base ``url`` (http or https, with a host), ``role``
    (prefill, decode, or another process such as the Mooncake master), its ``log`` file and
    ``pid`` when ``pdrig up`` started it."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    url: str
    role: str
    log: str | None = None
    pid: int | None = Field(None, ge=1)

    @field_validator("url")
    @classmethod
    def _base_url(cls, v: str) -> str:
        return base_url(v)


def base_url(url: str) -> str:
    """``url`` without a trailing ``/`` when it is an instance's base URL (http or https, a host,
    a port in 1-65535 when given); raises ValueError saying what is wrong otherwise."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port outside 0-65535
    except ValueError as e:
        raise ValueError(f"{url!r} is not a URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        raise ValueError(f"{url!r} is not a base URL like http://127.0.0.1:8100")
    return url.rstrip("/")


def read_endpoints(path: str | Path, flag: str = "--endpoints") -> dict[str, EndpointEntry]:
    """The entries of an ``endpoints.json`` by instance name. Raises InputFileError (a
    ConfigError) naming ``flag``, the file and the entry for a file that cannot be read (see
    :func:`rig.config.files.load_json`) or an entry that is not ``{url, role, ...}``."""
    data = load_json(path, flag, FIX, dict)
    out: dict[str, EndpointEntry] = {}
    for name, entry in data.items():
        try:
            out[name] = EndpointEntry.model_validate(entry)
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(x) for x in first["loc"])
            msg = first["msg"].removeprefix("Value error, ")
            raise InputFileError(f"{flag} {path}: entry {name!r}{'.' + field if field else ''}: {msg}; {FIX}",
                                 str(path)) from None
    return out


def by_role(entries: dict[str, EndpointEntry], role: str) -> list[tuple[str, EndpointEntry]]:
    """``(name, entry)`` of every entry with ``role``, in file order."""
    return [(n, e) for n, e in entries.items() if e.role == role]

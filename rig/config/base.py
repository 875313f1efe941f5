"""The config layer's common ground: its error type, the strict base model every section
derives from, the name pattern of instances and scenarios, and the regex-field check.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"
ConnectorMode = Literal["nixl", "mooncake-store", "nixl+store", "mooncake-p2p"]


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the field and the fix."""


class StrictModel(BaseModel):
    """Base for every config section: unknown fields are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def regex_field(v: str | None, what: str) -> str | None:
    """``v`` unchanged when it is None or a valid regular expression; raises ValueError naming
    the field ``what`` otherwise (for pydantic field validators)."""
    if v is not None:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"{what}: not a valid regular expression ({e})") from None
    return v

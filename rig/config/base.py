"""The config layer's common ground: its error type, the strict base model every section
derives from, the name pattern of instances and scenarios, and the regex-field check.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

from rig.errors import ConfigError as ConfigError  # defined in the one exception tree; the config layer's name for it

# Names of instances, scenarios, steps and the config: an RFC 1123 DNS label (1-63 lowercase letters,
# digits and '-', a letter or digit at both ends), because each becomes a file name (logs/<name>.log,
# waves/<name>.json, the run directory), a Compose service, a Kubernetes label value and part of a
# Service name (rig/plan/k8s.py), and a vLLM argument. Kubernetes' own rule for those is this label.
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
NAME_RULE = ("a name is 1-63 lowercase letters, digits and '-', with a letter or digit at both ends "
             "(an RFC 1123 DNS label: it becomes a file name and a Kubernetes and Compose name)")
# model.served_name: vLLM's --served-model-name and the OpenAI "model" field; also written into the
# Compose and Kubernetes health checks, so no whitespace, quote, '$' or shell character.
SERVED_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,199}$"

# Bounds on counts, from what the rig can send: a larger number is a typo (``concurrent: 100000000``
# would build that many prompts before the first request), refused with the bound in the message.
MAX_SENT_TOGETHER = 256  # copies sent at once on one client: rig.transport.client pools 256 connections
MAX_IN_FLIGHT = 4096  # a wave's concurrency: each request in flight holds up to two sockets (P's and D's hop)
MAX_REQUESTS = 1_000_000  # requests of one wave: ~6 h at the 50 req/s a tiny-model CPU pair serves
MAX_ROUNDS = 10_000  # requests, groups, waves, rounds of the kinds that send one after another
MAX_CONTEXT_WORDS = 1_000_000  # retrieval filler words (~1.3 tokens each): past any model's max_model_len
ConnectorMode = Literal["nixl", "mooncake-store", "nixl+store", "mooncake-p2p"]


class StrictModel(BaseModel):
    """Base for every config section: unknown fields are errors, not silently ignored, and no
    float field takes NaN or infinity (``.nan`` / ``.inf`` are valid YAML floats, but no timeout,
    share or rate of the rig means anything at them: a NaN passes every ``ge``/``le`` bound)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def regex_field(v: str | None, what: str) -> str | None:
    """``v`` unchanged when it is None or a valid regular expression; raises ValueError naming
    the field ``what`` otherwise (for pydantic field validators)."""
    if v is not None:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"{what}: not a valid regular expression ({e})") from None
    return v

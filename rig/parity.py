"""Output parity: a P/D answer against a non-disaggregated reference, token by token.

With greedy decoding, the same model and the same prompt, a correct KV transfer gives the same
tokens as serving the prompt without disaggregation. The most dangerous P/D failures (decode
reading freed, stale or never-filled blocks) return HTTP 200 with wrong tokens; this module is
what catches them. A comparison is only meaningful with identical output caps, so a pair whose
``max_tokens`` differ is *refused*, never reported as equal or diverged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ParityResult:
    """``status``: equal | diverged | refused. For ``diverged``, ``position`` is the first
    0-based output position that differs and ``pd_token``/``ref_token`` the tokens there
    (None where one side is shorter)."""

    status: str
    position: int | None = None
    pd_token: int | None = None
    ref_token: int | None = None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict."""
        return asdict(self)

    def describe(self) -> str:
        """One line for tables: 'equal', 'diverged at 3: 517 != 12', 'refused: ...'."""
        if self.status == "diverged":
            return f"diverged at {self.position}: {self.pd_token} != {self.ref_token}"
        if self.status == "refused":
            return f"refused: {self.reason}"
        return self.status


def compare(pd_tokens: list[int], ref_tokens: list[int], pd_max_tokens: int, ref_max_tokens: int) -> ParityResult:
    """Compare generated token IDs of a P/D answer and its reference.

    Refused when the output caps differ (the comparison would mean nothing). A length
    difference is a divergence at the first missing position.
    """
    if pd_max_tokens != ref_max_tokens:
        return ParityResult("refused", reason=f"max_tokens differ (P/D {pd_max_tokens}, reference {ref_max_tokens})")
    for i in range(max(len(pd_tokens), len(ref_tokens))):
        a = pd_tokens[i] if i < len(pd_tokens) else None
        b = ref_tokens[i] if i < len(ref_tokens) else None
        if a != b:
            return ParityResult("diverged", position=i, pd_token=a, ref_token=b)
    return ParityResult("equal")


def summarize(results: list[ParityResult | None]) -> dict[str, int]:
    """Counts ``{compared, equal, diverged, refused}`` over results (None = not compared)."""
    done = [r for r in results if r is not None]
    return {"compared": sum(r.status != "refused" for r in done),
            "equal": sum(r.status == "equal" for r in done),
            "diverged": sum(r.status == "diverged" for r in done),
            "refused": sum(r.status == "refused" for r in done)}

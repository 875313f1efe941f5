"""The base of every report model (:class:`ReportModel`) and the run-level facts that stand on
their own (:class:`BaselineReport`): plain data, imported by rig.report.model (which re-exports
them) and nothing of the rig else.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ReportModel(BaseModel):
    """The base of every report model: unknown fields refused, attribute docstrings as field
    descriptions (they are the JSON Schema's ``description``)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class BaselineReport(ReportModel):
    """One decode's per-request baseline (rig.workload.baseline.RequestBaseline): ``seconds`` is the median
    of ``round_trips_s``, P/D round trips ``prefill`` -> ``decode`` after its warm-up (``prompt_tokens``-token
    prompts, ``max_tokens`` generated, ``planned`` of them), seconds; None when one failed (``error``: why).
    ``method``: how it was measured, in words."""

    decode: str
    prefill: str
    seconds: float | None
    round_trips_s: list[float] = []
    prompt_tokens: int = 8
    max_tokens: int = 2
    planned: int = 3
    method: str = ""
    error: str = ""
    host_load_1m: float | None = None
    """The rig host's 1-minute load average when the round trips ended (None: unknown): the latency
    check's host-load guard compares the load around each scenario with it."""

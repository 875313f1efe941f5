"""Two observations of one scenario each, as the runner fills them: a P/D request answered with
parity equal (``ok_obs``) and one stalled on decode (``stalled_obs``), for the report's tests."""

from __future__ import annotations

from rig.observe.observations import ScenarioObservation
from rig.observe.parity import ParityResult
from rig.transport.records import Hop, PDRecord

DIAG = ("admission livelock on decode: waiting=1 (capacity) running=0 kv=0.0% kv_fetch "
        "waiting_to_start=1, unchanged for 8.0 s")


def ok_obs(name: str, decode: str = "decode") -> ScenarioObservation:
    rec = PDRecord(request_id=f"{name}-0", prompt_len=96, max_tokens=2, outcome="ok", verdict_after_s=2.2)
    rec.prefill = Hop("prefill", status=200, latency_s=0.105, token_ids=[1])
    rec.decode = Hop(decode, status=200, latency_s=2.153, token_ids=[5, 6],
                     usage={"completion_tokens": 2, "total_tokens": 98})
    return ScenarioObservation(scenario=name, decode=decode, prefill="prefill", records=[rec],
                               parity=[ParityResult("equal")], vllm_version="0.32.0", wall_s=2.5)


def stalled_obs(name: str) -> ScenarioObservation:
    rec = PDRecord(request_id=f"{name}-0", prompt_len=126, max_tokens=2, outcome="stalled",
                   diagnosis=DIAG, verdict_after_s=10.3)
    rec.prefill = Hop("prefill", status=200, latency_s=0.25, token_ids=[1])
    return ScenarioObservation(scenario=name, decode="decode", prefill="prefill", records=[rec],
                               parity=[None], stall_diagnosis=DIAG, vllm_version="0.32.0", wall_s=11.0)

"""In-memory observations of the edge-126 scenario for the judge's tests: answered, stalled and
failed records, the recorded 0.32.0 livelock's stall facts (tests/data) and its known issue, cpu-tiny's
block facts, a drained and fully observed ScenarioObservation."""

from __future__ import annotations

from pathlib import Path

from rig.config import ScenarioConfig
from rig.judge.signatures import BlockFacts
from rig.observe.metrics import parse_metrics
from rig.observe.observations import DrainResult, ScenarioObservation, TransferEvidence
from rig.observe.parity import ParityResult
from rig.observe.stall import StallFacts, facts_of
from rig.transport.records import Hop, PDRecord

DATA = Path(__file__).resolve().parents[1] / "data"

STALLED_PROM = (DATA / "vllm-0.32.0-decode-stalled-edge-126.prom").read_text()

LIVELOCK_SIG = {"kind": "stall", "instance": "decode", "waiting_reason": "capacity",
                "kv_fetch_stage": "waiting_to_start", "kv_usage_max": 0.05, "admission": "fits-but-waits"}

LIVELOCK = {"id": "spec-admission-livelock", "title": "flat spec block reservation",
            "affects": ">=0.32.0,<0.33", "symptom": LIVELOCK_SIG}

# cpu-tiny's `decode`: 32-token blocks, 5 blocks (4 usable), ngram k=1, max_model_len 128.
BLOCKS = BlockFacts(block_size=32, usable_blocks=4, num_speculative_tokens=1, max_model_len=128)

DIAG = ("admission livelock on decode: waiting=1 (capacity) running=0 kv=0.0% kv_fetch "
        "waiting_to_start=1, unchanged for 8.2 s")

EXPIRED = ("(Worker pid=6561) ERROR 11-29 19:43:00 [pull_worker.py:667] Potentially invalid KV blocks for "
           "unrecognized request {rid} were retrieved by a decode worker. They may have expired.")


def stall_facts(**swap: str) -> StallFacts:
    """Stall facts of the recorded 0.32.0 livelock; ``swap`` replaces exposition lines' values
    (``'reason="capacity"': '0.0'``) to build other frozen states from the same recording."""
    text = STALLED_PROM
    for label, value in swap.items():
        lines = text.splitlines()
        text = "\n".join(ln.rsplit(" ", 1)[0] + " " + value if label in ln and not ln.startswith("#") else ln
                         for ln in lines) + "\n"
    return facts_of(parse_metrics(text, "decode", t=0), 8.2)


def sc(known_issue: dict | None = None, **kw) -> ScenarioConfig:
    base = dict(name="edge-126", decode="decode", prompt_tokens=126, max_tokens=2,
                expect={"completion_tokens": 2, "total_tokens": 128})
    base.update(kw)
    return ScenarioConfig(known_issue=known_issue, **base)


def ok_record(i: int = 0, tokens: list[int] | None = None, n: int = 126) -> PDRecord:
    tokens = [517, 12] if tokens is None else tokens
    rec = PDRecord(request_id=f"edge-126-{i}", prompt_len=n, max_tokens=2, outcome="ok", verdict_after_s=0.2,
                   prompt=list(range(n)))
    rec.prefill = Hop("prefill", status=200, latency_s=0.05, token_ids=[9],
                      usage={"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1},
                      kv_transfer_params={"do_remote_prefill": True, "remote_request_id": f"cmpl-p-{i}"})
    rec.decode = Hop("decode", status=200, latency_s=0.04, token_ids=tokens,
                     usage={"prompt_tokens": n, "completion_tokens": len(tokens), "total_tokens": n + len(tokens)})
    return rec


def stalled_record(i: int = 0, facts: StallFacts | None = None, n: int = 126) -> PDRecord:
    rec = PDRecord(request_id=f"edge-126-{i}", prompt_len=n, max_tokens=2, outcome="stalled",
                   diagnosis=DIAG, verdict_after_s=9.2, prompt=list(range(n)), stall=facts or stall_facts())
    rec.prefill = Hop("prefill", status=200, latency_s=0.05, token_ids=[9],
                      kv_transfer_params={"do_remote_prefill": True, "remote_request_id": f"cmpl-p-{i}"})
    return rec


def error_record(i: int = 0, status: int = 500, msg: str = "boom", hop: str = "decode") -> PDRecord:
    rec = ok_record(i)
    h = Hop(hop, status=status, error=f"HTTP {status}: {msg}")
    if hop == "decode":
        rec.decode = h
    else:
        rec.prefill, rec.decode = h, None
    rec.outcome, rec.diagnosis = "http_error", f"{hop}: HTTP {status}: {msg}"
    return rec


def drains(idle: bool = True) -> list[DrainResult]:
    final = {"waiting": 0.0, "running": 0.0, "kv_usage": 0.0 if idle else 0.5}
    return [DrainResult("decode", idle, 0.3, 0.0, final),
            DrainResult("prefill", True, 0.1, 0.0, {"waiting": 0, "running": 0, "kv_usage": 0})]


def obs_of(records: list[PDRecord], parity: list | None = None, version: str = "0.32.0", **kw) -> ScenarioObservation:
    """A fully observed scenario: both logs scanned (no lines), both versions known, drained."""
    answered = [r for r in records if r.outcome == "ok"]
    obs = ScenarioObservation(
        scenario="edge-126", decode="decode", prefill="prefill", records=records,
        parity=parity if parity is not None else [ParityResult("equal") if r.outcome == "ok" else None
                                                  for r in records],
        evidence=TransferEvidence(nixl_bytes=65536.0 * len(answered), nixl_transfers=len(answered),
                                  external_prompt_tokens=sum(r.prompt_len for r in answered)),
        fatal_lines={"prefill": [], "decode": []}, kv_integrity_lines={"prefill": [], "decode": []},
        drains=drains(), vllm_version=version, versions={"prefill": version, "decode": version}, wall_s=1.0)
    for k, v in kw.items():
        setattr(obs, k, v)
    return obs


def checks_of(v) -> dict[str, bool | None]:
    return {c.name: c.ok for c in v.checks}


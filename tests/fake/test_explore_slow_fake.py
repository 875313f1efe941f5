"""pdrig explore finds a hop that waits a timeout's worth, on fake vLLM servers (tests/fake_vllm.py):
the ``slow-decode`` plant on D answers every pulled request of 9 or more prompt tokens with the
right tokens, but only after WAIT_S. No other check fails (the tokens, the pull, the drains are
right), so only the latency check (rig.judge.latency) can see it; the finding is triaged by its
mechanism, ``slow:decode:<part>``, new (no known issue is a slow hop), replayed and emitted.

The bound is capped at ``timeouts.kv_transfer_s`` = 4 s here (a drawn action of three 128-token
requests is 48 baseline round trips of work, whose derived bound alone could pass the wait), so
WAIT_S is three times the largest bound any action gets. The fake tests' host is idle
(tests/conftest.py), so the host-load guard does not decide here.
"""

from __future__ import annotations

from tests.helpers.explore_plants import explore_fake, the_finding

WAIT_S = 12.0


def test_the_explorer_finds_a_slow_decode_hop_as_a_slow_finding(base):
    report, _ = explore_fake(base, {"seed": 0, "actions": 2, "routes": ["pd"], "stop_at_first": True,
                                    "shrink_runs": 2},
                             decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "slow-decode",
                                                         "FAKE_VLLM_FAULT_ARG": f"{WAIT_S}:9"}}},
                             timeouts={"kv_transfer_s": 4, "latency_floor_s": 1, "request_s": 40})
    f = the_finding(report)
    key = f.mechanism.key
    assert key in ("slow:decode:total", "slow:decode:first-token"), (key, f.reason[:300])
    ev = f.mechanism.evidence
    assert ev["hop"] == "decode" and WAIT_S <= ev["wait_s"] < WAIT_S + 4 and ev["bound_s"] <= 4.0, ev
    assert ev["baseline_s"] is not None and ev["baseline_s"] < 1.0  # the baseline is the healthy deployment's
    assert f.known_issue == "new"
    assert f.reason.startswith("latency: ") and " hop (decode) waited " in f.reason
    assert f.stability == "stable" and f.emitted_verdict == "FAIL"

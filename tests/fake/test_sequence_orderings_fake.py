"""Other routers' hop orderings (rig/config/sequence.py routes pd-retry, pd-swallow-cancel) against
fake vLLM servers: a router that retries the decode hop with the same kv_transfer_params, and one
that swallows the client's cancel.

pd-retry's retry reads blocks P freed after the first attempt's read (the fake P's free-after-read
fault, as vLLM frees them on D's done notice): with the freed blocks reused (ARG ``wrong``: D's
retry answers wrong tokens) the scenario FAILs and the explorer names it ``stale-read:retry``; with
them still intact (P logs the invalid-blocks line, D's answer is right) and on a correct fake it PASSes."""

from __future__ import annotations

import json

import pytest

from rig.config import ConfigError, load_config
from rig.explore.grammar import Topology
from rig.explore.mechanism import mechanism_of
from rig.explore.oracles import signature_of
from rig.workload.sequence import SWALLOWED
from tests.helpers.fake_rig import fake_config, write_config
from tests.helpers.suites import run_on_fakes

SLOW_D = {"decode-slow": {"env": {"FAKE_VLLM_TOKEN_LATENCY": "0.05"}}}
ROLES = {"prefill": "prefill", "decode-slow": "decode"}
# 16 tokens at 50 ms on D: at 300 ms the first attempt has pulled and is decoding (the router's
# timeout closes it); 4 tokens end before 3 s (a connection dropped after the answer).
RETRY = {"name": "retry", "kind": "sequence", "decode": "decode-slow", "sequence": {"idle_margin_s": 1, "steps": [
    {"id": "timeout", "route": "pd-retry", "prompt_tokens": 40, "max_tokens": 16, "retry_after_ms": 300},
    {"id": "dropped", "route": "pd-retry", "prompt_tokens": 40, "max_tokens": 4, "retry_after_ms": 3000,
     "start": {"after": "timeout", "event": "decode-sent"}}]}}
# request 0 closed before P answers, request 1 while D decodes: the router runs both hops on anyway
SWALLOW = {"name": "swallow", "kind": "sequence", "decode": "decode-slow", "sequence": {"idle_margin_s": 1, "steps": [
    {"id": "w", "route": "pd-swallow-cancel", "prompt_tokens": 40, "max_tokens": 16, "count": 2,
     "cancel_after_ms": [0, 300]}]}}


def _run(tmp_path, scenarios, prefill_env=None):
    result, run_dir = run_on_fakes(tmp_path, scenarios, SLOW_D, ["nixl.kv_lease_duration=2"], prefill_env)
    return {v.scenario: (v, o) for v, o in zip(result.verdicts, result.observations, strict=True)}, run_dir


def _entries(run_dir, name):
    return {e["request_id"]: e for e in json.loads((run_dir / f"sequence-{name}.json").read_text())["entries"]}


def test_a_retry_that_reads_reused_blocks_fails_as_a_stale_read_of_cause_retry(tmp_path):
    got, run_dir = _run(tmp_path, [RETRY], {"FAKE_VLLM_FAULT": "free-after-read", "FAKE_VLLM_FAULT_ARG": "wrong"})
    v, obs = got["retry"]
    assert v.verdict == "FAIL", v.reason
    checks = {c.name: c for c in v.checks}
    assert checks["parity"].ok is False and checks["kv-integrity"].ok is False
    assert set(checks["kv-integrity"].requests) == {"retry-timeout-0", "retry-dropped-0"}
    # HTTP 200 with wrong tokens: the retry answered, and is judged on that answer
    assert checks["completed"].ok and all(r.outcome == "ok" and r.first_decode is not None for r in obs.records)
    entries = _entries(run_dir, "retry")
    assert "closed in flight 300 ms" in entries["retry-timeout-0"]["first_attempt"]
    assert "dropped connection" in entries["retry-dropped-0"]["first_attempt"]
    assert all("retry-sent" in e["events_ms"] for e in entries.values())
    topo = Topology(prefill="prefill", decode="decode-slow", block_size=32, max_model_len=128, usable_blocks=15)
    m = mechanism_of(v, obs, topo, ROLES, signature_of(v, obs, ROLES) or "")
    assert m.kind == "stale-read" and m.key == "stale-read:retry", m
    assert m.evidence["cause"] == "retry" and "Potentially invalid KV blocks" in m.evidence["line"]


def test_a_known_stale_read_of_cause_retry_is_xfail_and_the_config_holds_it_to_a_retry(tmp_path):
    known = {"id": "retry-stale", "title": "a retried decode hop reads blocks P freed", "affects": ">=0.1",
             "symptom": {"kind": "stale-kv", "cause": "retry"}}
    got, _ = _run(tmp_path, [{**RETRY, "known_issue": known}],
                  {"FAKE_VLLM_FAULT": "free-after-read", "FAKE_VLLM_FAULT_ARG": "wrong"})
    v, _ = got["retry"]
    assert v.verdict == "XFAIL", v.reason
    plain = {**RETRY, "sequence": {"steps": [{**RETRY["sequence"]["steps"][0], "route": "pd", "retry_after_ms": None}]}}
    with pytest.raises(ConfigError, match="cause retry needs a sequence step with route pd-retry"):
        load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=[{**plain, "known_issue": known}],
                                                       decodes=SLOW_D), "plain.yaml"))


@pytest.mark.parametrize("prefill_env", [None, {"FAKE_VLLM_FAULT": "free-after-read"}],
                         ids=["correct-fake", "freed-not-reused"])
def test_a_retry_that_answers_the_reference_passes(tmp_path, prefill_env):
    got, run_dir = _run(tmp_path, [RETRY], prefill_env)
    v, obs = got["retry"]
    assert v.verdict == "PASS", v.reason
    checks = {c.name: c for c in v.checks}
    assert checks["parity"].ok and checks["idle-after"].ok and checks["kv-integrity"].ok
    assert {r.request_id: r.first_decode is not None for r in obs.records} == {"retry-timeout-0": True,
                                                                                "retry-dropped-0": True}
    assert "kv-pulled" not in checks  # the retry may recompute on D: not held to a transfer
    retried = "decode hops sent again with the same params" in checks["kv-integrity"].detail
    # P that frees after the first read logs the retry's read: the route's mechanism, explained
    assert retried == (prefill_env is not None), checks["kv-integrity"].detail


def test_a_swallowed_cancel_runs_both_hops_to_the_end_and_passes(tmp_path):
    got, run_dir = _run(tmp_path, [SWALLOW])
    v, obs = got["swallow"]
    assert v.verdict == "PASS", v.reason
    checks = {c.name: c for c in v.checks}
    assert "2 run to completion after the client closed" in checks["completed"].detail
    assert checks["parity"].ok and checks["kv-pulled"].ok and checks["idle-after"].ok
    recs = {r.request_id: r for r in obs.records}
    assert all(r.outcome == "ok" and r.diagnosis.startswith(SWALLOWED) for r in recs.values())
    assert all(len(r.decode.token_ids or []) == 16 for r in recs.values())  # read to the end
    entries = _entries(run_dir, "swallow")
    for e in entries.values():
        # the client closed first: its part is not answered, the hops ran on after the close
        assert "client-closed" in e["events_ms"] and "answered" not in e["events_ms"]
        assert e["ended_ms"] > e["events_ms"]["client-closed"]
    first = entries["swallow-w-0"]["events_ms"]
    assert first["client-closed"] < first["prefill-answered"]  # closed at 0 ms: the router sent D's hop anyway

"""Sequence scenarios (bug record R02, R06) against fake vLLM servers: every step fires at its event and
not before, a straight-to-D request carries no kv_transfer_params, a stall is named with the steps
whose requests were outstanding, and an abandoned step's lease check is "not checked" (never ok)
where P has no expired-lease counter (the fake has none).

One suite run covers the scenarios; the timing assertions read ``sequence-<scenario>.json`` (ms
from each scenario's start, one clock).
"""

from __future__ import annotations

import json

from rig.cluster.processes import processes_of_run
from tests.helpers.suites import fake_suite_fixtures

DECODES = {
    # 20 ms per token: a 16-token decode hop lasts ~0.3 s, long enough to see a step wait for it.
    "decode-slow": {"env": {"FAKE_VLLM_TOKEN_LATENCY": "0.02"}},
    # P/D requests of >= 64 prompt tokens are never admitted on D (the fake's livelock).
    "decode-stall": {"env": {"FAKE_VLLM_FAULT": "stall", "FAKE_VLLM_FAULT_ARG": "64"}},
}


EXPIRED = "vllm:nixl_num_kv_expired_reqs"


def seq(name: str, decode: str, steps: list[dict]) -> dict:
    return {"name": name, "kind": "sequence", "decode": decode, "sequence": {"steps": steps, "idle_margin_s": 1}}


SCENARIOS = [
    seq("seq-order", "decode-slow", [
        {"id": "load", "route": "pd", "prompt_tokens": 40, "max_tokens": 16},
        {"id": "head", "route": "decode", "prompt_tokens": 40, "max_tokens": 4,
         "start": {"after": "load", "event": "decode-sent", "after_ms": 100}},
        {"id": "tail", "route": "prefill", "prompt_tokens": 20, "max_tokens": 4, "count": 2,
         "start": {"after": "head", "event": "answered"}},
        {"id": "last", "route": "pd", "prompt_tokens": 20, "max_tokens": 4,
         "start": {"after": "load", "event": "answered", "after_ms": 50}},
        # a one-hop step on the chat endpoint (request fields reach the step's hop and its reference)
        {"id": "chat", "route": "prefill", "prompt_tokens": 24, "max_tokens": 3, "request": {"endpoint": "chat"},
         "start": {"after": "load", "event": "sent"}},
    ]),
    seq("seq-stall", "decode-stall", [
        {"id": "big", "route": "pd", "prompt_tokens": 64, "max_tokens": 4},
        {"id": "behind", "route": "decode", "prompt_tokens": 16, "max_tokens": 4,
         "start": {"after": "big", "event": "decode-sent", "after_ms": 50}},
        {"id": "never", "route": "decode", "prompt_tokens": 16, "max_tokens": 4,
         "start": {"after": "big", "event": "answered"}},
    ]),
    seq("seq-abandon", "decode-slow", [
        {"id": "gone", "route": "pd-abandon", "prompt_tokens": 40, "max_tokens": 4, "count": 2},
        {"id": "after", "route": "decode", "prompt_tokens": 20, "max_tokens": 4,
         "start": {"after": "gone", "event": "prefill-answered"}},
    ]),
]


# suite: (RunResult, run_dir) of one run of SCENARIOS. P lacks the expired-lease counter:
# seq-abandon's lease-reaped must be "not checked", never ok.
base_dir, no_survivors, suite = fake_suite_fixtures(
    "fake-sequence", decodes=DECODES, scenarios=SCENARIOS, prefill_env={"FAKE_VLLM_OMIT_METRICS": EXPIRED},
    timeouts={"stall_window_s": 1.5, "kv_transfer_s": 3}, overrides=["nixl.kv_lease_duration=2"])


def verdict(suite, name):
    return next(v for v in suite[0].verdicts if v.scenario == name)


def entries(suite, name) -> dict[str, dict]:
    data = json.loads((suite[1] / f"sequence-{name}.json").read_text())
    return {e["request_id"]: e for e in data["entries"]}


def records(suite, name) -> dict:
    obs = next(o for o in suite[0].observations if o.scenario == name)
    return {r.request_id: r for r in obs.records}


def checks(v) -> dict[str, tuple[bool | None, str]]:
    return {c.name: (c.ok, c.detail) for c in v.checks}


def test_every_scenario_judged_and_reported(suite):
    result, run_dir = suite
    assert result.error == ""
    assert sorted(v.scenario for v in result.verdicts) == sorted(s["name"] for s in SCENARIOS)
    assert processes_of_run(run_dir) == []
    summary = (run_dir / "summary.md").read_text()
    assert "### Sequence `seq-order`" in summary and "| seq-order-head-0 | head | decode |" in summary


def test_steps_fire_at_their_event_not_before(suite):
    e = entries(suite, "seq-order")
    load, head = e["seq-order-load-0"], e["seq-order-head-0"]
    # head: 100 ms after load's decode hop was sent, while that hop was still decoding
    assert head["events_ms"]["sent"] >= load["events_ms"]["decode-sent"] + 100
    assert head["events_ms"]["sent"] < load["events_ms"]["answered"]
    # tail: both requests after head answered, sent together
    for k in (0, 1):
        assert e[f"seq-order-tail-{k}"]["events_ms"]["sent"] >= head["events_ms"]["answered"]
    assert e["seq-order-last-0"]["events_ms"]["sent"] >= load["events_ms"]["answered"] + 50
    assert e["seq-order-chat-0"]["events_ms"]["sent"] >= load["events_ms"]["sent"]
    v = verdict(suite, "seq-order")
    assert v.verdict == "PASS", v.reason
    c = checks(v)
    assert c["kv-pulled"][0] is True and c["kv-pulled"][1].startswith("pd and router steps only")
    assert c["token-counts"][0] is True and "head: 1 x 40+4" in c["token-counts"][1]


def test_straight_to_d_request_carries_no_kv_transfer_params(suite):
    recs = records(suite, "seq-order")
    head, tail = recs["seq-order-head-0"], recs["seq-order-tail-0"]
    assert head.prefill is None and head.decode is not None and head.decode.instance == "decode-slow"
    assert tail.prefill is None and tail.decode is not None and tail.decode.instance == "prefill"
    chat = recs["seq-order-chat-0"]
    assert chat.endpoint == "chat" and chat.outcome == "ok" and chat.decode.instance == "prefill"
    # D's log: one "completion fields" line per request D got, in arrival order (the fake logs the
    # body's field names). The scenarios' four D requests come last: seq-order's load (pd), head
    # (straight to D), last (pd), then seq-abandon's straight-to-D request.
    lines = [ln for ln in (suite[1] / "logs" / "decode-slow.log").read_text().splitlines()
             if "completion fields:" in ln]
    assert ["kv_transfer_params" in ln for ln in lines[-4:]] == [True, False, True, False]


def test_stall_names_its_outstanding_steps(suite):
    v = verdict(suite, "seq-stall")
    assert v.verdict == "FAIL", v.reason
    c = checks(v)
    assert c["no-stall"][0] is False
    assert "outstanding: big (1 of 1, route pd)" in c["no-stall"][1]
    e = entries(suite, "seq-stall")
    assert e["seq-stall-big-0"]["outcome"] == "stalled"
    # the step waiting for big's answer was never sent, and says why
    never = e["seq-stall-never-0"]
    assert never["outcome"] == "cancelled" and "never reached answered" in never["diagnosis"]
    assert "sent" not in never["events_ms"]


def test_abandoned_step_never_sends_its_decode_hop_and_its_lease_is_not_checked_without_the_counter(suite):
    recs = records(suite, "seq-abandon")
    for k in (0, 1):
        r = recs[f"seq-abandon-gone-{k}"]
        assert r.prefill is not None and r.prefill.kv_transfer_params and r.decode is None
        assert r.outcome == "cancelled" and "never sent" in r.diagnosis
    v = verdict(suite, "seq-abandon")
    c = checks(v)
    assert c["completed"][0] is True and "2 abandoned after P answered" in c["completed"][1]
    assert c["lease-reaped"][0] is None and "nixl_num_kv_expired_reqs_total" in c["lease-reaped"][1]
    assert v.verdict == "ERROR" and "lease-reaped" in v.reason

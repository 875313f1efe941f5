"""Observations (rig/observe/observations.py) pinned down, written against `make mutation`
survivors: idle needs all three gauges present and at their baseline (an absent gauge is "not
checked", never idle); a drain's detail names each gauge that is not idle; the transfer evidence is
each counter's delta; report.json and the metrics timeline keep what was observed (an absent
metric is left out, never written as 0)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest

from rig.observe import metrics as m
from rig.observe.observations import (
    IDLE_GAUGES,
    KV_EPS,
    DrainResult,
    SnapshotStore,
    TransferEvidence,
    absent_gauges,
    idle_verdict,
    wait_idle,
)


def prom(waiting=0.0, running=0.0, kv=0.1, extra="") -> str:
    out = ""
    for name, v in ((m.WAITING, waiting), (m.RUNNING, running), (m.KV_USAGE, kv)):
        if v is not None:
            out += f"# TYPE {name} gauge\n{name}{{engine=\"0\"}} {v}\n"
    return out + extra


# ------------------------------------------------------------------------------------ idle


def test_idle_needs_no_waiting_no_running_and_kv_at_most_the_baseline():
    assert KV_EPS == 1e-6
    assert idle_verdict({"waiting": 0.0, "running": 0.0, "kv_usage": 0.2}, 0.2) is True
    assert idle_verdict({"waiting": 0.0, "running": 0.0, "kv_usage": 0.2 + 0.9e-6}, 0.2) is True
    assert idle_verdict({"waiting": 0.0, "running": 0.0, "kv_usage": 0.2 + KV_EPS}, 0.2) is True
    assert idle_verdict({"waiting": 0.0, "running": 0.0, "kv_usage": 0.2 + 2e-6}, 0.2) is False
    assert idle_verdict({"waiting": 1.0, "running": 0.0, "kv_usage": 0.0}, 0.2) is False
    assert idle_verdict({"waiting": 0.0, "running": 1.0, "kv_usage": 0.0}, 0.2) is False


@pytest.mark.parametrize("gone", ["waiting", "running", "kv_usage"])
def test_an_absent_gauge_is_not_checked_never_idle(gone):
    state: dict[str, float | None] = {"waiting": 0.0, "running": 0.0, "kv_usage": 0.0}
    state[gone] = None
    assert idle_verdict(state, 0.5) is None
    del state[gone]
    assert idle_verdict(state, 0.5) is None


def test_absent_gauges_names_the_metrics_in_order():
    assert IDLE_GAUGES == {"waiting": m.WAITING, "running": m.RUNNING, "kv_usage": m.KV_USAGE}
    assert absent_gauges({"waiting": 0.0, "running": None}) == f"{m.RUNNING}, {m.KV_USAGE} absent from /metrics"
    assert absent_gauges({"waiting": None, "running": 1.0, "kv_usage": 0.0}) == f"{m.WAITING} absent from /metrics"


def test_drain_describe_says_what_the_user_acts_on():
    final = {"waiting": 2.0, "running": 1.0, "kv_usage": 0.5}
    assert DrainResult("decode", True, 0.44, 0.1, final).describe() == "decode idle after 0.4 s"
    assert (DrainResult("decode", None, 0.0, 0.1, {}, "vllm:x absent from /metrics").describe()
            == "decode idle not checked: vllm:x absent from /metrics")
    assert (DrainResult("decode", False, 5.0, 0.1, {}, "ConnectError: refused").describe()
            == "decode not observed idle: ConnectError: refused")
    assert (DrainResult("decode", False, 5.04, 0.1, final).describe()
            == "decode not idle after 5.0 s: waiting=2, running=1, kv_cache_usage_perc=50.0% (baseline 10.0%)")
    assert (DrainResult("p", False, 1.0, 0.1, {"waiting": 0.0, "running": 3.0, "kv_usage": 0.1}).describe()
            == "p not idle after 1.0 s: running=3")
    assert (DrainResult("p", False, 1.0, 0.25, {"waiting": 1.0, "running": 0.0, "kv_usage": 0.25 + 0.5e-6}).describe()
            == "p not idle after 1.0 s: waiting=1")
    assert (DrainResult("p", False, 1.0, 0.0, {"waiting": 1.0, "running": 0.0, "kv_usage": KV_EPS}).describe()
            == "p not idle after 1.0 s: waiting=1")
    assert (DrainResult("p", False, 1.0, 0.25, {"waiting": 0.0, "running": None, "kv_usage": 0.2501}).describe()
            == "p not idle after 1.0 s: kv_cache_usage_perc=25.0% (baseline 25.0%)")


def client(handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def run_wait(handler, baseline=0.1, timeout_s=0.0) -> DrainResult:
    async def go() -> DrainResult:
        async with client(handler) as http:
            return await wait_idle(http, "decode", "http://d", baseline, timeout_s, interval_s=0.0)
    return asyncio.run(go())


def test_wait_idle_returns_idle_on_the_first_idle_sample(monkeypatch):
    from rig.observe import observations
    monkeypatch.setattr(observations, "time", Clock())
    seen = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(str(req.url))
        return httpx.Response(200, text=prom(kv=0.1))

    d = run_wait(handler, timeout_s=30.0)
    assert (d.instance, d.idle, d.baseline_kv, d.error) == ("decode", True, 0.1, "")
    assert d.final == {"waiting": 0.0, "running": 0.0, "kv_usage": 0.1}
    assert seen == ["http://d/metrics"] and d.after_s == 1.0


def test_wait_idle_polls_until_idle():
    answers = iter([prom(running=1.0), prom(waiting=2.0), prom()])

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=next(answers))

    d = run_wait(handler, timeout_s=60.0)
    assert d.idle is True and d.final["running"] == 0.0


def test_wait_idle_with_an_absent_gauge_is_not_checked_at_once(monkeypatch):
    from rig.observe import observations
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(200, text=prom(kv=None))

    monkeypatch.setattr(observations, "time", Clock())
    d = run_wait(handler, baseline=0.3, timeout_s=60.0)
    assert (d.instance, d.after_s, d.baseline_kv) == ("decode", 1.0, 0.3)
    assert (d.idle, d.error) == (None, f"{m.KV_USAGE} absent from /metrics")
    assert d.final == {"waiting": 0.0, "running": 0.0, "kv_usage": None} and len(calls) == 1


def test_wait_idle_not_idle_at_the_deadline_keeps_the_last_gauges():
    d = run_wait(lambda req: httpx.Response(200, text=prom(running=2.0)), timeout_s=0.0)
    assert (d.idle, d.error, d.final["running"]) == (False, "", 2.0)
    assert d.describe() == "decode not idle after 0.0 s: running=2"


def test_wait_idle_an_unreachable_or_unreadable_instance_is_not_idle_naming_the_error():
    d = run_wait(lambda req: httpx.Response(503, text="down"), timeout_s=0.0)
    assert d.idle is False and d.error.startswith("HTTPStatusError: ") and "503" in d.error and d.final == {}
    d = run_wait(lambda req: httpx.Response(200, text="vllm:x{ 1\n"), timeout_s=0.0)
    assert d.idle is False and d.error.startswith("ValueError: ")


class Clock:
    """A monotonic clock that moves 1 s per reading: wait_idle's deadline without waiting."""

    def __init__(self) -> None:
        self.now = 99.0  # not 0: an elapsed time computed as now + start would show

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now


def test_wait_idle_reports_the_last_sample_and_the_last_error_at_the_deadline(monkeypatch):
    from rig.observe import observations
    for answers, error, running in (
            ([httpx.Response(503), httpx.Response(200, text=prom(running=1.0))], "", 1.0),
            ([httpx.Response(200, text=prom(running=1.0)), httpx.Response(503)], "HTTPStatusError", 1.0),
            ([httpx.Response(200, text=prom(running=1.0)), httpx.Response(200, text=prom(waiting=4.0))], "", 0.0)):
        monkeypatch.setattr(observations, "time", Clock())
        it = iter(answers)
        d = run_wait(lambda req, it=it: next(it), timeout_s=2.0)
        assert d.idle is False and d.error.startswith(error) and bool(d.error) == bool(error)
        assert d.final["running"] == running and d.after_s == 3.0


# -------------------------------------------------------------------------------- evidence

def counters(count, total, ext, cached, computed, failed, preempted, drafts) -> str:
    """/metrics text with the counters TransferEvidence reads."""
    by_source = "vllm:prompt_tokens_by_source_total"
    return (f"# TYPE vllm:nixl_bytes_transferred histogram\nvllm:nixl_bytes_transferred_count {count}\n"
            f"vllm:nixl_bytes_transferred_sum {total}\n# TYPE {by_source} counter\n"
            f'{by_source}{{source="external_kv_transfer"}} {ext}\n{by_source}{{source="local_cache_hit"}} {cached}\n'
            f'{by_source}{{source="local_compute"}} {computed}\n'
            + "".join(f"# TYPE {n} counter\n{n} {v}\n" for n, v in (
                (m.NIXL_FAILED_TRANSFERS, failed), (m.PREEMPTIONS, preempted), (m.SPEC_DRAFTS, drafts))))


BEFORE = counters(1, 100, 10, 20, 30, 1, 2, 3)
AFTER = counters(4, 1100, 17, 25, 36, 3, 9, 11)


def test_transfer_evidence_is_each_counters_delta():
    ev = TransferEvidence.between(m.parse_metrics(BEFORE, "d", t=0.0), m.parse_metrics(AFTER, "d", t=1.0))
    assert ev == TransferEvidence(nixl_bytes=1000.0, nixl_transfers=3.0, external_prompt_tokens=7.0,
                                  cached_prompt_tokens=5.0, computed_prompt_tokens=6.0, failed_transfers=2.0,
                                  preemptions=7.0, spec_drafts=8.0)
    assert TransferEvidence() == TransferEvidence(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


# ------------------------------------------------------------------------------- timeline


TIMELINE_TEXT = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting 0.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{reason="capacity"} 2.0
vllm:num_requests_waiting_by_reason{reason="deferred"} 0.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total 12.0
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1700000000.5
"""


def test_snapshot_store_writes_each_sample_leaving_absent_metrics_out(tmp_path):
    store = SnapshotStore(tmp_path)
    snap = m.MetricSnapshot("decode", t=1.23456, wall=1700000001.23456,
                            samples=m.parse_metrics(TIMELINE_TEXT).samples, text=TIMELINE_TEXT,
                            monotonic=frozenset({m.GENERATION_TOKENS}))
    store.sample("edge", snap)
    bare = m.MetricSnapshot("prefill", t=2.0, wall=1700000002.0)
    store.sample("edge", bare)
    store.sample("other", bare)
    store.save("before", snap)
    store.close()
    want = {"wall": 1700000001.235, "t": 1.235, "scenario": "edge", "instance": "decode",
            "num_requests_running": 1.0, "num_requests_waiting": 0.0, "generation_tokens_total": 12.0,
            "waiting_capacity": 2.0, "waiting_deferred": 0.0, "life": 1700000000.5,
            "counters": {m.GENERATION_TOKENS: 12.0}}
    bare_row = {"wall": 1700000002.0, "t": 2.0, "scenario": "edge", "instance": "prefill", "counters": {}}
    assert store.rows_of("edge") == [want, bare_row]
    assert store.rows_of("other") == [{**bare_row, "scenario": "other"}]
    assert store.rows_of("none") == []
    lines = (tmp_path / "metrics" / "timeline.jsonl").read_text().splitlines()
    assert [json.loads(ln) for ln in lines] == [want, bare_row, {**bare_row, "scenario": "other"}]
    assert (tmp_path / "metrics" / "before-decode.prom").read_text() == TIMELINE_TEXT


def test_wait_idle_waits_its_interval_between_samples(monkeypatch):
    from rig.observe import observations
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    monkeypatch.setattr(observations, "time", Clock())
    monkeypatch.setattr(observations, "asyncio", SimpleNamespace(sleep=sleep))
    answers = iter([prom(running=1.0), prom(running=1.0), prom()])

    async def go(**kw) -> DrainResult:
        async with client(lambda req: httpx.Response(200, text=next(answers))) as http:
            return await wait_idle(http, "decode", "http://d", 0.1, 60.0, **kw)
    assert asyncio.run(go()).idle is True
    assert slept == [0.5, 0.5]
    answers = iter([prom(running=1.0), prom()])
    asyncio.run(go(interval_s=2.0))
    assert slept == [0.5, 0.5, 2.0]


def test_snapshot_store_creates_the_run_directory(tmp_path):
    store = SnapshotStore(tmp_path / "runs" / "r1")
    store.close()
    assert (tmp_path / "runs" / "r1" / "metrics" / "timeline.jsonl").is_file()


def test_snapshot_store_appends_and_rows_of_is_a_copy(tmp_path):
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "timeline.jsonl").write_text('{"old": 1}\n')
    store = SnapshotStore(tmp_path)
    store.sample("s", m.MetricSnapshot("d", t=0.0, wall=0.0))
    store.rows_of("s").clear()
    assert len(store.rows_of("s")) == 1
    # written at once (flushed), before close: nothing is lost if the run dies
    assert (tmp_path / "metrics" / "timeline.jsonl").read_text().splitlines()[0] == '{"old": 1}'
    assert len((tmp_path / "metrics" / "timeline.jsonl").read_text().splitlines()) == 2
    store.close()

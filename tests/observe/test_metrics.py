"""Parsing vLLM 0.32.0's /metrics (recorded from live CPU runs in tests/data/), lookups, deltas."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from rig.observe import metrics as m
from rig.observe.observations import TransferEvidence

DATA = Path(__file__).resolve().parents[1] / "data"
# Decode-6blk before and after edge-126 (126-token prompt pulled from P over NIXL, 2 tokens out).
BEFORE = DATA / "vllm-0.32.0-decode-6blk-before-edge-126.prom"
AFTER = DATA / "vllm-0.32.0-decode-6blk-after-edge-126.prom"
# Decode (5 blocks, ngram k=1) with edge-126 stuck in the 0.32.0 admission livelock.
STALLED = DATA / "vllm-0.32.0-decode-stalled-edge-126.prom"


@pytest.fixture(scope="module")
def before() -> m.MetricSnapshot:
    return m.parse_metrics(BEFORE.read_text(), "decode-6blk", t=10.0)


@pytest.fixture(scope="module")
def after() -> m.MetricSnapshot:
    return m.parse_metrics(AFTER.read_text(), "decode-6blk", t=20.0)


@pytest.fixture(scope="module")
def stalled() -> m.MetricSnapshot:
    return m.parse_metrics(STALLED.read_text(), "decode", t=30.0)


def test_snapshot_fields(after):
    assert after.instance == "decode-6blk" and after.t == 20.0
    assert after.text == AFTER.read_text()
    assert len(after.samples) > 400  # python_*, process_* and ~60 vllm families with histograms


def test_every_name_the_rig_reads_is_exposed(after):
    names = [v for k, v in vars(m).items() if k.isupper() and isinstance(v, str) and v.startswith("vllm:")]
    assert len(names) >= 19
    missing = [n for n in names if not after.has(n)]
    assert missing == []


def test_gauges_and_counters(after, stalled):
    assert after.value(m.RUNNING) == 0 and after.value(m.WAITING) == 0
    assert after.value(m.KV_USAGE) == 0.0
    assert after.value(m.GENERATION_TOKENS) == 4  # 2 warm-up + 2 of edge-126
    assert after.value(m.PROMPT_TOKENS) == 134  # 8 warm-up + 126
    assert after.value(m.NIXL_BYTES_SUM) == 131072 and after.value(m.NIXL_XFER_COUNT) == 1
    assert stalled.value(m.WAITING) == 1 and stalled.value(m.RUNNING) == 0
    assert stalled.value(m.WAITING_BY_REASON, reason="capacity") == 1
    assert stalled.value(m.WAITING_BY_REASON, reason="deferred") == 0
    assert stalled.value(m.KV_FETCH_BY_STAGE, stage="waiting_to_start") == 1


def test_histogram_samples_by_suffix(after):
    assert after.value("vllm:nixl_xfer_time_seconds_count") == 1
    assert after.value("vllm:nixl_xfer_time_seconds_sum") > 0
    assert after.value("vllm:nixl_xfer_time_seconds_bucket", le="+Inf") == 1
    assert after.value("vllm:time_to_first_token_seconds_count") == 2


def test_value_sums_over_other_labels(after):
    # request_success_total is split by finished_reason; value() without it is the total.
    assert after.value(m.REQUEST_SUCCESS) == 2
    assert after.value(m.REQUEST_SUCCESS, finished_reason="length") == 2
    assert after.value(m.REQUEST_SUCCESS, finished_reason="stop") == 0
    assert after.value(m.PROMPT_TOKENS_BY_SOURCE) == after.value(m.PROMPT_TOKENS)
    # Labels that every sample has (engine, model_name) select the same total.
    assert after.value(m.REQUEST_SUCCESS, engine="0", model_name="tiny") == 2


def test_value_sums_over_engines():
    text = ("# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_waiting{engine="1",model_name="m"} 3.0\n'
            "# TYPE vllm:generation_tokens counter\n"
            'vllm:generation_tokens_total{engine="0",model_name="m"} 10.0\n'
            'vllm:generation_tokens_total{engine="1",model_name="m"} 5.0\n')
    s = m.parse_metrics(text, "d", t=0.0)
    assert s.value(m.WAITING) == 5 and s.value(m.WAITING, engine="1") == 3
    assert s.value(m.GENERATION_TOKENS) == 15
    assert s.by_label(m.WAITING, "engine") == {"0": 2.0, "1": 3.0}


def test_value_default_for_missing(after):
    assert not after.has("vllm:no_such_metric")
    assert after.value("vllm:no_such_metric") == 0.0
    assert after.value("vllm:no_such_metric", default=-1.0) == -1.0
    # An existing metric with a label value that matches nothing is also "missing".
    assert after.value(m.REQUEST_SUCCESS, default=-1.0, finished_reason="nope") == -1.0


def test_by_label(after, stalled):
    assert after.by_label(m.PROMPT_TOKENS_BY_SOURCE, "source") == {
        "local_compute": 8.0, "local_cache_hit": 0.0, "external_kv_transfer": 126.0}
    assert after.by_label(m.REQUEST_SUCCESS, "finished_reason") == {
        "stop": 0.0, "length": 2.0, "abort": 0.0, "error": 0.0, "repetition": 0.0}
    assert stalled.by_label(m.KV_FETCH_BY_STAGE, "stage") == {
        "waiting_to_start": 1.0, "in_progress": 0.0, "completed_waiting": 0.0}
    assert after.by_label(m.RUNNING, "no_such_label") == {}
    assert after.by_label("vllm:no_such_metric", "engine") == {}


def test_delta(before, after):
    assert m.delta(before, after, m.NIXL_BYTES_SUM) == 131072
    assert m.delta(before, after, m.NIXL_XFER_COUNT) == 1
    assert m.delta(before, after, m.PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer") == 126
    assert m.delta(before, after, m.PROMPT_TOKENS_BY_SOURCE, source="local_compute") == 0
    assert m.delta(before, after, m.GENERATION_TOKENS) == 2
    assert m.delta(before, after, m.REQUEST_SUCCESS, finished_reason="length") == 1
    assert m.delta(after, before, m.GENERATION_TOKENS) == -2


def test_transfer_evidence_from_recorded_run(before, after, stalled):
    ev = TransferEvidence.between(before, after)
    assert (ev.nixl_bytes, ev.nixl_transfers, ev.external_prompt_tokens) == (131072, 1, 126)
    assert ev.failed_transfers == 0 and ev.preemptions == 0
    assert ev.spec_drafts == 1  # ngram k=1 drafted once for the second token
    stuck = TransferEvidence.between(stalled, stalled)
    assert stuck.nixl_bytes == 0 and stuck.external_prompt_tokens == 0


def test_idle_state(after, stalled):
    assert m.idle_state(after) == {"waiting": 0.0, "running": 0.0, "kv_usage": 0.0}
    assert m.idle_state(stalled) == {"waiting": 1.0, "running": 0.0, "kv_usage": 0.0}


def test_not_exposition_format_raises():
    with pytest.raises(ValueError):
        m.parse_metrics("<html>502 Bad Gateway</html>\n", "d")


def test_t_defaults_to_monotonic():
    import time

    t0 = time.monotonic()
    s = m.parse_metrics("# TYPE x gauge\nx 1.0\n", "d")
    assert t0 <= s.t <= time.monotonic() and s.value("x") == 1.0


# -------------------------------------------------------------------------------------------------
# /metrics reading (rig/observe/metrics.py) pinned down, written against `make mutation`
# survivors: an absent metric is None (never 0) where its absence must not read as idle or as "no
# work"; lookups match the name and every asked label; sums are over the other labels; only the
# samples of counter / histogram / summary families count as monotonic; the required metrics of each
# role are named in order.

TEXT = """\
# HELP vllm:num_requests_running Running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="t"} 2.0
vllm:num_requests_running{engine="1",model_name="t"} 3.0
# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="t"} 0.0
# HELP vllm:prompt_tokens_by_source_total Prompt tokens.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"} 96.0
vllm:prompt_tokens_by_source_total{engine="1",source="external_kv_transfer"} 4.0
vllm:prompt_tokens_by_source_total{engine="0",source="local_compute"} 30.0
# HELP vllm:nixl_bytes_transferred Bytes.
# TYPE vllm:nixl_bytes_transferred histogram
vllm:nixl_bytes_transferred_bucket{le="+Inf"} 3.0
vllm:nixl_bytes_transferred_count 3.0
vllm:nixl_bytes_transferred_sum 4096.0
# HELP odd_total A gauge whose name ends in _total.
# TYPE odd_total gauge
odd_total 5.0
# HELP lat Latency.
# TYPE lat summary
lat_count 7.0
lat_sum 1.5
# HELP vllm:kv_cache_usage_perc Usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.25
"""


@pytest.fixture  # per test, so that mutmut counts every test reading it as covering parse_metrics
def snap() -> m.MetricSnapshot:
    return m.parse_metrics(TEXT, "decode", t=12.5)


def test_parse_keeps_the_instance_the_time_and_the_text(snap):
    assert (snap.instance, snap.t, snap.text) == ("decode", 12.5, TEXT)
    assert snap.samples[("vllm:num_requests_running", (("engine", "0"), ("model_name", "t")))] == 2.0
    assert m.parse_metrics("", "p").instance == "p" and m.parse_metrics("").samples == {}


def test_only_counter_histogram_and_summary_samples_are_monotonic(snap):
    assert snap.monotonic == frozenset({"vllm:prompt_tokens_by_source_total", "vllm:nixl_bytes_transferred_count",
                                        "vllm:nixl_bytes_transferred_sum", "lat_count", "lat_sum"})
    assert m.MONOTONIC_SUFFIXES == ("_total", "_count", "_sum")


def test_counter_values_names_each_monotonic_series_with_its_sorted_labels(snap):
    assert m.counter_values(snap) == {
        'vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"}': 96.0,
        'vllm:prompt_tokens_by_source_total{engine="1",source="external_kv_transfer"}': 4.0,
        'vllm:prompt_tokens_by_source_total{engine="0",source="local_compute"}': 30.0,
        "vllm:nixl_bytes_transferred_count": 3.0, "vllm:nixl_bytes_transferred_sum": 4096.0,
        "lat_count": 7.0, "lat_sum": 1.5}


def test_value_sums_the_matching_samples_and_defaults_only_when_none_matches(snap):
    assert snap.value(m.RUNNING) == 5.0
    assert snap.value(m.RUNNING, engine="1") == 3.0
    assert snap.value(m.PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer") == 100.0
    assert snap.value(m.PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer", engine="0") == 96.0
    assert snap.value(m.WAITING, default=-1.0) == 0.0  # present at 0 is 0, not the default
    assert snap.value("vllm:absent") == 0.0
    assert snap.value("vllm:absent", default=-1.0) == -1.0
    assert snap.value(m.RUNNING, default=-1.0, engine="9") == -1.0


def test_get_is_none_for_an_absent_metric_or_label_and_the_sum_otherwise(snap):
    assert snap.get(m.RUNNING) == 5.0
    assert snap.get(m.RUNNING, engine="0") == 2.0
    assert snap.get(m.WAITING) == 0.0
    assert snap.get("vllm:absent") is None
    assert snap.get(m.RUNNING, engine="9") is None
    assert snap.get(m.PROMPT_TOKENS_BY_SOURCE, source="local_compute") == 30.0
    assert snap.get(m.KV_USAGE, engine="0") == 0.25  # the asked labels are all the sample has
    assert snap.get("lat_sum") == 1.5 and snap.value("lat_sum") == 1.5  # a sample without labels


def test_has_and_by_label(snap):
    assert snap.has(m.WAITING) and not snap.has("vllm:absent") and not snap.has("vllm:num_requests")
    assert snap.by_label(m.PROMPT_TOKENS_BY_SOURCE, "source") == {"external_kv_transfer": 100.0, "local_compute": 30.0}
    assert snap.by_label(m.PROMPT_TOKENS_BY_SOURCE, "engine") == {"0": 126.0, "1": 4.0}
    assert snap.by_label(m.NIXL_BYTES_SUM, "source") == {}
    assert snap.by_label("vllm:absent", "source") == {}


def test_delta_is_after_minus_before_per_label():
    before = m.parse_metrics(TEXT, "d", t=1.0)
    after = m.parse_metrics(TEXT.replace("transferred_sum 4096.0", "transferred_sum 6144.0")
                            .replace('source="local_compute"} 30.0', 'source="local_compute"} 45.0'), "d", t=2.0)
    assert m.delta(before, after, m.NIXL_BYTES_SUM) == 2048.0
    assert m.delta(after, before, m.NIXL_BYTES_SUM) == -2048.0
    assert m.delta(before, after, m.PROMPT_TOKENS_BY_SOURCE, source="local_compute") == 15.0
    assert m.delta(before, after, m.PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer") == 0.0
    empty = m.parse_metrics("", "d", t=0.0)
    assert m.delta(empty, after, m.NIXL_BYTES_SUM) == 6144.0  # a series that appears counts from 0
    assert m.delta(after, empty, m.NIXL_BYTES_SUM) == -6144.0  # one that vanished: its fall
    assert m.delta(empty, empty, m.NIXL_BYTES_SUM) == 0.0


def test_idle_state_reads_an_absent_gauge_as_none_never_zero(snap):
    assert m.idle_state(snap) == {"waiting": 0.0, "running": 5.0, "kv_usage": 0.25}
    assert m.idle_state(m.parse_metrics("", "d")) == {"waiting": None, "running": None, "kv_usage": None}
    no_kv = m.parse_metrics(TEXT.replace('vllm:kv_cache_usage_perc{engine="0"} 0.25', ""), "d")
    assert m.idle_state(no_kv)["kv_usage"] is None


def test_required_metrics_per_role_with_and_without_nixl():
    base_d = (m.WAITING, m.RUNNING, m.KV_USAGE, m.GENERATION_TOKENS, m.PROMPT_TOKENS, m.REQUEST_SUCCESS,
              m.PREEMPTIONS, m.PROMPT_TOKENS_BY_SOURCE)
    assert m.required_metrics("decode", False) == base_d
    assert m.required_metrics("decode", True) == base_d + (m.NIXL_BYTES_SUM, m.NIXL_XFER_COUNT)
    assert m.required_metrics("prefill", True) == (m.WAITING, m.RUNNING, m.KV_USAGE)
    assert m.required_metrics("prefill", False) == (m.WAITING, m.RUNNING, m.KV_USAGE)
    assert m.required_metrics("router", True) == ()
    assert m.DIAGNOSTIC_METRICS == {"prefill": (m.PREFIX_HITS,), "decode": (m.WAITING_BY_REASON, m.KV_FETCH_BY_STAGE)}


def test_the_metrics_prefix_hits_needs_are_looked_for_on_p():
    """prefix-hits is "not checked" for a metric P lacks only if the presence scrape looks for it
    (rig.observe.evidence.metric_presence lists the required and diagnostic ones): otherwise a P
    without prefix_cache_hits would read 0 hits and pass a wave that expects none."""
    from rig.judge.checks import PREFIX_HIT_METRICS
    looked_for = m.required_metrics("prefill", False) + m.DIAGNOSTIC_METRICS["prefill"]
    assert set(PREFIX_HIT_METRICS) <= set(looked_for)


def test_missing_metrics_names_the_absent_ones_in_order(snap):
    names = (m.KV_USAGE, m.NIXL_XFER_COUNT, m.GENERATION_TOKENS, m.WAITING, m.PREEMPTIONS)
    assert m.missing_metrics(snap, names) == [m.GENERATION_TOKENS, m.PREEMPTIONS]
    assert m.missing_metrics(snap, ()) == []
    assert m.missing_metrics(m.parse_metrics("", "d"), (m.WAITING,)) == [m.WAITING]


def test_parse_stamps_the_monotonic_and_the_wall_clock(monkeypatch):
    monkeypatch.setattr(m, "time", SimpleNamespace(monotonic=lambda: 42.0, time=lambda: 1700000000.0))
    s = m.parse_metrics("")
    assert (s.instance, s.t, s.wall) == ("", 42.0, 1700000000.0)
    assert m.parse_metrics("", "d", t=3.0).t == 3.0


def test_scrape_gets_metrics_within_its_timeout_and_raises_on_an_error_status():
    asked = []

    def handler(req: httpx.Request) -> httpx.Response:
        asked.append((str(req.url), req.extensions["timeout"]["read"]))
        return httpx.Response(200 if req.url.host == "up" else 500, text=TEXT)

    async def go(url: str, **kw) -> m.MetricSnapshot:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return await m.scrape(http, url, "decode", **kw)

    s = asyncio.run(go("http://up"))
    assert (s.instance, s.get(m.RUNNING)) == ("decode", 5.0)
    asyncio.run(go("http://up", timeout_s=0.5))
    assert asked == [("http://up/metrics", 5.0), ("http://up/metrics", 0.5)]
    with pytest.raises(httpx.HTTPStatusError):
        asyncio.run(go("http://down"))


def test_not_the_exposition_format_raises_value_error():
    with pytest.raises(ValueError):
        m.parse_metrics("vllm:x{ 1\n")

"""Parsing vLLM 0.32.0's /metrics (recorded from live CPU runs in tests/data/), lookups, deltas."""

from __future__ import annotations

from pathlib import Path

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

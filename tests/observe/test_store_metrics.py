"""Store metrics (rig/observe/store_metrics.py) pinned down, written against `make mutation`
survivors: each store operation's calls / keys / bytes / failed keys, with only status ok counted
as ok bytes and any other status as a bad call; deltas per operation; the master's counters under
either spelling; a requeue seen only when running fell and waiting rose with no request finished;
the derived facts a store verdict reads (a ratio with nothing asked is None, never 0)."""

from __future__ import annotations

import pytest

from rig.observe import metrics as m
from rig.observe import store_metrics as sm

OPS = """\
# TYPE vllm:mooncake_store_operation_total counter
vllm:mooncake_store_operation_total{engine="0",operation="load_get",status="ok"} 4.0
vllm:mooncake_store_operation_total{engine="1",operation="load_get",status="ok"} 1.0
vllm:mooncake_store_operation_total{engine="0",operation="load_get",status="error"} 2.0
vllm:mooncake_store_operation_total{engine="0",operation="load_get",status="partial_failure"} 3.0
vllm:mooncake_store_operation_total{engine="0",operation="save_put",status="ok"} 7.0
# TYPE vllm:mooncake_store_operation_keys_total counter
vllm:mooncake_store_operation_keys_total{engine="0",operation="load_get",status="ok"} 40.0
vllm:mooncake_store_operation_keys_total{engine="0",operation="load_get",status="error"} 5.0
# TYPE vllm:mooncake_store_operation_bytes_total counter
vllm:mooncake_store_operation_bytes_total{engine="0",operation="load_get",status="ok"} 1000.0
vllm:mooncake_store_operation_bytes_total{engine="1",operation="load_get",status="ok"} 200.0
vllm:mooncake_store_operation_bytes_total{engine="0",operation="load_get",status="partial_failure"} 300.0
vllm:mooncake_store_operation_bytes_total{engine="0",operation="save_put",status="ok"} 700.0
# TYPE vllm:mooncake_store_operation_failed_keys_total counter
vllm:mooncake_store_operation_failed_keys_total{engine="0",operation="load_get",status="error"} 6.0
vllm:mooncake_store_operation_failed_keys_total{engine="0",operation="save_put",status="partial_failure"} 2.0
# TYPE vllm:mooncake_store_operation_latency_seconds_total counter
vllm:mooncake_store_operation_latency_seconds_total{engine="0",operation="load_get",status="ok"} 9.0
# TYPE vllm:other_total counter
vllm:other_total{operation="exotic",status="ok"} 99.0
"""


def snap(text: str) -> m.MetricSnapshot:
    return m.parse_metrics(text, "d", t=0.0)


def test_loadable_tokens_are_the_full_blocks_before_the_last_token():
    assert [sm.loadable_tokens(n, 16) for n in (0, 1, 16, 17, 32, 33, 48)] == [0, 0, 0, 16, 16, 32, 32]
    assert sm.loadable_tokens(9, 4) == 8 and sm.loadable_tokens(8, 4) == 4


def test_store_ops_sums_each_field_per_operation_and_splits_ok_from_bad():
    assert sm.store_ops(snap(OPS)) == {
        "load_get": {"calls": 10.0, "keys": 45.0, "bytes": 1500.0, "failed_keys": 6.0, "ok_bytes": 1200.0,
                     "bad_calls": 5.0},
        "save_put": {"calls": 7.0, "keys": 0.0, "bytes": 700.0, "failed_keys": 2.0, "ok_bytes": 700.0,
                     "bad_calls": 0.0},
    }
    assert sm.store_ops(snap("")) == {}


def test_a_series_without_operation_or_status_labels_is_unknown_and_never_ok():
    text = ("# TYPE vllm:mooncake_store_operation_total counter\nvllm:mooncake_store_operation_total 3.0\n"
            "# TYPE vllm:mooncake_store_operation_bytes_total counter\n"
            "vllm:mooncake_store_operation_bytes_total{operation=\"save_put\"} 8.0\n")
    ops = sm.store_ops(snap(text))
    assert ops["?"]["calls"] == 3.0 and ops["?"]["bad_calls"] == 3.0
    assert ops["save_put"]["bytes"] == 8.0 and ops["save_put"]["ok_bytes"] == 0.0


def test_ops_delta_is_after_minus_before_with_a_new_operation_from_zero():
    before = snap(OPS)
    after = snap(OPS.replace('operation="load_get",status="ok"} 4.0', 'operation="load_get",status="ok"} 6.0')
                 .replace('bytes_total{engine="0",operation="load_get",status="ok"} 1000.0',
                          'bytes_total{engine="0",operation="load_get",status="ok"} 1500.0')
                 + '# TYPE vllm:mooncake_store_operation_total counter\n'
                   'vllm:mooncake_store_operation_total{operation="exist",status="ok"} 1.0\n')
    d = sm.ops_delta(before, after)
    assert d["load_get"] == {"calls": 2.0, "keys": 0.0, "bytes": 500.0, "failed_keys": 0.0, "ok_bytes": 500.0,
                             "bad_calls": 0.0}
    assert d["save_put"] == dict.fromkeys(("calls", "keys", "bytes", "failed_keys", "ok_bytes", "bad_calls"), 0.0)
    assert d["exist"]["calls"] == 1.0 and d["exist"]["bytes"] == 0.0
    assert sm.ops_delta(after, snap("")) == {}


def test_op_reads_one_field_and_zero_when_absent():
    ops = {"load_get": {"calls": 3.0}}
    assert sm.op(ops, "load_get", "calls") == 3.0
    assert sm.op(ops, "load_get", "bytes") == 0.0
    assert sm.op(ops, "save_put", "calls") == 0.0


MASTER = """\
# TYPE master_batch_put_start_items counter
master_batch_put_start_items_total 5.0
# TYPE valid_get_nums_ counter
valid_get_nums__total 3.0
# TYPE total_get_nums_ gauge
total_get_nums_ 4.0
# TYPE master_evicted_key_count gauge
master_evicted_key_count 2.0
# TYPE master_key_count gauge
master_key_count{pool="a"} 6.0
master_key_count{pool="b"} 1.0
# TYPE master_total_capacity_bytes gauge
master_total_capacity_bytes 1024.0
"""


def test_master_values_read_either_spelling_summed_over_labels():
    v = sm.master_values(snap(MASTER))
    assert set(v) == set(sm.MASTER_COUNTERS) | set(sm.MASTER_GAUGES)
    assert (v["put_start_items"], v["valid_get_nums"], v["total_get_nums"], v["evicted_keys"]) == (5.0, 3.0, 4.0, 2.0)
    assert (v["key_count"], v["capacity_bytes"], v["allocated_bytes"], v["put_end_items"]) == (7.0, 1024.0, 0.0, 0.0)


def test_master_values_prefer_the_first_spelling():
    text = ("# TYPE master_evicted_key_count_total gauge\nmaster_evicted_key_count_total 8.0\n"
            "# TYPE master_evicted_key_count gauge\nmaster_evicted_key_count 2.0\n")
    assert sm.master_values(snap(text))["evicted_keys"] == 8.0


ENGINE = """\
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total 100.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total 40.0
# TYPE vllm:external_prefix_cache_queries_total counter
vllm:external_prefix_cache_queries_total 60.0
# TYPE vllm:external_prefix_cache_hits_total counter
vllm:external_prefix_cache_hits_total 32.0
# TYPE vllm:nixl_bytes_transferred histogram
vllm:nixl_bytes_transferred_sum 4096.0
vllm:nixl_bytes_transferred_count 1.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total 2.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total 9.0
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{source="local_compute"} 12.0
vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} 48.0
# TYPE vllm:prompt_tokens_cached_by_source_total counter
vllm:prompt_tokens_cached_by_source_total{source="external_unspecified"} 32.0
"""


def test_engine_values_name_each_counter_a_store_verdict_reads():
    assert sm.engine_values(snap(ENGINE)) == {
        "prefix_queries": 100.0, "prefix_hits": 40.0, "external_queries": 60.0, "external_hits": 32.0,
        "nixl_bytes": 4096.0, "preemptions": 2.0, "generation_tokens": 9.0,
        "prompt_local_compute": 12.0, "prompt_external_kv_transfer": 48.0, "cached_external_unspecified": 32.0}


def test_values_delta_per_key_with_a_missing_side_as_zero():
    assert sm.values_delta({"a": 1.0, "b": 5.0}, {"b": 7.0, "c": 2.0}) == {"a": -1.0, "b": 2.0, "c": 2.0}
    assert list(sm.values_delta({"z": 0.0, "a": 0.0}, {"m": 1.0})) == ["a", "m", "z"]


def gauges(running: float, waiting: float, done: float) -> m.MetricSnapshot:
    return snap(f"# TYPE {m.RUNNING} gauge\n{m.RUNNING} {running}\n# TYPE {m.WAITING} gauge\n{m.WAITING} {waiting}\n"
                f"# TYPE {m.REQUEST_SUCCESS} counter\n{m.REQUEST_SUCCESS} {done}\n")


def test_requeued_counts_the_smaller_of_fall_and_rise_with_nothing_finished():
    assert sm.requeued(gauges(3, 0, 5), gauges(1, 2, 5)) == 2
    assert sm.requeued(gauges(3, 0, 5), gauges(0, 1, 5)) == 1
    assert sm.requeued(gauges(3, 0, 5), gauges(2, 4, 5)) == 1
    assert sm.requeued(gauges(3, 0, 5), gauges(1, 2, 6)) == 0  # a request finished: not a requeue
    assert sm.requeued(gauges(1, 2, 5), gauges(3, 0, 5)) == 0
    assert sm.requeued(gauges(3, 2, 5), gauges(1, 2, 5)) == 0
    assert sm.requeued(gauges(3, 0, 5), gauges(3, 1, 5)) == 0


def obs(**kw) -> sm.StoreObservation:
    return sm.StoreObservation(kind="store-roundtrip", block_size=16, **kw)


def test_the_derived_facts_sum_p_and_d_per_operation():
    row = {"ok_bytes": 10.0, "failed_keys": 1.0, "bad_calls": 2.0}
    p_ops = {"save_put": {"ok_bytes": 100.0, "failed_keys": 3.0}, "load_get": dict(row)}
    d_ops = {"save_put": {"ok_bytes": 5.0, "failed_keys": 4.0}, "load_get": {"ok_bytes": 20.0, "failed_keys": 6.0,
                                                                              "bad_calls": 7.0}}
    o = obs(p_ops=p_ops, d_ops=d_ops)
    assert (o.bytes_put, o.bytes_got, o.d_bytes_got) == (105.0, 30.0, 20.0)
    assert (o.failed_load_keys, o.failed_load_calls, o.rejected_put_keys) == (7.0, 9.0, 7.0)
    assert (obs().bytes_put, obs().d_bytes_got, obs().failed_load_calls) == (0.0, 0.0, 0.0)


def test_ratios_are_none_when_nothing_was_asked():
    o = obs(d={"external_queries": 64.0, f"cached_{sm.STORE_SOURCE}": 48.0},
            master={"total_get_nums": 4.0, "valid_get_nums": 3.0})
    assert sm.STORE_SOURCE == "external_unspecified"
    assert (o.d_store_tokens, o.store_hit_ratio, o.master_get_ratio) == (48.0, 0.75, 0.75)
    o = obs(d={"external_queries": 0.0, f"cached_{sm.STORE_SOURCE}": 48.0}, master={"total_get_nums": 0.0})
    assert (o.store_hit_ratio, o.master_get_ratio) == (None, None)
    o = obs()
    assert (o.d_store_tokens, o.store_hit_ratio, o.master_get_ratio) == (0.0, None, None)
    assert obs(master={"total_get_nums": 2.0}).master_get_ratio == 0.0


@pytest.mark.parametrize("name", sorted(sm.STORE_OP_METRICS.values()))
def test_each_store_operation_metric_is_read(name):
    text = f'# TYPE {name} counter\n{name}{{operation="load_get",status="ok"}} 2.0\n'
    row = sm.store_ops(snap(text))["load_get"]
    field = next(f for f, n in sm.STORE_OP_METRICS.items() if n == name)
    assert row[field] == 2.0
    assert sum(v for k, v in row.items() if k not in (field, "ok_bytes")) == 0.0

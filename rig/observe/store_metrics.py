"""What the rig reads from a Mooncake store topology's ``/metrics``: the store
connector's per-operation counters on each vLLM instance, the engine counters a store verdict
reads, the master's own counters and gauges, and the :class:`StoreObservation` a store scenario
fills (rig.workload.store) and its judge reads (rig.judge.store_checks).

D loads only *full* blocks and never the block holding the last prompt token, so a prompt of
``n`` tokens can take at most ``floor((n-1)/bs) x bs`` tokens from the store (measured,
docs/explanation/mooncake.md; :func:`loadable_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rig.observe import metrics as m

# vLLM's store connector metrics (vllm/.../mooncake/store/metrics.py); labels operation, status
# (ok | partial_failure | error); a series exists only after its first operation.
STORE_OP_METRICS = {
    "calls": "vllm:mooncake_store_operation_total",
    "keys": "vllm:mooncake_store_operation_keys_total",
    "bytes": "vllm:mooncake_store_operation_bytes_total",
    "failed_keys": "vllm:mooncake_store_operation_failed_keys_total",
}
CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"
STORE_SOURCE = "external_unspecified"  # CacheHitSource of the store connector (NIXL is "p2p")

# mooncake_master's /metrics. Counters whose family name lacks "_total" (valid_get_nums_, ...)
# come out of prometheus_client's parser with "_total" appended: both spellings are tried.
MASTER_COUNTERS: dict[str, tuple[str, ...]] = {
    "put_start_items": ("master_batch_put_start_items_total",),
    "put_start_failed_items": ("master_batch_put_start_failed_items_total",),
    "put_end_items": ("master_batch_put_end_items_total",),
    "put_end_failed_items": ("master_batch_put_end_failed_items_total",),
    "put_start_alloc_failures": ("master_put_start_alloc_failures_total",),
    "get_replica_list_items": ("master_batch_get_replica_list_items_total",),
    "get_replica_list_failed_items": ("master_batch_get_replica_list_failed_items_total",),
    "exist_key_items": ("master_batch_exist_key_items_total",),
    "mem_cache_hit_bytes": ("mem_cache_hit_bytes_total",),
    "valid_get_nums": ("valid_get_nums__total", "valid_get_nums_"),
    "total_get_nums": ("total_get_nums__total", "total_get_nums_"),
    "evicted_keys": ("master_evicted_key_count_total", "master_evicted_key_count"),
    "evicted_bytes": ("master_evicted_size_bytes_total", "master_evicted_size_bytes"),
}
MASTER_GAUGES: dict[str, tuple[str, ...]] = {
    "key_count": ("master_key_count",),
    "allocated_bytes": ("master_allocated_bytes",),
    "capacity_bytes": ("master_total_capacity_bytes",),
    "active_clients": ("master_active_clients",),
}


def loadable_tokens(prompt_tokens: int, block_size: int) -> int:
    """Tokens D can take from the store for a prompt: the full blocks before the last token."""
    return max(0, (prompt_tokens - 1) // block_size) * block_size



# ------------------------------------------------------------------------------ metric reading


def store_ops(snap: m.MetricSnapshot) -> dict[str, dict[str, float]]:
    """``{operation: {calls, keys, bytes, failed_keys, ok_bytes, bad_calls}}`` of one snapshot.

    ``ok_bytes`` counts only ``status="ok"``; ``bad_calls`` the calls with another status
    (``partial_failure`` / ``error``). Summed over ``engine`` / ``model_name``.
    """
    out: dict[str, dict[str, float]] = {}
    for (name, labels), v in snap.samples.items():
        field_ = next((f for f, n in STORE_OP_METRICS.items() if n == name), None)
        if field_ is None:
            continue
        lab = dict(labels)
        op, ok = lab.get("operation", "?"), lab.get("status") == "ok"
        row = out.setdefault(op, {"calls": 0.0, "keys": 0.0, "bytes": 0.0, "failed_keys": 0.0,
                                  "ok_bytes": 0.0, "bad_calls": 0.0})
        row[field_] += v
        if field_ == "bytes" and ok:
            row["ok_bytes"] += v
        if field_ == "calls" and not ok:
            row["bad_calls"] += v
    return out


def ops_delta(before: m.MetricSnapshot, after: m.MetricSnapshot) -> dict[str, dict[str, float]]:
    """:func:`store_ops` of ``after`` minus ``before`` (an absent series counts as 0)."""
    a, b = store_ops(after), store_ops(before)
    out = {}
    for op, row in a.items():
        base = b.get(op, {})
        out[op] = {k: v - base.get(k, 0.0) for k, v in row.items()}
    return out




def op(ops: dict[str, dict[str, float]], operation: str, key: str) -> float:
    """``ops[op][key]`` of a :func:`store_ops` result, 0 when the operation or key is absent."""
    return ops.get(operation, {}).get(key, 0.0)


def _first(snap: m.MetricSnapshot, names: tuple[str, ...]) -> float:
    for n in names:
        if snap.has(n):
            return snap.value(n)
    return 0.0


def master_values(snap: m.MetricSnapshot) -> dict[str, float]:
    """The master's counters and gauges the rig reads (:data:`MASTER_COUNTERS`, ``MASTER_GAUGES``)."""
    return {k: _first(snap, names) for k, names in {**MASTER_COUNTERS, **MASTER_GAUGES}.items()}


def engine_values(snap: m.MetricSnapshot) -> dict[str, float]:
    """The vLLM counters a store verdict reads from one instance (flat dict, for deltas)."""
    out = {
        "prefix_queries": snap.value(m.PREFIX_QUERIES), "prefix_hits": snap.value(m.PREFIX_HITS),
        "external_queries": snap.value(m.EXT_PREFIX_QUERIES), "external_hits": snap.value(m.EXT_PREFIX_HITS),
        "nixl_bytes": snap.value(m.NIXL_BYTES_SUM), "preemptions": snap.value(m.PREEMPTIONS),
        "generation_tokens": snap.value(m.GENERATION_TOKENS),
    }
    for src, v in snap.by_label(m.PROMPT_TOKENS_BY_SOURCE, "source").items():
        out[f"prompt_{src}"] = v
    for src, v in snap.by_label(CACHED_BY_SOURCE, "source").items():
        out[f"cached_{src}"] = v
    return out




def values_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """``after - before`` per key of two flat value dicts (a key absent on one side counts as 0)."""
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(before) | set(after))}


def requeued(prev: m.MetricSnapshot, cur: m.MetricSnapshot) -> int:
    """Requests that went from running back to waiting between two samples of one instance:
    running fell and waiting rose while no request finished (a preemption seen from outside;
    vLLM counts ``num_preemptions_total`` only with the preempted request's next output)."""
    if cur.value(m.REQUEST_SUCCESS) != prev.value(m.REQUEST_SUCCESS):
        return 0
    fell = prev.value(m.RUNNING) - cur.value(m.RUNNING)
    rose = cur.value(m.WAITING) - prev.value(m.WAITING)
    return int(max(0.0, min(fell, rose)))



# ------------------------------------------------------------------------------- observation


@dataclass
class StoreObservation:
    """What a store scenario saw besides the requests (in ``ScenarioObservation.records``).

    Deltas over the scenario: ``p_ops`` / ``d_ops`` are :func:`store_ops` deltas per instance,
    ``p`` / ``d`` :func:`engine_values` deltas, ``master`` :func:`master_values` deltas (gauges:
    ``master_after``). ``per_request`` (store-roundtrip) and ``waves`` (prefix-wave-store) hold
    the same facts per request / per wave. Bytes and tokens are counts, times seconds.
    """

    kind: str
    block_size: int
    master_name: str = ""
    p_ops: dict[str, dict[str, float]] = field(default_factory=dict)
    d_ops: dict[str, dict[str, float]] = field(default_factory=dict)
    p: dict[str, float] = field(default_factory=dict)
    d: dict[str, float] = field(default_factory=dict)
    master: dict[str, float] = field(default_factory=dict)
    master_after: dict[str, float] = field(default_factory=dict)
    master_health: str = ""
    master_alive_end: bool = False
    routes: list[str] = field(default_factory=list)  # per record: "store" | "pd"
    expected_store_tokens: int | None = None  # store-roundtrip: sum of loadable_tokens
    keys_expected_in_master: int = 0  # put_end items the rig waited for before asking D
    put_waits: list[float] = field(default_factory=list)  # seconds until the master had them
    per_request: list[dict[str, Any]] = field(default_factory=list)
    waves: list[dict[str, Any]] = field(default_factory=list)
    requeues_seen: int = 0  # running -> waiting transitions seen in D's samples
    peak_running: float = 0.0
    peak_waiting: float = 0.0
    stall_diagnosis: str = ""
    notes: list[str] = field(default_factory=list)
    error: str = ""
    # prefix-wave-store rounds (bug record R14): one row per POST /reset_prefix_cache between rounds
    # (round, instance, HTTP status, success, attempts, seconds until success).
    resets: list[dict[str, Any]] = field(default_factory=list)

    # -- derived facts (what the report shows) ------------------------------------------------

    def _both(self, operation: str, key: str) -> float:
        """P's plus D's ``key`` of one store ``operation`` (:func:`op` of ``p_ops`` and ``d_ops``)."""
        return op(self.p_ops, operation, key) + op(self.d_ops, operation, key)

    @property
    def bytes_put(self) -> float:
        """Bytes written into the store with status ok (``save_put``, every instance)."""
        return self._both("save_put", "ok_bytes")

    @property
    def bytes_got(self) -> float:
        """Bytes loaded from the store with status ok (``load_get``, every instance)."""
        return self._both("load_get", "ok_bytes")

    @property
    def d_bytes_got(self) -> float:
        """Bytes D loaded from the store (status ok)."""
        return op(self.d_ops, "load_get", "ok_bytes")

    @property
    def failed_load_keys(self) -> float:
        """Keys whose GET failed (``load_get`` failed_keys, any status, every instance)."""
        return self._both("load_get", "failed_keys")

    @property
    def failed_load_calls(self) -> float:
        """``load_get`` calls with status partial_failure / error."""
        return self._both("load_get", "bad_calls")

    @property
    def rejected_put_keys(self) -> float:
        """Keys a ``save_put`` could not store (e.g. the pool is full); allowed, reported."""
        return self._both("save_put", "failed_keys")

    @property
    def d_store_tokens(self) -> float:
        """Prompt tokens D took from the store (``cached_by_source{external_unspecified}``)."""
        return self.d.get(f"cached_{STORE_SOURCE}", 0.0)

    @property
    def store_hit_ratio(self) -> float | None:
        """D's store tokens / the prompt tokens D asked its connectors about
        (``external_prefix_cache_queries``); None when D asked about none."""
        q = self.d.get("external_queries", 0.0)
        return self.d_store_tokens / q if q > 0 else None

    @property
    def master_get_ratio(self) -> float | None:
        """The master's ``valid_get_nums_ / total_get_nums_`` delta (None without GETs)."""
        t = self.master.get("total_get_nums", 0.0)
        return self.master.get("valid_get_nums", 0.0) / t if t > 0 else None


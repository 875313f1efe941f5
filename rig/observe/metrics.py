"""Observations from vLLM's Prometheus ``/metrics``: parsing, lookup, deltas.

Parsing uses ``prometheus_client.parser`` (the library that renders vLLM's metrics). Names are
the *sample* names as exposed by vLLM 0.32.0, counters ending in ``_total`` and histograms in
``_sum``/``_count`` (vllm/v1/metrics/loggers.py; docs/explanation/vllm-cpu-facts.md "Metrics the rig reads").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

# The names the rig reads, in one place.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
KV_USAGE = "vllm:kv_cache_usage_perc"  # a 0..1 fraction despite the name
KV_FETCH_BY_STAGE = "vllm:num_requests_kv_fetch_by_stage"
PREEMPTIONS = "vllm:num_preemptions_total"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
REQUEST_SUCCESS = "vllm:request_success_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
EXT_PREFIX_QUERIES = "vllm:external_prefix_cache_queries_total"
EXT_PREFIX_HITS = "vllm:external_prefix_cache_hits_total"
NIXL_BYTES_SUM = "vllm:nixl_bytes_transferred_sum"
NIXL_XFER_COUNT = "vllm:nixl_bytes_transferred_count"
NIXL_FAILED_TRANSFERS = "vllm:nixl_num_failed_transfers_total"
NIXL_FAILED_NOTIFS = "vllm:nixl_num_failed_notifications_total"
NIXL_EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
# A process's life: prometheus_client's process collector (vLLM's API server exposes it). Counters
# restart from 0 with a new process, so monotonicity is judged per (instance, this value).
PROCESS_START = "process_start_time_seconds"
# The sample suffixes of a counter (``_total``) and of a histogram or summary (``_count``,
# ``_sum``): values that may never decrease within one process's life (bug record R12).
MONOTONIC_SUFFIXES = ("_total", "_count", "_sum")

# What the checks read, per instance role, checked once per phase after warm-up (rig.run.runner).
# REQUIRED: without it a check cannot look at all -> the phase's scenarios are ERROR naming the
# metric and the vLLM version. A renamed gauge must not read 0: a missing kv_cache_usage_perc
# would make idle-after always idle.
#   waiting, running, KV usage: idle-after (observations.wait_idle) and the stall detector (stall.py);
#   NIXL bytes/transfers and prompt tokens by source: kv-pulled (observations.TransferEvidence);
#   generation/prompt tokens, finished requests, preemptions: the stall detector's "no counter moved".
REQUIRED_METRICS: dict[str, tuple[str, ...]] = {
    "prefill": (WAITING, RUNNING, KV_USAGE),
    "decode": (WAITING, RUNNING, KV_USAGE, GENERATION_TOKENS, PROMPT_TOKENS, REQUEST_SUCCESS, PREEMPTIONS,
               PROMPT_TOKENS_BY_SOURCE),
}
# Only where the decode pulls over NIXL (connector nixl or nixl+store; not the store-only mode).
REQUIRED_NIXL_METRICS: tuple[str, ...] = (NIXL_BYTES_SUM, NIXL_XFER_COUNT)
# DIAGNOSTIC: the stall diagnosis and known-issue signatures read them (why a request waits, its
# KV-fetch stage); absent ones are listed in ScenarioObservation.missing_metrics so a signature
# that needs them is "not checked", but the scenario still runs. vllm-cpu 0.30.0 has no
# num_requests_kv_fetch_by_stage (tests/data/vllm-0.30.0-decode-nospec-before-edge-126-nospec.prom).
# P's prefix-cache hits: prefix-hits is "not checked" when P lacks them (never "0 hits, as expected").
DIAGNOSTIC_METRICS: dict[str, tuple[str, ...]] = {
    "prefill": (PREFIX_HITS,),
    "decode": (WAITING_BY_REASON, KV_FETCH_BY_STAGE),
}


@dataclass(frozen=True)
class MetricSnapshot:
    """One scrape of one instance's ``/metrics``.

    ``t`` is ``time.monotonic()`` seconds at the scrape, ``wall`` the Unix time. ``samples``
    maps ``(sample_name, sorted label items)`` to the value.
    """

    instance: str
    t: float
    wall: float
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    text: str = ""
    # Sample names of counter / histogram / summary families that end in MONOTONIC_SUFFIXES (the
    # family's ``# TYPE``, so a gauge that happens to end in ``_total`` is not one of them).
    monotonic: frozenset[str] = frozenset()

    def value(self, name: str, default: float = 0.0, **labels: str) -> float:
        """Sum of the samples called ``name`` whose labels include ``labels``.

        Summing over the other labels (``engine``, ``model_name``) gives the instance total.
        Returns ``default`` when no sample matches (a metric this vLLM version does not expose).
        """
        total, found = 0.0, False
        want = set(labels.items())
        for (n, lab), v in self.samples.items():
            if n == name and want <= set(lab):
                total += v
                found = True
        return total if found else default

    def get(self, name: str, **labels: str) -> float | None:
        """Like :meth:`value`, but None when no sample matches: for a metric whose absence must
        not read as 0 (gauges compared to a baseline, counters that prove work happened)."""
        want = set(labels.items())
        found = [v for (n, lab), v in self.samples.items() if n == name and want <= set(lab)]
        return sum(found) if found else None

    def has(self, name: str) -> bool:
        """True if any sample called ``name`` is present."""
        return any(n == name for n, _ in self.samples)

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """``{label value: summed value}`` for metric ``name`` split by ``label``."""
        out: dict[str, float] = {}
        for (n, lab), v in self.samples.items():
            if n == name:
                key = dict(lab).get(label)
                if key is not None:
                    out[key] = out.get(key, 0.0) + v
        return out


def parse_metrics(text: str, instance: str = "", t: float | None = None) -> MetricSnapshot:
    """Parse Prometheus text exposition into a :class:`MetricSnapshot`.

    Raises ValueError (from prometheus_client) on text that is not the exposition format.
    """
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    monotonic: set[str] = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
            if family.type in ("counter", "histogram", "summary") and s.name.endswith(MONOTONIC_SUFFIXES):
                monotonic.add(s.name)
    return MetricSnapshot(instance=instance, t=time.monotonic() if t is None else t,
                          wall=time.time(), samples=samples, text=text, monotonic=frozenset(monotonic))


def counter_values(s: MetricSnapshot) -> dict[str, float]:
    """Every monotonic sample of ``s`` (``s.monotonic``: counters' ``_total``, histograms' and
    summaries' ``_count`` / ``_sum``) as ``{'name{label="v",...}': value}``, labels sorted."""
    return {n + ("{" + ",".join(f'{k}="{v}"' for k, v in lab) + "}" if lab else ""): v
            for (n, lab), v in s.samples.items() if n in s.monotonic}


async def scrape(client: httpx.AsyncClient, base_url: str, instance: str, timeout_s: float = 5.0) -> MetricSnapshot:
    """GET ``base_url/metrics`` and parse it.

    Raises httpx.HTTPError on connection problems or a non-200 answer.
    """
    r = await client.get(f"{base_url}/metrics", timeout=timeout_s)
    r.raise_for_status()
    return parse_metrics(r.text, instance)


def delta(before: MetricSnapshot, after: MetricSnapshot, name: str, **labels: str) -> float:
    """``after - before`` of a counter (or any sample) ``name`` with ``labels``; a series absent
    from one snapshot counts as 0 there (vLLM creates a labelled series at its first use). That a
    metric is exposed at all is :func:`missing_metrics`' to tell (:data:`REQUIRED_METRICS`): a
    delta of a metric the instance lacks reads 0, so a check reading it must first know it is
    present."""
    return (after.get(name, **labels) or 0.0) - (before.get(name, **labels) or 0.0)


def idle_state(s: MetricSnapshot) -> dict[str, float | None]:
    """The gauges that must return to their baseline after work: waiting, running, KV usage;
    None for a gauge the instance does not expose (never 0: that would read as idle)."""
    return {"waiting": s.get(WAITING), "running": s.get(RUNNING), "kv_usage": s.get(KV_USAGE)}


def required_metrics(role: str, nixl: bool) -> tuple[str, ...]:
    """The metrics that must be present on an instance of ``role`` ("prefill" | "decode"); with
    ``nixl`` (the decode pulls over NIXL) also :data:`REQUIRED_NIXL_METRICS` on a decode."""
    extra = REQUIRED_NIXL_METRICS if nixl and role == "decode" else ()
    return REQUIRED_METRICS.get(role, ()) + extra


def missing_metrics(s: MetricSnapshot, names: tuple[str, ...]) -> list[str]:
    """The names in ``names`` with no sample in ``s``, in order."""
    present = {n for n, _ in s.samples}
    return [n for n in names if n not in present]

"""Observations from vLLM's Prometheus ``/metrics``: parsing, lookup, deltas.

Parsing uses ``prometheus_client.parser`` (the library that renders vLLM's metrics). Names are
the *sample* names as exposed by vLLM 0.32.0, counters ending in ``_total`` and histograms in
``_sum``/``_count`` (vllm/v1/metrics/loggers.py; docs/vllm-cpu-facts.md "Metrics the rig reads").
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
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return MetricSnapshot(instance=instance, t=time.monotonic() if t is None else t,
                          wall=time.time(), samples=samples, text=text)


async def scrape(client: httpx.AsyncClient, base_url: str, instance: str, timeout_s: float = 5.0) -> MetricSnapshot:
    """GET ``base_url/metrics`` and parse it.

    Raises httpx.HTTPError on connection problems or a non-200 answer.
    """
    r = await client.get(f"{base_url}/metrics", timeout=timeout_s)
    r.raise_for_status()
    return parse_metrics(r.text, instance)


def delta(before: MetricSnapshot, after: MetricSnapshot, name: str, **labels: str) -> float:
    """``after - before`` of a counter (or any sample) ``name`` with ``labels``."""
    return after.value(name, **labels) - before.value(name, **labels)


def idle_state(s: MetricSnapshot) -> dict[str, float]:
    """The gauges that must return to their baseline after work: waiting, running, KV usage."""
    return {"waiting": s.value(WAITING), "running": s.value(RUNNING), "kv_usage": s.value(KV_USAGE)}

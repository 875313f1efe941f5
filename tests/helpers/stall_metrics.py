"""The recorded 0.32.0 livelock /metrics template (tests/data) and snapshots of it: the frozen and
idle states the stall detector, the evidence and the early verdict are tested on."""

from __future__ import annotations

from pathlib import Path

from rig.observe.metrics import parse_metrics

DATA = Path(__file__).resolve().parents[1] / "data"

TEMPLATE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="tiny"}} {waiting}
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{{engine="0",model_name="tiny",reason="capacity"}} {capacity}
vllm:num_requests_waiting_by_reason{{engine="0",model_name="tiny",reason="deferred"}} {deferred}
# HELP vllm:num_requests_kv_fetch_by_stage Number of waiting requests by async KV load stage.
# TYPE vllm:num_requests_kv_fetch_by_stage gauge
vllm:num_requests_kv_fetch_by_stage{{engine="0",model_name="tiny",stage="waiting_to_start"}} {wts}
vllm:num_requests_kv_fetch_by_stage{{engine="0",model_name="tiny",stage="in_progress"}} {inprog}
vllm:num_requests_kv_fetch_by_stage{{engine="0",model_name="tiny",stage="completed_waiting"}} {cw}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {kv}
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="tiny"}} {preempt}
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="tiny"}} {prompt}
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="tiny"}} {gen}
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="length",model_name="tiny"}} {success}
# HELP vllm:nixl_bytes_transferred Histogram of bytes transferred per NIXL KV Cache transfers.
# TYPE vllm:nixl_bytes_transferred histogram
vllm:nixl_bytes_transferred_count{{engine="0",model_name="tiny"}} {xfers}
vllm:nixl_bytes_transferred_sum{{engine="0",model_name="tiny"}} {xfer_bytes}
"""

# D stuck in the 0.32.0 admission livelock (as measured: docs/explanation/vllm-cpu-facts.md, tests/data/*stalled*).
LIVELOCK = dict(running=0, waiting=1, capacity=1, deferred=0, wts=1, inprog=0, cw=0, kv=0.0, preempt=0,
                prompt=8, gen=2, success=1, xfers=0, xfer_bytes=0)

IDLE = {**LIVELOCK, "waiting": 0, "capacity": 0, "wts": 0}


def snap(t: float, instance: str = "decode", **values):
    return parse_metrics(TEMPLATE.format(**{**LIVELOCK, **values}), instance, t=t)


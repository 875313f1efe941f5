"""P, D and the Mooncake master as one in-process state machine behind an httpx transport, for the
store wave's tests (no servers), and the fixture that makes the store wave settle in 10 ms."""

from __future__ import annotations

import json

import httpx
import pytest

from rig.workload import store_requests as sr

BS = 32

KEY_BYTES = 32768

LABELS = 'engine="0",model_name="tiny"'


class World:
    """P, D and the master as one in-process state machine behind an httpx transport."""

    def __init__(self, *, d_warm: bool = False, fail_get_every: int = 0, preempt: int = 0,
                 master_health: int = 200, corrupt_d: bool = False):
        self.store: set[tuple] = set()
        self.d_cache: set[tuple] = set()
        self.d_warm = d_warm  # D's prefix cache already holds every prompt (a broken setup)
        self.fail_get_every = fail_get_every
        self.preempt = preempt
        self.master_health = master_health
        self.corrupt_d = corrupt_d
        self.gets = 0
        self.ops = {"p": {}, "d": {}}  # (op, status) -> [calls, keys, bytes, failed]
        self.eng = {"p": {}, "d": {}}
        self.master = {"put_start": 0, "put_end": 0, "get_items": 0, "hit_bytes": 0}
        self.requests: list[tuple[str, int, bool]] = []  # (instance, prompt len, with params)

    # -- bookkeeping ----------------------------------------------------------------------------
    def op(self, inst: str, op: str, keys: int, nbytes: int = 0, failed: int = 0) -> None:
        status = "ok" if not failed else "partial_failure"
        row = self.ops[inst].setdefault((op, status), [0, 0, 0, 0])
        for i, v in enumerate((1, keys, nbytes, failed)):
            row[i] += v

    def inc(self, inst: str, key: str, v: float) -> None:
        self.eng[inst][key] = self.eng[inst].get(key, 0) + v

    @staticmethod
    def blocks(prompt: list[int], n: int) -> list[tuple]:
        return [tuple(prompt[: (i + 1) * BS]) for i in range(n)]

    @staticmethod
    def answer(prompt: list[int], max_tokens: int) -> list[int]:
        return [(sum(prompt) + 7 * j) % 997 + 3 for j in range(max_tokens)]

    # -- HTTP ----------------------------------------------------------------------------------
    def completion(self, inst: str, body: dict) -> httpx.Response:
        prompt, mt = body["prompt"], body["max_tokens"]
        params = body.get("kv_transfer_params")
        self.requests.append((inst, len(prompt), params is not None))
        n = len(prompt)
        self.inc(inst, "queries", n)
        if inst == "p":
            full = self.blocks(prompt, n // BS)
            self.op("p", "lookup_exists", len(full))
            new = [b for b in full if b not in self.store]
            self.op("p", "save_exists", len(full))
            if new:
                self.op("p", "save_put", len(new), len(new) * KEY_BYTES)
                self.master["put_start"] += len(new)
                self.master["put_end"] += len(new)
                self.store.update(new)
            self.inc("p", "local_compute", n)
            out: dict = {"choices": [{"token_ids": self.answer(prompt, mt), "text": "x", "finish_reason": "length"}],
                         "usage": {"prompt_tokens": n, "completion_tokens": mt, "total_tokens": n + mt}}
            if params and params.get("do_remote_decode"):
                out["kv_transfer_params"] = {"do_remote_prefill": True, "remote_block_ids": [[1]],
                                             "remote_engine_id": "p", "remote_host": "127.0.0.1",
                                             "remote_port": 1}
            return httpx.Response(200, json=out)
        # D
        loadable = self.blocks(prompt, (n - 1) // BS)
        self.op("d", "lookup_exists", n // BS)
        if params:
            self.inc("d", "nixl_bytes", n * 1024)
            self.inc("d", "cached_p2p", n)
            self.inc("d", "ext_hits", n)
            self.inc("d", "external_kv_transfer", n)
        else:
            local = 0
            for b in loadable:
                if b in self.d_cache or self.d_warm:
                    local += 1
                else:
                    break
            from_store = 0
            for b in loadable[local:]:
                if b in self.store:
                    from_store += 1
                else:
                    break
            self.inc("d", "prefix_hits", local * BS)
            if from_store:
                self.gets += 1
                failed = 1 if self.fail_get_every and self.gets % self.fail_get_every == 0 else 0
                self.op("d", "load_get", from_store, from_store * KEY_BYTES, failed)
                self.master["get_items"] += from_store
                self.master["hit_bytes"] += from_store * KEY_BYTES
                self.inc("d", "cached_external_unspecified", from_store * BS)
                self.inc("d", "ext_hits", from_store * BS)
                self.inc("d", "external_kv_transfer", from_store * BS)
            self.inc("d", "local_compute", n - (local + from_store) * BS)
        self.d_cache.update(self.blocks(prompt, n // BS))
        if self.preempt and mt > 1:
            self.inc("d", "preemptions", self.preempt)
        tokens = self.answer(prompt, mt)
        if self.corrupt_d:
            tokens = [t + 1 for t in tokens]
        return httpx.Response(200, json={"choices": [{"token_ids": tokens, "text": "x", "finish_reason": "length"}],
                                         "usage": {"prompt_tokens": n, "completion_tokens": mt,
                                                   "total_tokens": n + mt}})

    def vllm_metrics(self, inst: str) -> str:
        e = self.eng[inst]
        lines = [
            f"vllm:num_requests_running{{{LABELS}}} 0", f"vllm:num_requests_waiting{{{LABELS}}} 0",
            f"vllm:kv_cache_usage_perc{{{LABELS}}} 0",
            f"vllm:prefix_cache_queries_total{{{LABELS}}} {e.get('queries', 0)}",
            f"vllm:prefix_cache_hits_total{{{LABELS}}} {e.get('prefix_hits', 0)}",
            f"vllm:external_prefix_cache_queries_total{{{LABELS}}} {e.get('queries', 0)}",
            f"vllm:external_prefix_cache_hits_total{{{LABELS}}} {e.get('ext_hits', 0)}",
            f"vllm:nixl_bytes_transferred_sum{{{LABELS}}} {e.get('nixl_bytes', 0)}",
            f"vllm:num_preemptions_total{{{LABELS}}} {e.get('preemptions', 0)}",
        ]
        for src in ("local_compute", "external_kv_transfer"):
            lines.append(f'vllm:prompt_tokens_by_source_total{{{LABELS},source="{src}"}} {e.get(src, 0)}')
        for src in ("p2p", "external_unspecified"):
            cached = e.get("cached_" + src, 0)
            lines.append(f'vllm:prompt_tokens_cached_by_source_total{{{LABELS},source="{src}"}} {cached}')
        for (op, status), (calls, keys, nbytes, failed) in self.ops[inst].items():
            lab = f'{LABELS},operation="{op}",status="{status}"'
            lines += [f"vllm:mooncake_store_operation_total{{{lab}}} {calls}",
                      f"vllm:mooncake_store_operation_keys_total{{{lab}}} {keys}",
                      f"vllm:mooncake_store_operation_bytes_total{{{lab}}} {nbytes}",
                      f"vllm:mooncake_store_operation_failed_keys_total{{{lab}}} {failed}"]
        return "\n".join(lines) + "\n"

    def master_metrics(self) -> str:
        ms = self.master
        return MASTER_TEXT.format(keys=len(self.store), alloc=len(self.store) * KEY_BYTES,
                                  put_start=ms["put_start"], put_end=ms["put_end"],
                                  get_items=ms["get_items"], hit=ms["hit_bytes"],
                                  valid=ms["get_items"], total=ms["get_items"])

    def handler(self, req: httpx.Request) -> httpx.Response:
        host = req.url.host.split(".")[0]
        if req.url.path == "/metrics":
            return httpx.Response(200, text=self.master_metrics() if host == "m" else self.vllm_metrics(host))
        if req.url.path == "/health":
            return httpx.Response(self.master_health, text='{"status":"ok","role":"leader"}')
        if req.url.path == "/v1/completions":
            return self.completion(host, json.loads(req.content))
        return httpx.Response(404)


# The master's exposition as 0.3.13.post1 writes it (TYPE lines included: counter families whose
# name lacks _total come out of the parser with _total appended).
MASTER_TEXT = """# TYPE master_key_count gauge
master_key_count {keys}
# TYPE master_allocated_bytes gauge
master_allocated_bytes {alloc}
# TYPE master_total_capacity_bytes gauge
master_total_capacity_bytes 134217728
# TYPE master_active_clients gauge
master_active_clients 2
# TYPE master_batch_put_start_items_total counter
master_batch_put_start_items_total {put_start}
# TYPE master_batch_put_end_items_total counter
master_batch_put_end_items_total {put_end}
# TYPE master_batch_get_replica_list_items_total counter
master_batch_get_replica_list_items_total {get_items}
# TYPE mem_cache_hit_bytes_total counter
mem_cache_hit_bytes_total {hit}
# TYPE valid_get_nums_ counter
valid_get_nums_ {valid}
# TYPE total_get_nums_ counter
total_get_nums_ {total}
# TYPE master_evicted_key_count counter
master_evicted_key_count 0
"""


@pytest.fixture(autouse=True)
def fast_settle(monkeypatch):
    monkeypatch.setattr(sr, "SETTLE_INTERVAL_S", 0.01)


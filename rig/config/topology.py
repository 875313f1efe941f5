"""The whole rig config (:class:`RigConfig`): the topology of prefill and decode instances with
their settings and scenarios, and every rule that needs more than one section: unique names
and ports, the device's limits, scenarios that name instances, lease-dependent known issues,
and the Mooncake checks (ports, store kinds on store connectors). The per-instance rules
(NIXL side-channel port, store-client ports) are methods here, so the validation, the plan and
the port reservations use the same ones.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rig.config.base import NAME_PATTERN, ConnectorMode, StrictModel
from rig.config.deployment import AttachConfig, KubernetesConfig, PortsConfig
from rig.config.instances import InstanceConfig, LaunchConfig, MooncakeConfig, NixlConfig
from rig.config.model import ModelConfig
from rig.config.scenario_rules import check_scenario_lengths, check_scenario_refs, check_stale_kv
from rig.config.scenarios import STORE_KINDS, ScenarioConfig, find_source
from rig.config.sequence import Step
from rig.config.timeouts import TimeoutsConfig
from rig.connectors.kv_transfer import MODE_CHILDREN, MOONCAKE_P2P_CPU_REFUSAL, STORE_MODES
from rig.connectors.mooncake import CLIENT_PORT_OFFSET, CLIENT_PORT_STRIDE, client_port_ranges


class RigConfig(StrictModel):
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

    def kv_bytes_per_block(self, name: str) -> int | None:
        """Bytes of one KV block of instance ``name`` as NIXL moves it: K and V of every layer,
        ``2 x num_hidden_layers x num_key_value_heads x head_dim x dtype bytes x block_size``
        (the tiny model's recipe; 32,768 B at the defaults, float32 and block size 32). None
        where the rig does not know the geometry: a model that is not the rig's tiny one,
        ``dtype: auto``, a ``--kv-cache-dtype`` argument, or a speculative method with a draft
        model (its KV layers move too). Raises KeyError for a name that is not an instance."""
        inst = self.instance(name)
        size = {"float32": 4, "bfloat16": 2, "float16": 2}.get(self.dtype)
        args = [*self.launch.extra_args, *inst.extra_args]
        if (self.model.source != "tiny" or size is None or any(a.startswith("--kv-cache-dtype") for a in args)
                or (inst.speculative is not None and inst.speculative.model is not None)):
            return None
        r, block = self.model.tiny, inst.block_size or self.block_size
        return 2 * r.num_hidden_layers * r.num_key_value_heads * r.head_dim * size * block

    def index_of(self, name: str) -> int:
        """Position of instance ``name`` in :meth:`instances` (prefill first, 0-based): the
        per-instance port rules (NIXL side channel, Mooncake lookup and store-client ports) count
        from it. Raises KeyError for a name that is not an instance."""
        for index, (_, inst) in enumerate(self.instances()):
            if inst.name == name:
                return index
        raise KeyError(name)

    def side_channel_port(self, inst: InstanceConfig) -> int:
        """The NIXL side-channel port of ``inst`` (``VLLM_NIXL_SIDE_CHANNEL_PORT``): its own
        ``side_channel_port``, else ``nixl.side_channel_base_port`` + its :meth:`index_of`.
        The one rule the validation, the plan and the port reservations use."""
        if inst.side_channel_port is not None:
            return inst.side_channel_port
        return self.nixl.side_channel_base_port + self.index_of(inst.name)

    def connector_of(self, inst: InstanceConfig) -> str:
        """The connector mode of ``inst`` (one of rig.connectors.kv_transfer.MODES): its own
        ``connector``, else the config's top-level ``connector``."""
        return inst.connector or self.connector

    def layout(self) -> str:
        """The process layout the servers start in: ``launch.layout``, else ``fast`` on device cpu
        and ``production`` (vLLM's own) on cuda (rig/plan/processes.py LAYOUT_ENV)."""
        return self.launch.layout or ("fast" if self.device == "cpu" else "production")

    def max_model_len_of(self, inst: InstanceConfig | str) -> int:
        """The ``--max-model-len`` of ``inst`` (an instance or its name) in tokens: its own
        ``max_model_len``, else the top-level one. Raises KeyError for an unknown name."""
        i = self.instance(inst) if isinstance(inst, str) else inst
        return i.max_model_len or self.max_model_len

    def lease_s_of(self, name: str) -> float:
        """The NIXL lease (s) instance ``name`` applies as a prefill: its own
        ``kv_connector_extra_config.nixl.kv_lease_duration``, else ``nixl.lease_s``. Raises KeyError
        for an unknown instance."""
        extra = self.instance(name).kv_connector_extra_config
        own = extra.nixl.get("kv_lease_duration") if extra is not None else None
        return float(own) if own is not None else self.nixl.lease_s

    def uses_store(self) -> bool:
        """True when any instance runs a Mooncake store mode (the topology then has a master)."""
        return any(self.connector_of(i) in STORE_MODES for _, i in self.instances())

    def store_client_ports(self, name: str) -> tuple[tuple[int, int], tuple[int, int]]:
        """``(rpc_range, segment_range)`` of instance ``name``'s Mooncake store client, inclusive
        TCP port ranges (rig.connectors.mooncake.client_port_ranges from ``mooncake.rpc_port``).
        Raises KeyError for an unknown instance."""
        return client_port_ranges(self.mooncake.rpc_port, self.index_of(name))

    def mooncake_ports(self) -> dict[str, int]:
        """Every TCP port the Mooncake side of this config uses, ``{label: port}`` (empty without a
        store mode): the master's three and each store instance's client ranges (label e.g.
        ``"decode's store client (MC_MIN_RPC_PORT..MC_MAX_RPC_PORT 8518-8521)"``)."""
        if not self.uses_store():
            return {}
        mc = self.mooncake
        out = {"mooncake.rpc_port": mc.rpc_port, "mooncake.http_metadata_port": mc.http_metadata_port,
               "mooncake.metrics_port": mc.metrics_port}
        for _, inst in self.instances():
            if self.connector_of(inst) not in STORE_MODES:
                continue
            rpc, seg = self.store_client_ports(inst.name)
            for (lo, hi), what in ((rpc, "MC_MIN_RPC_PORT..MC_MAX_RPC_PORT"),
                                   (seg, "MC_STORE_CLIENT_MIN_PORT..MC_STORE_CLIENT_MAX_PORT")):
                for port in range(lo, hi + 1):
                    out[f"{inst.name}'s store client port {port} ({what} {lo}-{hi})"] = port
        return out

    def _mooncake_problems(self) -> list[str]:
        """What makes this config unusable for Mooncake, one message per problem (empty = fine).

        Checked at config time (the ``_mooncake`` validator): ``mooncake-p2p`` on a CPU
        device (:data:`MOONCAKE_P2P_CPU_REFUSAL`); Mooncake ports that collide with each other or
        with an instance's HTTP / NIXL side-channel port, or fall outside 1..65535; store scenarios
        (``store-roundtrip``, ``prefix-wave-store``, ``long-generation``) whose prefill or decode
        does not run a store mode (there would be no store traffic to judge); a ``store:`` section on
        another kind; a ``store-roundtrip`` prompt without one full block before its last token (D
        loads only full blocks and always computes the block holding the last prompt token).
        """
        problems: list[str] = []
        if self.device == "cpu":
            where = (["connector"] if self.connector == "mooncake-p2p" and
                     any(i.connector is None for _, i in self.instances()) else [])
            where += [f"{i.name}.connector" for _, i in self.instances() if i.connector == "mooncake-p2p"]
            if where:
                problems.append(f"{', '.join(where)}: {MOONCAKE_P2P_CPU_REFUSAL}")
        if self.uses_store():
            taken: dict[int, str] = {}
            for _, inst in self.instances():
                taken[inst.port] = f"{inst.name}.port"
                taken.setdefault(self.side_channel_port(inst), f"{inst.name}.side_channel_port")
            reported: set[str] = set()
            for label, port in self.mooncake_ports().items():
                group = label.split(" (", 1)[-1]  # one message per client range
                if not 1 <= port <= 65535:
                    if group not in reported:
                        reported.add(group)
                        problems.append(f"{label}: outside 1..65535; lower mooncake.rpc_port")
                elif port in taken:
                    if group not in reported:
                        reported.add(group)
                        problems.append(
                            f"{label} collides with {taken[port]} ({port}); change mooncake ports (store "
                            f"clients use mooncake.rpc_port+{CLIENT_PORT_OFFSET} onwards, "
                            f"{CLIENT_PORT_STRIDE} ports per instance) or the other port")
                else:
                    taken[port] = label
        for sc in self.scenarios:
            if sc.kind not in STORE_KINDS:
                if getattr(sc, "store", None) is not None:
                    problems.append(f"scenario {sc.name}: store: is only for kinds {', '.join(STORE_KINDS)}")
                continue
            plain = []
            for role, ref, pool in (("prefill", sc.prefill, self.prefill), ("decode", sc.decode, self.decode)):
                chosen = next((i for i in pool if i.name == ref), pool[0] if ref is None else None)
                if chosen is not None and self.connector_of(chosen) not in STORE_MODES:
                    plain.append(f"{role} {chosen.name} ({self.connector_of(chosen)})")
            st = getattr(sc, "store", None)
            if st is not None and st.reset_prefix_cache:
                # vLLM serves POST /reset_prefix_cache only in dev mode (0.32.0:
                # vllm/entrypoints/launchers/api_server/routers.py, envs.VLLM_SERVER_DEV_MODE).
                for role, ref, pool in (("prefill", sc.prefill, self.prefill), ("decode", sc.decode, self.decode)):
                    chosen = next((i for i in pool if i.name == ref), pool[0] if ref is None else None)
                    if chosen is not None and {**self.launch.env, **chosen.env}.get("VLLM_SERVER_DEV_MODE") != "1":
                        problems.append(
                            f"scenario {sc.name}: store.reset_prefix_cache needs VLLM_SERVER_DEV_MODE=1 in {role} "
                            f"{chosen.name}'s env (vLLM serves /reset_prefix_cache only in dev mode); add it to "
                            f"launch.env or to {chosen.name}'s env, or drop reset_prefix_cache")
            if plain:
                problems.append(f"scenario {sc.name} (kind {sc.kind}) needs a store connector "
                                f"({' or '.join(STORE_MODES)}) on prefill and decode; not on {', '.join(plain)}")
            if sc.kind == "store-roundtrip" and sc.prompt_tokens <= self.block_size:
                problems.append(
                    f"scenario {sc.name}: prompt_tokens {sc.prompt_tokens} must exceed block_size "
                    f"{self.block_size}: D loads only full blocks before the last prompt token "
                    f"(floor((n-1)/{self.block_size}) x {self.block_size} tokens)")
            st = getattr(sc, "store", None)
            if sc.kind == "prefix-wave-store" and (st.prefix_tokens if st else 96) >= sc.prompt_tokens:
                problems.append(f"scenario {sc.name}: store.prefix_tokens {st.prefix_tokens if st else 96} must be "
                                f"below prompt_tokens {sc.prompt_tokens} (each prompt = shared prefix + unique suffix)")
        return problems

    @model_validator(mode="after")
    def _unique_names(self) -> RigConfig:
        """Instance names are unique (every per-instance rule counts from :meth:`index_of`)."""
        names = [i.name for _, i in self.instances()]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"instance names must be unique; repeated: {sorted(dup)}")
        return self

    @model_validator(mode="after")
    def _mooncake(self) -> RigConfig:  # the only Mooncake validator
        """Refuse at config time what cannot work with Mooncake (:meth:`_mooncake_problems`):
        mooncake-p2p on cpu, colliding Mooncake ports, store scenarios on a non-store topology."""
        problems = self._mooncake_problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _prompt_sources(self) -> RigConfig:
        """Every ``same_as`` / ``head_of`` names a request with one prompt of a fitting length, whose
        prompt is rebuilt from its seed (not a step with ``prefix_of``, ``repeat_of`` or ``transform``),
        and the names form no cycle (rig/workload/prompts.py follows them)."""
        holders: list[tuple[ScenarioConfig, Step | None]] = []
        for sc in self.scenarios:
            holders.append((sc, None))
            holders += [(sc, st) for st in (sc.sequence.steps if sc.sequence else [])]
        for sc, st in holders:
            holder = st if st is not None else sc
            ref = holder.same_as or holder.head_of
            if ref is None:
                continue
            field = "same_as" if holder.same_as else "head_of"
            where = f"{sc.name}" + (f".sequence.steps[{st.id}]" if st is not None else "") + f".{field}"
            seen = [f"{sc.name}/{st.id}" if st else sc.name]
            cur_sc, cur_st = sc, st
            cur_ref: str | None = ref
            while cur_ref is not None:
                try:
                    cur_sc, cur_st = find_source(self.scenarios, cur_sc, cur_ref)
                except KeyError as e:
                    raise ValueError(f"{where} {ref!r}: {e.args[0]}; name <step>, <scenario>/<step> or an edge "
                                     "or fault <scenario>") from None
                key = f"{cur_sc.name}/{cur_st.id}" if cur_st else cur_sc.name
                if key in seen:
                    raise ValueError(f"{where} {ref!r}: the names form a cycle ({' -> '.join(seen + [key])}); "
                                     "let one of them draw its own prompt")
                seen.append(key)
                built = [f for f in ("prefix_of", "repeat_of", "transform") if cur_st is not None and
                         getattr(cur_st, f) is not None]
                if built:
                    raise ValueError(f"{where} {ref!r}: {key} has {built[0]} (its prompt is built from another "
                                     "step's prompt or P's answer while the run goes, not from its seed); name a "
                                     "request whose prompt is its own")
                src = cur_st if cur_st is not None else cur_sc
                cur_ref = src.same_as or src.head_of
                if cur_st is None and cur_sc.request is not None and cur_sc.request.prompts > 1 or \
                        cur_st is not None and cur_st.prompts > 1:
                    raise ValueError(f"{where} {ref!r}: {key} sends several prompts per request; name a request "
                                     "with one prompt")
            src_sc, src_st = find_source(self.scenarios, sc, ref)
            length = (src_st or src_sc).prompt_tokens
            if holder.same_as and holder.prompt_tokens != length:
                raise ValueError(f"{where} {ref!r}: that prompt has {length} tokens, prompt_tokens is "
                                 f"{holder.prompt_tokens}; set prompt_tokens: {length}, or use head_of")
            if holder.head_of and holder.prompt_tokens > length:
                raise ValueError(f"{where} {ref!r}: prompt_tokens {holder.prompt_tokens} is longer than that "
                                 f"prompt ({length} tokens); give at most {length}")
        return self

    @model_validator(mode="after")
    def _extra_config_children(self) -> RigConfig:
        """An instance's ``kv_connector_extra_config`` names only children its connector runs."""
        for _, inst in self.instances():
            extra = inst.kv_connector_extra_config
            if extra is None:
                continue
            mode = self.connector_of(inst)
            runs = MODE_CHILDREN[mode]
            for child in ("nixl", "store"):
                if getattr(extra, child) and child not in runs:
                    raise ValueError(
                        f"{inst.name}.kv_connector_extra_config.{child}: connector {mode!r} has no {child} child "
                        f"(it runs {', '.join(runs) or 'no configurable child'}); remove it or set {inst.name}."
                        f"connector to {'nixl+store' if mode != 'nixl+store' else mode!r}")
        return self

    @model_validator(mode="after")
    def _attach_names(self) -> RigConfig:
        names = [i.name for _, i in self.instances()]
        for section in ("endpoints", "logs"):
            unknown = sorted(set(getattr(self.attach, section)) - set(names))
            if unknown:
                raise ValueError(f"attach.{section} names {unknown}, which are not instances; "
                                 f"choose from {names}")
        return self

    @model_validator(mode="after")
    def _waits(self) -> RigConfig:
        """A stall must be visible before the request's deadline: otherwise every stalled request ends
        as a bare timeout without the stall diagnosis (rig.observe.stall watches for
        ``stall_window_s`` of frozen metrics inside ``request_s``)."""
        t = self.timeouts
        if t.stall_window_s >= t.request_s:
            raise ValueError(
                f"timeouts.stall_window_s {t.stall_window_s:g} must be below timeouts.request_s {t.request_s:g}: "
                "a stalled request would reach its deadline before the stall could be seen (a timeout without "
                "a diagnosis); lower stall_window_s or raise request_s")
        return self

    def wait_warnings(self) -> list[str]:
        """Waits that are legal but likely to give a false FAIL, one sentence each (printed when a run
        starts). ``timeouts.drain_s`` below the NIXL lease: prefill keeps the blocks of a request whose
        decode hop never pulled (cancelled, abandoned) until ``kv_lease_duration`` expires
        (vllm/distributed/kv_transfer/kv_connector/v1/nixl), so idle-after can fail on a healthy
        deployment whenever a scenario cancels."""
        out = []
        lease = self.nixl.lease_s
        nixl = any("nixl" in self.connector_of(i) for _, i in self.instances())
        if nixl and self.timeouts.drain_s < lease:
            out.append(f"timeouts.drain_s {self.timeouts.drain_s:g} s is below the NIXL lease {lease:g} s "
                       "(nixl.kv_lease_duration): a cancelled or abandoned request's blocks stay on prefill until "
                       "the lease expires, so idle-after may fail on a healthy deployment; raise drain_s to "
                       f"{lease:g} or more, or lower the lease")
        # vLLM >= 0.30 serves /inference/v1/generate only with --enable-scale-out (403 without it);
        # 0.27.1-0.29.0 serve it without and refuse the flag, so it cannot be a load-time error.
        gen = [sc.name for sc in self.scenarios if sc.request is not None and sc.request.endpoint == "generate"]
        args = [*self.launch.extra_args, *(a for v in self.launch.extra_args_by_vllm.values() for a in v),
                *(a for _, i in self.instances() for a in i.extra_args)]
        if gen and "--enable-scale-out" not in args:
            out.append(f"scenario(s) {', '.join(gen)} use request.endpoint generate, but no instance gets "
                       "--enable-scale-out: vLLM >= 0.30 answers /inference/v1/generate with 403 without it; "
                       "add it to launch.extra_args_by_vllm, e.g. {'>=0.30': ['--enable-scale-out']}")
        return out

    @model_validator(mode="after")
    def _consistent(self) -> RigConfig:
        """The cross-field rules (ports, device, each scenario against its instances, unique names);
        each raises ValueError naming the field and the fix (pydantic makes it a ConfigError line)."""
        self._check_ports()
        self._check_device()
        names = [i.name for _, i in self.instances()]
        for i, sc in enumerate(self.scenarios):
            check_scenario_refs(self, i, sc, names)
            check_scenario_lengths(self, i, sc)
            check_stale_kv(self, i, sc)
        snames = [s.name for s in self.scenarios]
        if len(set(snames)) != len(snames):
            raise ValueError("scenario names must be unique")
        return self

    def _check_ports(self) -> None:
        """Every instance's HTTP and NIXL side-channel port is its own."""
        ports: dict[int, str] = {}
        for _, inst in self.instances():
            # An unset side_channel_port is nixl.side_channel_base_port + index, which can collide
            # with another instance's explicit port.
            side = ("side_channel_port" if inst.side_channel_port is not None
                    else "side_channel_port (nixl.side_channel_base_port + index)")
            for label, port in (("port", inst.port), (side, self.side_channel_port(inst))):
                if port in ports:
                    raise ValueError(f"{inst.name}.{label} {port} is already used by {ports[port]}")
                ports[port] = f"{inst.name}.{label}"

    def _check_device(self) -> None:
        """CPU: block sizes a multiple of 32 (the CPU attention backend), no gpu_ids, a CPU KV buffer;
        CUDA: explicit GPU ids, a GPU shared by two instances only with an explicit memory split."""
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
            return
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

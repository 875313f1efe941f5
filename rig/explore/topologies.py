"""Topologies drawn from the knobs vLLM offers: ``pdrig explore --draw-topologies N``.

A drawn topology is the config with a few ``--set`` overrides on one (prefill, decode) pair, each
knob a setting vLLM exposes that changes a P/D code path:

- ``pool``: D's ``num_gpu_blocks_override`` (a null block + usable blocks: the admission and
  preemption arithmetic of vllm/v1/core/kv_cache_manager.py);
- ``lease``: P's ``nixl.kv_lease_duration`` (s; how long P holds blocks for D, nixl base_scheduler.py);
- ``spec``: D's speculative method (none, ngram with k = 1 or 2: vllm/config/speculative.py; the
  spec step's lookahead blocks are what vLLM PR #38900's admission rule counts);
- ``block_size``: the block size of both instances (the CPU attention backend takes multiples of 32);
- ``prefix_caching``: D's ``enable_prefix_caching`` (on: a prompt D has seen is served from its cache);
- ``max_num_seqs`` / ``max_num_batched_tokens``: D's scheduler caps (``--max-num-seqs``,
  ``--max-num-batched-tokens``; vllm/config/scheduler.py: batched tokens must be >= seqs);
- ``failure_policy``: D's ``kv_load_failure_policy`` (what D does when a KV read fails: recompute
  or fail the request; the NIXL connector's option);
- the prefill side's own knobs (``p_``): P's pool (``p_pool``: blocks P holds for D until the lease
  ends), its scheduler caps (``p_max_num_seqs``, ``p_max_num_batched_tokens``: a chunked prefill
  when a prompt exceeds the batched tokens), its ``p_prefix_caching``; ``nixl_threads`` (the NIXL
  connector's ``num_threads``, both sides).

Each variant is drawn from ``random.Random(f"{seed}/topology/{j}")`` (the same seed gives the same
variants), validated as a whole config (:class:`rig.config.RigConfig`, the same validators as a
hand-written profile) and by :func:`check_variant` (the combinations vLLM refuses at start-up)
before any server starts: a bad combination is one :class:`rig.config.ConfigError` naming the
variant, its ``--set``s and the fix. The explorer deploys each variant once and emits every
finding on it with the ``--set``s that reproduce it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import yaml

from rig.config import ConfigError, RigConfig
from rig.config.blocks import NULL_BLOCKS, blocks_for, usable_in_pool
from rig.config.loading import apply_overrides

NGRAM = {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# knob -> the values drawn (None: leave the config's value). "{d}" is the decode instance's name.
KNOBS: dict[str, tuple[Any, ...]] = {
    "pool": (5, 6, 8, 16),
    "lease": (5, 10, 30),
    "spec": ("none", 1, 2),
    "block_size": (32, 64),
    "prefix_caching": (True, False),
    "max_num_seqs": (1, 2, 4),
    "max_num_batched_tokens": (128, 256),
    "failure_policy": ("recompute", "fail"),
    # P's side (appended: the knobs above keep their draws for a seed)
    "p_pool": (8, 16, 64),
    "p_max_num_seqs": (1, 2, 4),
    "p_max_num_batched_tokens": (128, 256),
    "p_prefix_caching": (True, False),
    "nixl_threads": (1, 2),
}
# The scheduler caps a topology may carry (vllm/config/scheduler.py), as the argv flag of each.
CAP_FLAGS = {"max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens"}
KNOB_SHARE = 0.5  # chance that a knob is set away from the config in a variant
CPU_BLOCK_MULTIPLE = 32  # the CPU attention backend's block sizes (vllm/v1/attention/backends/cpu_attn.py)


@dataclass(frozen=True)
class Variant:
    """One drawn topology: ``name`` (``t<j>``), the ``knobs`` drawn (knob -> value), the
    ``sets`` (``dotted.path=value`` strings, as ``pdrig --set`` takes them) and the validated
    ``cfg``; ``decode`` is the decode instance the knobs apply to."""

    name: str
    decode: str
    knobs: dict[str, Any]
    sets: tuple[str, ...]
    cfg: RigConfig

    def describe(self) -> str:
        """'t1: pool=8 spec=2 lease=5' style (the config's own topology when nothing was drawn)."""
        return f"{self.name}: " + (" ".join(f"{k}={v}" for k, v in self.knobs.items()) or "the config as is")


def sets_of(knobs: dict[str, Any], decode: str, cfg: RigConfig) -> list[str]:
    """The ``--set`` strings of ``knobs`` on instance ``decode`` of ``cfg`` (values as YAML)."""
    d = f"decode.{decode}"
    out: list[str] = []

    def put(path: str, value: Any) -> None:
        text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
        out.append(f"{path}={text.removesuffix('...').strip()}")

    if "pool" in knobs:
        put(f"{d}.num_gpu_blocks_override", knobs["pool"])
    if "lease" in knobs:
        put("nixl.kv_lease_duration", knobs["lease"])
    if "spec" in knobs:
        put(f"{d}.speculative", None if knobs["spec"] == "none" else {**NGRAM, "num_speculative_tokens": knobs["spec"]})
    if "block_size" in knobs:
        put("block_size", knobs["block_size"])
    if "prefix_caching" in knobs:
        put(f"{d}.enable_prefix_caching", knobs["prefix_caching"])
    if "failure_policy" in knobs:
        put(f"{d}.kv_load_failure_policy", knobs["failure_policy"])
    if "nixl_threads" in knobs:
        put("nixl.num_threads", knobs["nixl_threads"])
    for side, name, prefix in (("decode", decode, ""), ("prefill", cfg.prefill[0].name, "p_")):
        path = f"{side}.{name}"
        if side == "prefill":
            if "p_pool" in knobs:
                put(f"{path}.num_gpu_blocks_override", knobs["p_pool"])
            if "p_prefix_caching" in knobs:
                put(f"{path}.enable_prefix_caching", knobs["p_prefix_caching"])
        caps = [x for cap, flag in CAP_FLAGS.items() if prefix + cap in knobs
                for x in (flag, str(knobs[prefix + cap]))]
        if caps:
            put(f"{path}.extra_args", [*cfg.instance(name).extra_args, *caps])
    return out


def caps_of(cfg: RigConfig, instance: str) -> dict[str, int]:
    """``{cap: value}`` of the scheduler caps (:data:`CAP_FLAGS`) ``instance`` is started with
    (its ``extra_args`` over ``launch.extra_args``; the last occurrence wins, as argparse); a
    cap left to vLLM's default is absent."""
    args = [*cfg.launch.extra_args, *cfg.instance(instance).extra_args]
    out: dict[str, int] = {}
    for cap, flag in CAP_FLAGS.items():
        for i, a in enumerate(args):
            if a == flag and i + 1 < len(args) and args[i + 1].isdigit():
                out[cap] = int(args[i + 1])
            elif a.startswith(flag + "=") and a.split("=", 1)[1].isdigit():
                out[cap] = int(a.split("=", 1)[1])
    return out


def check_variant(name: str, knobs: dict[str, Any], sets: list[str], cfg: RigConfig, decode: str) -> None:
    """Raise ConfigError naming the variant, its ``--set``s and the fix for a combination vLLM
    refuses at start-up, before any server starts: a block size that is not a multiple of 32 on the
    CPU, D's pool that cannot hold one ``max_model_len`` request (vLLM's KV cache check: usable
    blocks x block size >= max_model_len, vllm/v1/core/kv_cache_utils.py; the drawn pool or
    ``decode``'s own), ``max_num_batched_tokens``
    below ``max_num_seqs`` (vllm/config/scheduler.py)."""
    where = f"drawn topology {name} (--set {' --set '.join(sets)})"
    bs = knobs.get("block_size", cfg.block_size)
    if cfg.device == "cpu" and bs % CPU_BLOCK_MULTIPLE:
        raise ConfigError(f"{where}: block_size {bs} is not a multiple of {CPU_BLOCK_MULTIPLE} (the CPU attention "
                          "backend refuses it); draw block sizes from multiples of 32")
    pool = knobs.get("pool", cfg.instance(decode).num_gpu_blocks_override)
    usable = usable_in_pool(pool)
    if usable is not None and usable * bs < cfg.max_model_len:
        raise ConfigError(f"{where}: decode pool {pool} blocks ({usable} usable) x block_size {bs} < max_model_len "
                          f"{cfg.max_model_len}: vLLM refuses to start; raise num_gpu_blocks_override to "
                          f"{blocks_for(cfg.max_model_len, bs) + NULL_BLOCKS}")
    p_pool = knobs.get("p_pool")
    p_usable = usable_in_pool(p_pool)
    if p_usable is not None and p_usable * bs < cfg.max_model_len:
        raise ConfigError(f"{where}: prefill pool {p_pool} blocks ({p_usable} usable) x block_size {bs} < "
                          f"max_model_len {cfg.max_model_len}: vLLM refuses to start; raise p_pool to "
                          f"{blocks_for(cfg.max_model_len, bs) + NULL_BLOCKS}")
    for prefix in ("", "p_"):
        seqs, batched = knobs.get(prefix + "max_num_seqs"), knobs.get(prefix + "max_num_batched_tokens")
        if seqs is not None and batched is not None and batched < seqs:
            raise ConfigError(f"{where}: {prefix}max_num_batched_tokens {batched} < {prefix}max_num_seqs {seqs}: "
                              "vLLM refuses it; raise max_num_batched_tokens")


def build_variant(cfg: RigConfig, name: str, decode: str, knobs: dict[str, Any]) -> Variant:
    """``cfg`` with ``knobs`` on ``decode`` (and P where a knob is P's or both's), validated.
    Raises ConfigError (the variant's name, ``--set``s and the fix) for a bad combination."""
    sets = sets_of(knobs, decode, cfg)
    check_variant(name, knobs, sets, cfg, decode)
    v = variant_of_sets(cfg, name, decode, sets)
    return Variant(name, decode, dict(knobs), v.sets, v.cfg)


def variant_of_sets(cfg: RigConfig, name: str, decode: str, sets: list[str] | tuple[str, ...]) -> Variant:
    """The variant recorded in a history (its ``--set`` strings) rebuilt on ``cfg``, for a replay.
    Raises ConfigError as :func:`build_variant`."""
    data = cfg.model_dump(mode="json")
    data.pop("suite", None)
    apply_overrides(data, list(sets))
    try:
        out = RigConfig.model_validate(data)
    except ValueError as e:
        raise ConfigError(f"topology {name} (--set {' --set '.join(sets)}) does not validate: {e}") from None
    return Variant(name, decode, {}, tuple(sets), out)


def draw_variants(cfg: RigConfig, seed: int, n: int, decode: str | None = None,
                  knobs: tuple[str, ...] | None = None) -> list[Variant]:
    """``n`` variants of ``cfg`` on ``decode`` (default: the config's first decode instance),
    each knob of ``knobs`` (default all of :data:`KNOBS`) set with probability
    :data:`KNOB_SHARE`; a draw that :func:`check_variant` refuses is drawn again (up to 20 times,
    then that ConfigError is raised). Raises ConfigError for an unknown knob or decode instance."""
    names = [d.name for d in cfg.decode]
    decode = decode or names[0]
    if decode not in names:
        raise ConfigError(f"--draw-topologies: no decode instance {decode!r} (decode instances: {', '.join(names)})")
    bad = [k for k in knobs or () if k not in KNOBS]
    if bad:
        raise ConfigError(f"topology knobs: unknown {bad}; give some of {list(KNOBS)}")
    out = []
    for j in range(n):
        rng = random.Random(f"{seed}/topology/{j}")
        err: ConfigError | None = None
        for _ in range(20):
            drawn = {k: rng.choice(KNOBS[k]) for k in (knobs or tuple(KNOBS)) if rng.random() < KNOB_SHARE}
            try:
                out.append(build_variant(cfg, f"t{j}", decode, drawn))
                break
            except ConfigError as e:
                err = e
        else:
            assert err is not None
            raise err
    return out

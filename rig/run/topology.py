"""Which instances a command brings up when none are named: one rule for `pdrig up`,
`pdrig compose` and `pdrig e2e --instances`.

A manual wave needs a healthy P/D pair, not the suite's reproducer: cpu-tiny's first decode
(``decode``, 4 usable blocks, ngram k=1) is where vLLM 0.32.0's admission livelock lives, and a
wave against it crawls. So the default pair is, in order:
the pair of the config's first wave scenario; else the first prefill with the first decode that
no known issue of the config is expected on; else the first prefill and the first decode.
"""

from __future__ import annotations

from rig.config import WAVE_KINDS, ConfigError, RigConfig, ScenarioConfig
from rig.config.help import did_you_mean
from rig.run.phases import phases_of


def default_instances(cfg: RigConfig) -> tuple[list[str], str]:
    """``([prefill, decode], why)``: the default engine pair (module docstring) and one sentence
    saying why it was picked, for the command to print."""
    phases = {sc.name: ph for ph in phases_of(cfg, list(cfg.scenarios)) for sc in ph.scenarios}
    wave = next((sc for sc in cfg.scenarios if sc.kind in WAVE_KINDS), None)
    if wave is not None:
        ph = phases[wave.name]
        return [ph.prefill, ph.decode], f"the pair the config's first wave scenario ({wave.name}) uses"
    affected: dict[str, set[str]] = {}
    for sc in cfg.scenarios:
        if sc.known_issue is not None:
            affected.setdefault(phases[sc.name].decode, set()).add(sc.known_issue.id)
    clean = [d.name for d in cfg.decode if d.name not in affected]
    prefill = cfg.prefill[0].name
    if affected and clean:
        issues = "; ".join(f"{d} reproduces {', '.join(sorted(ids))}" for d, ids in sorted(affected.items()))
        return [prefill, clean[0]], (f"{clean[0]} is the first decode no known issue is expected on "
                                     f"({issues}); --instances picks others")
    return [prefill, cfg.decode[0].name], "the first prefill and decode of the config; --instances picks others"


def parse_instances(cfg: RigConfig, value: str) -> list[str]:
    """``a,b`` -> ``["a", "b"]``, each an instance of ``cfg``; raises ConfigError naming an
    unknown one with the nearest name and the valid names."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    valid = [i.name for _, i in cfg.instances()]
    for n in names:
        if n not in valid:
            raise ConfigError(f"--instances: no instance {n!r}{did_you_mean(n, valid)} "
                              f"(instances: {', '.join(valid)})")
    if not any(n in {p.name for p in cfg.prefill} for n in names) or \
            not any(n in {d.name for d in cfg.decode} for n in names):
        raise ConfigError(f"--instances {value}: name at least one prefill and one decode instance")
    return names


def scenarios_on(cfg: RigConfig, scenarios: list[ScenarioConfig], names: list[str]) -> list[ScenarioConfig]:
    """The scenarios whose (prefill, decode) pair is among ``names`` (suite order kept)."""
    keep = {sc.name for ph in phases_of(cfg, scenarios) if {ph.prefill, ph.decode} <= set(names)
            for sc in ph.scenarios}
    return [sc for sc in scenarios if sc.name in keep]

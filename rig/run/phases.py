"""The phases of a suite: its scenarios grouped by the (prefill, decode) pair they run on, in
suite order (:func:`phases_of`), and the scenarios a run selects (:func:`select_scenarios`).
rig/run/runner.py starts each phase's pair once and runs its scenarios on it."""

from __future__ import annotations

from dataclasses import dataclass

from rig.config import ConfigError, RigConfig, ScenarioConfig


@dataclass(frozen=True)
class Phase:
    """Scenarios that share one (prefill, decode) pair."""

    prefill: str
    decode: str
    scenarios: tuple[ScenarioConfig, ...]


def phases_of(cfg: RigConfig, scenarios: list[ScenarioConfig]) -> list[Phase]:
    """Group ``scenarios`` by their (prefill, decode) pair, keeping first-appearance order."""
    order: list[tuple[str, str]] = []
    groups: dict[tuple[str, str], list[ScenarioConfig]] = {}
    for sc in scenarios:
        key = (sc.prefill or cfg.prefill[0].name, sc.decode or cfg.decode[0].name)
        if key not in groups:
            order.append(key)
            groups[key] = []
        groups[key].append(sc)
    return [Phase(p, d, tuple(groups[(p, d)])) for p, d in order]


def select_scenarios(cfg: RigConfig, names: list[str] | None) -> list[ScenarioConfig]:
    """The scenarios to run: all, or those named (raises ConfigError for an unknown name)."""
    if not names:
        return list(cfg.scenarios)
    known = {s.name: s for s in cfg.scenarios}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"--scenario: unknown {unknown}; this config has {sorted(known)}")
    return [known[n] for n in names]

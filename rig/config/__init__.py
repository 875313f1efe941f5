"""Layer 1, config: what the user asks for, validated (pydantic models, YAML loading, `--set`, error help).

Imports only :mod:`rig.connectors` below it. Next layer: :mod:`rig.plan`. One job per module:

- :mod:`rig.config.base` -- ConfigError, the strict base model, the name pattern;
- :mod:`rig.config.instances` -- one vLLM instance, how instances launch, NIXL and Mooncake settings;
- :mod:`rig.config.blocks` -- KV block facts: vLLM's null block, usable blocks, blocks a prompt needs;
- :mod:`rig.config.model` -- which weights to serve, the tiny model's recipe;
- :mod:`rig.config.deployment` -- port reservations, attach mode, Kubernetes rendering;
- :mod:`rig.config.timeouts` -- every wait, in seconds;
- :mod:`rig.config.expectations` -- expected outcomes, known issues and their symptom signatures;
- :mod:`rig.config.scenarios` -- a scenario and each kind's settings (faults and per-hop request
  fields in :mod:`rig.config.faults`, :mod:`rig.config.request_fields`);
- :mod:`rig.config.topology` -- RigConfig, the rules across sections, the per-instance port rules;
- :mod:`rig.config.loading` -- YAML, suites, ``--set`` overrides, validation errors;
- :mod:`rig.config.help` -- did-you-mean, field listings, where suites are.

The names the rest of the rig uses are re-exported here (``from rig.config import RigConfig,
load_config``); modules inside this package import from the defining module.
"""

from rig.config.base import NAME_PATTERN, ConfigError
from rig.config.expectations import (
                                     AppendedTokenSignature,
                                     CounterRule,
                                     CrashSignature,
                                     Expectation,
                                     HttpErrorSignature,
                                     KnownIssue,
                                     LeakSignature,
                                     Outcome,
                                     Signature,
                                     StaleKvSignature,
                                     StallSignature,
                                     WrongMetricsSignature,
                                     WrongOutputSignature,
                                     version_in,
)
from rig.config.instances import InstanceConfig, SpeculativeConfig
from rig.config.loading import apply_overrides, load_config, read_yaml_mapping
from rig.config.scenarios import STORE_KINDS, WAVE_KINDS, ScenarioConfig, StoreScenarioConfig, WaveConfig
from rig.config.topology import RigConfig

__all__ = [
    "AppendedTokenSignature", "NAME_PATTERN", "STORE_KINDS", "WAVE_KINDS", "ConfigError", "CounterRule",
    "CrashSignature", "Expectation",
    "HttpErrorSignature", "InstanceConfig", "KnownIssue", "LeakSignature", "Outcome", "RigConfig", "ScenarioConfig",
    "Signature", "SpeculativeConfig", "StaleKvSignature", "StallSignature", "StoreScenarioConfig",
    "WaveConfig", "WrongMetricsSignature", "WrongOutputSignature", "apply_overrides", "load_config",
    "read_yaml_mapping", "version_in",
]

"""Layer 1, config: what the user asks for, validated (pydantic models, YAML loading, `--set`, error help).

Imports nothing from the rig above it. Next layer: :mod:`rig.plan`."""

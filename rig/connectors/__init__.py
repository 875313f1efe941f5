"""Layer 0, connectors: the pure kv-connector builders (``--kv-transfer-config`` JSON for NIXL,
Mooncake and their combination; the Mooncake master's argv, store config and client
environment; the Mooncake port layout). Plain typed arguments in, plain dicts/lists out.

Imports nothing from the rig, reads no file, starts nothing: every rule here was read from
vLLM 0.32.0's source (the module docstrings name the files). Next layer: :mod:`rig.config`."""

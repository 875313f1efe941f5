"""Layer 3, cluster: runs a plan on this host: processes, CPU shares and pinning, the reaper, port
locks, log sources, vLLM build envs, the tiny model, Mooncake's host probes. Imports only the
layers below it (connectors, config, plan)."""

"""Layer 3, cluster: runs a plan: the cluster (readiness, phases, teardown) over one deployment
backend (processes launched on this host, Compose containers, attached endpoints), CPU shares and
pinning, the reaper, port locks, log sources, vLLM build envs, the tiny model, Mooncake's host
probes. Imports only the layers below it (connectors, config, plan)."""

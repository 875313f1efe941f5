"""Layer 3, cluster: runs a plan on this host: processes, the reaper, port locks, log sources, vLLM
build envs, the tiny model. Imports only config and plan."""

"""Layer 6, workload: what is fired at the cluster (edge prompts as token-ID lists, prefix and pressure
waves, store and retrieval workloads, faults, warm-up); records what happened, judges nothing."""

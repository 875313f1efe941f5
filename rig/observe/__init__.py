"""Layer 5, observe: instruments the workloads and the judge read: `/metrics` snapshots, the stall watcher,
parity against the reference, drain-to-idle, evidence (logs, deaths, versions), the timeline, progress."""

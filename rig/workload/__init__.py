"""Step 4 of the rig's flow: workloads (edge prompts, prefix waves, pressure waves)."""

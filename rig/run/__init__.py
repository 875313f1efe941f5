"""App layer: one run end to end (config → plan → cluster → workload → observe → judge → report):
the suite runner, scenario kinds (which workload and which checks), topologies, the build matrix, waves."""

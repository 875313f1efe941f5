"""Layer 2, plan: the config turned into processes (argv, env, ports, CPU pins) and their renderings
(Compose, Kubernetes). Pure: starts nothing. Imports only :mod:`rig.config` (and connectors)."""

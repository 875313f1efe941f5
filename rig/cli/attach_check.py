"""Before an attached run (``pdrig e2e --attach``) takes a run directory: every instance the
selected scenarios use has an endpoint, and a vLLM server answers at each one.

Why here and not in the readiness wait: an attached deployment is not the rig's, so a closed port,
a port where something else listens (a web server answering 404 on ``/health``, a TCP service that
speaks no HTTP) or a vLLM serving another model is bad input (exit code 2, one line naming the
instance, its URL and what it answered) found in seconds, not a start-up to wait
``timeouts.startup_s`` for; and an endpoints file that names only some instances must not quietly
send the others to the config's default ports, where another run's servers may be listening.

What counts as "a vLLM server answers" (vLLM's ``vllm/entrypoints/openai/api_server.py``: ``GET
/health`` is 200, or 503 while its engine is not healthy; ``GET /v1/models`` lists the served model
names): ``/health`` answers 200 or a 5xx (a server or a router in front of it not ready yet: the
readiness wait waits for those, rig.cluster.backends.attached), and when it is 200, ``/v1/models``
is an OpenAI model list naming ``model.served_name`` (an empty list is waited for too).
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from rig.config import RigConfig
from rig.config.files import cut
from rig.config.scenarios import ScenarioConfig
from rig.errors import ConfigError
from rig.plan.spec import probe_host
from rig.run.phases import phases_of

CONNECT_S = 2.0  # a TCP connect on a LAN answers in milliseconds; a refused port at once
HTTP_S = 3.0  # a vLLM server answers /health and /v1/models in milliseconds once it listens
HEALTH_PATH = "/health"  # rig.plan.spec.ProcessSpec.health_path, the readiness rule's


def attached_urls(cfg: RigConfig, scenarios: list[ScenarioConfig], explicit: bool) -> dict[str, str]:
    """``{instance: http://host:port}`` of every prefill and decode the ``scenarios`` use: from
    ``attach.endpoints``, or the config's host and port when no endpoint was given at all
    (``explicit`` False: the documented ``pdrig up`` then ``pdrig e2e --attach`` on one config).
    Raises ConfigError naming the instances an explicit endpoint list leaves out."""
    names = sorted({n for ph in phases_of(cfg, scenarios) for n in (ph.prefill, ph.decode)})
    given = cfg.attach.endpoints
    missing = [n for n in names if n not in given]
    if explicit and missing:
        raise ConfigError(f"--attach: no endpoint for {', '.join(missing)} (the selected scenarios use them; "
                          f"endpoints given: {', '.join(sorted(given)) or 'none'}): add --endpoint NAME=URL, "
                          f"or pick scenarios on the given instances with --scenario / --instances")
    return {n: given.get(n) or f"http://{probe_host(cfg.launch.host)}:{cfg.instance(n).port}" for n in names}


def _not_vllm(url: str, served: str | None, http_s: float) -> str | None:
    """What ``url`` answered that no vLLM server (serving ``served``) answers, or None when it
    answered as one does, or as one not ready yet does (module docstring)."""
    import httpx

    base = url.rstrip("/")
    try:
        with httpx.Client(timeout=http_s) as http:  # as the readiness probe (rig.cluster.processes)
            health = http.get(base + HEALTH_PATH)
            if health.status_code >= 500:
                return None  # not ready yet (vLLM's engine, a router's backends): waited for
            if health.status_code != 200:
                return f"GET {HEALTH_PATH} answered HTTP {health.status_code}, not 200 (not a vLLM server?)"
            if served is None:
                return None
            models = http.get(base + "/v1/models")
    except httpx.TimeoutException:
        return f"accepts a TCP connection but gave no HTTP answer within {http_s:g} s (not a vLLM server?)"
    except httpx.HTTPError as exc:
        return f"accepts a TCP connection but does not speak HTTP ({type(exc).__name__}; not a vLLM server?)"
    try:
        listed = [m.get("id") for m in models.json().get("data")]
    except (ValueError, AttributeError, TypeError):
        return (f"GET /v1/models answered HTTP {models.status_code} without an OpenAI model list "
                "(not a vLLM server?)")
    if listed and served not in listed:
        names = cut(", ".join(str(n) for n in listed), 80)
        return f"serves {names}, not {served} (--set model.served_name=NAME, or attach to the right deployment)"
    return None


def check_answering(urls: dict[str, str], connect_s: float = CONNECT_S, served: str | None = None,
                    http_s: float = HTTP_S) -> None:
    """Raise ConfigError naming every instance whose ``http://host:port`` accepts no TCP
    connection within ``connect_s`` seconds (refused, unreachable, no route), or answers as no
    vLLM server serving ``served`` does (:func:`_not_vllm`; ``served`` None: ``/health`` only),
    each with what it answered. At most ``connect_s + 2 * http_s`` seconds per instance."""
    dead, wrong = [], []
    for name, url in urls.items():
        parts = urlsplit(url)
        try:
            with socket.create_connection((parts.hostname or "", parts.port or 80), timeout=connect_s):
                pass
        except OSError as exc:
            dead.append(f"{name} at {url} ({exc.strerror or type(exc).__name__})")
            continue
        problem = _not_vllm(url, served, http_s)
        if problem:
            wrong.append(f"{name} at {url} {problem}")
    if dead:
        raise ConfigError(f"--attach: nothing answers for {'; '.join(dead)}: start the deployment first "
                          f"(pdrig up) or fix --endpoint / --endpoints")
    if wrong:
        raise ConfigError(f"--attach: {'; '.join(wrong)}: fix --endpoint / --endpoints")

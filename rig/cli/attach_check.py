"""Before an attached run (``pdrig e2e --attach``) takes a run directory: every instance the
selected scenarios use has an endpoint, and something answers at each one.

Why here and not in the readiness wait: an attached deployment is not the rig's, so a closed port
is bad input (exit code 2, one line naming the instance and its URL) found in a second, not a
start-up to wait for; and an endpoints file that names only some instances must not quietly send
the others to the config's default ports, where another run's servers may be listening.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from rig.config import RigConfig
from rig.config.scenarios import ScenarioConfig
from rig.errors import ConfigError
from rig.plan.spec import probe_host
from rig.run.phases import phases_of

CONNECT_S = 2.0  # a TCP connect on a LAN answers in milliseconds; a refused port at once


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


def check_answering(urls: dict[str, str], connect_s: float = CONNECT_S) -> None:
    """Raise ConfigError naming every instance whose ``http://host:port`` accepts no TCP
    connection within ``connect_s`` seconds (refused, unreachable, no route)."""
    dead = []
    for name, url in urls.items():
        parts = urlsplit(url)
        try:
            with socket.create_connection((parts.hostname or "", parts.port or 80), timeout=connect_s):
                pass
        except OSError as exc:
            dead.append(f"{name} at {url} ({exc.strerror or type(exc).__name__})")
    if dead:
        raise ConfigError(f"--attach: nothing answers for {'; '.join(dead)}: start the deployment first "
                          f"(pdrig up) or fix --endpoint / --endpoints")

"""``pdrig e2e --attach`` refuses, before any run directory, an instance the endpoints leave out
and an endpoint where nothing answers: one line, exit code 2, naming the instance and its URL."""

from __future__ import annotations

import socket

import pytest

from rig.cli.attach_check import check_answering
from rig.errors import ConfigError
from tests.helpers.fake_rig import write_config
from tests.helpers.hostile import base_config, in_fresh_dir, refused


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_closed_endpoint_is_refused_naming_the_instance_and_url():
    port = closed_port()
    with in_fresh_dir() as d:
        cfg = write_config(d, {**base_config(d), "run_root": str(d / "runs")})
        line = refused(["e2e", "--attach", "--config", str(cfg), "--endpoint", f"prefill=http://127.0.0.1:{port}",
                        "--endpoint", f"decode=http://127.0.0.1:{port}"], d, {cfg.name})
    assert f"http://127.0.0.1:{port}" in line and "nothing answers" in line and "decode" in line


def test_an_instance_left_out_of_the_endpoints_is_refused_not_sent_to_the_default_port():
    port = closed_port()
    with in_fresh_dir() as d:
        cfg = write_config(d, {**base_config(d), "run_root": str(d / "runs")})
        line = refused(["e2e", "--attach", "--config", str(cfg), "--endpoint", f"prefill=http://127.0.0.1:{port}"],
                       d, {cfg.name})
    assert "no endpoint for decode" in line


def test_a_listening_endpoint_passes_and_a_closed_one_beside_it_is_named():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        live = f"http://127.0.0.1:{srv.getsockname()[1]}"
        check_answering({"prefill": live})  # answers: no error
        dead = f"http://127.0.0.1:{closed_port()}"
        with pytest.raises(ConfigError) as err:
            check_answering({"prefill": live, "decode": dead})
    assert "decode at " + dead in str(err.value) and "prefill" not in str(err.value).split("for ")[1].split(":")[0]

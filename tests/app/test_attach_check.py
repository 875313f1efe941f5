"""``pdrig e2e --attach`` refuses, before any run directory, an instance the endpoints leave out
and an endpoint where nothing answers: one line, exit code 2, naming the instance and its URL."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
from collections.abc import Iterator

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


class _Answers(http.server.BaseHTTPRequestHandler):
    """GET PATH answers ``self.server.answers[PATH]`` (status, JSON body); 404 for any other path."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        status, body = self.server.answers.get(self.path, (404, {"detail": "Not Found"}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serving(answers: dict[str, tuple[int, object]]) -> Iterator[str]:
    """An HTTP server on a loopback port answering ``answers``; yields its http://127.0.0.1:PORT."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    srv.answers = answers
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


VLLM = {"/health": (200, ""), "/v1/models": (200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})}


def test_a_vllm_endpoint_passes_and_a_closed_one_beside_it_is_named():
    with serving(VLLM) as live:
        check_answering({"prefill": live}, served="tiny")  # answers as vLLM does: no error
        dead = f"http://127.0.0.1:{closed_port()}"
        with pytest.raises(ConfigError) as err:
            check_answering({"prefill": live, "decode": dead}, served="tiny")
    assert "decode at " + dead in str(err.value) and "prefill" not in str(err.value).split("for ")[1].split(":")[0]


@pytest.mark.parametrize(("answers", "says"), [
    ({}, "GET /health answered HTTP 404"),  # a web server that is not vLLM
    ({"/health": (401, {})}, "GET /health answered HTTP 401"),
    ({"/health": (200, "")}, "without an OpenAI model list"),  # 200 on /health, 404 on /v1/models
    ({"/health": (200, ""), "/v1/models": (200, {"data": [{"id": "llama"}]})}, "serves llama, not tiny"),
])
def test_an_endpoint_that_answers_as_no_vllm_does_is_refused_saying_what_it_answered(answers, says):
    with serving(answers) as url, pytest.raises(ConfigError) as err:
        check_answering({"decode": url}, served="tiny")
    assert f"decode at {url} " in str(err.value) and says in str(err.value)


@pytest.mark.parametrize("answers", [{"/health": (503, "")}, {"/health": (200, ""), "/v1/models": (200, {"data": []})}])
def test_an_endpoint_not_ready_yet_is_left_to_the_readiness_wait(answers):
    with serving(answers) as url:
        check_answering({"decode": url}, served="tiny")  # vLLM's engine starting, a router without backends


def test_a_port_that_accepts_tcp_but_speaks_no_http_is_refused():
    with socket.socket() as silent, socket.socket() as talker:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # never accepts: the kernel completes the connection, nobody answers
        talker.bind(("127.0.0.1", 0))
        talker.listen()

        def garbage():  # every connection (the connect check's, then the HTTP request's) gets an SSH banner
            for _ in range(2):
                conn, _ = talker.accept()
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                conn.close()
        threading.Thread(target=garbage, daemon=True).start()
        urls = {"prefill": f"http://127.0.0.1:{silent.getsockname()[1]}",
                "decode": f"http://127.0.0.1:{talker.getsockname()[1]}"}
        with pytest.raises(ConfigError) as err:
            check_answering(urls, served="tiny", http_s=0.5)
    assert "no HTTP answer within 0.5 s" in str(err.value) and "does not speak HTTP" in str(err.value)


def test_attach_to_a_web_server_that_is_not_vllm_is_refused_before_any_run_directory():
    with serving({}) as url, in_fresh_dir() as d:
        cfg = write_config(d, {**base_config(d), "run_root": str(d / "runs")})
        line = refused(["e2e", "--attach", "--config", str(cfg), "--endpoint", f"prefill={url}",
                        "--endpoint", f"decode={url}"], d, {cfg.name})
    assert f"decode at {url} GET /health answered HTTP 404" in line and "prefill at" in line

"""Attach mode's log sources (rig/cluster/logs.py) and endpoints: a Docker Compose service's log through
a fake ``docker`` on PATH, pods' logs through lightkube against a mocked Kubernetes API (httpx2
MockTransport: the real client, only the HTTP answers are canned), and ``pdrig e2e --attach``
with ``--endpoint`` / ``--log`` against fake vLLM servers started outside the run.

Readable sources give exactly the text written after a mark; unreadable ones give None, which the
runner turns into "not checked" (rig/run/runner.py ``_scan_logs``).
"""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx2
import pytest
from lightkube import Client, KubeConfig
from lightkube.config.models import Cluster as KubeCluster
from lightkube.config.models import User

from rig import cli
from rig.cluster.backends.attached import Attached
from rig.cluster.logs import ComposeLog, FileLog, KubernetesLog, attach_log_source
from rig.cluster.processes import Cluster, ClusterError
from rig.config import ConfigError, load_config
from rig.plan.processes import build_plan, with_endpoints
from rig.run.runner import resolve_model
from tests.helpers.fake_rig import fake_config, scenario, write_config

FAKE_DOCKER = """#!{python}
# A fake `docker`: records its argv, prints $FAKE_DOCKER_DIR/<last arg>.log, exits $FAKE_DOCKER_RC.
import os, sys
d = os.environ["FAKE_DOCKER_DIR"]
with open(os.path.join(d, "argv.log"), "a") as f:
    f.write(repr(sys.argv[1:]) + "\\n")
rc = int(os.environ.get("FAKE_DOCKER_RC", "0"))
if rc:
    sys.stderr.write("Cannot connect to the Docker daemon\\n")
    sys.exit(rc)
sys.stdout.write(open(os.path.join(d, sys.argv[-1] + ".log")).read())
"""


@pytest.fixture()
def fake_docker(tmp_path, monkeypatch) -> Path:
    """A directory with a fake ``docker`` first on PATH; service logs are ``<dir>/<service>.log``."""
    d = tmp_path / "docker"
    d.mkdir()
    exe = d / "docker"
    exe.write_text(FAKE_DOCKER.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_DIR", str(d))
    return d


def test_compose_log_reads_what_was_written_after_the_mark(fake_docker, monkeypatch):
    log = fake_docker / "decode.log"
    log.write_text("INFO start\n")
    src = ComposeLog("decode", "stack/docker-compose.yml", "decode")
    m = src.mark()
    assert m is not None
    log.write_text("INFO start\nERROR Cannot get 3 free blocks from the pool\n")
    assert src.since(m) == "ERROR Cannot get 3 free blocks from the pool\n"
    m2 = src.mark()
    assert src.since(m2) == "" and src.since(m) == "ERROR Cannot get 3 free blocks from the pool\n"
    # The exact argv, one list, no shell.
    calls = [eval(line) for line in (fake_docker / "argv.log").read_text().splitlines()]
    assert calls[0] == ["compose", "-f", "stack/docker-compose.yml", "logs", "--no-color",
                        "--no-log-prefix", "decode"]
    # A restarted container's log is shorter than the mark: all of it is new.
    log.write_text("INFO again\n")
    assert src.since(m2) == "INFO again\n"
    # No engine / unknown service: docker exits non-zero -> unreadable, not empty.
    monkeypatch.setenv("FAKE_DOCKER_RC", "1")
    assert src.mark() is None and src.since(m) is None


def test_compose_log_without_docker_is_unreadable(tmp_path):
    src = ComposeLog("decode", "docker-compose.yml", "decode", docker=str(tmp_path / "no-docker"))
    assert src.mark() is None
    assert src.describe() == "docker compose -f docker-compose.yml logs decode"


# --- Kubernetes API, mocked at lightkube's HTTP layer -------------------------------------------

class FakeApi:
    """Canned answers of the Kubernetes API: pods by label, their logs; records every request."""

    def __init__(self, pods: dict[str, dict[str, str]], logs: dict[str, str], status: int = 200):
        self.pods, self.logs, self.status = pods, logs, status  # pod -> labels; pod -> log text
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        if self.status != 200:
            return httpx2.Response(self.status, json={
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": self.status,
                "reason": "Forbidden", "message": 'pods is forbidden: User "x" cannot list resource "pods"'})
        parts = request.url.path.strip("/").split("/")
        assert parts[:3] == ["api", "v1", "namespaces"]
        if parts[4:] == ["pods"]:
            wanted = dict(t.split("=") for t in request.url.params["labelSelector"].split(","))
            items = [{"metadata": {"name": n, "namespace": parts[3], "labels": lab}}
                     for n, lab in self.pods.items() if wanted.items() <= lab.items()]
            return httpx2.Response(200, json={"apiVersion": "v1", "kind": "PodList",
                                              "metadata": {}, "items": items})
        if parts[4] == "pods" and parts[6:] == ["log"]:
            return httpx2.Response(200, text=self.logs[parts[5]])
        return httpx2.Response(404, json={"kind": "Status", "code": 404, "message": "not found"})


def kube_config() -> KubeConfig:
    """A kubeconfig as a service account's: the API server and a bearer token."""
    return KubeConfig.from_one(cluster=KubeCluster(server="http://kube.test"), user=User(token="t"),
                               namespace="pdrig")


def k8s_client(api) -> Client:
    return Client(config=kube_config(), transport=httpx2.MockTransport(api))


def test_kubernetes_log_reads_each_pod_past_its_own_mark():
    labels = {"pdrig/run": "r1", "pdrig/instance": "decode"}
    api = FakeApi({"pdrig-r1-decode": labels, "pdrig-r1-prefill": {"pdrig/run": "r1", "pdrig/instance": "prefill"}},
                  {"pdrig-r1-decode": "INFO up\n", "pdrig-r1-prefill": "INFO p\n"})
    src = KubernetesLog("decode", "pdrig/run=r1,pdrig/instance=decode", namespace="llm",
                        container="vllm", client=k8s_client(api))
    m = src.mark()
    api.logs["pdrig-r1-decode"] += "ERROR EngineCore encountered a fatal error\n"
    api.logs["pdrig-r1-prefill"] += "ERROR not this pod's\n"
    assert src.since(m) == "ERROR EngineCore encountered a fatal error\n"
    log_req = [r for r in api.requests if r.url.path.endswith("/log")][-1]
    assert log_req.url.path == "/api/v1/namespaces/llm/pods/pdrig-r1-decode/log"
    assert log_req.url.params["container"] == "vllm"
    list_req = api.requests[0]
    assert list_req.url.path == "/api/v1/namespaces/llm/pods"
    assert list_req.headers["authorization"] == "Bearer t"
    assert list_req.url.params["labelSelector"] == "pdrig/run=r1,pdrig/instance=decode"


def test_kubernetes_log_two_replicas_keep_their_own_offsets():
    lab = {"app": "decode"}
    api = FakeApi({"d-a": lab, "d-b": lab}, {"d-a": "a1\n", "d-b": "b1\nb2\n"})
    src = KubernetesLog("decode", "app=decode", client=k8s_client(api))
    m = src.mark()
    api.logs["d-a"] += "a2\n"
    api.logs["d-b"] += "b3\n"
    assert src.since(m) == "a2\nb3\n"
    # namespace None: the client's own (the pod's namespace in a cluster).
    assert api.requests[0].url.path == "/api/v1/namespaces/pdrig/pods"


@pytest.mark.parametrize("case", ["forbidden", "no-pod", "unreachable"])
def test_kubernetes_log_unreadable_is_none(case):
    if case == "forbidden":
        client = k8s_client(FakeApi({"d": {"app": "decode"}}, {"d": "x\n"}, status=403))
    elif case == "no-pod":
        client = k8s_client(FakeApi({"d": {"app": "other"}}, {"d": "x\n"}))
    else:
        def refuse(request):
            raise httpx2.ConnectError("connection refused", request=request)

        client = k8s_client(refuse)
    src = KubernetesLog("decode", "app=decode", client=client)
    assert src.mark() is None


def test_kubernetes_log_refuses_selectors_it_cannot_send():
    with pytest.raises(ValueError, match="only key=value"):
        KubernetesLog("decode", "app!=decode")


# --- config and CLI ---------------------------------------------------------------------------

def test_log_flags_become_the_attach_section(tmp_path):
    ov = cli.attach_overrides(
        ["decode=http://10.0.0.5:8200"],
        ["decode=file:/var/log/d e.log", "prefill=compose:stack/dc.yml:prefill",
         "decode-6blk=k8s:llm-d/app=vllm,role=decode@vllm", "decode-nospec=compose:decode-nospec"])
    cfg = load_config("configs/cpu-tiny.yaml", ov)
    a = cfg.attach
    assert a.endpoints == {"decode": "http://10.0.0.5:8200"}
    assert attach_log_source("decode", a.logs["decode"]) == FileLog("decode", "/var/log/d e.log")
    src = attach_log_source("prefill", a.logs["prefill"])
    assert (src.compose_file, src.service) == ("stack/dc.yml", "prefill")
    assert a.logs["decode-nospec"].compose.file == "docker-compose.yml"
    k = attach_log_source("decode-6blk", a.logs["decode-6blk"])
    assert (k.namespace, k.selector, k.container) == ("llm-d", "app=vllm,role=decode", "vllm")
    with pytest.raises(ConfigError, match="--log 'decode'"):
        cli.attach_overrides([], ["decode"])
    with pytest.raises(ConfigError, match="not instances"):
        load_config("configs/cpu-tiny.yaml", cli.attach_overrides([], ["dec=file:/x"]))
    with pytest.raises(ConfigError, match="is not http://HOST:PORT"):
        load_config("configs/cpu-tiny.yaml", cli.attach_overrides(["decode=https://x:1/v1"], []))
    with pytest.raises(ConfigError, match="exactly one of"):
        load_config("configs/cpu-tiny.yaml", ["attach.logs.decode={file: /x, compose: {service: d}}"])


def test_logs_from_compose_names_every_instance_and_log_overrides_one(tmp_path, monkeypatch):
    seen = {}

    class Capture:
        def __init__(self, cfg, scenarios, run_dir, **kw):
            seen.update(kw["log_sources"])

        def run(self):
            raise SystemExit(0)

    monkeypatch.setattr("rig.run.runner.SuiteRunner", Capture)
    monkeypatch.setattr("rig.cli.run.check_answering", lambda urls, **_: None)  # no deployment: only the log sources
    monkeypatch.chdir(tmp_path)
    config = str(Path(__file__).resolve().parents[2] / "configs" / "cpu-tiny.yaml")
    with pytest.raises(SystemExit):
        cli.cmd_e2e(cli.build_parser().parse_args(
            ["e2e", "-c", config, "--set", f"run_root={tmp_path}", "--attach",
             "--logs-from-compose", "dc.yml", "--log", "decode=file:/d.log"]))
    assert seen["decode"] == FileLog("decode", "/d.log")
    assert {n: (s.compose_file, s.service) for n, s in seen.items() if n != "decode"} == {
        n: ("dc.yml", n) for n in ("prefill", "decode-6blk", "decode-nospec")}
    with pytest.raises(ConfigError, match="add --attach"):
        cli.cmd_e2e(cli.build_parser().parse_args(["e2e", "-c", config, "--logs-from-compose", "dc.yml"]))


def test_with_endpoints_moves_only_the_named_processes():
    cfg = load_config("configs/cpu-tiny.yaml")
    plan = build_plan(cfg, "/r", "m", "python")
    moved = with_endpoints(plan, {"decode": "http://pdrig-r1-decode:8200"})
    d = moved.by_name("decode")
    assert d.base_url == "http://pdrig-r1-decode:8200" and d.ready_ports == ()
    assert moved.by_name("prefill") == plan.by_name("prefill")
    with pytest.raises(KeyError):
        with_endpoints(plan, {"nope": "http://a:1"})


# --- pdrig e2e --attach against servers started elsewhere ---------------------------------------

def test_e2e_attach_with_endpoints_and_a_compose_log(fake_servers_dir, fake_docker, restore_signals):
    base = fake_servers_dir
    """Servers run "elsewhere" (another Cluster, other ports than the config says); the run
    reaches them only through --endpoint, reads decode's log through `docker compose logs` (the
    fake docker serves the server's real log file) and fails no-fatal-log on its fatal line;
    prefill has no log source: its log is unscanned, and the run says so."""
    data = fake_config(base, decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "fatal-log"}}},
                       scenarios=[scenario("one", "decode")])
    cfg = load_config(write_config(base, data))
    outside = Cluster(build_plan(cfg, base / "outside", resolve_model(cfg), sys.executable), 30, 3)
    try:
        outside.start(["prefill", "decode"])
        # The config the rig is given points at ports where nothing listens.
        data["prefill"][0]["port"] = 1024
        data["decode"][0]["port"] = 1025
        config = write_config(base, data, "attach.yaml")
        (fake_docker / "decode.log").symlink_to(outside.plan.by_name("decode").log_path)
        rc = cli.main(["e2e", "-c", str(config), "--attach", "--quiet",
                       "--endpoint", f"prefill={outside.url('prefill')}",
                       "--endpoint", f"decode={outside.url('decode')}",
                       "--log", "decode=compose:stack.yml:decode"])
        report = json.loads(max((base / "runs").glob("*/report.json")).read_text())
    finally:
        outside.stop_all()
    assert rc == 1
    ((verdict, obs),) = [(s["verdict"], s["observation"]) for s in report["scenarios"]]
    assert any("Cannot get 3 free blocks" in ln for ln in obs["fatal_lines"]["decode"])
    assert obs["unscanned_logs"] == {"prefill": obs["unscanned_logs"]["prefill"]}
    assert obs["unscanned_logs"]["prefill"].startswith("no log source given")
    assert all(r["outcome"] == "ok" for r in obs["records"])  # reached through the endpoints
    fatal = next(c for c in verdict["checks"] if c["name"] == "no-fatal-log")
    assert fatal["ok"] is False and "Cannot get 3 free blocks" in fatal["detail"]
    assert verdict["verdict"] == "FAIL"


def test_attach_runs_get_fresh_prompts_unless_a_seed_is_given():
    """A deployment the rig did not start keeps D's prefix cache across runs: each attach run
    seeds its prompts from its run name, so a second run's prompts are new to D."""
    from rig.workload.prompts import make_prompt

    cfg = load_config("configs/cpu-tiny.yaml", ["scenarios.edge-126.seed=7"])
    a = cli.fresh_prompt_seeds(cfg, "20261130-200322-cpu-tiny")
    b = cli.fresh_prompt_seeds(cfg, "20261130-200340-cpu-tiny")
    sa = {s.name: s.seed for s in a.scenarios}
    sb = {s.name: s.seed for s in b.scenarios}
    assert sa["edge-126"] == sb["edge-126"] == 7  # explicit seeds are kept
    n = "edge-96-block-boundary"
    assert sa[n] is not None and sa[n] != sb[n]
    assert make_prompt(96, sa[n]) != make_prompt(96, sb[n])
    assert cli.fresh_prompt_seeds(cfg, "20261130-200322-cpu-tiny").scenarios == a.scenarios  # reproducible
    assert all(s.seed is None for s in cfg.scenarios if s.name != "edge-126")  # cfg unchanged


def test_attach_to_an_endpoint_that_does_not_answer_names_the_url(fake_servers_dir, restore_signals, capsys):
    """An attached endpoint where nothing listens is bad input: refused before any run directory
    (rc 2) in one line naming each instance and the URL it tried."""
    base = fake_servers_dir
    data = fake_config(base, scenarios=[scenario("one", "decode")])
    data["timeouts"] = {**data.get("timeouts", {}), "startup_s": 2}
    config = write_config(base, data, "attach.yaml")
    rc = cli.main(["e2e", "-c", str(config), "--attach", "--quiet",
                   "--endpoint", "prefill=http://127.0.0.1:1026", "--endpoint", "decode=http://127.0.0.1:1027"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1, err
    assert "prefill at http://127.0.0.1:1026" in err[0] and "decode at http://127.0.0.1:1027" in err[0]
    assert not (base / "runs").exists() or not list((base / "runs").glob("*/report.json"))


def test_endpoints_json_of_pdrig_up_gives_the_urls_and_the_logs(tmp_path, capsys):
    ep = tmp_path / "endpoints.json"
    ep.write_text(json.dumps({
        "mooncake-master": {"url": "http://127.0.0.1:8300", "role": "mooncake-master"},
        "prefill": {"url": "http://127.0.0.1:8100", "role": "prefill", "log": "/r/logs/prefill.log", "pid": 7},
        "decode": {"url": "http://127.0.0.1:8200", "role": "decode", "log": "/r/logs/decode.log", "pid": 8}}))
    urls, logs = cli.up_endpoint_flags(str(ep))
    assert urls == ["prefill=http://127.0.0.1:8100", "decode=http://127.0.0.1:8200"]
    assert logs == ["prefill=file:/r/logs/prefill.log", "decode=file:/r/logs/decode.log"]
    cfg = load_config("configs/cpu-tiny.yaml", cli.attach_overrides(urls, logs))
    assert attach_log_source("decode", cfg.attach.logs["decode"]) == FileLog("decode", "/r/logs/decode.log")
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(ConfigError, match="--endpoints .*bad.json: the top level must be an object, not a list"):
        cli.up_endpoint_flags(str(tmp_path / "bad.json"))
    assert cli.main(["e2e", "--endpoints", str(ep)]) == 2  # main turns the ConfigError into exit 2
    assert "describe a deployment the rig did not start: add --attach" in capsys.readouterr().err


# --- attached endpoints: waited for only once they answer ----------------------------------------

def _closed_port() -> int:
    """A port nothing listens on (bound, then closed again)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _attached_plan(tmp_path: Path, urls: dict[str, str]):
    cfg = load_config("configs/cpu-tiny.yaml")
    return with_endpoints(build_plan(cfg, tmp_path / "run", "m", "python"), urls)


def test_an_attached_endpoint_that_never_answers_fails_in_seconds_naming_it(tmp_path):
    """Under the 1,200 s ceiling of the CPU profiles, an endpoint with nothing behind it fails
    once ``connect_s`` has passed without any answer, naming its URL and what was tried; the
    progress display waits for it, it never says "starting" (the rig did not start it)."""
    urls = {n: f"http://127.0.0.1:{_closed_port()}" for n in ("prefill", "decode")}
    shown = io.StringIO()
    with Cluster(_attached_plan(tmp_path, urls), 1200, 3, display="lines", display_stream=shown,
                 backend=Attached(connect_s=1.0)) as cluster:
        outcome = cluster.start_each(["prefill", "decode"])
        watches = dict(cluster.startups)
    for name, url in urls.items():
        err = outcome[name]
        assert isinstance(err, ClusterError), err
        assert f"{name} at {url} (attached: the rig did not start it) does not answer" in str(err)
        assert f"GET {url}/health" in str(err) and "ConnectError" in str(err)
        assert "timeouts.startup_s" not in str(err)  # not the ceiling's message
        assert watches[name].outcome == "failed" and "connecting" in watches[name].phase_s
    assert shown.getvalue().startswith("[waiting for ") and "starting" not in shown.getvalue()


def test_an_attached_endpoint_that_answers_but_is_not_ready_is_waited_for(tmp_path):
    """One that answers ``/health`` 503 is still coming up: no early failure, the wait goes on to
    the ceiling, its phase says what it waits for."""
    class Loading(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Loading)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    shown = io.StringIO()
    try:
        with Cluster(_attached_plan(tmp_path, {"decode": url}), 3, 3, display="lines", display_stream=shown,
                     backend=Attached(connect_s=0.5)) as cluster, pytest.raises(ClusterError) as e:
            cluster.start(["decode"])
        watch = cluster.startups["decode"]
    finally:
        server.shutdown()
        server.server_close()
    assert "did not answer /health with the model listed within 3 s (timeouts.startup_s; last: " \
           f"GET {url}/health answered 503)" in str(e.value)
    assert watch.outcome == "timeout" and "waiting for /health" in watch.phase_s
    assert "decode: timeout" in shown.getvalue() and "starting" not in shown.getvalue()


def test_e2e_attach_to_endpoints_that_do_not_answer_ends_in_seconds_not_at_the_ceiling(
        fake_servers_dir, restore_signals, capsys, monkeypatch):
    """``pdrig e2e --attach`` with the CPU profiles' 1,200 s ceiling: nothing answers at either
    endpoint, so the run breaks (rc 3) once the attached backend's connect time has passed,
    naming each URL; its progress says it waits for them, never that it starts them."""
    base = fake_servers_dir
    data = fake_config(base, scenarios=[scenario("one", "decode")])
    data["timeouts"] = {**data.get("timeouts", {}), "startup_s": 1200}
    config = write_config(base, data, "attach.yaml")
    urls = {n: f"http://127.0.0.1:{_closed_port()}" for n in ("prefill", "decode")}
    # endpoints that stop answering after the CLI's connect check (which alone would refuse them):
    # the attached backend's own bound ends the wait
    monkeypatch.setattr("rig.cli.run.check_answering", lambda urls, **_: None)
    rc = cli.main(["e2e", "-c", str(config), "--attach",
                   *[a for n, u in urls.items() for a in ("--endpoint", f"{n}={u}")]])
    err = capsys.readouterr().err
    assert rc == 3
    report = json.loads(max((base / "runs").glob("*/report.json")).read_text())
    assert "no scenario could run" in report["error"]
    for name, url in urls.items():
        assert f"{name} at {url} (attached: the rig did not start it) does not answer" in report["error"]
    assert "phase 1: waiting for decode, prefill" in err
    assert "starting" not in err, err


def test_attach_connect_s_null_waits_for_the_first_answer_up_to_the_ceiling(tmp_path):
    """``attach.connect_s: null`` (the Kubernetes Job, whose pods start with it): an endpoint that
    does not answer yet is waited for until ``timeouts.startup_s``, not given up early."""
    url = f"http://127.0.0.1:{_closed_port()}"
    with Cluster(_attached_plan(tmp_path, {"decode": url}), 3, 3, attach=True, attach_connect_s=None) as cluster, \
            pytest.raises(ClusterError) as e:
        cluster.start(["decode"])
    assert f"decode at {url} (attached: the rig did not start it) did not answer /health" in str(e.value)
    assert "within 3 s (timeouts.startup_s; last: GET" in str(e.value) and "does not answer" not in str(e.value)

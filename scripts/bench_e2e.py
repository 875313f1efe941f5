#!/usr/bin/env python3
"""Benchmark of the live suite against the floor it cannot beat (not a test).

1. **Bare start-up** of one P+D pair: the first prefill and decode of the config's plan spawned
   from their argv/env (pinned as the plan says), timed to ``/health`` + ``/v1/models``, then
   stopped. No rig logic (no port checks, warm-up, log marks). Also the CPU seconds each
   instance's process tree burned to get ready, sampled from ``/proc``, so the floor of a
   perfectly parallel start-up of the suite's instances over the host's CPUs can be stated:
   ``sum(CPU-s of every instance the suite starts) / CPUs``.
2. **The suite** (``pdrig e2e``, default the edge suite) ``--repeats`` times, each in its own
   process and run root. Per repeat: wall seconds and the ratio wall / bare start-up, the
   rig's own phase timings, the time to verdict of every stalled request of an XFAIL scenario
   (``verdict_after_s``: from sending the decode hop to the stall verdict) and which evidence
   decided it (early reasoning or the window), and the false stalls: stalled requests of a
   scenario without a known issue (a control).

Prints min/median/max and writes everything (with the load average before and after) as JSON
for comparison across commits. The box is shared: read ratios measured within one run, and the
load average next to them. Every live server is started by this script's children; run it
under ``/work/bin/live`` on the team box (``make bench``).

    .venv/bin/python scripts/bench_e2e.py --repeats 3
    .venv/bin/python scripts/bench_e2e.py --repeats 20 --skip-bare --out runs/bench/e2e-20.json
    .venv/bin/python scripts/bench_e2e.py --combine runs/bench/b1.json runs/bench/b2.json --out all.json

On a shared box the live lock is held for one batch at a time: ``--budget-min`` (default 9)
starts no repeat that would end past that many minutes, and ``--combine`` merges the JSONs of
several batches (each repeat keeps the ratio to its own batch's bare start-up).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# ------------------------------------------------------------------ pure analysis (tested)


def spread(values: list[float]) -> dict[str, float] | None:
    """``{min, median, max, n}`` of ``values`` (None when empty)."""
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def analyse_report(report: dict[str, Any]) -> dict[str, Any]:
    """The figures of one ``report.json`` of ``pdrig e2e``.

    ``ttv``: ``{scenario: [seconds, ...]}`` time to verdict of each stalled request of an XFAIL
    scenario; ``decided``: ``{scenario: ["early" | "window", ...]}`` alongside; ``false_stalls``:
    ``["scenario/request", ...]`` stalled requests of scenarios that declare no known issue;
    ``verdicts``: ``{scenario: verdict}``; ``timings``: the rig's own (seconds)."""
    ttv: dict[str, list[float]] = {}
    decided: dict[str, list[str]] = {}
    false_stalls: list[str] = []
    verdicts: dict[str, str] = {}
    declared = {s["name"]: s.get("known_issue") is not None for s in (report.get("config") or {}).get("scenarios", [])}
    for sc in report.get("scenarios", []):
        v, obs = sc["verdict"], sc.get("observation") or {}
        name = v["scenario"]
        verdicts[name] = v["verdict"]
        known = declared.get(name, False)
        for rec in obs.get("records", []):
            if rec.get("outcome") != "stalled":
                continue
            if not known:
                false_stalls.append(f"{name}/{rec['request_id']}")
            elif v["verdict"] == "XFAIL" and rec.get("verdict_after_s") is not None:
                ttv.setdefault(name, []).append(rec["verdict_after_s"])
                decided.setdefault(name, []).append("early" if "decided early" in rec.get("diagnosis", "")
                                                    else "window")
    return {"status": report.get("status"), "timings": report.get("timings", {}), "verdicts": verdicts,
            "ttv": ttv, "decided": decided, "false_stalls": false_stalls}


def summarise(bare: dict[str, Any] | None, repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """Spreads across repeats: suite wall, ratio wall / bare pair start-up (when measured),
    time to verdict per XFAIL scenario, the false-stall total and the verdicts that varied."""
    walls = [r["wall_s"] for r in repeats]
    out: dict[str, Any] = {"suite_wall_s": spread(walls),
                           "false_stalls": sum(len(r["false_stalls"]) for r in repeats),
                           "runs_not_passed": [i for i, r in enumerate(repeats) if r["status"] != "passed"]}
    if bare is not None:
        out["ratio_wall_to_pair_startup"] = spread([w / bare["pair_ready_s"] for w in walls])
    elif all("ratio_to_pair" in r for r in repeats):  # combined batches: each to its own bare start-up
        out["ratio_wall_to_pair_startup"] = spread([r["ratio_to_pair"] for r in repeats])
    # Where the wall goes: the rig's own timings, and what is left beyond the start-ups.
    keys = sorted({k for r in repeats for k in r.get("timings", {})})
    out["timings_s"] = {k: spread([r["timings"][k] for r in repeats if k in r.get("timings", {})]) for k in keys}
    out["beyond_startup_s"] = spread([r["wall_s"] - sum(v for k, v in r.get("timings", {}).items()
                                                        if k.startswith("startup")) for r in repeats])
    names = sorted({n for r in repeats for n in r["ttv"]})
    out["ttv_s"] = {n: spread([t for r in repeats for t in r["ttv"].get(n, [])]) for n in names}
    out["decided"] = {n: {k: sum(r["decided"].get(n, []).count(k) for r in repeats) for k in ("early", "window")}
                      for n in names}
    seen: dict[str, set[str]] = {}
    for r in repeats:
        for n, v in r["verdicts"].items():
            seen.setdefault(n, set()).add(v)
    out["verdicts"] = {n: sorted(v) for n, v in seen.items()}
    return out


def summarise_layouts(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Bare P+D start-ups per process layout (``samples``: ``{layout, pair_ready_s, load_before,
    load_after, cpu_s}`` each, in run order): per layout the spread of the pair's seconds to ready
    and of the 1-minute load before each start, and ``ratio_medians``: each layout's median over
    the last layout's (``production`` last: fast / production)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for sm in samples:
        by.setdefault(sm["layout"], []).append(sm)
    out: dict[str, Any] = {lay: {"pair_ready_s": spread([x["pair_ready_s"] for x in xs]),
                                 "load_before": spread([x["load_before"] for x in xs]),
                                 "cpu_s": spread([sum(x["cpu_s"].values()) for x in xs])} for lay, xs in by.items()}
    if len(by) > 1:
        base = out[list(by)[-1]]["pair_ready_s"]["median"]
        out["ratio_medians"] = {lay: out[lay]["pair_ready_s"]["median"] / base for lay in by}
    return out


def layout_startups(config: str, overrides: list[str], work: Path, layouts: list[str], n: int) -> list[dict[str, Any]]:
    """``n`` bare P+D start-ups per layout of ``layouts`` (``launch.layout``), alternated (round i
    runs the layouts in order when i is even, reversed when odd, so neither always starts on the
    quieter box); each sample with the 1-minute load before and after it."""
    samples = []
    for i in range(n):
        for lay in (layouts if i % 2 == 0 else layouts[::-1]):
            before = os.getloadavg()[0]
            b = bare_startup(config, [*overrides, f"launch.layout={lay}"], work, label=f"bare-{lay}-{i + 1}")
            samples.append({"layout": lay, "round": i + 1, "pair_ready_s": b["pair_ready_s"], "ready_s": b["ready_s"],
                            "cpu_s": b["cpu_s"], "load_before": before, "load_after": os.getloadavg()[0],
                            **{k: b[k] for k in ("zygote_s", "zygote_cpu_s", "pair_ready_after_zygote_s") if k in b}})
            zyg = (f" (zygote imports {b['zygote_s']:.1f} s / {b['zygote_cpu_s']:.1f} CPU-s, then the pair "
                   f"{b['pair_ready_after_zygote_s']:.1f} s)" if "zygote_s" in b else "")
            print(f"bare P+D, launch.layout={lay} (round {i + 1}): {b['pair_ready_s']:.1f} s{zyg}, CPU-s {b['cpu_s']}, "
                  f"load {before:.2f} -> {samples[-1]['load_after']:.2f}", flush=True)
    return samples


def floor_of(bare: dict[str, Any], n_prefill: int, n_decode: int, cpus: int) -> dict[str, float]:
    """The start-up floor of a suite starting ``n_prefill`` P and ``n_decode`` D instances like
    the measured ones on ``cpus`` CPUs, perfectly parallel (CPU-bound: CPU-s / CPUs), in seconds
    and as a ratio to the measured pair start-up."""
    cpu_s = n_prefill * bare["cpu_s"]["prefill"] + n_decode * bare["cpu_s"]["decode"]
    return {"suite_startup_cpu_s": cpu_s, "cpus": cpus, "parallel_floor_s": cpu_s / cpus,
            "floor_ratio": cpu_s / cpus / bare["pair_ready_s"]}


# ------------------------------------------------------------------ live parts


def _tree_cpu(pid: int, seen: dict[int, float]) -> None:
    """Record the CPU seconds (user + system) of ``pid`` and its descendants into ``seen``
    (pid -> latest value, so a child that exits keeps its last reading)."""
    import psutil

    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return
    for p in procs:
        try:
            t = p.cpu_times()
            seen[p.pid] = t.user + t.system
        except psutil.Error:
            continue


def bare_startup(config: str, overrides: list[str], work: Path, names: list[str] | None = None,
                 pin: bool = True, timeout_s: float = 300, python: str = sys.executable,
                 label: str = "") -> dict[str, Any]:
    """Spawn instances of the plan together (default: the first P and D, keyed ``prefill`` and
    ``decode``; else ``names``), pinned as the plan says unless ``pin`` is False, wait until all
    answer, stop them. ``python`` is the interpreter put into ``launch.command`` (a build's);
    the logs go under ``work/<label or bare or bare-all>/logs``.

    With ``launch.layout: zygote`` the instances are forked from the fork server
    (rig.cluster.zygote), started first: ``pair_ready_s`` counts from its start (its imports
    included), ``zygote_s`` is its imports alone, ``pair_ready_after_zygote_s`` counts from the
    forks, and ``zygote_cpu_s`` is its own CPU-s (shared by every instance of a deployment).

    Returns ``{ready_s: {key: s}, pair_ready_s (the last ready), cpu_s: {key: CPU-s to ready}}``.
    Raises RuntimeError when one exits or is not ready within ``timeout_s``; nothing outlives it."""
    import httpx

    from rig.cluster.backends.local import start_zygote, zygote_hooks
    from rig.cluster.mooncake import master_binary
    from rig.config import load_config
    from rig.plan.processes import build_plan
    from rig.run.runner import resolve_model

    cfg = load_config(config, overrides)
    run_dir = work / (label or ("bare" if names is None else "bare-all"))
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    plan = build_plan(cfg, run_dir, resolve_model(cfg), python, master_binary(cfg))
    specs = ({"prefill": plan.by_name(cfg.prefill[0].name), "decode": plan.by_name(cfg.decode[0].name)}
             if names is None else {n: plan.by_name(n) for n in names})
    procs: dict[str, Any] = {}
    cpu: dict[str, dict[int, float]] = {role: {} for role in specs}
    ready: dict[str, float] = {}
    zygote, extra = None, {}
    try:
        t0 = time.monotonic()
        if plan.layout.startswith("zygote"):
            zygote = start_zygote(plan, None)
            extra["zygote_s"] = zygote.wait_ready(timeout_s)
        t_fork = time.monotonic()
        for role, spec in specs.items():
            for path, content in spec.files.items():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(content)
            for d in spec.dirs:
                Path(d).mkdir(parents=True, exist_ok=True)
            if zygote is not None:
                procs[role] = zygote.spawn(list(spec.argv), {**os.environ, **spec.env}, spec.log_path,
                                           spec.cpus if pin else (), hooks=zygote_hooks(plan))
                continue
            with open(spec.log_path, "ab") as log:
                procs[role] = subprocess.Popen(list(spec.argv), env={**os.environ, **spec.env}, stdout=log,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True)
            if spec.cpus and pin:
                os.sched_setaffinity(procs[role].pid, set(spec.cpus))
        with httpx.Client(timeout=2.0) as http:
            while len(ready) < len(specs):
                for role, spec in specs.items():
                    _tree_cpu(procs[role].pid, cpu[role])
                    if role in ready:
                        continue
                    if procs[role].poll() is not None:
                        raise RuntimeError(f"{spec.name} exited with {procs[role].returncode}; see {spec.log_path}")
                    try:
                        ok = (http.get(spec.base_url + spec.health_path).status_code == 200
                              and http.get(spec.base_url + "/v1/models").status_code == 200)
                    except httpx.HTTPError:
                        ok = False
                    if ok:
                        ready[role] = time.monotonic() - t0
                if time.monotonic() - t0 > timeout_s:
                    raise RuntimeError(f"not ready within {timeout_s:.0f} s: {sorted(set(specs) - set(ready))}")
                time.sleep(0.25)
                if zygote is not None:
                    extra["zygote_cpu_s"] = round(_own_cpu(zygote.pid), 2)
    finally:
        _stop(list(procs.values()))
        if zygote is not None:
            zygote.close()
    if zygote is not None:
        extra["pair_ready_after_zygote_s"] = max(ready.values()) - (t_fork - t0)
    return {"ready_s": ready, "pair_ready_s": max(ready.values()),
            "cpu_s": {role: round(sum(seen.values()), 2) for role, seen in cpu.items()}, **extra}


def _own_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` alone (0.0 when gone)."""
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


def _stop(procs: list[Any], grace_s: float = 10.0) -> None:
    """SIGTERM every process group, SIGKILL what is left after ``grace_s``."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)


def run_suite(config: str, overrides: list[str], scenarios: list[str], root: Path) -> dict[str, Any]:
    """One ``pdrig e2e`` in a child process with its own run root; its figures plus ``wall_s``."""
    cmd = [sys.executable, "-m", "rig.cli", "e2e", "--config", config, "--quiet", "--set", f"run_root={root}"]
    for o in overrides:
        cmd += ["--set", o]
    for s in scenarios:
        cmd += ["--scenario", s]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    reports = sorted(root.glob("*/report.json"))
    if not reports:
        return {"status": "no report", "exit": proc.returncode, "stderr": proc.stderr[-2000:], "wall_s": wall,
                "timings": {}, "verdicts": {}, "ttv": {}, "decided": {}, "false_stalls": []}
    out = analyse_report(json.loads(reports[-1].read_text()))
    return {**out, "exit": proc.returncode, "wall_s": wall, "run_dir": str(reports[-1].parent)}


def _fmt(s: dict[str, float] | None, unit: str = "") -> str:
    if not s:
        return "-"
    return f"min {s['min']:.2f}{unit} median {s['median']:.2f}{unit} max {s['max']:.2f}{unit} (n={s['n']})"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 0 (a benchmark reports, it does not judge)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/cpu-tiny.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE")
    ap.add_argument("--scenario", action="append", default=[], help="only these scenarios (repeatable)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-bare", action="store_true", help="no bare start-up (no ratios)")
    ap.add_argument("--bare-all", action="store_true",
                    help="also start every instance the suite uses at once, unpinned (both CPUs): the "
                         "measured floor of a parallel start-up")
    ap.add_argument("--alternate", metavar="PATH=VALUE",
                    help="odd repeats (1st, 3rd, ...) with this extra override: a before/after within one "
                         "run, summarised per variant (e.g. launch.start_all_at_once=false)")
    ap.add_argument("--layouts", metavar="A,B",
                    help="bare P+D start-up per launch.layout (e.g. fast,production), --repeats each, alternated, "
                         "then the suite repeats alternate the layouts too (summarised per layout)")
    ap.add_argument("--budget-min", type=float, default=9.0,
                    help="start no repeat that would end past this many minutes (the live lock is shared)")
    ap.add_argument("--combine", nargs="+", metavar="JSON", help="merge the JSONs of earlier batches, run nothing")
    ap.add_argument("--out", help="JSON output (default runs/bench/e2e-<stamp>.json)")
    args = ap.parse_args(argv)
    if args.combine:
        return combine(args.combine, args.out)
    from rig.config import load_config

    cfg = load_config(args.config, args.overrides)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    work = ROOT / "runs" / "bench" / f"e2e-{stamp}"
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                              "command": " ".join([Path(sys.executable).name, *sys.argv]),
                              "config": args.config, "overrides": args.overrides, "cpus": os.cpu_count(),
                              "loadavg_before": os.getloadavg()}
    bare = None
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()] if args.layouts else []
    if layouts:
        result["layout_startups"] = layout_startups(args.config, args.overrides, work, layouts, args.repeats)
        result["layout_summary"] = summarise_layouts(result["layout_startups"])
        args.skip_bare = True  # the ratios are per layout (below)
    if not args.skip_bare:
        bare = bare_startup(args.config, args.overrides, work)
        print(f"bare P+D start-up: {bare['pair_ready_s']:.1f} s (P {bare['ready_s']['prefill']:.1f}, "
              f"D {bare['ready_s']['decode']:.1f}); CPU-s to ready: P {bare['cpu_s']['prefill']:.1f}, "
              f"D {bare['cpu_s']['decode']:.1f}", flush=True)
        scen = [s for s in cfg.scenarios if not args.scenario or s.name in args.scenario]
        n_dec = len({s.decode or cfg.decode[0].name for s in scen})
        n_pre = len({s.prefill or cfg.prefill[0].name for s in scen})
        result["floor"] = floor_of(bare, n_pre, n_dec, len(os.sched_getaffinity(0)))
        if args.bare_all:
            names = sorted({s.prefill or cfg.prefill[0].name for s in scen}
                           | {s.decode or cfg.decode[0].name for s in scen})
            every = bare_startup(args.config, args.overrides, work, names=names, pin=False)
            result["bare_all"] = {**every, "ratio_to_pair": every["pair_ready_s"] / bare["pair_ready_s"]}
            print(f"every instance at once, unpinned ({', '.join(names)}): {every['pair_ready_s']:.1f} s = "
                  f"{result['bare_all']['ratio_to_pair']:.2f}x the pair; CPU-s {every['cpu_s']}", flush=True)
    result["bare"] = bare
    repeats: list[dict[str, Any]] = []
    t_start = time.monotonic()
    for i in range(args.repeats):
        longest = max((r["wall_s"] for r in repeats), default=0.0)
        if time.monotonic() - t_start + longest > args.budget_min * 60:
            print(f"stopping after {i} repeats: another would end past --budget-min {args.budget_min:g}", flush=True)
            break
        variant = [args.alternate] if args.alternate and i % 2 == 0 else []
        if layouts:
            variant = [f"launch.layout={layouts[i % len(layouts)]}"]
        r = run_suite(args.config, args.overrides + variant, args.scenario, work / f"repeat-{i + 1}")
        r["variant"] = variant[0] if variant else "as configured"
        if bare:
            r["ratio_to_pair"] = r["wall_s"] / bare["pair_ready_s"]
        repeats.append(r)
        ratio = f", {r['wall_s'] / bare['pair_ready_s']:.2f}x the pair start-up" if bare else ""
        print(f"repeat {i + 1}/{args.repeats}: {r['status']} in {r['wall_s']:.1f} s{ratio}; "
              f"ttv {r['ttv']} ({r['decided']}); false stalls {r['false_stalls'] or 0}", flush=True)
    result["repeats"] = repeats
    result["summary"] = summarise(bare, repeats)
    if args.alternate or layouts:
        result["summary_by_variant"] = {v: summarise(bare, [r for r in repeats if r["variant"] == v])
                                        for v in dict.fromkeys(r["variant"] for r in repeats)}
    result["loadavg_after"] = os.getloadavg()
    _print_summary(result)
    return _write(result, Path(args.out) if args.out else work.with_suffix(".json"))


def _print_summary(result: dict[str, Any]) -> None:
    for lay, ls in result.get("layout_summary", {}).items():
        if lay != "ratio_medians":
            print(f"bare P+D launch.layout={lay}: {_fmt(ls['pair_ready_s'], ' s')}; load before "
                  f"{_fmt(ls['load_before'])}; CPU-s {_fmt(ls['cpu_s'])}")
    if "ratio_medians" in result.get("layout_summary", {}):
        print("median start-up ratio: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                     result["layout_summary"]["ratio_medians"].items()))
    for variant, vs in result.get("summary_by_variant", {}).items():
        ratio = _fmt(vs.get("ratio_wall_to_pair_startup"))
        print(f"\n{variant}: suite wall {_fmt(vs['suite_wall_s'], ' s')}; ratio {ratio}")
        for k, t in vs["timings_s"].items():
            print(f"  {k}: {_fmt(t, ' s')}")
    s = result["summary"]
    print(f"\nsuite wall: {_fmt(s['suite_wall_s'], ' s')}")
    if s.get("ratio_wall_to_pair_startup"):
        print(f"ratio wall / pair start-up: {_fmt(s['ratio_wall_to_pair_startup'])}")
    if result.get("floor"):
        fl = result["floor"]
        print(f"start-up floor: {fl['suite_startup_cpu_s']:.0f} CPU-s over {fl['cpus']} CPUs = "
              f"{fl['parallel_floor_s']:.1f} s = {fl['floor_ratio']:.2f}x the pair start-up")
    for k, t in s.get("timings_s", {}).items():
        print(f"  {k}: {_fmt(t, ' s')}")
    print(f"  beyond the start-ups: {_fmt(s.get('beyond_startup_s'), ' s')}")
    for n, t in s["ttv_s"].items():
        print(f"time to verdict {n}: {_fmt(t, ' s')}; decided {s['decided'][n]}")
    print(f"false stalls: {s['false_stalls']} over {s['suite_wall_s']['n'] if s['suite_wall_s'] else 0} repeats; "
          f"runs not passed: {s['runs_not_passed']}")
    for b in result.get("batches", [result]):
        print(f"load average before {b.get('loadavg_before')}, after {b.get('loadavg_after')} ({b.get('date')})")


def _write(result: dict[str, Any], out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


def combine(paths: list[str], out: str | None) -> int:
    """Merge batch JSONs: repeats concatenated (each keeps its ``ratio_to_pair`` to its own
    batch's bare start-up), the summary recomputed over all of them; the batches' dates,
    commands, bare start-ups, floors and load averages kept under ``batches``."""
    batches = [json.loads(Path(p).read_text()) for p in paths]
    for b in batches:  # JSONs written before repeats carried their ratio
        for r in b["repeats"]:
            if "ratio_to_pair" not in r and b.get("bare"):
                r["ratio_to_pair"] = r["wall_s"] / b["bare"]["pair_ready_s"]
    repeats = [r for b in batches for r in b["repeats"]]
    result = {"combined": paths, "date": datetime.now(UTC).isoformat(timespec="seconds"),
              "batches": [{k: b.get(k) for k in ("date", "command", "loadavg_before", "loadavg_after", "bare",
                                                 "floor", "bare_all")} | {"repeats": len(b["repeats"])}
                          for b in batches],
              "repeats": repeats, "summary": summarise(None, repeats)}
    _print_summary(result)
    return _write(result, Path(out) if out else Path(paths[-1]).with_name("combined.json"))


if __name__ == "__main__":
    sys.exit(main())

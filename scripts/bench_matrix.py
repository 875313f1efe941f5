#!/usr/bin/env python3
"""Benchmark of ``pdrig matrix``: time per build against one P+D start-up of that build plus its
scenarios (not a test).

For each build (in order): the bare start-up of one P+D pair with the build's interpreter
(:func:`bench_e2e.bare_startup`: plan argv, pinned as configured, to ``/health`` +
``/v1/models``), then one ``pdrig matrix --builds ...`` over all of them in a child process.
Per build: the wall of its suite run (its ``report.json`` ``timings.total``), the sum of its
scenarios' own wall (``observation.wall_s``) and

    ratio = suite run / (bare pair start-up of the build + its scenarios)

whose goal is <= 1.5 for every build after the first. Writes a JSON (with the load
average before and after) and prints a table. Starts live servers: run it under
``/work/bin/live`` on the team box.

    .venv/bin/python scripts/bench_matrix.py --builds 0.31.0,0.32.0 --suite edge
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def per_build(report: dict[str, Any], pair_ready_s: float) -> dict[str, Any]:
    """The figures of one build's suite run: ``run_s`` (timings.total), ``scenarios_s`` (sum of
    the scenarios' wall), ``pair_ready_s`` (bare start-up of that build), ``ratio`` =
    run / (pair start-up + scenarios), ``startup_s`` (the run's own start-up timings summed)
    and its status. Seconds throughout."""
    timings = report.get("timings", {})
    run_s = timings.get("total", 0.0)
    scen = sum((s.get("observation") or {}).get("wall_s") or 0.0 for s in report.get("scenarios", []))
    return {"status": report.get("status"), "run_s": run_s, "scenarios_s": scen, "pair_ready_s": pair_ready_s,
            "startup_s": sum(v for k, v in timings.items() if k.startswith("startup")),
            "ratio": run_s / (pair_ready_s + scen) if pair_ready_s + scen > 0 else None}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 0 (a benchmark reports, it does not judge)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--builds", required=True, help="comma-separated build names (configs/builds.yaml)")
    ap.add_argument("--suite", default="edge")
    ap.add_argument("--config", default="configs/cpu-tiny.yaml")
    ap.add_argument("--builds-dir", help="where build envs live (default $PDRIG_BUILDS_DIR or .cache/builds)")
    ap.add_argument("--out", help="JSON output (default runs/bench/matrix-<stamp>.json)")
    args = ap.parse_args(argv)
    from bench_e2e import bare_startup

    from rig.cluster.builds import DEFAULT_BUILDS_FILE, Builder, builds_dir, load_builds
    from rig.config.schema import load_config
    from rig.run.matrix import suite_spec

    builds = [b.strip() for b in args.builds.split(",") if b.strip()]
    files = load_builds(str(DEFAULT_BUILDS_FILE))
    overrides = [f"suite={suite_spec(files, args.suite).file}", *suite_spec(files, args.suite).set]
    builder = Builder(files, builds_dir(args.builds_dir), load_config(args.config, overrides).device)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    work = ROOT / "runs" / "bench" / f"matrix-{stamp}"
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                              "command": " ".join([Path(sys.executable).name, *sys.argv]), "builds": builds,
                              "suite": args.suite, "loadavg_before": os.getloadavg(), "bare": {}}
    for b in builds:
        bare = bare_startup(args.config, overrides, work, python=str(builder.python(b)), label=f"bare-{b}")
        result["bare"][b] = bare
        print(f"{b}: bare P+D start-up {bare['pair_ready_s']:.1f} s; CPU-s P {bare['cpu_s']['prefill']:.1f} "
              f"D {bare['cpu_s']['decode']:.1f}", flush=True)
    cmd = [sys.executable, "-m", "rig.cli", "matrix", "--builds", ",".join(builds), "--suite", args.suite,
           "--config", args.config, "--out", str(work / "matrix"), "--quiet"]
    if args.builds_dir:
        cmd += ["--builds-dir", args.builds_dir]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)  # a failed cell is a figure, not an error
    result["matrix_wall_s"] = time.monotonic() - t0
    result["matrix_exit"] = proc.returncode
    result["per_build"] = {}
    for b in builds:
        rep = work / "matrix" / b / Path(suite_spec(files, args.suite).file).stem / "report.json"
        if not rep.exists():
            rep = next((work / "matrix" / b).glob("*/report.json"), rep)
        if rep.exists():
            result["per_build"][b] = per_build(json.loads(rep.read_text()), result["bare"][b]["pair_ready_s"])
        else:
            result["per_build"][b] = {"status": "no report", "stderr": proc.stderr[-2000:]}
    result["loadavg_after"] = os.getloadavg()
    print(f"\nmatrix of {len(builds)} builds ({args.suite}): {result['matrix_wall_s']:.1f} s (exit {proc.returncode})")
    print("build | status | suite run s | pair start-up s | scenarios s | run / (start-up + scenarios)")
    for b, f in result["per_build"].items():
        if f.get("ratio") is None:
            print(f"{b} | {f['status']} | - | - | - | -")
            continue
        print(f"{b} | {f['status']} | {f['run_s']:.1f} | {f['pair_ready_s']:.1f} | {f['scenarios_s']:.1f} | "
              f"{f['ratio']:.2f}x")
    print(f"load average before {result['loadavg_before']}, after {result['loadavg_after']}")
    out = Path(args.out) if args.out else work.with_suffix(".json")
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

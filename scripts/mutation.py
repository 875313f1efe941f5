"""`make mutation`: mutation testing of rig/judge and rig/observe with mutmut 3, a score per module,
the survivors, and a committed baseline of the survivors judged equivalent.

mutmut 3 copies the tree to ``mutants/``, records in a first pass which tests (of
``[tool.mutmut] pytest_add_cli_args_test_selection`` in pyproject.toml: the fast unit tests) cover
each function, then runs each mutant against those tests only. This script runs it (``--modules``
limits it to some modules: ``judge.verdict,observe.stall``), reads the results from
``mutants/**/*.py.meta``, and compares the survivors with the baseline
(``tests/data/mutation_baseline.yaml``): a survivor not in the baseline is new, and the script exits
1 naming it with its diff. A baseline entry is keyed by the mutated function and the changed
lines (not mutmut's numbering, which shifts when code is added), with a one-line reason why the
mutant is equivalent (no test could tell it from the original).

Statuses are mutmut's (mutmut/stats.py): killed (a test failed), survived (every covering test
passed), no tests (no fast test reaches the function: counted as a survivor), timeout (counted as
killed: the mutant made a test hang), suspicious, skipped.

Writes ``runs/mutation/report.md`` and ``report.json`` (the table and every survivor's diff).
Exit: 0 when every survivor is in the baseline and every mutant ran, 1 when a survivor is not in
the baseline or a mutant was not run, 2 when mutmut failed. Baseline entries of the modules run
that matched no survivor are listed as stale (the code under them changed), without failing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "tests" / "data" / "mutation_baseline.yaml"
PACKAGES = ("rig/judge", "rig/observe")
# mutmut's exit codes per mutant (mutmut/stats.py status_by_exit_code)
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          35: "suspicious", 36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", -9: "killed (signal)",
          37: "caught by type check", None: "not checked"}
UNDETECTED = ("survived", "no tests")


def module_of(mutant: str) -> str:
    """``rig.judge.checks.x_fn__mutmut_3`` -> ``rig.judge.checks``."""
    head = mutant.split("__mutmut_")[0]
    return head.rsplit(".", 1)[0]


def function_of(mutant: str) -> str:
    """``rig.judge.checks.x_fn__mutmut_3`` -> ``rig.judge.checks.fn`` (a method: ``xǁClsǁm`` ->
    ``Cls.m``)."""
    head = mutant.split("__mutmut_")[0]
    mod, fn = head.rsplit(".", 1)
    fn = fn[2:] if fn.startswith("x_") else fn
    if fn.startswith("xǁ"):
        fn = ".".join(p for p in fn[2:].split("ǁ") if p)
    return f"{mod}.{fn}"


def changed_lines(diff: str) -> tuple[str, str]:
    """``(removed, added)`` lines of a mutant's unified diff, each stripped and joined by ' / '."""
    minus = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    plus = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    return " / ".join(minus), " / ".join(plus)


def selected(modules: list[str]) -> list[str]:
    """The module paths (``rig/judge/checks.py``) ``--modules`` names (``judge.checks`` or a path),
    every module of :data:`PACKAGES` when empty. Raises SystemExit naming an unknown module."""
    every = sorted(str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).glob("*.py")
                   if p.name != "__init__.py")
    if not modules:
        return every
    out = []
    for name in modules:
        path = name if name.endswith(".py") else "rig/" + name.removeprefix("rig.").replace(".", "/") + ".py"
        if path not in every:
            raise SystemExit(f"MODULES: no module {name!r} under {', '.join(PACKAGES)}; "
                             f"give e.g. judge.verdict or rig/observe/stall.py")
        out.append(path)
    return out


def read_results(paths: list[str]) -> dict[str, dict[str, int | None]]:
    """``{module path: {mutant name: exit code}}`` from mutmut's ``mutants/<path>.meta`` files."""
    out = {}
    for p in paths:
        meta = ROOT / "mutants" / (p + ".meta")
        for _ in range(50):  # mutmut rewrites a .meta while it runs: read a whole one
            try:
                out[p] = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
                break
            except json.JSONDecodeError:
                time.sleep(0.1)
        else:
            raise SystemExit(f"{meta}: not readable JSON")
    return out


def diff_of(mutant: str, path: str) -> str:
    """The unified diff of ``mutant`` of module ``path`` (mutmut's own, read in the ``mutants/`` tree)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    return get_diff_for_mutant(mutant, path=Path(path))


def load_baseline(path: Path) -> list[dict[str, str]]:
    """The baseline entries: ``{function, removed, added, reason}`` each. Raises SystemExit on an
    entry without a reason."""
    if not path.exists():
        return []
    entries = yaml.safe_load(path.read_text()) or []
    for e in entries:
        if not str(e.get("reason", "")).strip():
            raise SystemExit(f"{path}: entry {e.get('function')} has no reason: say why the mutant is equivalent")
    return entries


def key(e: dict[str, str]) -> tuple[str, str, str]:
    return e["function"], e["removed"], e["added"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", default=os.environ.get("MODULES", ""),
                    help="comma-separated modules (judge.verdict,observe.stall); default every module")
    ap.add_argument("--baseline", type=Path, default=BASELINE)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "mutation")
    ap.add_argument("--keep", action="store_true", help="reuse mutants/ (mutmut re-runs only changed functions)")
    ap.add_argument("--no-run", action="store_true", help="only read the results of the last run")
    ap.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args(argv)
    paths = selected([m for m in args.modules.split(",") if m.strip()])
    os.chdir(ROOT)
    t0 = time.monotonic()
    if not args.no_run:
        if not args.keep:
            shutil.rmtree(ROOT / "mutants", ignore_errors=True)
        globs = [p[:-3].replace("/", ".") + ".*" for p in paths]
        cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.max_children), *globs]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        print("$", " ".join(cmd), flush=True)
        rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode
        if rc != 0:
            print(f"mutmut exited {rc}", file=sys.stderr)
            return 2
    took = time.monotonic() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # mutmut and the forks it waited for
    cpu = usage.ru_utime + usage.ru_stime
    results = read_results(paths)
    baseline = load_baseline(args.baseline)
    known = {key(e): e for e in baseline}
    rows, survivors = [], []
    for p, codes in results.items():
        statuses = [STATUS.get(c, "suspicious") for c in codes.values()]
        killed = sum(s.startswith("killed") or s in ("timeout", "caught by type check") for s in statuses)
        undetected = sum(s in UNDETECTED for s in statuses)
        unrun = sum(s == "not checked" for s in statuses)
        rows.append({"module": p, "mutants": len(codes), "killed": killed, "survived": undetected,
                     "not_run": unrun, "timeouts": sum(s == "timeout" for s in statuses),
                     "other": len(codes) - killed - undetected - unrun,
                     "score": round(100 * killed / max(1, killed + undetected), 1)})
        for name, code in sorted(codes.items()):
            if STATUS.get(code, "suspicious") not in UNDETECTED:
                continue
            diff = diff_of(name, p)
            removed, added = changed_lines(diff)
            entry = {"mutant": name, "function": function_of(name), "status": STATUS[code],
                     "removed": removed, "added": added, "diff": diff}
            base = known.get((entry["function"], removed, added))
            entry["reason"] = base["reason"] if base else ""
            survivors.append(entry)
    new = [s for s in survivors if not s["reason"]]
    # Baseline entries of the modules run that matched no survivor: code changed under them (an
    # entry whose lines are gone), listed so they are removed rather than kept with a stale reason.
    run_modules = {r["module"].removesuffix(".py").replace("/", ".") for r in rows}
    matched = {(s["function"], s["removed"], s["added"]) for s in survivors}
    stale = [e for e in baseline if key(e) not in matched
             and any(e["function"].startswith(m + ".") for m in run_modules)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps({"modules": rows, "survivors": survivors,
                                                      "seconds": round(took), "cpu_seconds": round(cpu)}, indent=1))
    lines = ["| module | mutants | killed (of which timeouts) | survived | not run | score |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['module']} | {r['mutants']} | {r['killed']} ({r['timeouts']}) | {r['survived']} | "
              f"{r['not_run']} | {r['score']} % |" for r in rows]
    tot_k, tot_s = sum(r["killed"] for r in rows), sum(r["survived"] for r in rows)
    lines.append(f"| total | {sum(r['mutants'] for r in rows)} | {tot_k} ({sum(r['timeouts'] for r in rows)}) | "
                 f"{tot_s} | {sum(r['not_run'] for r in rows)} | "
                 f"{round(100 * tot_k / max(1, tot_k + tot_s), 1)} % |")
    unrun = sum(r["not_run"] for r in rows)
    other = sum(r["other"] for r in rows)
    text = "\n".join(lines) + f"\n\n{len(survivors) - len(new)} survivor(s) in the baseline (equivalent), " \
        f"{len(new)} new; {unrun} mutant(s) not run; {other} suspicious or skipped (neither killed nor " \
        f"survived: mutmut's own status, e.g. a mutant that signalled the test process); " \
        f"{took:.0f} s wall, {cpu:.0f} s CPU\n"
    for e in stale:
        text += f"\nSTALE BASELINE ENTRY (matched no survivor): {e['function']}: {e['removed']!r} -> {e['added']!r}\n"
    for s in new:
        text += f"\nNEW SURVIVOR {s['mutant']} ({s['status']}):\n{s['diff']}\n"
    (args.out / "report.md").write_text(text)
    print(text)
    if new:
        print(f"{len(new)} survivor(s) not in {args.baseline}: kill each with a test that "
              "asserts the behaviour, or add it there with the reason it is equivalent", file=sys.stderr)
        return 1
    if unrun:
        print(f"{unrun} mutant(s) not run: a partial run proves nothing about them; run again without "
              "--no-run or after mutmut finished", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

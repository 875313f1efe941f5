#!/usr/bin/env python3
"""Place test files left in tests/ (tests/test_*.py) into the folders laid out like the code.

    python3 scripts/place_tests.py     # from the repository root; git mv's each file, then fix paths

Run it after merging a branch that added a test file at the top of tests/ (the layout: tests/README.md).

Each test file goes to the folder of the layer it tests (tests/<layer>/): the tests of
rig/<layer>/<module>.py are tests/<layer>/test_<module>.py, one test module per rig module. Whole-suite
runs against fake servers go to tests/fake/, live vLLM tests (the e2e marker) to tests/live/, checks
on the repository itself (docs, Makefile, CI, layers, schemas) to tests/repo/. Files not in PLACE are
placed by the name of the rig module they test, then by RULES on their name, and any file still
unplaced stops the script (name it in PLACE). Paths computed from __file__ gain one level;
"tests/test_x.py" mentions anywhere in the repository follow the move. A placed file that imports
another test module is named: its shared helpers belong in tests/helpers/ (``from tests.helpers.x import y``).
"""

import re
import subprocess
import sys
from pathlib import Path

PLACE = {
    "config": ["test_config.py", "test_config_help.py", "test_fault_spec.py", "test_sequence_spec.py",
               "test_request_fields.py", "test_extra_args_by_vllm.py", "test_profiles.py", "test_topology_variety.py",
               "test_pool_scenarios.py", "test_connectors.py", "test_routes.py"],
    "plan": ["test_plan_cpu.py", "test_plan_line.py", "test_compose.py", "test_k8s.py"],
    "cluster": ["test_ports.py", "test_startup.py", "test_start_all_at_once.py", "test_sigint.py", "test_logs.py",
                "test_builds.py", "test_mooncake.py", "test_attach.py", "test_containers.py",
                "test_request_schemas.py"],
    "transport": ["test_transport.py", "test_fast_transport.py", "test_generate_endpoint.py"],
    "observe": ["test_metrics.py", "test_stall.py", "test_parity.py", "test_stall_evidence.py",
                "test_death_summary.py", "test_drain.py", "test_endpoint_watch.py", "test_evidence.py",
                "test_observations.py", "test_progress.py", "test_store_metrics.py", "test_timeline.py"],
    "workload": ["test_engine.py", "test_waves.py", "test_store.py", "test_store_cancel.py", "test_retrieval.py",
                 "test_wave_refusal.py", "test_warmup_paths.py"],
    "judge": ["test_verdict.py", "test_verdict_kinds.py", "test_leak_signature.py", "test_preemption_check.py",
              "test_shared_params_signature.py", "test_early_verdict.py", "test_counter_rules.py",
              "test_counters.py", "test_cached_tokens.py", "test_survivor_errors.py",
              "test_prompt_source.py", "test_verdict_cases.py", "test_checks.py", "test_fault_checks.py",
              "test_sequence_checks.py", "test_signatures.py", "test_store_checks.py", "test_wave_checks.py"],
    "report": ["test_report.py", "test_report_legend.py", "test_grid.py"],
    "app": ["test_proxy.py", "test_pytest_plugin.py", "test_up.py", "test_bench_e2e.py", "test_bench_matrix.py",
            "test_hostruns.py"],
    "explore": ["test_explore_unit.py", "test_explore_sigint.py"],
    "fake": ["test_integration_fake.py", "test_faults_fake.py", "test_sequence_fake.py",
             "test_counters_generate_fake.py", "test_evidence_fake.py"],
    "repo": ["test_docs.py", "test_docs_links.py", "test_layers.py", "test_makefile.py", "test_ci_workflow.py",
             "test_schema.py", "test_bug_record.py", "test_mutation.py"],
}
RULES = [(r"_live\.py$", "live"), (r"_fake\.py$", "fake"),
         (r"^test_(config|plan|cluster|transport|observe|workload|judge|report|explore)_", None)]


def main() -> int:
    """Move every tests/test_*.py to its folder; 1 (and nothing moved) when one has no place."""
    root = Path.cwd()
    tests = root / "tests"
    where = {f: d for d, fs in PLACE.items() for f in fs}
    moves: dict[str, str] = {}
    unplaced = []
    for p in sorted(tests.glob("test_*.py")):
        d = where.get(p.name)
        if d is None:  # test_<module>.py: the layer of rig/<layer>/<module>.py, when one layer has it
            layers = sorted({m.parent.name for m in (root / "rig").glob(f"*/{p.name[len('test_'):]}")})
            d = layers[0] if len(layers) == 1 else None
        for rx, folder in RULES:
            m = re.search(rx, p.name)
            if d is None and m:
                d = folder or m.group(1)  # test_<layer>_*.py: that layer's folder
        if d is None:
            unplaced.append(p.name)
        else:
            moves[f"tests/{p.name}"] = f"tests/{d}/{p.name}"
    if unplaced:
        print("unplaced (add them to PLACE):", " ".join(unplaced))
        return 1
    if not moves:
        print("nothing to place: every test file is in its folder")
        return 0
    for old, new in moves.items():
        (root / new).parent.mkdir(exist_ok=True)
        subprocess.run(["git", "mv", old, new], check=True)
        p = root / new
        t = p.read_text()
        t = t.replace("Path(__file__).resolve().parents[1]", "Path(__file__).resolve().parents[2]")
        t = t.replace("Path(__file__).resolve().parent.parent", "Path(__file__).resolve().parents[2]")
        t = re.sub(r"Path\(__file__\)\.resolve\(\)\.parent(?=\s*/)", "Path(__file__).resolve().parents[1]", t)
        t = re.sub(r"Path\(__file__\)\.parent(?=\s*/)", "Path(__file__).resolve().parents[1]", t)
        p.write_text(t)
        borrowed = re.findall(r"^\s*from (?:tests\.)?(test_\w+|conftest) import", t, re.M)
        if borrowed:
            print(f"{new} imports from {', '.join(sorted(set(borrowed)))}: move what it borrows into tests/helpers/")
    # mentions of the old paths anywhere in the repository's text files
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
    pat = re.compile(r"(?<![\w/])(" + "|".join(re.escape(o) for o in moves) + r")(?![\w])")
    for f in files:
        fp = root / f
        if not fp.is_file() or fp.suffix not in (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", "") \
                and fp.name != "Makefile":
            continue
        try:
            t = fp.read_text()
        except UnicodeDecodeError:
            continue
        n = pat.sub(lambda m: moves[m.group(1)], t)
        if n != t:
            fp.write_text(n)
            print("paths updated:", f)
    for old, new in moves.items():
        print(f"{old} -> {new}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

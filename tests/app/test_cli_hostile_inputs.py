"""Hostile input, generated (Hypothesis): configs, `--set`s, histories and command-line arguments that
no valid run can come from. For each the rig must answer exit code 2 with one line on stderr, no
traceback, and create nothing in the working directory (a fresh temporary one per example) nor at
the filesystem root. The CLI runs in-process (``rig.cli.main``) for speed; a few real subprocess
runs check the same of the console entry point.

Every input is invalid by construction (a field given a NaN, a port outside 1-65535, bytes that are
not UTF-8, an alias bomb, ...), so no example can start a server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from tests.helpers.fake_rig import ROOT
from tests.helpers.hostile import base_config, in_fresh_dir, refused

# Bounded for `make test`: a few hundred examples over the tests below, reproducible (derandomize),
# no example database (database=None) and Hypothesis's own cache kept out of the repository.
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "pdrig-hypothesis"))
EXAMPLES = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

FLOAT_FIELDS = ["timeouts.startup_s", "timeouts.request_s", "timeouts.stall_window_s", "timeouts.drain_s",
                "timeouts.metrics_interval_s", "model.tiny.weight_std"]
PORT_FIELDS = ["prefill.0.port", "decode.0.port", "nixl.side_channel_base_port", "mooncake.rpc_port"]
COUNT_FIELDS = {"scenarios.0.concurrent": 256}
NOT_FINITE = st.sampled_from([".nan", ".NaN", ".inf", "-.inf", ".Inf"])
WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=12)
# YAML values that cannot parse, whatever word is put in them (letters only: no closing bracket or quote)
BROKEN_YAML = st.one_of(WORD.map(lambda w: f"[{w}"), WORD.map(lambda w: f"{{{w}"), WORD.map(lambda w: f"'{w}"),
                        WORD.map(lambda w: f'"{w}'), WORD.map(lambda w: f"{w}: x: y"), WORD.map(lambda w: f"*{w}"),
                        WORD.map(lambda w: f"&{w} [*{w}]"))


def write(d: Path, name: str, data: bytes | str) -> str:
    p = d / name
    (p.write_bytes if isinstance(data, bytes) else p.write_text)(data)
    return str(p)


# --- configs ---------------------------------------------------------------------------------------

def _non_utf8(text: str, at: int, junk: bytes) -> bytes:
    raw = text.encode()
    return raw[:at % len(raw)] + junk + raw[at % len(raw):]


def _duplicate(text: str, data: dict, pick: int) -> str:
    key = list(data)[pick % len(data)]
    return text + yaml.safe_dump({key: data[key]}, sort_keys=False)


def _bomb(text: str, width: int, depth: int) -> str:
    lines = ["bomb0: &b0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"bomb{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * width) + "]" for i in range(1, depth)]
    return text + "\n".join(lines) + "\n"


def _deep(text: str, depth: int) -> str:
    return text + "deep: " + "[" * depth + "]" * depth + "\n"


HOSTILE_CONFIG = st.one_of(
    st.tuples(st.just("non-utf8"), st.integers(0, 10_000), st.sampled_from([b"\xff", b"\xc3", b"\xe9\x00", b"\x80"])),
    st.tuples(st.just("duplicate"), st.integers(0, 50)),
    st.tuples(st.just("bomb"), st.integers(9, 30), st.integers(6, 9)),
    st.tuples(st.just("deep"), st.integers(65, 3000)),
    st.tuples(st.just("nul"), st.sampled_from(["name", "run_root", "cache_dir"])),
    st.tuples(st.just("top"), st.sampled_from(["- a\n- b\n", "42\n", "just words\n", "[1, 2]\n"])),
    st.tuples(st.just("float"), st.sampled_from(FLOAT_FIELDS),
              st.sampled_from([float("nan"), float("inf"), -float("inf")])),
)


def _hostile_config_file(d: Path, case: tuple) -> str:
    data = base_config(d)
    text = yaml.safe_dump(data, sort_keys=False)
    kind = case[0]
    if kind == "non-utf8":
        return write(d, "c.yaml", _non_utf8(text, case[1], case[2]))
    if kind == "duplicate":
        return write(d, "c.yaml", _duplicate(text, data, case[1]))
    if kind == "bomb":
        return write(d, "c.yaml", _bomb(text, case[1], case[2]))
    if kind == "deep":
        return write(d, "c.yaml", _deep(text, case[1]))
    if kind == "nul":
        return write(d, "c.yaml", text + f'{case[1]}: "x\\0y"\n')
    if kind == "top":
        return write(d, "c.yaml", case[1])
    node = data  # a float field given NaN or infinity (written by yaml as .nan / .inf)
    *parents, last = case[1].split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = case[2]
    return write(d, "c.yaml", yaml.safe_dump(data, sort_keys=False))


@EXAMPLES
@given(case=HOSTILE_CONFIG, command=st.sampled_from(["config", "plan", "e2e", "explore", "up", "build-model",
                                                    "compose", "k8s", "ps", "clean"]))
def test_a_hostile_config_file_is_refused_in_one_line(case, command):
    with in_fresh_dir() as d:
        path = _hostile_config_file(d, case)
        refused([command, "--config", path], d, {"c.yaml"})


# --- --set ----------------------------------------------------------------------------------------

HOSTILE_SET = st.one_of(
    st.tuples(st.sampled_from(FLOAT_FIELDS), NOT_FINITE).map(lambda t: f"{t[0]}={t[1]}"),
    st.tuples(st.sampled_from(PORT_FIELDS), st.one_of(st.integers(max_value=1023), st.integers(min_value=65536)))
    .map(lambda t: f"{t[0]}={t[1]}"),
    st.tuples(st.sampled_from(list(COUNT_FIELDS)), st.integers(min_value=257)).map(lambda t: f"{t[0]}={t[1]}"),
    st.tuples(st.sampled_from(["name", "timeouts.request_s", "decode.0.cpus", "suite"]), BROKEN_YAML)
    .map(lambda t: f"{t[0]}={t[1]}"),
    st.sampled_from(["suite=42", "suite=[1, 2]", "scenarios=7", "prefill=x", "timeouts=[]"]),
    WORD.filter(lambda w: w not in ("name", "device", "model", "dtype", "connector", "suite", "launch"))
    .map(lambda w: f"{w}.x=1"),
    st.sampled_from(["noequals", "=1", "a..b=1", ".=2"]),
    # a flow mapping with one key twice (on one line), an integer no field takes, bytes that are not UTF-8
    # (a surrogate, as Python gives them from argv), a path deeper than any field
    WORD.map(lambda w: f"launch.env={{{w}: a, {w}: b}}"),
    st.integers(4301, 6000).map(lambda n: "scenarios.0.concurrent=" + "9" * n),
    WORD.map(lambda w: f"name={w}\udce9"),
    st.integers(65, 3000).map(lambda n: ".".join(["a"] * n) + "=1"),
)


@EXAMPLES
@given(override=HOSTILE_SET, command=st.sampled_from(["config", "plan", "e2e", "explore"]))
def test_a_hostile_set_is_refused_in_one_line_before_anything_starts(override, command):
    with in_fresh_dir() as d:
        path = write(d, "c.yaml", yaml.safe_dump(base_config(d), sort_keys=False))
        refused([command, "--config", path, "--set", override], d, {"c.yaml"})


# --- histories ------------------------------------------------------------------------------------

HOSTILE_LINE = st.one_of(
    st.sampled_from(["[1, 2]", "42", '"text"', "null", "true", "{", "not json", '{"a": 1, "a": 2}']),
    st.integers(65, 5000).map(lambda n: "[" * n + "]" * n),
    st.dictionaries(WORD, st.integers(), max_size=3).map(
        lambda extra: '{"phase": "explore", "action": ' + __import__("json").dumps(extra) + "}"),
)


@EXAMPLES
@given(lines=st.lists(HOSTILE_LINE, min_size=1, max_size=4), junk=st.sampled_from([b"", b"\xff\xfe"]))
def test_a_hostile_history_is_refused_before_any_server(lines, junk):
    with in_fresh_dir() as d:
        cfg = write(d, "c.yaml", yaml.safe_dump(base_config(d), sort_keys=False))
        history = write(d, "h.jsonl", junk + "\n".join(lines).encode() + b"\n")
        refused(["explore", "--config", cfg, "--replay", history], d, {"c.yaml", "h.jsonl"})


# --- command-line arguments -----------------------------------------------------------------------

NOT_A_NUMBER = st.one_of(st.sampled_from(["nan", "inf", "-inf", "NaN", "1e999"]), WORD)
BAD_PORT = st.one_of(st.integers(max_value=0), st.integers(min_value=65536)).map(str)
HOSTILE_ARGS = st.one_of(
    NOT_A_NUMBER.map(lambda v: ["explore", "--minutes", v]),
    NOT_A_NUMBER.map(lambda v: ["explore", "--cancel-share", v]),
    st.integers(min_value=100_001).map(lambda n: ["explore", "--actions", str(n)]),
    # an empty name in a comma list: refused, not dropped into the default the user did not ask for
    st.tuples(st.sampled_from(["--routes", "--topologies", "--nemesis", "--knobs"]),
              st.sampled_from([",", "pd,,decode", "decode,", ",decode", " , "])).map(lambda f: ["explore", *f]),
    BAD_PORT.map(lambda p: ["proxy", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--port", p]),
    BAD_PORT.map(lambda p: ["up", "--proxy", p]),
    NOT_A_NUMBER.map(lambda v: ["clean", "--min-age-s", v]),
    st.sampled_from([["proxy", "--prefill", "notaurl", "--decode", "http://127.0.0.1:2"],
                     ["proxy", "--prefill", "ftp://x", "--decode", "http://127.0.0.1:2"],
                     ["proxy", "--prefill", "http://h:99999", "--decode", "http://127.0.0.1:2"],
                     ["k8s", "-o", "."], ["compose", "-o", "."], ["schema", "--out", "c.yaml"],
                     ["matrix", "--builds", "0.32.0", "--report-only", "--out", "/pdrig-no-such-matrix"],
                     ["e2e", "--endpoints", "c.yaml"], ["e2e", "--attach", "--endpoints", "c.yaml"],
                     ["explore", "--replay", "nowhere.jsonl"], ["e2e", "--frobnicate"], ["nosuchcommand"]]),
    # names that become Kubernetes names, paths or argv: anything with a character no DNS label has
    st.text(alphabet="./;$ '`&|A_", min_size=1, max_size=8).map(lambda t: ["k8s", "-n", f"x{t}"]),
    st.text(alphabet=" ;$'`&|", min_size=1, max_size=8).map(lambda t: ["k8s", "--image", f"pdrig{t}cpu"]),
    st.text(alphabet="./;$ '`A_", min_size=1, max_size=8).map(lambda t: ["plan", "--set", f"decode.0.name=d{t}"]),
    st.integers(64, 400).map(lambda n: ["config", "--set", "name=" + "a" * n]),
)


@EXAMPLES
@given(argv=HOSTILE_ARGS)
def test_hostile_arguments_are_refused_in_one_line(argv):
    with in_fresh_dir() as d:
        cfg = write(d, "c.yaml", yaml.safe_dump(base_config(d), sort_keys=False))
        needs_config = argv[0] in ("explore", "up", "clean", "k8s", "compose", "e2e", "matrix", "plan", "config")
        refused([*argv, *(["--config", cfg] if needs_config else [])], d, {"c.yaml"})


def test_the_console_entry_point_refuses_in_one_line_too(tmp_path):
    (tmp_path / "bad.yaml").write_bytes(b"name: \xff\n")
    for argv in (["config", "--config", "bad.yaml"], ["explore", "--minutes", "nan", "--config", "bad.yaml"],
                 ["proxy", "--prefill", "x", "--decode", "y", "--port", "99999"]):
        r = subprocess.run([sys.executable, "-m", "rig.cli", *argv], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (argv, r.stderr)
        assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


@EXAMPLES
@given(field=st.sampled_from(["run_root", "cache_dir"]),
       command=st.sampled_from(["e2e", "explore", "up", "build-model"]), under=st.booleans())
def test_a_run_root_or_cache_dir_that_is_a_file_is_refused_before_work(field, command, under):
    with in_fresh_dir() as d:
        cfg = write(d, "c.yaml", yaml.safe_dump(base_config(d), sort_keys=False))
        target = "c.yaml/below" if under else "c.yaml"  # the file itself, or a folder under it
        line = refused([command, "--config", cfg, "--set", f"{field}={target}"], d, {"c.yaml"})
        assert field in line


def test_a_replayed_action_or_topology_the_explorer_could_not_run_is_refused_before_any_server(tmp_path):
    import json

    from rig.explore.grammar import Action, Step

    action = Action(index=1, steps=[Step(id="s0", prompt_tokens=33, max_tokens=2)]).model_dump(mode="json")
    topo = {"prefill": "prefill", "decode": "decode", "block_size": 32, "max_model_len": 128, "usable_blocks": 4}
    cfg = write(tmp_path, "c.yaml", yaml.safe_dump(base_config(tmp_path), sort_keys=False))
    for bad_topo, says in (({**topo, "decode": "nowhere"}, "are not in this config"),
                           ({**topo, "block_size": "32"}, "block_size is not of the type"),
                           ({k: v for k, v in topo.items() if k != "max_model_len"}, "lacks max_model_len"),
                           ({**topo, "gpus": 8}, "has unknown gpus")):
        history = write(tmp_path, "h.jsonl", json.dumps({"phase": "explore", "action": action, "topology": bad_topo}))
        line = refused(["explore", "--config", cfg, "--replay", history], tmp_path, {"c.yaml", "h.jsonl"})
        assert says in line and "action 1" in line

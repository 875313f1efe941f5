"""Each class of hostile input a new user tried, one named example each (docs/reference/errors.md
lists them with their messages): the rig answers exit code 2 with one line on stderr naming the
file, field or flag, no traceback, and creates nothing in the working directory nor at ``/``.

The generated variants of these classes are in tests/app/test_cli_hostile_inputs.py; this module
pins the examples the hand trial found, so each row of the errors table has the test that shows it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.helpers.hostile import base_config, in_fresh_dir, refused


def _config(d: Path, **fields) -> str:
    data = {**base_config(d), **fields}
    (d / "c.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return "c.yaml"


def _fifo(d: Path) -> None:
    os.mkfifo(d / "fifo")


def _history(d: Path, steps: list[dict], **topology) -> None:
    topo = {"prefill": "prefill", "decode": "decode", "block_size": 32, "max_model_len": 128, "usable_blocks": 4,
            **topology}
    line = {"phase": "explore", "action": {"index": 1, "steps": steps}, "topology": topo}
    (d / "h.jsonl").write_text(json.dumps(line) + "\n")


# (class, argv after the config, what must be in the line, setup of the working directory)
Setup = Callable[[Path], object] | None
CASES: list[tuple[str, list[str], str, Setup]] = [
    ("a --set value of bytes that are not UTF-8", ["config", "--set", "name=caf\udce9"], "not UTF-8", None),
    ("a duplicate key on one line (flow mapping)", ["config", "--set", "launch.env={A: 1, A: 2}"],
     "appears twice", None),
    ("an integer of 5,000 digits", ["config", "--set", "scenarios.0.concurrent=" + "9" * 5000],
     "scenarios.0.concurrent", None),
    ("a --set path 10,000 levels deep", ["config", "--set", ".".join(["a"] * 10_000) + "=1"], "levels deep", None),
    ("-o /dev/full", ["k8s", "-o", "/dev/full"], "-o /dev/full: cannot write it", None),
    ("-o the config itself", ["k8s", "-o", "c.yaml"], "the config this command reads", None),
    ("ports.lock_dir that is a file", ["e2e", "--set", "ports.lock_dir=c.yaml"], "ports.lock_dir", None),
    ("an attach endpoint at port 99999", ["e2e", "--attach", "--endpoint", "decode=http://127.0.0.1:99999"],
     "port 99999", None),
    ("max_tokens longer than the context", ["e2e", "--set", "scenarios.0.max_tokens=10000000000000"],
     "max_tokens", None),
    ("an explore --known file that is not UTF-8", ["explore", "--known", "k.yaml"], "not UTF-8",
     lambda d: (d / "k.yaml").write_bytes(b"- name: \xff\n")),
    ("an explore --known FIFO (never opened)", ["explore", "--known", "fifo"], "not a file", _fifo),
    ("an attach log that is a FIFO (never opened)", ["e2e", "--attach", "--log", "decode=file:fifo"],
     "not a regular file", _fifo),
    ("a compose file of the attach logs that is a FIFO", ["e2e", "--attach", "--logs-from-compose", "fifo"],
     "not a file", _fifo),
    ("a replayed step longer than its topology's context", ["explore", "--replay", "h.jsonl"], "do not fit",
     lambda d: _history(d, [{"id": "s0", "prompt_tokens": 100_000_000, "max_tokens": 2}])),
    ("a replayed action of 1,000 steps", ["explore", "--replay", "h.jsonl"], "fired together",
     lambda d: _history(d, [{"id": f"s{i}", "prompt_tokens": 8, "max_tokens": 2} for i in range(1_000)])),
    ("a replayed topology of block size 0", ["explore", "--replay", "h.jsonl"], "block_size 0",
     lambda d: _history(d, [{"id": "s0", "prompt_tokens": 8, "max_tokens": 2}], block_size=0)),
    # names that become paths, argv and Kubernetes names
    ("a Kubernetes namespace that is a shell line", ["k8s", "-n", "../x; rm -rf /"], "is not a namespace", None),
    ("a Kubernetes image with a space", ["k8s", "--image", "pdrig:cpu; rm"], "is not an image reference", None),
    ("an instance name too long for a Service name", ["k8s", "--set", "decode.0.name=" + "d" * 50,
                                                        "--set", "scenarios.0.decode=" + "d" * 50],
     "longer than the 63 characters", None),
    ("a run id with a path in it", ["k8s", "--run-id", "../r1"], "--run-id", None),
    ("a claim that is not a Kubernetes name", ["k8s", "--set", "kubernetes.run_dir_claim=../claim"],
     "run_dir_claim", None),
    ("an instance name of 300 characters", ["config", "--set", "decode.0.name=" + "d" * 300], "1-63 lowercase", None),
    ("an instance name with a slash", ["plan", "--set", "decode.0.name=../../x"], "RFC 1123", None),
    ("a served model name with a quote", ["config", "--set", "model.served_name=a'b"], "served model name", None),
    ("a tiny model of terabytes", ["build-model", "--set", "model.tiny.hidden_size=8192",
                                   "--set", "model.tiny.num_hidden_layers=64"], "more than the 200,000,000", None),
    # an explore --known entry that does not validate: before the --build lookup, the run directory, any server
    ("an explore --known entry of an unknown symptom", ["explore", "--build", "nosuch", "--known", "k.yaml"],
     "known_issue.symptom", lambda d: (d / "k.yaml").write_text(
         "- name: a\n  known_issue: {id: x, title: t, affects: '>=0.1', symptom: {kind: nosuch}}\n")),
    ("an explore --known entry without an id", ["explore", "--known", "k.yaml"], "not a mapping with an id",
     lambda d: (d / "k.yaml").write_text("- name: a\n  known_issue: just-words\n")),
]


@pytest.mark.parametrize(("what", "argv", "says", "setup"), CASES, ids=[c[0] for c in CASES])
def test_a_hostile_input_is_refused_in_one_line(what, argv, says, setup):
    with in_fresh_dir() as d:
        config = _config(d)
        given = {config}
        if setup is not None:
            setup(d)
            given |= {p.name for p in d.iterdir()}
        line = refused([*argv, "--config", config], d, given)
        assert says in line, (what, line)
        assert len(line) < 600, line  # quotes of what was given are cut, never kilobytes


def test_a_config_path_too_long_for_the_filesystem_is_refused_naming_it():
    with in_fresh_dir() as d:
        line = refused(["config", "--config", "a" * 5000], d, set())
        assert "too long" in line and len(line) < 400


def test_schema_out_where_no_folder_can_be_made_is_refused_in_one_line():
    with in_fresh_dir() as d:
        line = refused(["schema", "--out", "/proc/pdrig-no-such-folder"], d, set())
        assert "--out /proc/pdrig-no-such-folder: cannot create it" in line

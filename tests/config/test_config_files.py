"""The one loader of user files (rig/config/files.py) and what load_config, the builds file and the
endpoints.json reader make of it: every problem one InputFileError line naming the file, the line
where known, and the fix."""

from __future__ import annotations

import json
import time

import pytest

from rig.cluster.builds import load_builds
from rig.config import ConfigError, load_config
from rig.config.endpoints_file import read_endpoints
from rig.config.files import (
    MAX_DEPTH,
    MAX_YAML_BYTES,
    MAX_YAML_NODES,
    RigYamlLoader,
    json_lines,
    load_json,
    load_yaml,
    parse_json,
    parse_yaml,
)
from rig.errors import InputFileError, PdrigError
from tests.helpers.fake_rig import fake_config, write_config


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


def test_the_c_loader_is_used_where_pyyaml_has_it():
    import yaml

    if getattr(yaml, "__with_libyaml__", False):
        assert issubclass(RigYamlLoader, yaml.CSafeLoader)
    assert issubclass(RigYamlLoader, yaml.SafeLoader if not yaml.__with_libyaml__ else yaml.CSafeLoader)


def test_a_duplicate_key_names_both_lines(tmp_path):
    with pytest.raises(InputFileError) as e:
        parse_yaml("name: a\ndecode:\n  - name: d1\nport: 1\ndecode:\n  - name: d2\n", "f.yaml")
    assert "key 'decode' appears twice, on line 2 and line 5" in one_line(e)
    # a merge key may still be overridden by an explicit key, as YAML says
    assert parse_yaml("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  x: 3\n", "f.yaml")["other"] == {"x": 3, "y": 2}


def test_a_second_decode_section_in_a_config_is_refused_not_last_wins(tmp_path):
    path = write_config(tmp_path, fake_config(tmp_path))
    path.write_text(path.read_text() + "decode:\n- name: other\n  port: 9999\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert f"config file {path}: key 'decode' appears twice" in one_line(e)


def test_an_alias_bomb_is_refused_fast_without_being_expanded():
    bomb = "a0: &a0 [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 12))  # 9^12 values expanded
    t = time.monotonic()
    with pytest.raises(InputFileError) as e:
        parse_yaml(bomb, "bomb.yaml")
    assert time.monotonic() - t < 5  # linear in the file: it would never end if expanded
    assert f"aliases expand to more than {MAX_YAML_NODES:,} values" in one_line(e)
    # aliases within the bound are fine (the shipped suites use them)
    assert parse_yaml("a: &x {k: 1}\nb: *x\n", "ok.yaml") == {"a": {"k": 1}, "b": {"k": 1}}


def test_an_alias_that_contains_itself_and_deep_nesting_are_refused():
    with pytest.raises(InputFileError) as e:
        parse_yaml("a: &x [1, *x]\n", "loop.yaml")
    assert "an alias that contains itself" in one_line(e)
    deep = "a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n"
    with pytest.raises(InputFileError) as e:
        parse_yaml(deep, "deep.yaml")
    assert f"nested more than {MAX_DEPTH} levels deep" in one_line(e)
    with pytest.raises(InputFileError):
        parse_yaml("a: " + "[" * 100_000, "deeper.yaml")  # libyaml's own bound, still one line


def test_a_nul_character_is_refused():
    with pytest.raises(InputFileError) as e:
        parse_yaml('run_root: "runs\\0x"\n', "nul.yaml")
    assert "a NUL character" in one_line(e)


def test_size_encoding_and_kind_of_a_file(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * MAX_YAML_BYTES + b"\n")
    t = time.monotonic()
    with pytest.raises(InputFileError) as e:
        load_yaml(big, "config file", "give a config")
    assert time.monotonic() - t < 5 and "more than the 4,194,304 the rig reads" in one_line(e)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: ok\ndescription: caf\xe9\n")
    with pytest.raises(InputFileError) as e:
        load_yaml(latin, "config file", "give a config")
    assert f"config file {latin}:2: not UTF-8 text (byte 0xe9 at offset 25); save it as UTF-8" in one_line(e)
    with pytest.raises(InputFileError) as e:
        load_yaml(tmp_path, "config file", "give a config")
    assert "not a file" in one_line(e)
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(InputFileError) as e:
        load_yaml(tmp_path / "list.yaml", "config file", "give a config")
    assert "the top level must be a mapping of fields, not a list" in one_line(e)
    assert issubclass(InputFileError, ConfigError) and issubclass(InputFileError, PdrigError)


def test_json_refuses_nan_duplicates_and_depth(tmp_path):
    for text, says in (('{"a": NaN}', "NaN is not JSON"), ('{"a": 1, "a": 2}', "key 'a' appears twice"),
                       ("[" * 100_000 + "]" * 100_000, "nested too deep"),
                       ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"nested more than {MAX_DEPTH} levels"),
                       ('{"a": "x\\u0000"}', "a NUL character")):
        with pytest.raises(InputFileError) as e:
            parse_json(text, "e.json")
        assert says in one_line(e)
    (tmp_path / "e.json").write_text("[1]")
    with pytest.raises(InputFileError, match="the top level must be an object, not a list"):
        load_json(tmp_path / "e.json", "--endpoints", "give an endpoints.json")


def test_json_lines_name_the_line_and_allow_the_rigs_own_nan(tmp_path):
    h = tmp_path / "history.jsonl"
    h.write_text('{"phase": "explore", "delta": NaN}\n\n[1, 2]\n')
    with pytest.raises(InputFileError) as e:
        list(json_lines(h, "--replay", "give a history.jsonl"))
    assert f"--replay {h}:3: each line must be a JSON object, not a list; give a history.jsonl" in one_line(e)
    h.write_text('{"phase": "explore", "delta": NaN}\n')
    ((line, entry),) = json_lines(h, "--replay", "give a history.jsonl")
    assert line == 1 and entry["phase"] == "explore"


def test_suite_and_scenarios_of_the_wrong_type(tmp_path):
    path = write_config(tmp_path, fake_config(tmp_path))
    with pytest.raises(ConfigError) as e:
        load_config(path, ["suite=42"])
    assert "suite: 42 is not a suite file; give a path" in one_line(e)
    (tmp_path / "s.yaml").write_text("- name: a\n  decode: decode\n  prompt_tokens: 8\n  max_tokens: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, ["suite=s.yaml", "scenarios=7"])
    assert "scenarios: 7 is not a list of scenarios" in one_line(e)


def test_set_values_that_are_not_yaml_are_one_line(tmp_path):
    path = write_config(tmp_path, fake_config(tmp_path))
    for bad in ("timeouts.startup_s=[1", "name=a: b: c", "name=*nowhere", "a..b=1"):
        with pytest.raises(ConfigError) as e:
            load_config(path, [bad])
        assert one_line(e).startswith("--set")


def test_nan_and_infinity_are_refused_in_float_fields_and_request_fields(tmp_path):
    path = write_config(tmp_path, fake_config(tmp_path))
    for bad in ("timeouts.startup_s=.nan", "timeouts.request_s=.inf", "timeouts.stall_window_s=-.inf"):
        with pytest.raises(ConfigError) as e:
            load_config(path, [bad])
        assert "Input should be a finite number" in one_line(e)
    cfg = fake_config(tmp_path, scenarios=[{"name": "t", "decode": "decode", "prompt_tokens": 8, "max_tokens": 1,
                                             "request": {"all": {"temperature": float("nan")}}}])
    with pytest.raises(ConfigError, match=r"request.all.temperature: nan is not a number JSON can carry"):
        load_config(write_config(tmp_path, cfg, "nan.yaml"))


def test_counts_are_bounded_by_what_the_rig_can_send(tmp_path):
    cfg = fake_config(tmp_path, scenarios=[{"name": "t", "decode": "decode", "prompt_tokens": 8, "max_tokens": 1}])
    path = write_config(tmp_path, cfg)
    with pytest.raises(ConfigError) as e:
        load_config(path, ["scenarios.t.concurrent=100000000"])
    assert "less than or equal to 256" in one_line(e)


def test_a_builds_file_with_a_duplicate_build_is_refused(tmp_path):
    b = tmp_path / "builds.yaml"
    b.write_text("builds:\n  x: {vllm: 0.32.0}\n  x: {vllm: 0.31.0}\n")
    with pytest.raises(ConfigError) as e:
        load_builds(b)
    assert f"builds file {b}: key 'x' appears twice, on line 2 and line 3" in one_line(e)


def test_an_endpoints_file_is_checked_entry_by_entry(tmp_path):
    e = tmp_path / "endpoints.json"
    good = {"prefill": {"url": "http://127.0.0.1:8100/", "role": "prefill", "log": None, "pid": 12},
            "decode": {"url": "http://127.0.0.1:8200", "role": "decode"}}
    e.write_text(json.dumps(good))
    got = read_endpoints(e)
    assert got["prefill"].url == "http://127.0.0.1:8100" and got["decode"].pid is None
    for entry, says in (({"url": "notaurl", "role": "decode"}, "entry 'decode'.url: 'notaurl' is not a base URL"),
                        ({"url": "http://h:99999", "role": "decode"}, "is not a URL"),
                        ({"role": "decode"}, "entry 'decode'.url: Field required"),
                        ("x", "entry 'decode'")):
        e.write_text(json.dumps({**good, "decode": entry}))
        with pytest.raises(InputFileError) as err:
            read_endpoints(e)
        assert says in one_line(err) and str(e) in str(err.value)


def test_the_error_tree_and_the_exit_codes():
    from rig.cli import exit_code
    from rig.cluster.ports import PortConflict
    from rig.errors import BuildError, ClusterError, ContainerError, RigError, TransportError
    from rig.proxy import HopFailed
    from rig.transport.fast import BadStreamChunk

    assert issubclass(ConfigError, ValueError) and issubclass(ClusterError, RuntimeError)
    assert all(issubclass(c, RigError) for c in (ClusterError, ContainerError, BuildError, PortConflict))
    assert issubclass(HopFailed, TransportError) and issubclass(BadStreamChunk, TransportError)
    assert [exit_code(e) for e in (InputFileError("x"), PortConflict("x", 1, ""), BuildError("x"),
                                   KeyError("bug"))] == [2, 3, 3, 3]

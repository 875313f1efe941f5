"""The one way the rig reads a file a user gives it: configs, suites, builds files, ``endpoints.json``,
``history.jsonl`` (``--replay``) and a ``--set`` value. Every problem is one
:class:`~rig.errors.InputFileError` (a ConfigError: exit code 2) naming the file, the line where
known, and the fix, raised before any port, directory or server is taken.

What is refused, and why:

- **too big** (:data:`MAX_YAML_BYTES`, :data:`MAX_JSON_BYTES`, :data:`MAX_HISTORY_BYTES`): checked
  with ``stat`` before reading, so a 50 MB config cannot hang the parser.
- **not UTF-8**: YAML and JSON are UTF-8 text; the error names the byte offset.
- **duplicate keys** in a YAML mapping (naming both lines) or a JSON object: YAML's default is that
  the last one silently wins, so a second ``decode:`` would drop the instances of the first.
- **alias bombs and deep nesting**: a YAML document whose aliases expand to more than
  :data:`MAX_YAML_NODES` nodes (billion laughs), an alias that contains itself, or nesting deeper
  than :data:`MAX_DEPTH`. The expanded size is counted on the composed node graph, each shared node
  once (linear in the file), before anything is constructed; the objects built share the aliased
  parts, but validation and ``pdrig config``'s dump would walk every copy.
- **JSON** nested deeper than :data:`MAX_DEPTH`, with ``NaN``/``Infinity`` (not JSON; Python's
  json module accepts them), or whose top level is not what the file must hold.

YAML is parsed with libyaml's ``CSafeLoader`` where PyYAML was built with it (about 10x faster
than the pure-Python ``SafeLoader``, the fallback); both build plain Python objects only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from rig.errors import InputFileError

MAX_YAML_BYTES = 4 << 20  # the largest shipped profile or suite is under 64 KiB
MAX_JSON_BYTES = 4 << 20  # endpoints.json is under 4 KiB
MAX_HISTORY_BYTES = 256 << 20  # a 40-action exploration writes ~0.4 MB; hours of it stay far below
MAX_YAML_NODES = 200_000  # nodes after alias expansion; the largest shipped suite has a few thousand
MAX_DEPTH = 64  # nesting of mappings and lists; the deepest config field is under 10 levels down

_YamlBase: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, second: int):
        where = f"on line {first}" if first == second else f"on line {first} and line {second}"
        super().__init__(f"key {short(key)} appears twice, {where}")
        self.line = second


class RigYamlLoader(_YamlBase):
    """PyYAML's safe loader (libyaml's when installed) that refuses a duplicate key in a mapping,
    naming both lines (``<<`` merge keys may still be overridden by explicit keys, as YAML says),
    also two keys on one line (a flow mapping such as ``env: {A: 1, A: 2}``)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _DuplicateKey(key, seen[key], line)
                seen[key] = line
            except TypeError:  # an unhashable key: the base class names it
                continue
        return super().construct_mapping(node, deep)


def _where(source: str, line: int | None) -> str:
    return f"{source}:{line}" if line else source


def cut(text: str, limit: int = 120) -> str:
    """``text`` cut to ``limit`` characters with ``...`` (a path or value quoted in an error line,
    never kilobytes of it)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def read_text(path: str | Path, what: str, limit: int, fix: str) -> str:
    """The UTF-8 text of ``path``. ``what`` names where the path came from (``config file``,
    ``--replay``, ``suite``), ``fix`` what to give instead. Raises InputFileError for a missing
    path, a directory, a file over ``limit`` bytes, an unreadable one or bytes that are not UTF-8."""
    p = Path(path)
    what = f"{what} {cut(str(p))}"
    try:
        st = p.stat()
    except OSError as e:
        raise InputFileError(f"{what}: cannot read it ({e.strerror or e}); {fix}", str(p)) from None
    if not p.is_file():
        raise InputFileError(f"{what}: not a file; {fix}", str(p))
    if st.st_size > limit:
        raise InputFileError(f"{what}: {st.st_size:,} bytes, more than the {limit:,} the rig reads; {fix}",
                             str(p))
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InputFileError(f"{what}: cannot read it ({e.strerror or e}); {fix}", str(p)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InputFileError(f"{what}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                             f"save it as UTF-8; {fix}", str(p), line) from None


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root: yaml.Node, source: str) -> None:
    """Raise InputFileError when the document ``root`` would expand past :data:`MAX_YAML_NODES`
    nodes or :data:`MAX_DEPTH` levels, or an alias contains itself. Iterative, each distinct node
    visited once (shared alias targets are sized once and counted per reference)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        kids = _children(node)
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            line = node.start_mark.line + 1
            if size[key] > MAX_YAML_NODES:
                raise InputFileError(f"{_where(source, line)}: aliases expand to more than {MAX_YAML_NODES:,} values "
                                     "(an alias bomb?); write the values out or use fewer aliases", source, line)
            if depth[key] > MAX_DEPTH:
                raise InputFileError(f"{_where(source, line)}: nested more than {MAX_DEPTH} levels deep; "
                                     "no rig field is nested that deep", source, line)
            continue
        if key in size:
            continue
        if isinstance(node, yaml.ScalarNode) and "\x00" in node.value:
            line = node.start_mark.line + 1
            raise InputFileError(f"{_where(source, line)}: a NUL character in a value; no rig field takes one",
                                 source, line)
        on_path.add(key)
        stack.append((node, True))
        for kid in kids:
            if id(kid) in on_path:
                line = kid.start_mark.line + 1
                raise InputFileError(f"{_where(source, line)}: an alias that contains itself; "
                                     "a config value cannot be infinite", source, line)
            if id(kid) not in size:
                stack.append((kid, False))


def parse_yaml(text: str, source: str, lines: bool = True) -> Any:
    """The YAML document ``text`` as plain Python objects (None when empty); ``source`` names it
    in errors (a file, ``--set k=v``; ``lines=False``: no line number, for a one-line value).
    Raises InputFileError for invalid YAML, a duplicate key, an alias bomb or nesting past the
    bounds (module docstring)."""
    try:
        loader = RigYamlLoader(text)
    except UnicodeEncodeError as e:  # a surrogate: bytes of the command line that are not UTF-8
        raise InputFileError(f"{source}: not UTF-8 text (character {e.start + 1}); give UTF-8 text", source) \
            from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, source)
        return loader.construct_document(node)
    except _DuplicateKey as e:
        raise InputFileError(f"{source}: {e}; keep one (the rig never lets the last one win silently)",
                             source, e.line) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None and lines else None
        problem = getattr(e, "problem", None) or str(e)
        context = getattr(e, "context", None)
        text_ = " ".join(f"{context + ': ' if context else ''}{problem}".split())
        raise InputFileError(f"{_where(source, line)}: not valid YAML ({text_})", source, line) from None
    except RecursionError:  # the pure-Python parser on deep nesting (libyaml stops at 1,000 levels)
        raise InputFileError(f"{source}: nested too deep to read; no rig field is nested that deep", source) from None
    except InputFileError:
        raise
    except ValueError as e:  # a scalar no type takes: an integer of more than 4,300 digits
        raise InputFileError(f"{source}: a value the rig cannot read ({str(e).split(';')[0]}); "
                             "no rig field takes it", source) from None
    finally:
        loader.dispose()


def load_yaml(path: str | Path, what: str, fix: str, top: type | tuple[type, ...] = dict) -> Any:
    """The YAML document in file ``path`` (empty: ``top()``); raises InputFileError (see
    :func:`read_text`, :func:`parse_yaml`) and when its top level is not a ``top`` (``dict``: a
    mapping of fields, ``list``: a list of scenarios)."""
    data = parse_yaml(read_text(path, what, MAX_YAML_BYTES, fix), f"{what} {path}")
    kinds = top if isinstance(top, tuple) else (top,)
    if data is None:
        return kinds[0]()
    if not isinstance(data, kinds):
        want = " or ".join("a mapping of fields" if k is dict else "a list" for k in kinds)
        raise InputFileError(f"{what} {path}: the top level must be {want}, not {_kind(data)}; {fix}", str(path))
    return data


def short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (an error message quotes what it got, never
    megabytes of it)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", int: "a number", float: "a number",
            bool: "true/false"}.get(type(value), type(value).__name__)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (give a number)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice in one object")
        out[k] = v
    return out


def _depth(value: Any) -> int:
    """Nesting depth of decoded JSON (iterative: a depth check must not itself recurse). Raises
    ValueError for a string holding a NUL character (no path, URL or name takes one)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, str) and "\x00" in v:
            raise ValueError("a NUL character in a string")
        if isinstance(v, dict) and any("\x00" in k for k in v):
            raise ValueError("a NUL character in a key")
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_json(text: str, source: str, allow_nan: bool = False, what: str = "valid JSON") -> Any:
    """One JSON value from ``text`` (``source`` names it in errors, ``what`` the form expected).
    Raises InputFileError for invalid JSON, NaN/Infinity (unless ``allow_nan``: the rig's own
    history lines may carry a NaN metric), a duplicate key, or nesting deeper than :data:`MAX_DEPTH`."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=None if allow_nan else _no_constant)
    except RecursionError:
        raise InputFileError(f"{source}: nested too deep to read (more than {MAX_DEPTH} levels)", source) from None
    except ValueError as e:
        raise InputFileError(f"{source}: not {what} ({e})", source) from None
    try:
        deep = _depth(value) > MAX_DEPTH
    except ValueError as e:
        raise InputFileError(f"{source}: {e}; no rig field takes one", source) from None
    if deep:
        raise InputFileError(f"{source}: nested more than {MAX_DEPTH} levels deep", source)
    return value


def load_json(path: str | Path, what: str, fix: str, top: type = dict, allow_nan: bool = False) -> Any:
    """The JSON value in file ``path``, which must be a ``top`` (``dict``: an object). Raises
    InputFileError (see :func:`read_text`, :func:`parse_json`) naming ``what`` and ``fix``."""
    value = parse_json(read_text(path, what, MAX_JSON_BYTES, fix), f"{what} {path}", allow_nan)
    if not isinstance(value, top):
        raise InputFileError(f"{what} {path}: the top level must be {'an object' if top is dict else 'a list'}, "
                             f"not {_kind(value)}; {fix}", str(path))
    return value


def json_lines(path: str | Path, what: str, fix: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line of a JSON-lines file (``history.jsonl``):
    each line must be one JSON object. Raises InputFileError naming the line (see
    :func:`read_text` for the file itself, :func:`parse_json` for a line)."""
    text = read_text(path, what, MAX_HISTORY_BYTES, fix)
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        source = f"{what} {path}:{i}"
        try:
            value = parse_json(line, source, allow_nan=True, what="a JSON line")
        except InputFileError as e:
            raise InputFileError(f"{e}; {fix}", str(path), i) from None
        if not isinstance(value, dict):
            raise InputFileError(f"{source}: each line must be a JSON object, not {_kind(value)}; {fix}", str(path), i)
        yield i, value


def folder_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be (or become) a writable folder, or None when it can: an existing file,
    an existing folder this process cannot write, or a nearest existing ancestor that is not a
    writable folder (so creating it would fail). Creates nothing."""
    p = Path(path).expanduser()
    if p.exists():
        if not p.is_dir():
            return "it is a file, not a folder"
        return None if os.access(p, os.W_OK | os.X_OK) else "that folder is not writable"
    parent = p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, not a folder"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"{parent} is not writable"

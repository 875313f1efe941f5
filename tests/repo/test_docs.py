"""The README and docs a newcomer follows: commands that exist, no references a clone lacks."""

from __future__ import annotations

import re
import subprocess

from rig.cli import build_parser
from tests.helpers.fake_rig import ROOT

README = (ROOT / "README.md").read_text()


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-zA-Z0-9_-]+):(?!=)", (ROOT / "Makefile").read_text(), re.M))


def test_every_make_command_in_the_readme_is_a_target():
    used = set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", README))
    assert used and used <= make_targets(), used - make_targets()


def test_every_pdrig_subcommand_in_the_readme_exists():
    subs = set(build_parser()._subparsers._group_actions[0].choices)  # noqa: SLF001 - argparse has no API
    # `pdrig X` as a command (not `kubectl -n pdrig logs`, where pdrig is a namespace)
    used = set(re.findall(r"(?:^|[`/\s(])(?<!-n )pdrig ([a-z][a-z0-9-]*)", README, re.M))
    assert used and used <= subs, used - subs


def test_readme_commands_do_not_assume_pdrig_on_path():
    # make setup does not put pdrig on PATH: commands a reader copies (code blocks, inline code
    # with options) use .venv/bin/pdrig; `pdrig up` as the name of a command is fine.
    blocks = "\n".join(re.findall(r"```sh\n(.*?)```", README, re.S)).splitlines()
    spans = [s for s in re.findall(r"`([^`]*)`", README.replace("\n", " ")) if " --" in s]
    bare = [ln for ln in blocks + spans if re.match(r"\s*pdrig ", ln)]
    assert blocks and spans and bare == []


def test_no_placeholders_left():
    assert "⟨" not in README


def test_no_reference_to_files_a_clone_lacks():
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split()
    offenders = [f for f in files if (ROOT / f).is_file() and f != "tests/repo/test_docs.py"
                 and re.search(r"FIELD_NOTES|\.\./shared/", (ROOT / f).read_text(errors="replace"))]
    assert offenders == []


def test_the_how_to_one_line_builds_are_builds_the_builds_file_accepts():
    """The one line a user adds for the next release or a PR branch (docs/howto/builds-and-matrix.md)
    is a valid entry of configs/builds.yaml as the model reads it, and the matrix command after it
    names builds that then exist."""
    import yaml

    from rig.cluster.builds import BuildsFile

    text = (ROOT / "docs" / "howto" / "builds-and-matrix.md").read_text()
    lines = re.findall(r'`("[^"`]+": \{[^`]+\})`', text)
    assert len(lines) >= 2, "the how-to lost its one-line builds"
    data = yaml.safe_load((ROOT / "configs" / "builds.yaml").read_text())
    added = {}
    for line in lines:
        added.update(yaml.safe_load("{" + line + "}"))
    builds = BuildsFile.model_validate({**data, "builds": {**data["builds"], **added}})
    kinds = {("wheel" if builds.builds[n].overlay.wheel else "source") for n in added}
    assert kinds == {"wheel", "source"}, kinds
    commands = [names.split(",") for names in re.findall(r"pdrig matrix --builds ([\w.,-]+)", text)]
    after = [names for names in commands if set(names) & set(added)]
    assert after and all(n in builds.builds for names in after for n in names), after

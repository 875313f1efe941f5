"""`make help` lists every target of the Makefile with its one-line description."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from conftest import ROOT


def targets() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    return [m.group(1) for m in re.finditer(r"^([a-zA-Z0-9_-]+):(?!=)", text, re.M)]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this host")
def test_make_help_lists_every_target_with_a_description():
    out = subprocess.run(["make", "-s", "-C", str(ROOT), "help"], capture_output=True, text=True,
                         check=True).stdout
    listed = dict(re.findall(r"^  make (\S+)\s+(.+)$", out, re.M))
    assert set(targets()) == set(listed) and len(listed) >= 10
    assert all(len(desc) > 10 for desc in listed.values())


def test_help_is_the_default_goal():
    assert targets()[0] == "help"

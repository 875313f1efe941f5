"""`make help` lists every target of the Makefile with its one-line description."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.helpers.fake_rig import ROOT


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


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this host")
@pytest.mark.parametrize("target", ["regressions", "matrix-regressions"])
def test_ctrl_c_in_the_first_profile_starts_no_second_one(tmp_path, target):
    """A fresh-clone review pressed Ctrl-C during `make regressions`: the nixl profile stopped
    (pdrig exits 130) but the recipe went on to start the Mooncake profile. A first run that
    ended by a signal (exit >= 128) must end the recipe with its code; a plain failure (1) must not."""
    log = tmp_path / "calls"
    for rc, second in ((130, False), (1, True)):
        log.write_text("")
        fake = tmp_path / f"pdrig-{rc}"
        fake.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\nexit {rc}\n")
        fake.chmod(0o755)
        p = subprocess.run(["make", "-s", "-C", str(ROOT), target, f"PDRIG={fake}"], capture_output=True, text=True)
        calls = log.read_text().splitlines()
        assert len(calls) == (2 if second else 1), calls
        assert "mooncake" not in calls[0] and (not second or "mooncake" in calls[1])
        assert p.returncode != 0

"""What the repository tracks: never an environment or a cache.

A worktree's ``.venv`` / ``.cache`` may be a symlink to another checkout's; ``.gitignore``'s
``.venv/`` matches only a directory, so a ``git add -A`` there once committed the symlinks, and a
checkout of that commit replaced a real ``.venv`` with a link to itself. ``.gitignore`` now names
both without the slash; this test fails on any tracked path under them (or under runs/).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_no_environment_cache_or_run_is_tracked():
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True).stdout
    bad = [f for f in files.splitlines() if f.split("/", 1)[0] in (".venv", ".cache", "runs")]
    assert not bad, f"tracked paths that are environments, caches or run directories: {bad[:10]}"


def test_gitignore_ignores_symlinked_environments_too():
    lines = set((ROOT / ".gitignore").read_text().splitlines())
    assert {".venv", ".cache"} <= lines

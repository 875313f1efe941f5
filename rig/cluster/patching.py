"""Applying a build's patches to an overlay env's copy of vLLM (rig/cluster/builds.py ``base:`` +
``patches:``): the patched file is a real copy, so the base env's file it was linked to is never
written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from rig.errors import BuildError


def link_tree(src: Path, dst: Path) -> None:
    """Copy the tree ``src`` to ``dst`` as hard links (a copy where linking fails); compiled
    caches are left out (they would be written next to the base's)."""
    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link, ignore=shutil.ignore_patterns("__pycache__"))


def patched_files(patch: Path) -> list[str]:
    """The paths a unified diff changes (``+++ b/<path>``, with the first component stripped)."""
    out = []
    for line in patch.read_text().splitlines():
        if line.startswith("+++ "):
            path = line[4:].split("\t")[0].strip()
            out.append(path.split("/", 1)[1] if "/" in path else path)
    return out


def apply_patch(patch: Path, site: Path) -> None:
    """Apply ``patch`` (a unified diff, -p1) to the tree under ``site``.

    Checked first with ``patch --dry-run`` so nothing is half-applied; a patched file that is a
    hard link is replaced by its own copy first, so the file it shares is never written.
    Raises BuildError naming the patch file, the target file and each hunk that failed.
    """
    if shutil.which("patch") is None:
        raise BuildError(f"{patch}: GNU patch is not installed (Debian: apt-get install patch)")
    files = patched_files(patch)
    if not files:
        raise BuildError(f"{patch}: not a unified diff (no '+++ b/<path>' line)")
    missing = [f for f in files if not (site / f).is_file()]
    if missing:
        raise BuildError(f"{patch}: does not apply: {', '.join(missing)} not found under {site}")
    cmd = ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-r", "-", "-i", str(patch),
           "-d", str(site)]
    dry = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True)
    if dry.returncode != 0:
        raise BuildError(f"{patch}: does not apply to {site}: {_hunk_failures(dry.stdout + dry.stderr)}")
    for f in files:
        target = site / f
        if target.stat().st_nlink > 1:
            data = target.read_bytes()
            target.unlink()
            target.write_bytes(data)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"{patch}: failed after a clean dry run: {r.stdout.strip()[-500:]}")


def _hunk_failures(output: str) -> str:
    """``patch``'s output reduced to "<file>: hunk #N FAILED at L" items."""
    current, items = "?", []
    for line in output.splitlines():
        m = re.match(r"(?:checking|patching) file (.+)", line)
        if m:
            current = m.group(1).strip()
        m = re.match(r"Hunk #(\d+) FAILED at (\d+)", line)
        if m:
            items.append(f"{current}: hunk #{m.group(1)} FAILED at line {m.group(2)}")
        elif "previously applied" in line or "Reversed" in line:
            items.append(f"{current}: already applied (reversed patch detected)")
    return "; ".join(dict.fromkeys(items)) or output.strip()[-500:]

#!/usr/bin/env python3
"""A stand-in for the ``docker`` CLI in unit tests: the subset rig/cluster/containers.py and
rig/run/docker_run.py call, with container states kept in a JSON file.

Environment: ``FAKE_DOCKER_STATE`` (the JSON file: ``{"containers": {service: state}, "calls": [argv...]}``),
``FAKE_DOCKER_FAIL`` (a sub-command, e.g. ``up``, that exits 1 with a message). Every call's argv
is appended to ``calls``. A state is ``{"Status": ..., "ExitCode": ..., "Pid": ..., "Health": {...}}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    path = Path(os.environ["FAKE_DOCKER_STATE"])
    st = json.loads(path.read_text()) if path.exists() else {"containers": {}, "calls": []}
    st["calls"].append(argv)
    cs = st["containers"]
    fail = os.environ.get("FAKE_DOCKER_FAIL", "")
    # FAKE_DOCKER_FAIL_TIMES=N: the sub-command in FAKE_DOCKER_FAIL fails its first N calls only
    times = int(os.environ.get("FAKE_DOCKER_FAIL_TIMES", "0"))
    if times and fail:
        st["failed"] = st.get("failed", 0) + (argv[0] == fail)
        if st["failed"] > times:
            fail = ""
    out, rc = "", 0

    def save() -> None:
        path.write_text(json.dumps(st))

    if argv[0] == "compose":
        args = argv[5:]  # compose -p P -f F <sub> ...  (or -f F only: ComposeLog)
        if argv[1] == "-f":
            args = argv[3:]
        sub = args[0]
        if sub == fail:
            save()
            print(f"fake docker: {sub} failed", file=sys.stderr)
            return 1
        if sub == "up":
            for name in st.get("services", []):
                cs[name] = {"Status": "running", "ExitCode": 0, "Pid": 0, "Health": {"Status": "healthy"}}
        elif sub == "ps" and "-q" in args:
            out = f"cid-{args[-1]}\n" if args[-1] in cs else ""
        elif sub == "ps":
            out = json.dumps([{"Service": n, "State": c["Status"]} for n, c in cs.items()])
        elif sub == "logs":
            out = f"log of {args[-1]}\n"
        elif sub == "down":
            cs.clear()
    else:
        sub, target = argv[0], argv[-1].removeprefix("cid-")
        if sub == fail or (sub != "inspect" and target not in cs):
            save()
            print(f"fake docker: {sub} {target} failed", file=sys.stderr)
            return 1
        c = cs.get(target)
        if sub == "inspect":
            if c is None:
                return 1
            out = json.dumps(c)
        elif sub == "pause":
            if c["Status"] != "running":
                save()
                print(f"fake docker: container {target} is not running", file=sys.stderr)
                return 1
            c["Status"] = "paused"
        elif sub == "unpause":
            c["Status"] = "running"
        elif sub == "kill":
            c["Status"], c["ExitCode"] = "exited", 137
        elif sub == "restart":
            c.update(Status="running", ExitCode=0, Health={"Status": "healthy"})
    save()
    sys.stdout.write(out)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

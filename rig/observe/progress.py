"""Live progress of a wave: requests done / failed / cancelled, and per instance running,
waiting and KV usage.

On a terminal it is a ``rich.live`` panel redrawn a few times a second; elsewhere (CI logs,
pipes) it is one plain line every ``line_interval_s`` seconds plus a final line, so logs stay
short and greppable. The display only reads: the engine's live ``counts`` and the timeline
sampler's ``latest`` rows (see :mod:`rig.observe.timeline`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from rig.observe.timeline import KV, RUNNING, WAITING

MODES = ("auto", "rich", "lines", "off")


def resolve_mode(mode: str, stream: TextIO | None = None) -> str:
    """``auto`` -> ``rich`` on a TTY, else ``lines``; other modes unchanged.

    Raises ValueError for an unknown mode.
    """
    if mode not in MODES:
        raise ValueError(f"progress mode {mode!r}: choose one of {list(MODES)}")
    if mode != "auto":
        return mode
    s = stream or sys.stderr
    return "rich" if getattr(s, "isatty", lambda: False)() else "lines"


def status_line(title: str, total: int, counts: Mapping[str, int], latest: Mapping[str, Mapping[str, Any]],
                elapsed_s: float) -> str:
    """One plain line: ``title: done/total (pct) | ok N failed N cancelled N | in flight N |
    <instance> run R wait W kv K% | ... | X req/s``."""
    done = counts.get("ok", 0) + counts.get("failed", 0) + counts.get("cancelled", 0)
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    parts = [f"{title}: {done}/{total} ({100.0 * done / total if total else 0:.0f}%)",
             f"ok {counts.get('ok', 0)} failed {counts.get('failed', 0)} cancelled {counts.get('cancelled', 0)}",
             f"in flight {counts.get('in_flight', 0)}"]
    for inst, row in latest.items():
        parts.append(f"{inst} run {row.get(RUNNING, 0):g} wait {row.get(WAITING, 0):g} "
                     f"kv {100.0 * row.get(KV, 0.0):.0f}%")
    parts.append(f"{rate:.{1 if rate < 10 else 0}f} req/s, {elapsed_s:.0f} s")
    return " | ".join(parts)


class WaveProgress:
    """Shows a wave's progress until :meth:`stop`; ``mode`` as in :func:`resolve_mode`.

    ``counts`` and ``latest`` are read live (the engine and the sampler update them).
    """

    def __init__(self, title: str, total: int, counts: Mapping[str, int],
                 latest: Mapping[str, Mapping[str, Any]], mode: str = "auto",
                 stream: TextIO | None = None, line_interval_s: float = 5.0):
        self.title, self.total, self.counts, self.latest = title, total, counts, latest
        self.stream = stream or sys.stderr
        self.mode = resolve_mode(mode, self.stream)
        self.line_interval_s = line_interval_s
        self.t0 = time.monotonic()
        self._live: Any = None
        self._task: asyncio.Task | None = None

    def line(self) -> str:
        """The current status as one line."""
        return status_line(self.title, self.total, self.counts, self.latest, time.monotonic() - self.t0)

    def _render(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        c = self.counts
        done = c.get("ok", 0) + c.get("failed", 0) + c.get("cancelled", 0)
        elapsed = time.monotonic() - self.t0
        head = Table.grid(padding=(0, 2))
        head.add_row(f"[bold]{self.title}[/]", ProgressBar(total=max(self.total, 1), completed=done, width=40),
                     f"{done}/{self.total}", f"{done / elapsed if elapsed > 0 else 0:.1f} req/s",
                     f"{elapsed:.0f} s")
        head.add_row(f"[green]ok {c.get('ok', 0)}[/]", f"[red]failed {c.get('failed', 0)}[/]",
                     f"[yellow]cancelled {c.get('cancelled', 0)}[/]", f"in flight {c.get('in_flight', 0)}", "")
        inst = Table(box=None, padding=(0, 2), show_edge=False)
        for col in ("instance", "running", "waiting", "KV usage"):
            inst.add_column(col, justify="left" if col == "instance" else "right")
        for name, row in self.latest.items():
            inst.add_row(name, f"{row.get(RUNNING, 0):g}", f"{row.get(WAITING, 0):g}",
                         f"{100.0 * row.get(KV, 0.0):.1f}%")
        return Group(head, inst)

    async def _lines(self) -> None:
        while True:
            await asyncio.sleep(self.line_interval_s)
            print(self.line(), file=self.stream, flush=True)

    def start(self) -> None:
        """Begin showing progress (needs a running event loop in ``lines`` mode)."""
        self.t0 = time.monotonic()
        if self.mode == "rich":
            from rich.console import Console
            from rich.live import Live

            self._live = Live(get_renderable=self._render, console=Console(file=self.stream),
                              refresh_per_second=4, transient=False)
            self._live.start()
        elif self.mode == "lines":
            print(self.line(), file=self.stream, flush=True)
            self._task = asyncio.create_task(self._lines())

    async def stop(self) -> None:
        """Stop; the final state is printed once (as the last redraw or a last line)."""
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            print(self.line(), file=self.stream, flush=True)

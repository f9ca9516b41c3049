"""Progress of the long steps (calibration, sensitivity, the gate, a build's stages), or nothing.

Quantization code reports progress through ``Steps``; the CLI passes a live display and library callers pass
nothing (silent). On a terminal the display is a set of rich progress bars; anywhere else (CI, nohup, a pipe)
bars are never drawn, so it is ``LineProgress``: one plain line when a step starts, at every tenth of a step
with a known size, and when it ends, each with the time since the command started.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def make_progress(console: Console | None = None) -> "Progress | LineProgress":
    """A progress display on ``console``, by default stderr (stdout stays clean for --json): bars on a terminal,
    plain lines elsewhere."""
    console = console if console is not None else Console(stderr=True)
    if not console.is_terminal:
        return LineProgress(console)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


@dataclass
class _LineTask:
    description: str
    total: float | None
    started: float
    completed: float = 0.0
    reported_tenths: int = 0
    finished: bool = field(default=False)


class LineProgress:
    """The part of rich's ``Progress`` that edgekit uses, as plain lines for logs: a bar off a terminal is never
    drawn, and a cold build was silent for 5-10 minutes under CI or nohup."""

    def __init__(self, console: Console, clock=time.monotonic):
        self.console = console
        self._clock = clock
        self._t0 = clock()
        self._tasks: dict[int, _LineTask] = {}

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def _line(self, text: str) -> None:
        self.console.print(f"[{self._clock() - self._t0:7.1f} s] {text}", markup=False, highlight=False,
                           soft_wrap=True)

    def note(self, text: str) -> None:
        """A step without a size (e.g. the planner's "rmsnorm/rmsnorm_fwd: 5 candidates, compiling")."""
        self._line(text)

    def add_task(self, description: str, total: float | None = 100.0, **_) -> int:
        tid = len(self._tasks)
        self._tasks[tid] = _LineTask(description, total, self._clock())
        self._line(f"{description} ...")
        return tid

    def advance(self, task_id: int, advance: float = 1) -> None:
        task = self._tasks[task_id]
        self.update(task_id, completed=task.completed + advance)

    def update(self, task_id: int, *, completed: float | None = None, description: str | None = None, **_) -> None:
        task = self._tasks[task_id]
        if description is not None:
            task.description = description
        if completed is None or task.finished:
            return
        task.completed = completed
        if task.total and completed >= task.total:
            task.finished = True
            self._line(f"{task.description}: done in {self._clock() - task.started:.1f} s")
            return
        if task.total and task.total > 1:
            tenths = int(10 * completed / task.total)
            if tenths > task.reported_tenths:
                task.reported_tenths = tenths
                self._line(f"{task.description}: {100 * completed / task.total:.0f}% "
                           f"({completed:g}/{task.total:g})")


class Steps:
    """A thin handle over an optional rich Progress."""

    def __init__(self, progress: Progress | None = None):
        self.progress = progress

    @contextmanager
    def task(self, description: str, total: int) -> Iterator:
        """Yields ``advance(n=1)``."""
        if self.progress is None:
            yield lambda n=1: None
            return
        tid = self.progress.add_task(description, total=total)
        yield lambda n=1: self.progress.advance(tid, n)
        self.progress.update(tid, completed=total)


SILENT = Steps(None)

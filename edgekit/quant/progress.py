"""Rich progress bars for the long steps (calibration, sensitivity, the gate), or nothing.

Quantization code reports progress through ``Steps``; the CLI passes a live
``rich.progress.Progress`` and library callers pass nothing (silent).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def make_progress(console: Console | None = None) -> Progress:
    """A progress display on ``console``, by default stderr (stdout stays clean for --json)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console if console is not None else Console(stderr=True),
        transient=False,
    )


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

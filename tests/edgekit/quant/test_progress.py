"""Progress off a terminal (CI, nohup, a pipe): plain lines with the elapsed time, a percentage every tenth."""

from __future__ import annotations

import io

from rich.console import Console

from edgekit.quant.progress import LineProgress, Steps, make_progress


def _console(buf: io.StringIO) -> Console:
    return Console(file=buf, force_terminal=False, width=80)


def test_a_step_with_a_size_prints_start_each_tenth_and_done_with_elapsed_time():
    buf, now = io.StringIO(), [100.0]
    progress = LineProgress(_console(buf), clock=lambda: now[0])
    with Steps(progress).task("calibrate", 20) as advance:
        for _ in range(20):
            now[0] += 1.5
            advance()
    lines = buf.getvalue().splitlines()
    assert lines[0] == "[    0.0 s] calibrate ..."
    assert lines[1] == "[    3.0 s] calibrate: 10% (2/20)" and lines[9] == "[   27.0 s] calibrate: 90% (18/20)"
    assert lines[-1] == "[   30.0 s] calibrate: done in 30.0 s" and len(lines) == 11


def test_off_a_terminal_make_progress_gives_lines_and_on_a_terminal_bars():
    buf = io.StringIO()
    assert isinstance(make_progress(_console(buf)), LineProgress)
    assert not isinstance(make_progress(Console(file=buf, force_terminal=True)), LineProgress)

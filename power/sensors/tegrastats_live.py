"""A live ``tegrastats`` process as a sensor, for boards whose sysfs rails cannot be read.

Some JetPack releases (and containers without the i2c sysfs tree mounted) give
no readable INA3221 files, while NVIDIA's ``tegrastats`` still prints rails,
loads and temperatures. This sensor spawns ``tegrastats --interval MS`` (found on
``PATH``, so tests put a fake one there), parses each line as it arrives on a
reader thread (``tegrastats.parse_line``) and answers ``read()`` with the latest
line's sample, stamped with the time the line arrived (tegrastats' own
timestamp is local time without a zone). A line older than three intervals, or
a process that exited, makes the sample unavailable with the reason.
``close()`` terminates the process (SIGTERM, then SIGKILL after 1 s) and joins
the reader. Nothing is run through a shell.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections import deque

from edgekit.power.sample import PowerSample
from edgekit.power.sensors.base import Sensor
from edgekit.power.sensors.tegrastats import parse_line


class TegrastatsSensor(Sensor):
    name = "tegrastats"

    def __init__(self, interval_ms: int = 500, executable: str = "tegrastats"):
        if interval_ms < 10:
            raise ValueError(f"tegrastats interval must be >= 10 ms, got {interval_ms}")
        self.interval_ms = int(interval_ms)
        self.min_interval_s = self.interval_ms / 1000.0
        self.path = shutil.which(executable)
        self.executable = executable
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._latest: tuple[float, PowerSample] | None = None  # (monotonic arrival, sample)
        self._stderr: deque[str] = deque(maxlen=5)
        self._lock = threading.Lock()
        self.lines = 0  # lines read, and how many of them carried nothing recognisable
        self.skipped = 0
        self._closed = False

    def available(self) -> bool:
        return self.path is not None

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [self.path, "--interval", str(self.interval_ms)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace", bufsize=1,
        )
        self._reader = threading.Thread(target=self._read_lines, name="edgekit-tegrastats", daemon=True)
        self._reader.start()
        threading.Thread(target=self._read_stderr, name="edgekit-tegrastats-err", daemon=True).start()

    def _read_lines(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            arrived, wall = time.monotonic(), time.time()
            s = parse_line(line, t_s=wall)
            with self._lock:
                self.lines += 1
                if s is None:
                    self.skipped += 1
                    continue
                s.t_s = wall
                self._latest = (arrived, s)

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line.strip())

    def _read(self, t: float) -> PowerSample:
        if self.path is None:
            return PowerSample.unavailable(self.name, f"no {self.executable!r} executable on PATH", t)
        if self._closed:
            return PowerSample.unavailable(self.name, "closed (the tegrastats process was stopped)", t)
        if self._proc is None:
            self._start()
        assert self._proc is not None
        code = self._proc.poll()
        with self._lock:
            latest = self._latest
        if code is not None and (latest is None or time.monotonic() - latest[0] > 3 * self.min_interval_s):
            err = "; ".join(self._stderr) or "no message"
            return PowerSample.unavailable(self.name, f"tegrastats exited with status {code}: {err}", t)
        if latest is None:
            return PowerSample.unavailable(self.name, "waiting for the first tegrastats line", t)
        age_s = time.monotonic() - latest[0]
        if age_s > 3 * self.min_interval_s:
            return PowerSample.unavailable(self.name, f"no tegrastats line for {age_s:.1f} s (interval {self.interval_ms} ms)", t)
        return latest[1]

    def close(self) -> None:
        self._closed = True
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(1.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(1.0)
        if self._reader is not None:  # the process is gone: its stdout ends and the reader returns
            self._reader.join(1.0)
            self._reader = None
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    def describe(self) -> str:
        return f"tegrastats ({self.path}, every {self.interval_ms} ms)" if self.path else "tegrastats (absent)"

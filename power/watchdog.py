"""The watchdog: a background thread that samples sensors and latency, applies policies, acts.

Inference threads only call ``tracker.record`` (cheap). This thread runs at
the sampler's rate (1 kHz while something moves, 10 Hz while steady) and wakes
at once when ``record`` sees a value above the spike threshold.

At the fast rate the loop does not poll 1000 times a second to find nothing
due: it sleeps until the next thing that is (a sensor whose refresh interval
has passed, the next percentile update), never shorter than one fast period
(1 ms) and never longer than one slow period. Each wakeup costs the inference
thread the GIL and a core for tens of microseconds, so wakeups with no work are
pure overhead; spikes do not wait for a tick at all. Each tick it

1. takes the new latency observations, checks them against the window's p50
   (spike rule) and, at most every ``stats_interval_s`` (longer for big windows),
   recomputes the window percentiles (jitter rule) and the next spike threshold;
2. reads every sensor whose own refresh interval has passed, merges the
   latest readings into one board sample, and checks power, temperature,
   over-current counters and throttling (trip points, GPU clock drops);
3. runs the actions of every event, logs samples/latency/events as JSONL and
   updates the Prometheus gauges.

Nothing here raises into the caller: sensor errors are "unavailable" samples,
action errors are recorded in the event, and an unexpected error in a tick is
logged and the loop goes on.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from collections.abc import Callable

from edgekit.power.actions import ActionRegistry
from edgekit.power.events import Event
from edgekit.power.jsonl import JsonlLogger
from edgekit.power.latency import METRICS, LatencyTracker, WindowStats
from edgekit.power.metrics import WatchdogMetrics
from edgekit.power.policy import PolicyConfig, PolicyEngine
from edgekit.power.sample import PowerSample, merge
from edgekit.power.sampler import AdaptiveSampler, moved
from edgekit.power.sensors.base import CompositeSensor, Sensor


class Watchdog:
    def __init__(
        self,
        tracker: LatencyTracker | None = None,
        sensors: list[Sensor] | Sensor | None = None,
        policy: PolicyConfig | None = None,
        actions: ActionRegistry | None = None,
        logger: JsonlLogger | None = None,
        sampler: AdaptiveSampler | None = None,
        on_event: Callable[[Event], None] | None = None,
        log_interval_s: float = 0.1,
        stats_interval_s: float = 0.05,
        dry_run: bool = False,
        absent_sensors: list[str] | None = None,
        steady_log_interval_s: float = 1.0,
        measured_on: str | None = None,
    ):
        self.policy = policy or PolicyConfig()
        # what produced the latencies (edgekit.measured_on's "cpu", "gpu (NVIDIA H100 ...)"): every latency record says
        # so, and the report with it, since a CPU's timings judged against a target's budgets are not the target's
        self.measured_on = measured_on
        self.tracker = tracker or LatencyTracker(window_s=self.policy.window_s)
        if isinstance(sensors, CompositeSensor):
            sensors = sensors.sensors
        elif isinstance(sensors, Sensor):
            sensors = [sensors]
        self.sensors: list[Sensor] = list(sensors or [])
        self.engine = PolicyEngine(self.policy)
        self.actions = actions or ActionRegistry()
        self.logger = logger
        self.sampler = sampler or AdaptiveSampler()
        self.on_event = on_event
        self.log_interval_s = log_interval_s
        # While nothing moves (the sampler is slow) a sample is logged at most this often: an idle server wrote
        # ~7 KB/s of identical readings. 0 logs every read (a caller that paces the reads, e.g. `edgekit monitor`).
        self.steady_log_interval_s = steady_log_interval_s
        self.stats_interval_s = stats_interval_s
        self.dry_run = dry_run
        # one set of gauges per registry: a second watchdog on the same tracker shares them
        if self.tracker.watchdog_metrics is None:
            self.tracker.watchdog_metrics = WatchdogMetrics(self.tracker.registry)
        self.metrics = self.tracker.watchdog_metrics
        self.registry = self.tracker.registry
        # sensors probed and not found (names): exported as edgekit_sensor_available 0
        self.absent_sensors = list(absent_sensors or [])
        self.metrics.update_sources({name: False for name in self.absent_sensors})

        self.events: deque[Event] = deque(maxlen=1000)
        self.latest: PowerSample | None = None
        self.latest_stats: dict[str, WindowStats] = {}
        self.ticks = 0
        self.cpu_s = 0.0  # CPU time the watchdog thread used, and for how long it ran (its cost)
        self.run_s = 0.0
        self.errors: deque[str] = deque(maxlen=20)
        self._seq = {m: 0 for m in METRICS}
        self._stats_at = {m: -float("inf") for m in METRICS}
        self._stats_gap = {m: stats_interval_s for m in METRICS}
        self._sensor_due = [0.0] * len(self.sensors)
        self._sensor_last: list[PowerSample | None] = [None] * len(self.sensors)
        self._last_sample_log = -float("inf")
        self._last_latency_log = -float("inf")
        self._latency_unlogged = False  # the window statistics changed since the last latency record
        self._unsummarised: set[str] = set()  # metrics with observations their window statistics do not hold yet
        self._stop = threading.Event()
        self._active = threading.Event()
        self._active.set()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------
    def write_meta(self, **extra) -> None:
        """The log's first record: sensors, policy, rates and (``start``) this board's power mode."""
        if self.logger is not None:
            self.logger.meta(sensors=[s.describe() for s in self.sensors], policy=self.policy.model_dump(),
                             fast_hz=self.sampler.fast_hz, slow_hz=self.sampler.slow_hz, **extra)

    def start(self) -> "Watchdog":
        if self._thread is not None:
            return self
        if self.logger is not None:
            from edgekit.power.sensors.power_mode import read_power_mode

            self.write_meta(power_mode=read_power_mode())
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="edgekit-watchdog", daemon=True)
        self._thread.start()
        return self

    def pause(self) -> None:
        """Stop sampling until resume() (the thread stays, blocked); e.g. while a model loads."""
        self._active.clear()

    def resume(self) -> None:
        self._active.set()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._active.set()
        self.tracker.wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self.logger is not None:
            self.logger.close()
        for s in self.sensors:
            s.close()

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        wake = self.tracker.wake
        cpu0, wall0 = time.thread_time(), time.monotonic()
        while not self._stop.is_set():
            if not self._active.is_set():
                self._active.wait()  # paused: blocked, no CPU, until resume() or stop()
                continue
            wake.wait(self.next_sleep_s(time.monotonic()))  # returns at once on a spike
            wake.clear()
            if self._stop.is_set():
                break
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 - keep watching; say what went wrong
                self.errors.append(f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")
            self.cpu_s, self.run_s = time.thread_time() - cpu0, time.monotonic() - wall0

    def next_sleep_s(self, mono: float) -> float:
        """How long to sleep: one slow period when steady; when fast, until the next due item."""
        slow = 1.0 / self.sampler.slow_hz
        if self.sampler.mode(mono) == "slow":
            return slow
        fast = 1.0 / self.sampler.fast_hz
        due = min(self._sensor_due, default=float("inf"))
        waiting = [m for m in METRICS if self.tracker.count(m) != self._seq[m]]
        if waiting:  # new observations: update their percentiles on time
            stats_due = min(self._stats_at[m] + self._stats_gap[m] for m in waiting)
            # A percentile update rides on a sensor read that comes within half an interval of
            # it: one wakeup instead of two (spikes never wait: record() wakes the loop).
            if stats_due + self.stats_interval_s / 2 < due:
                due = stats_due
        return min(max(due - mono, fast), slow)

    # -- one step -------------------------------------------------------------
    def tick(self, now_mono: float | None = None, now_wall: float | None = None, read_all: bool = False) -> list[Event]:
        """One step. ``read_all`` reads every sensor now, whatever its refresh interval (a caller such
        as `edgekit monitor` that paces the ticks itself wants one fresh sample per tick)."""
        mono = time.monotonic() if now_mono is None else now_mono
        wall = time.time() if now_wall is None else now_wall
        self.ticks += 1
        events = self._check_latency(mono, wall)
        events += self._check_sensors(mono, wall, force=read_all)
        for e in events:
            self._raise(e, mono)
        return events

    def _check_latency(self, mono: float, wall: float) -> list[Event]:
        events: list[Event] = []
        tr = self.tracker
        for m in METRICS:
            count = tr.count(m)
            new: list[tuple[float, float]] = []
            if count != self._seq[m]:
                new = tr.since(m, self._seq[m])
                self._seq[m] = count
                self._unsummarised.add(m)
            elif m not in self._unsummarised:
                self._expire(m, mono)
                continue
            before = self.latest_stats.get(m)
            spikes = self.engine.check_spikes(m, new, before, wall) if new else []
            events += spikes
            if spikes or mono - self._stats_at[m] >= self._stats_gap[m]:
                self._unsummarised.discard(m)
                c0 = time.perf_counter()
                stats = tr.stats(m, mono)
                # A big window (thousands of tokens) costs more to summarise: space the updates
                # so percentiles never take more than ~0.5 % of a core.
                self._stats_gap[m] = max(self.stats_interval_s, 200.0 * (time.perf_counter() - c0))
                self._stats_at[m] = mono
                if stats is None:
                    continue
                prev_p50 = before.p50_ms if before else None
                self.latest_stats[m] = stats
                self._latency_unlogged = True
                tr.spike_threshold_ms[m] = self.engine.spike_threshold_ms(stats)
                events += self.engine.check_window(stats, wall)
                if spikes or moved(prev_p50, stats.p50_ms, rel=0.1, abs_=0.5):
                    self.sampler.note_activity(mono)
        # one record per change of the windows (not per tick: the last window was rewritten at 10 Hz while idle),
        # including the change to an empty window once the last observation has left it
        if self.logger is not None and self._latency_unlogged and mono - self._last_latency_log >= self.log_interval_s:
            self._last_latency_log = mono
            self._latency_unlogged = False
            self.logger.write({"type": "latency", "t_s": wall, "rate_hz": self.sampler.rate_hz(mono),
                               "metrics": {m: s.to_dict() for m, s in self.latest_stats.items()},
                               **({"measured_on": self.measured_on} if self.measured_on else {})})
            for s in self.latest_stats.values():
                self.metrics.update_latency(s)
            self.metrics.rate.set(self.sampler.rate_hz(mono))
        return events

    def _expire(self, metric: str, mono: float) -> None:
        """A metric that saw nothing new for a whole window: its window is recomputed (observations leave it), and
        an empty one is dropped, not reported as the last busy window forever."""
        if metric not in self.latest_stats or mono - self._stats_at[metric] < self.tracker.window_s:
            return
        self._stats_at[metric] = mono
        stats = self.tracker.stats(metric, mono)
        if stats is None:
            del self.latest_stats[metric]
            self.tracker.spike_threshold_ms[metric] = float("inf")
        else:
            self.latest_stats[metric] = stats
        self._latency_unlogged = True

    def _check_sensors(self, mono: float, wall: float, force: bool = False) -> list[Event]:
        """Read the sensors that are due (all of them with ``force``) and apply the sensor policies."""
        if not self.sensors:
            if force:  # a caller pacing the reads itself still gets a sample per tick: an unavailable one
                absent = ", ".join(self.absent_sensors) or "none probed"
                self.latest = PowerSample.unavailable("none", f"no sensors on this machine (absent: {absent})", wall)
                self._log_sample(self.latest, mono)
            return []
        events: list[Event] = []
        read_any = temps_read = oc_read = False
        # Due times advance by whole intervals from a common start (not from "now"), so sensors
        # whose intervals divide each other (50 ms, 100 ms, 500 ms) stay in step and share
        # wakeups; one fast period of slack absorbs the loop's own timing jitter.
        slack = 1.0 / self.sampler.fast_hz
        for i, s in enumerate(self.sensors):
            if not force and mono < self._sensor_due[i] - slack:
                continue
            nxt = self._sensor_due[i] + s.min_interval_s
            self._sensor_due[i] = nxt if nxt > mono else mono + s.min_interval_s  # fell behind: restart the phase
            sample = s.read(wall)
            events += self.engine.check_sensor(sample)
            if self._sensor_last[i] is None or self._sensor_last[i].available != sample.available:
                self.metrics.update_sources({s.name: sample.available})
            self._sensor_last[i] = sample
            read_any = True
            temps_read = temps_read or bool(sample.temps_c)
            oc_read = oc_read or bool(sample.oc_event_counts)
        if not read_any:
            return events
        board = merge([x for x in self._sensor_last if x is not None], wall)
        prev = self.latest
        self.latest = board
        events += self.engine.check_power(board)
        if temps_read:  # temperatures change only when a sensor that has them was read
            events += self.engine.check_temperatures(board)
        if oc_read:  # counters change only when read (once a second); the rule measures its window between reads
            events += self.engine.check_over_current(board)
        if board.trips or board.gpu_max_freq_mhz is not None:
            events += self.engine.check_throttle(board)
        if prev is not None and (
            moved(prev.budget_power()[0], board.budget_power()[0], rel=0.05, abs_=250.0)
            or (temps_read and any(moved(prev.temps_c.get(z), c, rel=0.0, abs_=2.0) for z, c in board.temps_c.items()))
        ):
            self.sampler.note_activity(mono)
        self._log_sample(board, mono)
        return events

    def _log_sample(self, board: PowerSample, mono: float) -> None:
        steady = self.steady_log_interval_s if self.sampler.mode(mono) == "slow" else 0.0
        if mono - self._last_sample_log >= max(self.log_interval_s, steady):
            self._last_sample_log = mono
            self.metrics.update_sample(board)
            if self.logger is not None:
                self.logger.write({"type": "sample", **board.to_dict()})

    def _raise(self, e: Event, mono: float) -> None:
        e.detected_mono_s = mono
        e.actions = self.actions.run(e, self.policy.actions.get(e.kind, []), dry_run=self.dry_run)
        self.sampler.note_activity(mono)
        with self._lock:
            self.events.append(e)
        self.metrics.count_event(e)
        if self.logger is not None:
            self.logger.write({"type": "event", **e.to_dict()}, flush=True)
        if self.on_event is not None:
            try:
                self.on_event(e)
            except Exception as err:  # noqa: BLE001 - a listener's bug must not stop the watchdog
                self.errors.append(f"on_event: {type(err).__name__}: {err}")

    # -- offline --------------------------------------------------------------
    def observe_sample(self, sample: PowerSample) -> list[Event]:
        """Apply the power/temperature policies to one given sample (replay, standalone monitor)."""
        events = self.engine.check_sample(sample)
        self.latest = sample
        self.metrics.update_sample(sample)
        if self.logger is not None:
            self.logger.write({"type": "sample", **sample.to_dict()})
        for e in events:
            self._raise(e, time.monotonic())
        return events

    def recent_events(self, n: int = 10) -> list[Event]:
        with self._lock:
            return list(self.events)[-n:]

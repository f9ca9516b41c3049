"""edgekit.power: power sensors, latency tracking and the on-device watchdog.

Modules (one concept each)::

    sample.py            PowerSample: rails (mW), total, GPU load, temperatures; merge; total rule
    sensors/base.py      Sensor.read() never raises: absent/unreadable -> an "unavailable" sample
    sensors/sysfs.py     the injectable sysfs root; value files re-read with pread
    sensors/hwmon_ina3221.py  Jetson INA3221 rails (hwmon globbed, NC and sum channels skipped)
    sensors/thermal.py   thermal zones by type; sensors/gpu_load.py Tegra GPU load and clock
    sensors/tegrastats.py     lenient tegrastats line parser and log replay
    sensors/nvml.py      discrete GPUs (power, instantaneous power, energy counter)
    sensors/rapl.py      CPU package energy counters; sensors/system.py psutil CPU/memory
    sensors/discover.py  which sensors this machine (or a recorded tree) has
    latency.py           rolling windows (p50/p95/p99, jitter p99-p50, std), Prometheus histograms
    sampler.py           adaptive rate: fast (1 kHz) while metrics move, slow (10 Hz) when steady
    policy.py            PolicyConfig (budgets, overrides) and the rules that raise events
    events.py, actions.py     events with evidence; registered callbacks, nvpmodel
    watchdog.py          the background thread tying it together; metrics.py its gauges
    jsonl.py, report.py  the log and `edgekit report`; scrape.py, monitor_view.py `edgekit monitor`
    probation.py         is a swapped plugin worse than the one before?

Wiring it into a runtime::

    from edgekit.power.latency import LatencyTracker, timed_stream
    from edgekit.power.policy import PolicyConfig
    from edgekit.power.sensors.discover import local_sensors
    from edgekit.power.watchdog import Watchdog

    policy = PolicyConfig.from_profile(target_profile_dict, overrides={"power_target_w": 15})
    tracker = LatencyTracker(window_s=policy.window_s)
    wd = Watchdog(tracker, local_sensors()[0], policy, logger=JsonlLogger("watchdog.jsonl"))
    wd.actions.register("rollback_plugin", lambda event: runtime.rollback_probation(event))
    wd.start()
    for tok in timed_stream(generator.stream(ids, n), tracker): ...
    # /metrics: prometheus_client.generate_latest(wd.registry)

Nothing is imported here, so ``import edgekit.power`` stays cheap.
"""

"""edgekit.power: power sensors, latency tracking and the on-device watchdog.

Modules (one concept each)::

    sample.py            PowerSample: rails (mW), measured total or labelled sum of rails, loads, temperatures,
                         OC counters, trip points, clocks; merge. Absent stays None, never 0
    sensors/base.py      Sensor.read() never raises: absent/unreadable -> an "unavailable" sample
    sensors/sysfs.py     the injectable sysfs root; value files re-read with pread
    sensors/hwmon_ina3221.py  Jetson INA3221 rails (hwmon globbed, NC and sum channels skipped)
    sensors/iio_ina3221x.py   the same rails through JetPack 4's ina3221x IIO driver
    sensors/thermal.py   thermal zones by type, trip points, placeholder zones; gpu_load.py GPU load, clock, ceiling
    sensors/soctherm_oc.py    Orin over-current / under-voltage event counters
    sensors/tegrastats.py     lenient tegrastats line parser (JetPack 4-7) and log replay
    sensors/tegrastats_live.py  a live `tegrastats --interval` process where sysfs rails are not readable
    sensors/power_mode.py     the nvpmodel power mode for logs, reports and benchmark rows
    sensors/nvml.py      discrete GPUs (power, instantaneous power, energy counter)
    sensors/rapl.py      CPU package energy counters; sensors/system.py psutil CPU/memory
    sensors/discover.py  which sensors this machine (or a recorded tree) has, and which are absent
    latency.py           rolling windows (p50/p95/p99, jitter p99-p50, std), Prometheus histograms
    sampler.py           adaptive rate: fast (1 kHz) while metrics move, slow (10 Hz) when steady
    policy.py            PolicyConfig (budgets, overrides) and the rules that raise events
    band_quantity.py     which power reading the power band holds (a sum missing a rail is not the board's power)
    events.py, actions.py     events with evidence; registered callbacks, nvpmodel
    watchdog.py          the background thread tying it together; metrics.py its families (built at
                         scrape time: what was not read is not exported; edgekit_sensor_available per source)
    jsonl.py, report.py  the log and `edgekit report`; scrape.py, monitor_view.py `edgekit monitor`
    probation.py         is a swapped plugin worse than the one before?

Wiring it into a runtime::

    from edgekit.power.latency import LatencyTracker, timed_stream
    from edgekit.power.policy import PolicyConfig
    from edgekit.power.sensors.discover import absent_names, local_sensors
    from edgekit.power.watchdog import Watchdog

    policy = PolicyConfig.from_profile(target_profile_dict, overrides={"power_target_w": 15})
    tracker = LatencyTracker(window_s=policy.window_s)
    sensors, absent = local_sensors()
    wd = Watchdog(tracker, sensors, policy, logger=JsonlLogger("watchdog.jsonl"), absent_sensors=absent_names(absent))
    wd.actions.register("rollback_plugin", lambda event: runtime.rollback_probation(event))
    wd.start()
    for tok in timed_stream(generator.stream(ids, n), tracker): ...
    # /metrics: prometheus_client.generate_latest(wd.registry)

Nothing is imported here, so ``import edgekit.power`` stays cheap.
"""

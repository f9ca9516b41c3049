"""edgekit.power: power sensors, latency tracking and the watchdog."""

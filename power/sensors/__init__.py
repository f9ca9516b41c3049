"""Power, temperature and load sensors behind one interface (``Sensor.read() -> PowerSample``)."""

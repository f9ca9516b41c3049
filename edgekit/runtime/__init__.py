"""Device runtime: bundle loading, plugin dispatch, OTA swap, server."""

"""Device runtime: bundle loading, plugin dispatch and GPU runner, OTA swap and agent, server.

The publisher's side of OTA (the TUF repository) is host code: ``edgekit.publish``.
"""

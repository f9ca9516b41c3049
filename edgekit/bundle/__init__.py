"""Bundles: manifest, signatures, plugins, golden vectors, verification.

One concept per module:

- ``canonical``: canonical JSON, hashes, safe relative paths (atomic writes: ``edgekit.durable``).
- ``keys``: ed25519 key files, key ids, detached signatures, the development key.
- ``manifest``: manifest.json schema (format name + version, files with sha256/size).
- ``plugin``: plugin.json schema and the signed single-file plugin package (OTA).
- ``golden``: golden vectors file format and the pure comparison verdict.
- ``archive``: deterministic .tar writing and safe extraction.
- ``writer``: ``BundleWriter`` (atomic, deterministic, signs the manifest).
- ``verify``: pure checks over bytes + the ``verify_bundle(path, ...)`` I/O layer.

Running a bundle's plugins on a GPU is device code: ``edgekit.runtime.gpu_runner``.

Nothing is imported here, so ``import edgekit.bundle.keys`` stays cheap.
"""

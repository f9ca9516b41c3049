"""Bundles: manifest, signatures, plugins, golden vectors, verification."""

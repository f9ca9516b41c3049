"""The small bundle the runtime's GPU tests serve: preset:tiny, fp16, built for h200 (its fused operators shipped as
plugins), opened on the GPU (golden vectors through the plugins). One builder, so the tests serve the same thing."""

from __future__ import annotations

from pathlib import Path


def tiny_h200_bundle(root: Path):
    """Build the bundle under ``root`` and open it on CUDA (an OpenedBundle)."""
    from edgekit.builder import BuildOptions, build_bundle
    from edgekit.runtime.bundle_runtime import open_bundle

    opts = BuildOptions(model="preset:tiny", target="h200", out=root / "b", dev_key=True, precision="fp16",
                        context=96, buckets=(16, 32), cache_dir=root / "cache", onnx=False)
    build_bundle(opts)
    return open_bundle(opts.out, [], allow_dev_key=True, device="cuda")

"""Load and launch every plugin of a bundle the way a device does, then print which Triton modules got imported.

Usage: ``python plugin_loader_probe.py BUNDLE`` prints one JSON object: the plugins loaded, the launches made and
``triton_modules`` (``triton`` itself or any ``edgekit.kernels.*_triton``), which must be empty: a device runs
compiled plugins without Triton installed. Not a test module: test_device_without_triton.py runs it in a process
where Triton, transformers and ONNX cannot be imported, and scripts/check_wheel.sh in a venv that lacks them.

There is no GPU here, so the CUDA driver's part (loading a cubin, cuLaunchKernel) is replaced by stand-ins that
count launches; everything above it is the device's own code: plugin metadata, the trusted launcher's program
checks, each operator's host-side preparation (on the golden inputs the plugin ships) and the launch program.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # host checks accept CPU tensors (no GPU to put them on); Triton is not loaded


class StandInKernel:
    """A compiled kernel as the launcher sees it (its signature), launched by counting."""

    launches = 0

    def __init__(self, meta: dict, **_):
        self.name = meta["name"]
        self.signature = [tuple(p) for p in meta["signature"]]

    @classmethod
    def from_metadata(cls, meta, **kw) -> "StandInKernel":
        return cls(meta, **kw)

    def launch(self, grid, args, stream) -> None:
        StandInKernel.launches += 1

    def unload(self) -> None:
        pass


def main(bundle: Path) -> dict:
    import torch

    import edgekit.kernels.launcher as launcher
    from edgekit.bundle.golden import read_golden
    from edgekit.bundle.manifest import MANIFEST_FILE, PLUGIN_METADATA_FILE, parse_manifest
    from edgekit.bundle.plugin import parse_plugin_metadata
    from edgekit.kernels.registry import OPERATORS
    from edgekit.runtime.gpu_runner import call_with_spec_order, load_plugin_op

    # what `serve` imports on a GPU: the engine, the fused decode step, CUDA graphs, the store and its checks
    import edgekit.runtime.cuda_graphs  # noqa: F401
    import edgekit.runtime.fused_decode  # noqa: F401
    import edgekit.runtime.graphed_prefill  # noqa: F401
    import edgekit.runtime.plugin_checks  # noqa: F401
    import edgekit.runtime.serving  # noqa: F401

    launcher.LoadedKernel = StandInKernel  # the CUDA driver's part only
    manifest = parse_manifest((bundle / MANIFEST_FILE).read_bytes())
    loaded = []
    for ref in manifest.plugins:
        d = bundle / ref.path
        meta = parse_plugin_metadata((d / PLUGIN_METADATA_FILE).read_bytes())
        op = load_plugin_op(meta, lambda name, d=d: (d / name).read_bytes(), torch.device("cpu"))
        for case in read_golden((d / "golden.safetensors").read_bytes()).cases:
            inputs = {k: v for k, v in case.inputs.items()}
            call_with_spec_order(op, ref.op, inputs, dict(case.meta.attributes))
        loaded.append(ref.op)
    assert OPERATORS  # the registry itself imports no Triton module
    triton = sorted(m for m in sys.modules if m == "triton" or m.startswith("triton.")
                    or (m.startswith("edgekit.kernels.") and m.endswith("_triton")))
    return {"plugins": loaded, "launches": StandInKernel.launches, "triton_modules": triton}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))

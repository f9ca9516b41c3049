"""Golden vectors on a GPU: run a bundle's plugins themselves (cubin, or PTX on a newer GPU).

`verify` on a machine with a CUDA GPU passes `plugin_runner(bundle_root)` as its
`run_golden`: each plugin's golden vectors are run through that plugin's own
kernels, loaded by the trusted launcher (edgekit.kernels.launcher) from the
verified bytes; model-level vectors (golden/*.safetensors, plugin=None) run on
the bundle's plugin for that operator when it has one, else on the torch
reference on the GPU. Only called after every hash has been checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import torch

from edgekit.bundle.golden import GoldenRunner, run_reference
from edgekit.bundle.manifest import PLUGIN_METADATA_FILE
from edgekit.bundle.plugin import PluginMetadata, parse_plugin_metadata


def load_plugin_op(meta: PluginMetadata, read: Callable[[str], bytes], device: Optional[torch.device] = None):
    """A callable operator (kernels.launcher.PluginOp) from a plugin's metadata and file bytes."""
    from edgekit.kernels.launcher import LoadedKernel, PluginOp

    kernels = {}
    try:
        for k in meta.kernels:
            kernels[k.kernel] = LoadedKernel.from_metadata(
                meta.loader_metadata(k.kernel), cubin=read(k.cubin), ptx=read(k.ptx).decode("utf-8"), device=device
            )
        return PluginOp(meta.op, meta.launch, kernels)
    except BaseException:
        for lk in kernels.values():
            lk.unload()
        raise


def on_own_stream(dev: torch.device, fn: Callable[[], Any]):
    """``fn()`` on a CUDA stream of its own, its tensor outputs copied to the host on that stream, which alone is
    waited for. Never the legacy default stream nor a device-wide synchronize: a check beside a serving process
    neither waits for the serving stream's work nor disturbs a graph capture on another thread. Its kernels may run
    beside the serving graphs: no edgekit kernel waits on a grid barrier, so each program runs to its end."""
    stream = torch.cuda.Stream(device=dev)  # no wait on the caller's stream: the inputs are host tensors
    with torch.cuda.stream(stream):
        out = _to_host(fn())
    stream.synchronize()
    return out


def _to_host(raw):
    """Outputs (a tensor, a sequence or a mapping of them) with every tensor copied to the CPU."""
    if isinstance(raw, torch.Tensor):
        return raw.cpu()
    if isinstance(raw, dict):
        return {k: _to_host(v) for k, v in raw.items()}
    if isinstance(raw, (list, tuple)):
        return type(raw)(_to_host(v) for v in raw)
    return raw


def call_with_spec_order(fn, op: str, inputs: dict[str, torch.Tensor], attributes: dict[str, Any]):
    """Call an operator implementation positionally, like its reference: inputs in spec order
    (None for an absent optional input), then attributes in spec order."""
    from edgekit.kernels.registry import OPERATORS

    spec = OPERATORS[op].spec
    args = [inputs.get(t.name) for t in spec.inputs]
    args += [attributes[a] for a in spec.attributes if a in attributes]
    return fn(*args)


def plugin_runner(bundle_root: str | Path, device: str = "cuda") -> GoldenRunner:
    """A GoldenRunner that executes the bundle's plugins on `device`; loaded plugins are cached per runner."""
    root = Path(bundle_root)
    dev = torch.device(device)
    loaded: dict[str, Any] = {}

    def plugin_for(plugin_dir: str):
        if plugin_dir not in loaded:
            d = root / plugin_dir
            meta = parse_plugin_metadata((d / PLUGIN_METADATA_FILE).read_bytes(), name=f"{plugin_dir}/{PLUGIN_METADATA_FILE}")
            loaded[plugin_dir] = load_plugin_op(meta, lambda name: (d / name).read_bytes(), dev)
        return loaded[plugin_dir]

    def active_plugin_dir(op: str) -> Optional[str]:
        versions = sorted((int(p.name), p) for p in (root / "plugins" / op).glob("*") if p.name.isdigit()) if (root / "plugins" / op).is_dir() else []
        return f"plugins/{op}/{versions[-1][0]}" if versions else None

    def run(op: str, inputs: dict[str, torch.Tensor], attributes: dict[str, Any], plugin: Optional[str]):
        target = plugin or active_plugin_dir(op)
        impl = plugin_for(target) if target is not None else None

        def launch():
            on_dev = {k: v.to(dev) for k, v in inputs.items()}
            if impl is None:
                return run_reference(op, on_dev, attributes)
            return call_with_spec_order(impl, op, on_dev, attributes)

        return on_own_stream(dev, launch)

    return run

"""Open a built bundle on the device: verify it, load its weights and tokenizer, and build its dispatch table.

Nothing is used before ``verify_bundle`` has checked the signature against a
trusted key and every file's hash; an unverified bundle is refused. On a CUDA
GPU each operator runs its bundle plugin (the cubin for the exact arch, else
the PTX JIT-compiled by the driver) through the trusted launcher; without a GPU
the same model runs on the torch reference operators (FP32), which gives the
tokens the plugins must match.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from edgekit.bundle.manifest import MANIFEST_FILE, PLUGIN_METADATA_FILE, Manifest, parse_manifest
from edgekit.bundle.verify import VerificationReport
from edgekit.errors import BundleError, EdgekitError
from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import Decoder, ModelWeights
from edgekit.shapes import StaticShapes, batch_buckets_for


@dataclass
class OpenedBundle:
    root: Path
    manifest: Manifest
    report: VerificationReport
    config: ModelConfig
    weights: ModelWeights
    tokenizer: object | None
    shapes: StaticShapes
    device: torch.device
    notes: list[str] = field(default_factory=list)
    _tmp: object | None = None  # keeps an extracted archive alive

    @property
    def backend(self) -> str:
        return "plugins" if self.device.type == "cuda" else "reference"

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        """The decode batch sizes this bundle serves: its plan's (the KV cache, tiles and memory plan were sized for
        the largest). A bundle whose plan predates them serves powers of two up to its manifest's batch."""
        planned = (self.manifest.plan.get("shapes") or {}).get("batch_buckets")
        batch = self.shapes.batch
        if planned is None:
            return batch_buckets_for(batch)
        if (not isinstance(planned, list) or not all(isinstance(b, int) and b >= 1 for b in planned)
                or planned != sorted(set(planned)) or planned[-1] != batch):
            raise BundleError(f"{self.root}: the plan's batch buckets {planned!r} are not increasing sizes ending at "
                              f"the manifest's batch {batch}", hint="rebuild the bundle with this edgekit")
        return tuple(planned)

    def serving_buckets(self, batch: int | None) -> tuple[int, ...]:
        """The batch buckets of serving at most ``batch`` sequences together (None: the plan's batch). More than the
        plan's batch is refused: the bundle's KV cache, tiles and memory plan were made for at most that many."""
        planned = self.batch_buckets
        if batch is None:
            return planned
        if batch > planned[-1]:
            raise BundleError(f"batch {batch} is more than bundle {self.root} was planned for ({planned[-1]}): its KV "
                              f"cache, kernel tiles and memory plan are sized for {planned[-1]} sequences",
                              hint=f"serve with --batch {planned[-1]} or less, or rebuild with `edgekit build --batch "
                                   f"{batch}`")
        return tuple(b for b in planned if b < batch) + (batch,)

    @property
    def watchdog_budgets(self) -> dict | None:
        """The watchdog's budgets the plan recorded for the bundle's target (None: a plan that predates them)."""
        budgets = self.manifest.plan.get("budgets")
        return dict(budgets) if isinstance(budgets, dict) else None

    def plugin_dir(self, op: str) -> Path | None:
        refs = [p for p in self.manifest.plugins if p.op == op]
        return self.root / max(refs, key=lambda p: p.version).path if refs else None

    def dispatch_table(self) -> DispatchTable:
        """Plugins on a GPU (one per operator the bundle ships), the torch reference on a CPU."""
        table = DispatchTable()
        if self.device.type != "cuda":
            return table
        from edgekit.runtime.gpu_runner import load_plugin_op
        from edgekit.bundle.plugin import parse_plugin_metadata

        for ref in self.manifest.plugins:
            d = self.root / ref.path
            meta = parse_plugin_metadata((d / PLUGIN_METADATA_FILE).read_bytes(), name=f"{ref.path}/{PLUGIN_METADATA_FILE}")
            table.set(ref.op, load_plugin_op(meta, lambda name, d=d: (d / name).read_bytes(), self.device),
                      source=f"plugin:v{ref.version}")
        return table

    def decoder(self, ops: DispatchTable | None = None) -> Decoder:
        return Decoder(self.config, self.weights, ops if ops is not None else self.dispatch_table())


DEVICE_NAMES = ("cuda", "gpu", "cpu")  # gpu: another name for cuda


def resolve_device(requested: str | None) -> torch.device:
    """The device to run on: ``requested`` (cuda, gpu, cpu, cuda:N), or CUDA when there is one. Refuses, in one
    line, a name torch does not know and a GPU this machine does not have (rather than failing mid-verification)."""
    if not requested:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = "cuda" + requested[3:] if requested.startswith("gpu") else requested
    kind, _, index = name.partition(":")
    if kind not in ("cuda", "cpu") or (index and not (kind == "cuda" and index.isdigit())):
        raise EdgekitError(f"device {requested!r} is not one of {', '.join(DEVICE_NAMES)} (or cuda:N)",
                           hint="omit --device to use a CUDA GPU when there is one, the CPU otherwise")
    if kind == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise EdgekitError(f"device {requested!r}: {why}",
                               hint="use --device cpu (the torch reference operators), or run where a CUDA GPU is")
        if index and int(index) >= torch.cuda.device_count():
            raise EdgekitError(f"device {requested!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)",
                               hint="pick an index below that, or omit it")
    return torch.device(name)


def open_bundle(path: str | Path, trusted_keys, *, allow_dev_key: bool = False, golden: bool = True,
                device: str | None = None) -> OpenedBundle:
    from edgekit.bundle.golden import run_reference
    from edgekit.bundle.verify import verify_bundle
    from edgekit.model.weights_file import load_weights_file

    path = Path(path)
    dev = resolve_device(device)
    tmp = None
    if path.is_file():  # a single-file archive: extract safely (refuses .., absolute paths, links)
        from edgekit.bundle.archive import safe_extract

        tmp = tempfile.TemporaryDirectory(prefix="edgekit-bundle-")
        root = safe_extract(path, Path(tmp.name) / "bundle")
    else:
        root = path
    runner_for_root = None
    if golden and dev.type == "cuda":
        from edgekit.runtime.gpu_runner import plugin_runner

        runner_for_root = plugin_runner
    report = verify_bundle(root, trusted_keys, allow_dev_key=allow_dev_key,
                           run_golden=run_reference if golden else None, runner_for_root=runner_for_root)
    report.raise_if_failed()  # an unverified bundle is never used
    manifest = parse_manifest((root / MANIFEST_FILE).read_bytes())
    act_dtype = torch.float16 if dev.type == "cuda" else torch.float32
    q = load_weights_file(root / "weights", dtype=act_dtype, device=dev)
    tok = None
    if (root / "tokenizer" / "tokenizer.json").exists():
        from edgekit.model.tokenizer import tokenizer_from_directory

        tok = tokenizer_from_directory(root / "tokenizer")
    b = manifest.buckets
    shapes = StaticShapes(tuple(b.prompt_lengths), b.max_seq_len, b.batch)
    notes = []
    weights = q.weights
    if dev.type != "cuda":
        notes.append("no CUDA GPU: operators run on the torch reference (FP32) with the bundle's weights")
        weights, n = dequantized_for_cpu(weights)
        if n:
            notes.append(f"{n} weight-only (INT8/INT4) projections dequantized once to FP32 for the CPU (same values; "
                         "re-dequantizing per call on a CPU costs ~20x)")
    if manifest.dev_key:
        notes.append("signed with the public development key (integrity only)")
    if q.kv_scales is not None:
        raise BundleError(f"{root}: INT8 KV cache bundles are not served yet", hint="build without --kv-int8")
    return OpenedBundle(root, manifest, report, q.config, weights, tok, shapes, dev, notes, tmp)


def dequantized_for_cpu(weights: ModelWeights) -> tuple[ModelWeights, int]:
    """W8A16, W4A16 and grouped INT8 projections as FP32 `linear` weights: the values the weight-only op multiplies by
    (a tied quantized head's FP32 copy then serves the lookup too: edgekit.model.layers.with_layers).

    W8A8 stays as it is: its activations are quantized too, which a float weight would not reproduce.
    """
    from edgekit.kernels.linear import LinearWeights
    from edgekit.model.layers import named_linears, with_layers

    layers, n = {}, 0
    for name, lw in named_linears(weights).items():
        if lw.op in ("linear_w8a16", "linear_w4a16", "linear_w8a16_grouped"):
            layers[name] = LinearWeights("linear", lw.dequantized().to(lw.scale.device), lw.bias)
            n += 1
    return (with_layers(weights, layers) if layers else weights), n

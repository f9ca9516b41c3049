"""The bundle's weights file: one safetensors file, and reading it back into ModelWeights.

Written by the build and by ``edgekit quantize``, read by the device runtime
(which never imports the quantizer). ``model.safetensors`` holds, by name:
    tok_embeddings, norm, blocks.{i}.attn_norm, blocks.{i}.ffn_norm   FP (storage dtype, FP16 by default)
    blocks.{i}.q_norm, k_norm (D,), post_attn_norm, post_ffn_norm     FP, when the config's family has them
    {layer}.qweight int8 (N, K), {layer}.scale fp32 (N,)             an INT8 layer
    {layer}.smooth fp32 (K,)                                         W8A8 with SmoothQuant
    {layer}.qweight uint8 (N, K/2), {layer}.scale fp16|fp32 (N, K/G)  a W4A16 layer (kernels/int4_layout.py:
    {layer}.offset fp16|fp32 (N, K/G)                                GGML Q4 nibble order, G = 32|64|128;
                                                                     offset only when asymmetric)
    {layer}.qweight int8 (N, K), {layer}.scale fp16|fp32 (N, K/G)     a grouped INT8 layer (kernels/
                                                                     int8_group_layout.py: a GGUF Q8_0 tensor
                                                                     taken in bit for bit, G = 32)
    {layer}.weight (N, K)                                            a layer kept in floating point
    {layer}.bias (N,)                                                when the layer has one
    blocks.{i}.k_scale, blocks.{i}.v_scale fp32 (Hkv,)               INT8 KV cache only

where {layer} is ``blocks.{i}.wqkv|wo|w_gate_up|w_down`` or ``lm_head``. A
tied LM head kept in floating point has no tensors of its own. A tied LM head
that is quantized (INT8 or W4A16) is the only copy of the matrix: the file has
its ``lm_head.*`` tensors and no ``tok_embeddings`` (the header says
``"embedding": "lm_head"``, format version 2), and the lookup dequantizes the
rows it gathers (edgekit.model.embedding). The safetensors
header's metadata carries a small JSON description: the format and its
version, the model config, the mode, and each layer's operator and precision
(a W4A16 layer also its ``group`` and whether it has an ``offset``). W4A16
scales and offsets are stored in their own dtype, never widened or rounded: a
GGUF Q4_1 file's fp16 scales travel bit for bit.
Files are written to a temp name, fsync'd and renamed, so a crash leaves the
old file or the new one. Reading never unpickles anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from edgekit.errors import ModelLoadError
from edgekit.kernels.int4_layout import GROUP_SIZES
from edgekit.kernels.int8_group_layout import GROUP_SIZES as INT8_GROUP_SIZES
from edgekit.kernels.linear import LinearWeights
from edgekit.kernels.registry import OPERATORS
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import BlockWeights, Decoder, ModelWeights
from edgekit.model.embedding import QuantizedEmbedding
from edgekit.model.kv_int8 import KVScales, make_decoder
from edgekit.model.layers import HEAD, dtype_name, layer_names, named_linears
from edgekit.model.weights import norm_shapes

FORMAT = "edgekit-quant"
FORMAT_VERSION = 1
# Version 2 is written only when the embedding is read from a quantized tied head (version-1 readers would find
# no tok_embeddings); everything else is still written as version 1, so older readers keep reading it.
EMBEDDING_IN_HEAD_VERSION = 2
READABLE_VERSIONS = (FORMAT_VERSION, EMBEDDING_IN_HEAD_VERSION)
WEIGHTS_FILE = "model.safetensors"
REPORT_FILE = "report.json"
_OPS = tuple(name for name, op in OPERATORS.items() if op.scheme)  # the linear operators, one per scheme


@dataclass
class StoredModel:
    config: ModelConfig
    weights: ModelWeights
    kv_scales: KVScales | None
    header: dict  # the JSON description from the file

    def decoder(self, ops=None) -> Decoder:
        return make_decoder(self.config, self.weights, ops, self.kv_scales)


def _stored_precision(lw: LinearWeights, float_name: str) -> str:
    """The scheme a record stores ("w8a16", "w4a16", ...), or the storage dtype's name for a float one ("fp16")."""
    scheme = OPERATORS[lw.op].scheme
    return float_name if scheme == "fp16" else scheme


def serialize(config: ModelConfig, weights: ModelWeights, kv_scales: KVScales | None, storage_dtype: torch.dtype,
              extra: dict | None = None) -> bytes:
    """The safetensors bytes of a (possibly partly) quantized model."""
    fdt = storage_dtype

    def fp(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device="cpu", dtype=fdt).contiguous()

    emb_in_head = isinstance(weights.tok_embeddings, QuantizedEmbedding)
    tensors: dict[str, torch.Tensor] = {"norm": fp(weights.norm)}
    if not emb_in_head:
        tensors["tok_embeddings"] = fp(weights.tok_embeddings)
    for i, b in enumerate(weights.blocks):
        for name, t in b.norms().items():
            tensors[f"blocks.{i}.{name}"] = fp(t)
    layers = {}
    for name, lw in named_linears(weights).items():
        if lw.op not in _OPS:
            raise ModelLoadError(f"{name}: unknown operator {lw.op!r}; expected one of {', '.join(_OPS)}")
        tied = name == HEAD and weights.tied
        layers[name] = {"op": lw.op, "precision": _stored_precision(lw, dtype_name(fdt)), "tied": tied,
                        "bias": lw.bias is not None, "smooth": lw.smooth is not None}
        if tied and lw.op == "linear":
            continue  # the embedding tensor is the head
        if lw.op == "linear":
            tensors[f"{name}.weight"] = fp(lw.weight)
        elif lw.op == "linear_w8a16_grouped":  # codes and group scales as taken in (a Q8_0 tensor's bytes)
            layers[name].update(group=lw.in_features // lw.scale.shape[1])
            tensors[f"{name}.qweight"] = lw.weight.detach().cpu().contiguous()
            tensors[f"{name}.scale"] = lw.scale.detach().cpu().contiguous()
        elif lw.op == "linear_w4a16":
            layers[name].update(group=lw.in_features // lw.scale.shape[1], offset=lw.offset is not None)
            tensors[f"{name}.qweight"] = lw.weight.detach().cpu().contiguous()
            tensors[f"{name}.scale"] = lw.scale.detach().cpu().contiguous()
            if lw.offset is not None:
                tensors[f"{name}.offset"] = lw.offset.detach().cpu().contiguous()
        else:
            tensors[f"{name}.qweight"] = lw.weight.detach().cpu().contiguous()
            tensors[f"{name}.scale"] = lw.scale.detach().to("cpu", torch.float32).contiguous()
            if lw.smooth is not None:
                tensors[f"{name}.smooth"] = lw.smooth.detach().to("cpu", torch.float32).contiguous()
        if lw.bias is not None:
            tensors[f"{name}.bias"] = fp(lw.bias)
    if kv_scales is not None:
        kv_scales.check(config)
        for i, (k, v) in enumerate(zip(kv_scales.k, kv_scales.v)):
            tensors[f"blocks.{i}.k_scale"] = k.detach().to("cpu", torch.float32).contiguous()
            tensors[f"blocks.{i}.v_scale"] = v.detach().to("cpu", torch.float32).contiguous()
    header = {
        "format": FORMAT, "format_version": EMBEDDING_IN_HEAD_VERSION if emb_in_head else FORMAT_VERSION,
        "config": config.to_dict(), **({"embedding": HEAD} if emb_in_head else {}),
        "storage_dtype": dtype_name(fdt), "kv_int8": kv_scales is not None, "layers": layers, **(extra or {}),
    }
    return st_save(tensors, metadata={"edgekit": json.dumps(header)})


class _Reader:
    """Tensor lookups with shape and dtype checks that name the file and the tensor."""

    def __init__(self, path: Path, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device):
        self.path, self.tensors, self.dtype, self.device = path, tensors, dtype, device

    def get(self, name: str, shape: tuple[int, ...], kind: str) -> torch.Tensor:
        t = self.tensors.get(name)
        if t is None:
            raise ModelLoadError(f"{self.path}: tensor {name!r} is missing", hint="the file is incomplete; quantize again")
        if tuple(t.shape) != shape:
            raise ModelLoadError(f"{self.path}: tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
        if kind in ("int8", "uint8"):
            want = torch.int8 if kind == "int8" else torch.uint8
            if t.dtype != want:
                raise ModelLoadError(f"{self.path}: tensor {name!r} is {t.dtype}, expected {want}")
            return t.to(self.device)
        if not t.is_floating_point():
            raise ModelLoadError(f"{self.path}: tensor {name!r} is {t.dtype}, expected a floating-point tensor")
        if kind == "group":  # W4A16 scales/offsets: kept in their stored dtype (fp16 or fp32); zero and negative
            # scales are legal (GGML Q4_0 stores a negative d when the block's largest magnitude is negative)
            if t.dtype not in (torch.float16, torch.float32):
                raise ModelLoadError(f"{self.path}: tensor {name!r} is {t.dtype}, expected float16 or float32 group scales")
            if not bool(torch.isfinite(t).all()):
                raise ModelLoadError(f"{self.path}: tensor {name!r} has non-finite entries; expected finite group scales",
                                        hint="the file is corrupt; quantize again")
            return t.to(self.device)
        if kind == "scale":
            t = t.to(torch.float32)
            if not bool(torch.isfinite(t).all() and (t > 0).all()):
                raise ModelLoadError(f"{self.path}: tensor {name!r} has zero, negative or non-finite entries; expected positive scales")
            return t.to(self.device)
        return t.to(device=self.device, dtype=self.dtype)


def load_weights_file(directory: Path, dtype: torch.dtype = torch.float32, device="cpu") -> StoredModel:
    """Read ``directory/model.safetensors`` back; floating-point tensors become ``dtype`` (activations' dtype)."""
    path = Path(directory) / WEIGHTS_FILE
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file", hint="pass the directory `edgekit quantize -o DIR` wrote")
    raw = path.read_bytes()
    try:
        tensors = st_load(raw)
        meta = _metadata(raw)
    except (SafetensorError, ValueError) as e:
        raise ModelLoadError(f"{path}: not a readable safetensors file ({e})", hint="the file is truncated or corrupt") from e
    header = _edgekit_header(path, meta)
    cfg = ModelConfig.from_dict(header["config"])
    r = _Reader(path, tensors, dtype, device)
    C, V = cfg.hidden_size, cfg.vocab_size
    emb_in_head = header.get("embedding") == HEAD
    if header.get("embedding") not in (None, HEAD):
        raise ModelLoadError(f"{path}: the header says the embedding is {header['embedding']!r}; expected {HEAD!r} or none")
    emb = None if emb_in_head else r.get("tok_embeddings", (V, C), "fp")
    shapes = dict(cfg.linear_shapes())
    shapes[HEAD] = (V, C)
    layers_meta = header.get("layers", {})
    missing = [n for n in layer_names(cfg.n_layers) if n not in layers_meta]
    if missing:
        raise ModelLoadError(f"{path}: the header describes no layer {missing[0]!r} ({len(missing)} missing)")

    def layer(name: str) -> LinearWeights:
        m = layers_meta[name]
        N, K = shapes[name.rsplit(".", 1)[-1]] if name != HEAD else shapes[HEAD]
        if m["op"] not in _OPS:
            raise ModelLoadError(f"{path}: layer {name} has unknown operator {m['op']!r}; expected one of {', '.join(_OPS)}")
        bias = r.get(f"{name}.bias", (N,), "fp") if m.get("bias") else None
        if m.get("tied") and m["op"] == "linear":
            if emb is None:
                raise ModelLoadError(f"{path}: the header reads the embedding from a floating-point {HEAD}, which "
                                        "has no tensors of its own", hint="the file is corrupt; quantize again")
            return LinearWeights("linear", emb, bias)
        if m["op"] == "linear":
            return LinearWeights("linear", r.get(f"{name}.weight", (N, K), "fp"), bias)
        if m["op"] == "linear_w4a16":
            return _w4a16_layer(r, name, m, N, K, bias)
        if m["op"] == "linear_w8a16_grouped":
            return _w8a16_grouped_layer(r, name, m, N, K, bias)
        smooth = r.get(f"{name}.smooth", (K,), "scale") if m.get("smooth") else None
        return LinearWeights(m["op"], r.get(f"{name}.qweight", (N, K), "int8"), bias, r.get(f"{name}.scale", (N,), "scale"), smooth)

    norms = norm_shapes(cfg)
    blocks = [
        BlockWeights(
            **{name: r.get(f"blocks.{i}.{name}", shape, "fp") for name, shape in norms.items()},
            wqkv=layer(f"blocks.{i}.wqkv"), wo=layer(f"blocks.{i}.wo"), w_gate_up=layer(f"blocks.{i}.w_gate_up"),
            w_down=layer(f"blocks.{i}.w_down"),
        )
        for i in range(cfg.n_layers)
    ]
    head = layer(HEAD)
    if emb_in_head != bool(layers_meta[HEAD].get("tied") and head.op != "linear"):
        raise ModelLoadError(f"{path}: the header's embedding ({header.get('embedding')!r}) and its {HEAD} "
                                f"({head.op}, tied={layers_meta[HEAD].get('tied')}) disagree",
                                hint="the file is corrupt; quantize again")
    if emb_in_head:
        emb = QuantizedEmbedding(head, dtype)
    weights = ModelWeights(tok_embeddings=emb, blocks=blocks, norm=r.get("norm", (C,), "fp"), lm_head=head)
    kv = None
    if header.get("kv_int8"):
        H = cfg.n_kv_heads
        kv = KVScales([r.get(f"blocks.{i}.k_scale", (H,), "scale") for i in range(cfg.n_layers)],
                      [r.get(f"blocks.{i}.v_scale", (H,), "scale") for i in range(cfg.n_layers)])
    return StoredModel(cfg, weights, kv, header)


def _w4a16_layer(r: _Reader, name: str, m: dict, n: int, k: int, bias: torch.Tensor | None) -> LinearWeights:
    group = m.get("group")
    if group not in GROUP_SIZES or k % group:
        raise ModelLoadError(f"{r.path}: W4A16 layer {name} has group {group!r}; expected one of {GROUP_SIZES} dividing K={k}")
    scale = r.get(f"{name}.scale", (n, k // group), "group")
    offset = r.get(f"{name}.offset", (n, k // group), "group") if m.get("offset") else None
    if offset is not None and offset.dtype != scale.dtype:
        raise ModelLoadError(f"{r.path}: W4A16 layer {name} stores scales as {scale.dtype} but offsets as {offset.dtype}")
    return LinearWeights("linear_w4a16", r.get(f"{name}.qweight", (n, k // 2), "uint8"), bias, scale, offset=offset)


def _w8a16_grouped_layer(r: _Reader, name: str, m: dict, n: int, k: int, bias: torch.Tensor | None) -> LinearWeights:
    group = m.get("group")
    if group not in INT8_GROUP_SIZES or k % group:
        raise ModelLoadError(f"{r.path}: grouped INT8 layer {name} has group {group!r}; expected one of "
                                f"{INT8_GROUP_SIZES} dividing K={k}")
    return LinearWeights("linear_w8a16_grouped", r.get(f"{name}.qweight", (n, k), "int8"), bias,
                         r.get(f"{name}.scale", (n, k // group), "group"))


def _edgekit_header(path: Path, meta: dict[str, str]) -> dict:
    """The edgekit header of a weights file's safetensors metadata, checked for format and version."""
    if "edgekit" not in meta:
        raise ModelLoadError(f"{path}: no edgekit header in the safetensors metadata", hint="it was not written by `edgekit quantize`")
    header = json.loads(meta["edgekit"])
    if header.get("format") != FORMAT or header.get("format_version") not in READABLE_VERSIONS:
        raise ModelLoadError(
            f"{path}: format {header.get('format')!r} version {header.get('format_version')!r}; "
            f"expected {FORMAT!r} version {' or '.join(map(str, READABLE_VERSIONS))}",
            hint="quantize the model again with this edgekit",
        )
    return header


def read_config(directory: Path) -> ModelConfig:
    """The model config stored in ``directory/model.safetensors``, read from its header alone (not the weights)."""
    path = Path(directory) / WEIGHTS_FILE
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            head += f.read(int.from_bytes(head, "little")) if len(head) == 8 else b""
        meta = _metadata(head)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: no readable safetensors header ({e})", hint="the file is missing, truncated or corrupt") from e
    return ModelConfig.from_dict(_edgekit_header(path, meta)["config"])


def _metadata(raw: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file (the 8-byte length, then the JSON header)."""
    if len(raw) < 8:
        raise ValueError("shorter than the 8-byte header length")
    n = int.from_bytes(raw[:8], "little")
    if n > len(raw) - 8:
        raise ValueError(f"header length {n} exceeds the file size {len(raw)}")
    return json.loads(raw[8 : 8 + n]).get("__metadata__", {}) or {}

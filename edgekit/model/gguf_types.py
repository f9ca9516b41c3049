"""How each GGUF tensor type enters edgekit: losslessly as W4A16, as floating point, or dequantized.

GGML's 4-bit block formats are edgekit's W4A16 layout (kernels/int4_layout.py)
up to a byte copy or a nibble re-ordering, so they are taken in bit for bit:

    Q4_0  18-byte block of 32: d fp16, 16 bytes of nibbles      w = (q - 8) * d     -> symmetric,  g32, fp16 scale
    Q4_1  20-byte block of 32: d, m fp16, 16 bytes of nibbles   w = q * d + m       -> asymmetric, g32, fp16 scale/offset
    Q4_K  144-byte super-block of 256: d, dmin fp16, 8 six-bit (sc, m) pairs, 128 bytes of nibbles;
          w = (d * sc) * q - (dmin * m) per 32 weights         -> asymmetric, g32, fp32 scale/offset

d * sc is exact in FP32 (11 x 6 significant bits), so is dmin * m, and q * scale
(+ 4 bits): dequantizing our record rounds once, where gguf-py's does, and gives
the same bits. Q4_K's nibbles are ordered differently (a 64-weight chunk keeps
weights 0..31 in the low nibbles of 32 bytes and 32..63 in the high ones), so
its codes are unpacked and re-packed in GGML Q4_0 order.

Every other quantized type that gguf-py can dequantize (Q8_0, Q5_*, Q2_K,
Q3_K, Q5_K, Q6_K) is expanded to FP32 on load and goes through edgekit's own
(calibrated) quantization: it is NOT taken in losslessly. The exception is a
Q8_0 embedding / LM head (the default model's tied table), taken in with
``keep_q8_0`` as grouped INT8 (kernels/int8_group_layout.py: codes and fp16
scales are byte copies of the blocks); Q8_0 projections are still dequantized. A type outside these tables is refused with the tensor's name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from edgekit.errors import ModelLoadError
from edgekit.kernels.int4_layout import SUBBLOCK, dequantize_int4, pack_int4
from edgekit.kernels.int8_group_layout import dequantize_int8_grouped, from_q8_0

FLOAT_TYPES = ("F32", "F16", "BF16")
LOSSLESS_INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")
DEQUANTIZED_TYPES = ("Q8_0", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "Q6_K")
KNOWN_TYPES = FLOAT_TYPES + LOSSLESS_INT4_TYPES + DEQUANTIZED_TYPES

INTAKE = {
    **{t: "floating point" for t in FLOAT_TYPES},
    "Q4_0": "projections lossless: W4A16 g32 symmetric, fp16 scales (byte copy); embedding/LM head dequantized",
    "Q4_1": "projections lossless: W4A16 g32 asymmetric, fp16 scales and offsets (byte copy); embedding/LM head dequantized",
    "Q4_K": "projections lossless: W4A16 g32 asymmetric, fp32 scales and offsets (nibbles re-ordered); "
            "embedding/LM head dequantized",
    **{t: "dequantized to FP32, then quantized by the chosen precision (not lossless)" for t in DEQUANTIZED_TYPES},
    "Q8_0": "embedding/LM head lossless with --quantize-head (no --head-precision): grouped INT8 g32, fp16 scales "
            "(byte copies; tied: one matrix); projections dequantized, then quantized by the chosen precision",
}

_QK_K = 256  # weights per K-quant super-block


@dataclass
class Int4Tensor:
    """One GGUF 4-bit tensor in edgekit's W4A16 layout: qweight uint8 (N, K/2), scale/offset (N, K/32)."""

    qweight: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor | None  # None: symmetric (Q4_0)

    def dequantized(self) -> torch.Tensor:
        return dequantize_int4(self.qweight, self.scale, self.offset)

    def rows(self, fn) -> "Int4Tensor":
        """The same tensor with ``fn`` applied to the row axis of all three parts (e.g. a row permutation)."""
        return Int4Tensor(fn(self.qweight), fn(self.scale), fn(self.offset) if self.offset is not None else None)


@dataclass
class Int8GroupTensor:
    """One GGUF Q8_0 tensor in edgekit's grouped INT8 layout (kernels/int8_group_layout.py): qweight int8 (N, K),
    scale fp16 (N, K/32), both byte copies of the file's blocks."""

    qweight: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def from_q8_0(cls, data: np.ndarray) -> "Int8GroupTensor":
        return cls(*from_q8_0(data))

    def dequantized(self) -> torch.Tensor:
        return dequantize_int8_grouped(self.qweight, self.scale)


# W4A16 bytes per group of 32 of each lossless type: scale (+ offset), in the dtype the intake keeps
GROUP_BYTES = {"Q4_0": 2, "Q4_1": 4, "Q4_K": 8}


def lossless_int4_layout(projection_types: dict[str, int]) -> tuple[int, int] | None:
    """(group, bytes of scale [+ offset] per group) an INT4 build will have when every projection is stored in one
    lossless 4-bit type; None otherwise (those layers go through the calibrated path)."""
    if len(projection_types) != 1 or next(iter(projection_types)) not in GROUP_BYTES:
        return None
    return SUBBLOCK, GROUP_BYTES[next(iter(projection_types))]


def check_type(tensor_name: str, type_name: str, source: str) -> None:
    """Refuse a tensor type edgekit has no mapping for, in one line naming the tensor and the type."""
    if type_name not in KNOWN_TYPES:
        raise ModelLoadError(
            f"{source}: tensor {tensor_name} has GGUF type {type_name}, which edgekit cannot map; "
            f"supported: {', '.join(KNOWN_TYPES)}",
            hint="re-quantize the model with llama.cpp to Q4_K_M, Q4_0, Q8_0 or F16",
        )


def _halves(raw: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
    return raw[..., :first], raw[..., first:]


def _fp16(raw: np.ndarray) -> torch.Tensor:
    """(..., 2) bytes -> (...) float16."""
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16)[..., 0].copy())


def int4_from_gguf(type_name: str, data: np.ndarray) -> Int4Tensor:
    """A Q4_0 / Q4_1 / Q4_K tensor's raw blocks (N rows, bytes per row) as W4A16 g32, bit-exact."""
    n = data.shape[0]
    if type_name == "Q4_0":
        blocks = data.reshape(n, -1, 18)
        d, qs = _halves(blocks, 2)
        return Int4Tensor(torch.from_numpy(qs.reshape(n, -1).copy()), _fp16(d), None)
    if type_name == "Q4_1":
        blocks = data.reshape(n, -1, 20)
        dm, qs = _halves(blocks, 4)
        return Int4Tensor(torch.from_numpy(qs.reshape(n, -1).copy()), _fp16(dm[..., :2]), _fp16(dm[..., 2:]))
    if type_name == "Q4_K":
        return _q4_k(data)
    raise ValueError(f"{type_name} is not a lossless 4-bit type; expected one of {LOSSLESS_INT4_TYPES}")


def _q4_k(data: np.ndarray) -> Int4Tensor:
    from gguf.quants import Q4_K  # the format's own 6-bit (scale, min) unpacking

    n = data.shape[0]
    blocks = data.reshape(-1, 144)  # (n * K/256, 144)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # (nb, 1)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16].copy())  # (nb, 8) each, 0..63
    scale = d * sc.astype(np.float32)  # exact: 11 x 6 significant bits
    offset = -(dmin * m.astype(np.float32))
    # nibbles: byte j of 64-weight chunk c holds weight 64c + j (low) and 64c + 32 + j (high)
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    codes = (qs & np.uint8(0x0F)).reshape(n, -1)  # (N, K) in natural order
    k = codes.shape[1]
    return Int4Tensor(pack_int4(torch.from_numpy(codes)), torch.from_numpy(scale.reshape(n, k // SUBBLOCK)),
                      torch.from_numpy(offset.reshape(n, k // SUBBLOCK)))


def concat_int4(parts: list[Int4Tensor]) -> Int4Tensor:
    """Stack the rows of several 4-bit tensors (Q, K, V -> wqkv) into one record, still bit-exact.

    Mixed forms are widened, never rounded: a symmetric part gets offset = -8 * scale (exact: a power of
    two), and fp16 scales become fp32 beside an fp32 part (exact)."""
    dtype = torch.float32 if any(p.scale.dtype == torch.float32 for p in parts) else torch.float16
    asymmetric = any(p.offset is not None for p in parts)

    def offset(p: Int4Tensor) -> torch.Tensor:
        return p.offset.to(dtype) if p.offset is not None else p.scale.to(dtype) * -8

    return Int4Tensor(
        torch.cat([p.qweight for p in parts]),
        torch.cat([p.scale.to(dtype) for p in parts]),
        torch.cat([offset(p) for p in parts]) if asymmetric else None,
    )

"""The half2 W4A16 inline PTX (kernels/int4_half2_triton.py), executed instruction by instruction by a bit-level NumPy
model: the nibble decode is exact for every code at every position of a sub-block, the activation pairs and
their sum are what the dot expects, and the dot matches an FP64 sum within FP16 rounding. The CPU interpreter
cannot run inline assembly (it runs the pure-Triton twin), so this is where the PTX's arithmetic is checked
without a GPU; the GPU tests (test_w4a16_gpu.py) run it for real."""

from __future__ import annotations

import re

import numpy as np
import pytest

from edgekit.kernels.int4_half2_triton import PAIR_PTX, SUBBLOCK_DOT_PTX, XSUM_PTX


def _f16x2(v: int) -> tuple[np.float16, np.float16]:
    return tuple(np.array([v & 0xFFFF, v >> 16], dtype=np.uint16).view(np.float16))


def _bits(lo: np.float16, hi: np.float16) -> int:
    u = np.array([lo, hi], dtype=np.float16).view(np.uint16)
    return int(u[0]) | (int(u[1]) << 16)


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)  # a = 0xF0, b = 0xCC, c = 0xAA
        out |= ((lut >> idx) & 1) << bit
    return out


def _prmt(a: int, b: int, sel: int) -> int:
    src = a.to_bytes(4, "little") + b.to_bytes(4, "little")
    return int.from_bytes(bytes(src[(sel >> (4 * i)) & 7] for i in range(4)), "little")


def _half2_op(op, a: int, b: int, c: int | None = None) -> int:
    # each lane computed in FP64 (exact for a product of two halves) and rounded once to FP16, like HFMA2
    lanes = [op(float(x), float(y), None if c is None else float(z))
             for x, y, z in zip(_f16x2(a), _f16x2(b), _f16x2(c) if c is not None else (None, None))]
    return _bits(np.float16(lanes[0]), np.float16(lanes[1]))


def run_ptx(ptx: str, inputs: list[int]) -> list[int]:
    """Execute ``ptx`` (the subset the W4A16 kernels use) on 32-bit inputs $k..; returns the outputs $0.."""
    n_out = max(int(m) for m in re.findall(r"\$(\d+)", ptx)) + 1 - len(inputs)
    regs: dict[str, object] = {f"${n_out + i}": v for i, v in enumerate(inputs)}

    def val(tok: str):
        tok = tok.strip()
        return int(tok, 0) if re.match(r"^(0x[0-9a-fA-F]+|\d+)$", tok) else regs[tok]

    body = ptx.strip().removeprefix("{").removesuffix("}")
    for stmt in (s.strip() for s in body.split(";")):
        if not stmt or stmt.startswith(".reg"):
            continue
        opcode, rest = stmt.split(None, 1)
        if opcode == "mov.b32" and rest.startswith("{"):  # unpack a half2
            (h0, h1), src = re.match(r"\{\s*(\w+),\s*(\w+)\s*\},\s*(\S+)", rest).group(1, 2), rest.split(",")[-1]
            regs[h0], regs[h1] = _f16x2(val(src))
            continue
        d, *args = [t.strip() for t in rest.split(",")]
        a = [val(t) for t in args]
        if opcode == "mov.b32":
            r = a[0]
        elif opcode == "shr.b32":
            r = (a[0] & 0xFFFFFFFF) >> a[1]
        elif opcode == "lop3.b32":
            r = _lop3(*a)
        elif opcode == "prmt.b32":
            r = _prmt(*a)
        elif opcode == "sub.rn.f16x2":
            r = _half2_op(lambda x, y, _: x - y, a[0], a[1])
        elif opcode == "add.rn.f16x2":
            r = _half2_op(lambda x, y, _: x + y, a[0], a[1])
        elif opcode == "mul.rn.f16x2":
            r = _half2_op(lambda x, y, _: x * y, a[0], a[1])
        elif opcode == "fma.rn.f16x2":
            r = _half2_op(lambda x, y, z: x * y + z, a[0], a[1], a[2])
        elif opcode == "cvt.f32.f16":
            r = np.float32(a[0])
        elif opcode == "add.rn.f32":
            r = np.float32(np.float32(a[0]) + np.float32(a[1]))
        else:
            raise AssertionError(f"the model does not know {opcode!r}: extend it with the new instruction")
        if d.startswith("$") and isinstance(r, np.float32):
            r = int(np.array([r], dtype=np.float32).view(np.uint32)[0])
        regs[d] = r
    return [regs[f"${i}"] for i in range(n_out)]


def _words(codes: np.ndarray) -> list[int]:
    """32 codes of a sub-block -> its four int32 words in GGML nibble order (int4_layout.pack_int4)."""
    packed = (codes[:16] | (codes[16:] << 4)).astype(np.uint8)
    return [int.from_bytes(packed[4 * j:4 * j + 4].tobytes(), "little") for j in range(4)]


def _pairs(x: np.ndarray) -> list[int]:
    """The 16 pair words the dot takes (x already scaled), word by word: e_lo, o_lo, e_hi, o_hi."""
    out = []
    for j in range(4):
        out += [_bits(x[4 * j], x[4 * j + 2]), _bits(x[4 * j + 1], x[4 * j + 3]),
                _bits(x[16 + 4 * j], x[16 + 4 * j + 2]), _bits(x[16 + 4 * j + 1], x[16 + 4 * j + 3])]
    return out


def _dot(codes: np.ndarray, x: np.ndarray) -> float:
    bits = run_ptx(SUBBLOCK_DOT_PTX.value, _words(codes) + _pairs(x))[0]
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


@pytest.mark.parametrize("position", range(32))
def test_every_code_decodes_exactly_to_q_minus_8_at_every_position(position):
    # a one-hot activation reads one weight back through the whole PTX: decode, lane, pair and sum
    rng = np.random.default_rng(position)
    x = np.zeros(32, dtype=np.float16)
    x[position] = 1.0
    for q in range(16):
        codes = rng.integers(0, 16, 32)
        codes[position] = q
        assert _dot(codes, x) == q - 8, (position, q)


def test_the_dot_matches_fp64_within_fp16_rounding():
    rng = np.random.default_rng(0)
    for _ in range(200):
        codes = rng.integers(0, 16, 32)
        x = (rng.standard_normal(32) * rng.choice([1e-3, 1.0, 30.0])).astype(np.float16)
        want = float(np.sum((codes - 8).astype(np.float64) * x.astype(np.float64)))
        bound = 32 * 2.0 ** -11 * float(np.sum(np.abs((codes - 8) * x.astype(np.float64))))  # 16 FP16 sums a lane
        assert abs(_dot(codes, x) - want) <= bound + 1e-6


def test_large_activations_stay_finite_at_one_sixteenth():
    # the kernel feeds x / 16: a sub-block of |x| = 8000 (all codes 0, the worst sign pattern) stays finite
    x16 = np.full(32, 8000.0 / 16, dtype=np.float16)
    assert np.isfinite(_dot(np.zeros(32, dtype=np.int64), x16))
    assert _dot(np.zeros(32, dtype=np.int64), x16) == pytest.approx(-8 * 32 * 500.0, rel=1e-3)


def test_activation_pairs_are_scaled_and_permuted_and_summed():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(32) * 3).astype(np.float16)
    words = [_bits(x[2 * p], x[2 * p + 1]) for p in range(16)]  # word p = {x[2p], x[2p+1]}
    x16 = (x.astype(np.float32) / 16).astype(np.float16)
    pairs = []
    for half in (0, 1):
        for j in range(4):
            e, o = run_ptx(PAIR_PTX.value, [words[8 * half + 2 * j], words[8 * half + 2 * j + 1]])
            b = 16 * half + 4 * j
            assert _f16x2(e) == (x16[b], x16[b + 2]) and _f16x2(o) == (x16[b + 1], x16[b + 3])
            pairs.append((e, o))
    ordered = [w for j in range(4) for w in (*pairs[j], *pairs[4 + j])]  # e_lo, o_lo, e_hi, o_hi of word j
    assert ordered == _pairs(x16)
    got = float(np.array(run_ptx(XSUM_PTX.value, ordered), dtype=np.uint32).view(np.float32)[0])
    assert got == pytest.approx(float(x16.astype(np.float64).sum()), abs=4 * 2.0 ** -11 * float(np.abs(x16).sum()))

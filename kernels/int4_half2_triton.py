"""The W4A16 GEMV's half2 sub-block dot product: 32 packed INT4 codes x 32 FP16 activations in ~55 instructions.

One call handles one weight row's 32-element sub-block (int4_layout.py: 16 bytes in GGML nibble order, byte j
holding element j in its low nibble and element j + 16 in its high nibble) as four int32 words w_0..w_3.
Word j holds elements 4j..4j+3 (low nibbles, bits 0-3 of its bytes) and 16+4j..16+4j+3 (high nibbles).

Nibbles become FP16 without the int-to-float unit (the "magic number" trick): OR-ing 0x6400 (1024.0) into a
half whose low mantissa bits hold a nibble gives exactly 1024 + q; one LOP3 does the AND and the OR for two
halves at once. Per word:

    t0 = lop3(w,      0x000F000F, 0x6400_6400)  = {1024 + q[4j],        1024 + q[4j+2]}
    t1 = lop3(w >> 8, 0x000F000F, 0x6400_6400)  = {1024 + q[4j+1],      1024 + q[4j+3]}
    t2 = lop3(w,      0x00F000F0, 0x6400_6400)  = {1024 + 16 q[16+4j],  1024 + 16 q[16+4j+2]}
    t3 = lop3(w >> 8, 0x00F000F0, 0x6400_6400)  = {1024 + 16 q[16+4j+1], 1024 + 16 q[16+4j+3]}
    t0, t1 -= {1032, 1032}                      -> q - 8   (exact)
    t2, t3 = t * {1/16, 1/16} + {-72, -72}      -> q - 8   (exact, one HFMA2)

and four HFMA2 multiply them with the matching activation pairs into one half2 accumulator: 13 instructions
for 8 weights, against ~20 for the FP32 path. Codes are centred (q - 8), so the asymmetric form adds
(offset + 8 scale) * sum(x) instead of offset * sum(x).

Accuracy and range. Products of an exact small integer and an FP16 activation are rounded to FP16, and each
accumulator lane sums 16 of them in FP16 (relative error ~2^-11 of the sub-block's partial), then the two
lanes are added in FP32; groups and sub-blocks are accumulated in FP32. The activations are pre-scaled by 1/16
(exact but for values under 2^-10, which lose bits below 2^-24 in absolute terms) so that a lane's partial,
at most 16 * 8 * max|x| / 16, stays finite for every |x| < 8188; the caller multiplies the row's sum by 16.

Around the dot (kernels/linear_w4a16_triton.py, DECODE 3): the activation pairs (``activation_pairs``: 16
word loads, PRMT and a 1/16 HMUL2 per pair, the FP32 sum) are made once per (thread, sub-block) and shared by
the 8-16 weight rows a thread holds, and the group scales are loaded in inline PTX (``load_where_used``) so
that Triton keeps them in the dot products' layout instead of moving them through shared memory every step.
The fused decode GEMVs (fused_gemv_triton.py) compute their activation step in registers: ``activation_pairs_of``
makes the same activation words from it with bit operations (one trip through shared memory a step, where Triton
moves each sub-block's 32 halves to the threads that hold its weights) and ``pairs_of_words`` pairs, scales and
sums them as for the loaded words.

``PTX`` (compiled kernels) and the pure-Triton twin (Triton's CPU interpreter, which cannot run inline
assembly) compute the same values: every decode is exact, and the twin rounds each product and each sum to
FP16 where HFMA2 rounds once. The constants below are shared with the bit-level NumPy model of the PTX
(tests/kernels/test_int4_half2_triton.py), which checks the decode on every code.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.linear_triton import _PTX_DEQUANT

MAGIC = 0x64006400  # {1024.0, 1024.0} as half2 bits
LOW_MASK = 0x000F000F  # a word's bytes 0 and 2, low nibbles: two halves' mantissa bits 0-3
HIGH_MASK = 0x00F000F0  # the same bytes' high nibbles: mantissa bits 4-7 (1024 + 16 q)
LOP3_AND_OR = 0xEA  # lop3 truth table of (a & b) | c
LOW_BIAS = 0x64086408  # {1032.0, 1032.0}: (1024 + q) - 1032 = q - 8
HIGH_SCALE = 0x2C002C00  # {1/16, 1/16}
HIGH_BIAS = 0xD480D480  # {-72.0, -72.0}: (1024 + 16 q) / 16 - 72 = q - 8
X_PRESCALE = tl.constexpr(1.0 / 16.0)  # activations enter the dot products as x / 16 (range; see the module doc)
X_SCALE_BITS = 0x2C002C00  # {1/16, 1/16}: the same, as half2 bits
UNSCALE = tl.constexpr(16.0)


def _word_asm(j: int) -> str:
    """PTX for word j: decode to four half2 of q - 8 and accumulate them against the pairs $5+4j..$8+4j."""
    w, xe_lo, xo_lo, xe_hi, xo_hi = f"${1 + j}", *(f"${5 + 4 * j + i}" for i in range(4))
    first = j == 0

    def acc(t: str, x: str) -> str:
        return f"mul.rn.f16x2 a, {t}, {x}; " if first and t == "t0" else f"fma.rn.f16x2 a, {t}, {x}, a; "

    return (f"shr.b32 s, {w}, 8; "
            f"lop3.b32 t0, {w}, {LOW_MASK:#010x}, {MAGIC:#010x}, {LOP3_AND_OR:#04x}; "
            f"lop3.b32 t1, s, {LOW_MASK:#010x}, {MAGIC:#010x}, {LOP3_AND_OR:#04x}; "
            f"lop3.b32 t2, {w}, {HIGH_MASK:#010x}, {MAGIC:#010x}, {LOP3_AND_OR:#04x}; "
            f"lop3.b32 t3, s, {HIGH_MASK:#010x}, {MAGIC:#010x}, {LOP3_AND_OR:#04x}; "
            "sub.rn.f16x2 t0, t0, lb; sub.rn.f16x2 t1, t1, lb; "
            "fma.rn.f16x2 t2, t2, hs, hb; fma.rn.f16x2 t3, t3, hs, hb; "
            + acc("t0", xe_lo) + acc("t1", xo_lo) + acc("t2", xe_hi) + acc("t3", xo_hi))


# $0: the FP32 dot (as bits); $1-$4: the sub-block's words; $5-$20: per word j, the activation pairs
# {x[4j], x[4j+2]}, {x[4j+1], x[4j+3]}, {x[16+4j], x[16+4j+2]}, {x[16+4j+1], x[16+4j+3]} (pre-scaled halves)
SUBBLOCK_DOT_PTX = tl.constexpr(
    "{ .reg .b32 s, t0, t1, t2, t3, a, lb, hs, hb; .reg .b16 h0, h1; .reg .f32 f0, f1; "
    f"mov.b32 lb, {LOW_BIAS:#010x}; mov.b32 hs, {HIGH_SCALE:#010x}; mov.b32 hb, {HIGH_BIAS:#010x}; "
    + "".join(_word_asm(j) for j in range(4))
    + "mov.b32 {h0, h1}, a; cvt.f32.f16 f0, h0; cvt.f32.f16 f1, h1; add.rn.f32 f0, f0, f1; mov.b32 $0, f0; }"
)


@triton.jit
def _split4(t):
    """The four slices of ``t``'s last dimension (of size 4), in order."""
    a, b = tl.split(tl.reshape(t, t.shape[:-1] + [2, 2]))  # a = {0, 2}, b = {1, 3}
    t0, t2 = tl.split(a)
    t1, t3 = tl.split(b)
    return t0, t1, t2, t3


@triton.jit
def _word_twin(w, xe_lo, xo_lo, xe_hi, xo_hi, a_even, a_odd):
    """Pure-Triton twin of one word's PTX: the same exact decodes and FP16 products, summed in FP16 in the
    PTX's order (per lane: byte 0 or 2's low nibble, byte 1 or 3's low nibble, then their high nibbles).
    Written without nested calls: the interpreter pays ~0.1 ms a call, which dominated the fused tests' time."""
    for HIGH in tl.static_range(2):
        for b in tl.static_range(4):
            q = ((w >> (8 * b + 4 * HIGH)) & 15).to(tl.float16) - 8.0
            if HIGH:
                pair = xo_hi if b % 2 else xe_hi
            else:
                pair = xo_lo if b % 2 else xe_lo
            x = ((pair >> (16 * (b // 2))) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)  # low or high half
            if b < 2:  # bytes 0 and 1 go to the half2's low lane, bytes 2 and 3 to its high lane
                a_even = a_even + q * x
            else:
                a_odd = a_odd + q * x
    return a_even, a_odd


# $0, $1: {x[4j], x[4j+2]} / 16 and {x[4j+1], x[4j+3]} / 16 from the activation words $2 = {x[4j], x[4j+1]} and
# $3 = {x[4j+2], x[4j+3]}: two byte permutes and two half2 multiplies by 1/16
PAIR_PTX = tl.constexpr(
    "{ .reg .b32 e, o, k; "
    f"mov.b32 k, {X_SCALE_BITS:#010x}; prmt.b32 e, $2, $3, 0x5410; prmt.b32 o, $2, $3, 0x7632; "
    "mul.rn.f16x2 $0, e, k; mul.rn.f16x2 $1, o, k; }"
)
# $0: the FP32 sum of the 32 halves in the pair words $1-$16 (four HADD2 chains of four pairs, then FP32)
XSUM_PTX = tl.constexpr(
    "{ .reg .b32 a, b, c, d; .reg .b16 h<8>; .reg .f32 f<8>; "
    "add.rn.f16x2 a, $1, $2; add.rn.f16x2 a, a, $3; add.rn.f16x2 a, a, $4; "
    "add.rn.f16x2 b, $5, $6; add.rn.f16x2 b, b, $7; add.rn.f16x2 b, b, $8; "
    "add.rn.f16x2 c, $9, $10; add.rn.f16x2 c, c, $11; add.rn.f16x2 c, c, $12; "
    "add.rn.f16x2 d, $13, $14; add.rn.f16x2 d, d, $15; add.rn.f16x2 d, d, $16; "
    "mov.b32 {h0, h1}, a; mov.b32 {h2, h3}, b; mov.b32 {h4, h5}, c; mov.b32 {h6, h7}, d; "
    "cvt.f32.f16 f0, h0; cvt.f32.f16 f1, h1; cvt.f32.f16 f2, h2; cvt.f32.f16 f3, h3; "
    "cvt.f32.f16 f4, h4; cvt.f32.f16 f5, h5; cvt.f32.f16 f6, h6; cvt.f32.f16 f7, h7; "
    "add.rn.f32 f0, f0, f1; add.rn.f32 f2, f2, f3; add.rn.f32 f4, f4, f5; add.rn.f32 f6, f6, f7; "
    "add.rn.f32 f0, f0, f2; add.rn.f32 f4, f4, f6; add.rn.f32 f0, f0, f4; mov.b32 $0, f0; }"
)


@triton.jit
def _scaled_half_bits(bits):
    """16-bit FP16 pattern (int32, 0..65535) -> the pattern of that value times 1/16 (FP16 rounding)."""
    h = (bits.to(tl.int16).to(tl.float16, bitcast=True) * tl.full((), X_PRESCALE, tl.float16))
    return h.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _pairs_of(a, b):
    if _PTX_DEQUANT:
        e, o = tl.inline_asm_elementwise(asm=PAIR_PTX, constraints="=r,=r,r,r", args=[a, b],
                                         dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    else:  # the twin: {a.lo, b.lo} and {a.hi, b.hi}, each half times 1/16
        ab = tl.join(a, b)
        a_lo, b_lo = tl.split(_scaled_half_bits(ab & 0xFFFF))
        a_hi, b_hi = tl.split(_scaled_half_bits((ab >> 16) & 0xFFFF))
        e = a_lo | (b_lo << 16)
        o = a_hi | (b_hi << 16)
    return e, o


@triton.jit
def load_where_used(ptrs):
    """``tl.load(ptrs)`` (FP16 or FP32, no mask), written as inline PTX in compiled kernels so that the values
    take the layout of their users: Triton gives a plain load its own layout from the pointers' contiguity,
    and for the group scales that layout differs from the dot products', costing a trip through shared
    memory every step."""
    if _PTX_DEQUANT:
        if ptrs.dtype.element_ty == tl.float16:
            v = tl.inline_asm_elementwise(asm="ld.global.nc.b16 $0, [$1];", constraints="=h,l", args=[ptrs],
                                          dtype=tl.int16, is_pure=True, pack=1)
            return v.to(tl.float16, bitcast=True)
        else:
            v = tl.inline_asm_elementwise(asm="ld.global.nc.b32 $0, [$1];", constraints="=r,l", args=[ptrs],
                                          dtype=tl.int32, is_pure=True, pack=1)
            return v.to(tl.float32, bitcast=True)
    else:
        return tl.load(ptrs)


@triton.jit
def activation_pairs(x_words, at, live):
    """The 16 activation pairs of each sub-block (the order ``subblock_dots_half2`` takes them, pre-scaled by
    1/16) and the FP32 sum of its 32 scaled activations: 16 x (SB,) int32, (SB,) float32.

    ``x_words``: int32 pointer over the FP16 activation row (word p = {x[2p], x[2p+1]}); ``at`` (SB,): each
    sub-block's first word; ``live`` (SB,): sub-blocks inside K. Sixteen word loads per sub-block, each a (SB,)
    tensor: computed where the weight tile's rows need them, so every row a thread holds shares them."""
    return pairs_of_words((
        tl.load(x_words + at, mask=live, other=0), tl.load(x_words + at + 1, mask=live, other=0),
        tl.load(x_words + at + 2, mask=live, other=0), tl.load(x_words + at + 3, mask=live, other=0),
        tl.load(x_words + at + 4, mask=live, other=0), tl.load(x_words + at + 5, mask=live, other=0),
        tl.load(x_words + at + 6, mask=live, other=0), tl.load(x_words + at + 7, mask=live, other=0),
        tl.load(x_words + at + 8, mask=live, other=0), tl.load(x_words + at + 9, mask=live, other=0),
        tl.load(x_words + at + 10, mask=live, other=0), tl.load(x_words + at + 11, mask=live, other=0),
        tl.load(x_words + at + 12, mask=live, other=0), tl.load(x_words + at + 13, mask=live, other=0),
        tl.load(x_words + at + 14, mask=live, other=0), tl.load(x_words + at + 15, mask=live, other=0)))


@triton.jit
def activation_pairs_of(x, BLOCK_K: tl.constexpr):
    """``activation_pairs`` of an FP16 activation step held in registers, x (BLOCK_K,) (the fused decode GEMVs
    compute theirs: RMS-normalised, or combined from split-KV partials): the sub-blocks' activation words are
    made by bit operations instead of loads, then paired, scaled and summed by the same code."""
    SB: tl.constexpr = BLOCK_K // 32
    bits = x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF  # (BLOCK_K,)
    halves = tl.reshape(bits, (BLOCK_K // 2, 2)) << (tl.arange(0, 2) * 16)[None, :]
    words = tl.reshape(tl.sum(halves, axis=1), (SB, 4, 4))  # [sub-block, p // 4, p % 4]: word p = {x[2p], x[2p+1]}
    r0, r1, r2, r3 = _split4(tl.permute(words, (0, 2, 1)))  # word 4r + c at [:, c] of r<r>
    w0, w1, w2, w3 = _split4(r0)
    w4, w5, w6, w7 = _split4(r1)
    w8, w9, w10, w11 = _split4(r2)
    w12, w13, w14, w15 = _split4(r3)
    return pairs_of_words((w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15))


@triton.jit
def pairs_of_words(w):
    """``activation_pairs`` from each sub-block's 16 activation words ``w`` (a tuple of 16 (SB,) int32, word p =
    {x[2p], x[2p+1]}): two byte permutes and two 1/16 half2 multiplies a word pair, and the FP32 sum."""
    e_lo0, o_lo0 = _pairs_of(w[0], w[1])  # word J's pairs of the sub-block's low half: words 2J, 2J + 1
    e_lo1, o_lo1 = _pairs_of(w[2], w[3])
    e_lo2, o_lo2 = _pairs_of(w[4], w[5])
    e_lo3, o_lo3 = _pairs_of(w[6], w[7])
    e_hi0, o_hi0 = _pairs_of(w[8], w[9])  # and of its high half: words 8 + 2J, 9 + 2J
    e_hi1, o_hi1 = _pairs_of(w[10], w[11])
    e_hi2, o_hi2 = _pairs_of(w[12], w[13])
    e_hi3, o_hi3 = _pairs_of(w[14], w[15])
    # word by word, as the dot takes them: e_lo j, o_lo j, e_hi j, o_hi j
    pairs = (e_lo0, o_lo0, e_hi0, o_hi0, e_lo1, o_lo1, e_hi1, o_hi1,
             e_lo2, o_lo2, e_hi2, o_hi2, e_lo3, o_lo3, e_hi3, o_hi3)
    if _PTX_DEQUANT:
        s_bits = tl.inline_asm_elementwise(
            asm=XSUM_PTX, constraints="=r" + ",r" * 16,
            args=[pairs[0], pairs[1], pairs[2], pairs[3], pairs[4], pairs[5], pairs[6], pairs[7], pairs[8], pairs[9],
                  pairs[10], pairs[11], pairs[12], pairs[13], pairs[14], pairs[15]],
            dtype=tl.int32, is_pure=True, pack=1)
        x_sum = s_bits.to(tl.float32, bitcast=True)
    else:
        x_sum = tl.zeros(e_lo0.shape, tl.float32)
        for i in tl.static_range(16):
            lo = (pairs[i] & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
            hi = ((pairs[i] >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
            x_sum += lo.to(tl.float32) + hi.to(tl.float32)
    return pairs, x_sum


@triton.jit
def subblock_dots_half2(words, p):
    """sum over each sub-block of (q - 8) * x (x as in the pairs ``p``), FP32 (BN, SB).

    ``words``: (BN, SB, 4) int32, each row's sub-blocks as four words; ``p``: the 16 (SB,) pair tensors of
    ``activation_pairs``."""
    w0, w1, w2, w3 = _split4(words)
    if _PTX_DEQUANT:
        bits = tl.inline_asm_elementwise(
            asm=SUBBLOCK_DOT_PTX, constraints="=r" + ",r" * 20,
            args=[w0, w1, w2, w3, p[0][None, :], p[1][None, :], p[2][None, :], p[3][None, :], p[4][None, :],
                  p[5][None, :], p[6][None, :], p[7][None, :], p[8][None, :], p[9][None, :], p[10][None, :],
                  p[11][None, :], p[12][None, :], p[13][None, :], p[14][None, :], p[15][None, :]],
            dtype=tl.int32, is_pure=True, pack=1)
        return bits.to(tl.float32, bitcast=True)
    else:
        a_even = tl.zeros(w0.shape, tl.float16)
        a_odd = tl.zeros(w0.shape, tl.float16)
        a_even, a_odd = _word_twin(w0, p[0][None, :], p[1][None, :], p[2][None, :], p[3][None, :], a_even, a_odd)
        a_even, a_odd = _word_twin(w1, p[4][None, :], p[5][None, :], p[6][None, :], p[7][None, :], a_even, a_odd)
        a_even, a_odd = _word_twin(w2, p[8][None, :], p[9][None, :], p[10][None, :], p[11][None, :], a_even, a_odd)
        a_even, a_odd = _word_twin(w3, p[12][None, :], p[13][None, :], p[14][None, :], p[15][None, :], a_even, a_odd)
        return a_even.to(tl.float32) + a_odd.to(tl.float32)

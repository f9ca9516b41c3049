"""The tied quantized embedding's lookup as one Triton kernel: gather a token's row of codes and dequantize it.

Reference: ``kernels/fused_tied_lookup.py``. One program writes BLOCK_C columns of
one token's row (grid: (cdiv(C, BLOCK_C), B)); a row is a few KB, so the kernel
is a launch and two dependent reads (the token id, then its row), nothing to tile
for bandwidth. The values are the reference's bit for bit:

- INT4 (W4A16, kernels/int4_layout.py): element e of the row lies in sub-block
  e // 32, byte (e // 32) * 16 + e % 16, low nibble for e % 32 < 16; its group
  scale (and offset) at e >> (5 + group_shift). (q - 8) * scale is exact in FP32
  for FP16 scales (4 bits times 11); an FP32 scale's product is rounded, as torch
  rounds it. With offsets the product is taken with ``mul.rn`` so that it is
  rounded before the add, as torch's two ops round it (a fused multiply-add would
  round once).
- INT8 (W8A16): code * channel scale in FP32.
- float: the row as stored.

Then rounded to the activation dtype and, for Gemma 3, multiplied by the
embedding scale (already in that dtype) and rounded again, as the glue does.

H100 80GB HBM3, 2026-12-06, one token, CUDA-graph replay (scripts/bench_kernels.py
--only lookup): 1.4-1.8 us a lookup against the glue's 6.5 (INT8), 11.0-12.5 (INT4)
and 15.4-16.8 us (INT4 with offsets) at smollm2-135m, llama-3.2-1b and qwen3-1.7b
tables; in llama-3.2-1b's int4-head graphed step (tools/step_ab.py against the
glue) 1726 -> 1765 tok/s (+2.2%).
"""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from edgekit.kernels.fused_gemv_triton import (
    INT4_ATTRS, INT4_INPUTS, format_launches, int4_params, weight_columns, weight_kernels,
)
from edgekit.kernels.kernel_def import ACT_CODES, OpKernels, Param, pow2_at_least, program_doc
from edgekit.kernels.launch_rule import attr, cdiv, check, ptr, shape, stride
from edgekit.kernels.linear_triton import _PTX_DEQUANT
from edgekit.kernels.pdl_triton import _pdl_enter
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.fused_tied_lookup import OP_NAME, prepare

SUBBLOCK = tl.constexpr(32)


@triton.jit
def _product_rounded(q, s):
    """q * s rounded to FP32 on its own (no contraction into a following add): ``mul.rn`` in compiled code; the
    interpreter computes it in NumPy, which never contracts."""
    if _PTX_DEQUANT:
        return tl.inline_asm_elementwise(asm="mul.rn.f32 $0, $1, $2;", constraints="=r,r,r", args=[q, s],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return q * s


@triton.jit
def _tied_lookup_kernel(
    tok_ptr, w_ptr, s_ptr, y_ptr, C, stride_wv, stride_ym, row_scale,
    sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift,
    BLOCK_C: tl.constexpr, W_FORMAT: tl.constexpr, STAGES: tl.constexpr = 1, PDL: tl.constexpr = 0,
):
    """BLOCK_C columns of token b's row: y[b, cols] = dequantized W[tokens[b], cols] (x row_scale)."""
    _pdl_enter(PDL)  # the token is the previous kernel's output (the decode loop's feedback)
    pid, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    token = tl.load(tok_ptr + b).to(tl.int64)
    cols = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = cols < C
    row = w_ptr + token * stride_wv
    if W_FORMAT == 2:  # INT4
        byte = (cols // SUBBLOCK) * (SUBBLOCK // 2) + cols % (SUBBLOCK // 2)
        bits = tl.load(row + byte, mask=mask, other=0).to(tl.int32)
        q = tl.where(cols % SUBBLOCK < SUBBLOCK // 2, bits & 15, bits >> 4)
        group = token * stride_sn + (cols >> (5 + group_shift))
        if scale_f32:
            s = tl.load(s_ptr + group, mask=mask, other=0.0)
        else:
            s = tl.load(sh_ptr + group, mask=mask, other=0.0).to(tl.float32)
        if has_offset:
            if scale_f32:
                o = tl.load(of_ptr + group, mask=mask, other=0.0)
            else:
                o = tl.load(oh_ptr + group, mask=mask, other=0.0).to(tl.float32)
            v = _product_rounded(q.to(tl.float32), s) + o
        else:
            v = (q - 8).to(tl.float32) * s
    elif W_FORMAT == 1:  # INT8
        v = tl.load(row + cols, mask=mask, other=0).to(tl.float32) * tl.load(s_ptr + token)
    else:
        v = tl.load(row + cols, mask=mask, other=0.0)
    # rounded to the activation dtype, then times the embedding scale (Gemma 3; 1.0 otherwise, which changes no
    # value) and rounded again, as the glue's x * scale
    x = (v.to(y_ptr.dtype.element_ty).to(tl.float32) * row_scale).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + b * stride_ym + cols, x, mask=mask)


def _params(w_type: str, scale_value) -> tuple[Param, ...]:
    return (
        Param("tok_ptr", "*i64", ptr("tokens")),
        Param("w_ptr", w_type, ptr("weight")),
        Param("s_ptr", "*fp32", scale_value),
        Param("y_ptr", "*act", ptr("x")),
        Param("C", "i32", ROW_WIDTH),
        Param("stride_wv", "i32", stride("weight", 0)),
        Param("stride_ym", "i32", stride("x", 0)),
        Param("row_scale", "fp32", attr("row_scale")),
        *int4_params(),
    )


ROW_WIDTH = weight_columns()  # the row's width (INT4: two a stored byte)


def _space(s: dict) -> list:
    return [({"BLOCK_C": c}, w, 1) for c in (256, 512, 1024, 2048) for w in (1, 2, 4)]


def _default(s: dict):
    """A whole row in one or two programs: the row is a few KB, the launch is the cost."""
    return {"BLOCK_C": min(pow2_at_least(int(s.get("k_in") or 2048), 256), 2048)}, 4, 1


# the fused kernels' definitions, with no shared memory (no reduction, no staged loop: one load a column)
FP, W8, W4 = (dataclasses.replace(k, smem_estimate=lambda c, warps, stages, nbytes: 0)
              for k in weight_kernels(OP_NAME, "tied_lookup", _tied_lookup_kernel, _params, ("BLOCK_C",), _space,
                                      _default))


def program(variants) -> dict:
    dtype = next(iter(variants.values())).dtype  # every variant of a program is for one activation dtype
    launches, checks = format_launches(OP_NAME, (FP, W8, W4), variants,
                                       lambda v: [cdiv(ROW_WIDTH, v.constexprs["BLOCK_C"]), shape("tokens", 0), 1])
    act = ACT_CODES[dtype]
    return program_doc(
        OP_NAME, ["tokens", "weight", "scale", *INT4_INPUTS], ["scale", *INT4_INPUTS], [*INT4_ATTRS, "act_code", "row_scale"],
        checks=checks + [check("eq", attr("act_code"), act, f"{OP_NAME}: this program writes {dtype} rows (act_code "
                                                           f"{act}); the call asked for other rows (act_code: "
                                                           + ", ".join(f"{c} {n}" for n, c in ACT_CODES.items())
                                                           + "): build the plugin for the activation dtype")],
        let=[],
        buffers=[{"name": "x", "shape": [shape("tokens", 0), ROW_WIDTH], "dtype": dtype}],
        launches=launches,
        outputs=["x"],
    )


OP = OpKernels(op=OP_NAME, kernels=(FP, W8, W4), program=program, prepare=prepare,
               required=((FP.kernel, W8.kernel, W4.kernel),))

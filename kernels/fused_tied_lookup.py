"""Fused decode operator: the token embedding of a tied quantized LM head, gathered and dequantized in one kernel.

A tied model whose LM head is quantized keeps one matrix for the head and the
lookup (``model/embedding.py``): the lookup dequantizes the rows it gathers.
Written as torch ops (the ``embed`` glue node) that is one kernel per op: the
rows' codes and scales gathered, the codes widened, each byte's two nibbles
looked up, the product written: 5 kernels a decode step for a symmetric INT4
table, 7 with offsets, 3 for INT8 (``graph.launch_count`` counts them as they
run). In a graphed decode step each costs a launch. This operator replaces the
node on the fused path when the table is an INT8 (W8A16) or INT4 (W4A16) head:
one kernel, one program per slice of a token's row.

The rows are the head's weights as the glue writes them (the reference is that
computation): computed in FP32 (FP64 when the rows are), rounded once to the
activation dtype. No input carries the activation dtype (the tokens are
integers, the scales keep their stored dtype), so the call names it: the
``dtype`` attribute, which the fused graph binds to the model's activation dtype
(``graph.executor``: ``@act_dtype``, the dtype of the model's embedding, which is
what a decoder's activations are). A float table (FP16 weights) is gathered as
stored; the plugin carries that kernel too, so golden vectors check all three.
"""

from __future__ import annotations

import torch

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.fused_decode_common import (
    fused_precision, golden_weight, weight_inputs, weight_operands, weight_shape,
)
from edgekit.kernels.fusion import HEAD, Fusion
from edgekit.kernels.kernel_def import ACT_CODES, TORCH_DTYPE_TO_ACT
from edgekit.kernels.linear import LinearWeights
from edgekit.kernels.operator import DECODE, GOLDEN_ACT, Operator
from edgekit.kernels.precision import accumulate_dtype, rounded_to
from edgekit.kernels.spec import ELEMENTWISE_TOLERANCE, FLOAT_DTYPES, OpSpec, TensorSpec

OP_NAME = "fused_tied_lookup"
TOKEN_DTYPES = ("int64",)  # the decode step's token ids
# The activation dtypes the call may name, as the ``dtype`` attribute spells them (torch's names)
ROW_DTYPES = {name: getattr(torch, name) for name in FLOAT_DTYPES}

SPEC = OpSpec(
    name=OP_NAME,
    abi_version=1,
    inputs=(TensorSpec("tokens", "(B,)", TOKEN_DTYPES), *weight_inputs("V", "C", bias=False)),
    outputs=(TensorSpec("x", "(B, C)", FLOAT_DTYPES),),
    attributes=("dtype", "row_scale"),
    tolerance=ELEMENTWISE_TOLERANCE,
    doc="x = W[tokens] dequantized (INT8: codes * channel scale; INT4: per group, (q - 8) * scale or q * scale + "
        "offset), computed in FP32 (FP64 for FP64 rows) and rounded once to ``dtype``; a float W gathered as stored. "
        "With ``row_scale`` (Gemma 3's sqrt(hidden)), x = x * scale, the scale rounded to ``dtype`` first.",
)


def row_dtype(dtype: str) -> torch.dtype:
    """The torch dtype the ``dtype`` attribute names; OperatorError naming the accepted ones otherwise."""
    if dtype not in ROW_DTYPES:
        raise OperatorError(f"{OP_NAME}: dtype attribute {dtype!r} is not an activation dtype; expected one of "
                            f"{', '.join(ROW_DTYPES)}")
    return ROW_DTYPES[dtype]


def _record(weight, scale, offset) -> LinearWeights:
    """The table as the projection record its format stands for (the head's own record, on the fused path)."""
    if weight.dtype == torch.uint8:
        return LinearWeights("linear_w4a16", weight, scale=scale, offset=offset)
    if weight.dtype == torch.int8:
        return LinearWeights("linear_w8a16", weight, scale=scale)
    return LinearWeights("linear", weight)


def fused_tied_lookup_reference(tokens, weight, scale, offset, dtype: str, row_scale: float | None = None
                                ) -> torch.Tensor:
    """Rows ``tokens`` (B,) of the table, (B, C) in ``dtype``: the record's dequantization of those rows, as the
    ``embed`` glue computes it (``QuantizedEmbedding``; a float table's rows as stored), times ``row_scale`` as the
    glue applies the embedding scale."""
    out = row_dtype(dtype)
    rows = tokens.reshape(-1).to(torch.long)
    record = _record(weight, scale, offset)
    if record.op == "linear":
        x = weight.index_select(0, rows).to(out)
    else:
        x = record.dequantized(rows, accumulate_dtype(out), out_dtype=out)
    return x if row_scale is None else x * rounded_to(row_scale, out)


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    """One decode call: ``rows`` tokens of a table of the model's width (its vocabulary rows capped like the linear
    golden calls; the build's golden cases quantize the table to INT8 and INT4 beside this float one), with the
    model's embedding scale (None but for Gemma 3)."""
    table = golden_weight(g, cfg.vocab_size, cfg.hidden_size, bias=False)
    tokens = torch.randint(0, table["weight"].shape[0], (rows,), generator=g)
    return {"tokens": tokens, **table}, {"dtype": GOLDEN_ACT, "row_scale": cfg.embedding_scale}  # the model's own


def prepare(tokens, weight, scale, offset, dtype, row_scale=None):
    op = OP_NAME
    hc.on_cuda(op, ("tokens", tokens), ("weight", weight), ("scale", scale), ("offset", offset))
    out = row_dtype(dtype)
    if out not in (torch.float16, torch.bfloat16, torch.float32):
        raise OperatorError(f"{op}: the kernels write FP16, BF16 or FP32 rows; dtype {dtype!r} was asked",
                            hint="FP64 rows come from the torch reference (an FP64 run)")
    if tokens.dtype != torch.int64:
        raise OperatorError(f"{op}: tokens have dtype {tokens.dtype}; expected int64 token ids (the decode step's)")
    hc.ndim(op, tokens, "tokens", 1, "(B,)")
    hc.vector(op, tokens, "tokens", tokens.shape[0])  # one id after another: the kernel reads tokens[b]
    if weight.dim() != 2:
        raise OperatorError(f"{op}: weight has shape {tuple(weight.shape)}; expected the (V, C) table")
    width = weight_shape({"weight": weight})["k_in"]
    if weight.is_floating_point() and weight.dtype != out:
        raise OperatorError(f"{op}: a float table of {weight.dtype} cannot give {dtype} rows as stored",
                            hint="pass the table in the activation dtype")
    # x stands for the rows' dtype and width in the shared weight checks (no activation comes in)
    like = torch.empty((0, width), dtype=out, device=weight.device)
    operands, attrs = weight_operands(op, like, weight, scale, offset, weight.shape[0], width)
    tensors = {"tokens": tokens, **operands}
    # the dtype asked for, as a number a compiled program checks (its rows buffer has one dtype) and the JIT path
    # picks its kernels by (kernel_def.call_act_dtype)
    attrs = {**attrs, "act_code": ACT_CODES[TORCH_DTYPE_TO_ACT[str(out)]],
             "row_scale": 1.0 if row_scale is None else rounded_to(row_scale, out)}  # x * 1.0 is x, bit for bit
    return tensors, attrs, lambda bufs: bufs["x"]


# The fused decode graph's ``embed`` node of a table read from a tied INT8 or INT4 head (the builder binds the head's
# record to it and names its scheme); a float table keeps the glue's one gather kernel.
FUSION = Fusion(
    pattern=("embed",),
    inputs={"tokens": "0.tokens", "proj": "0.proj"},
    outputs={"x": "0.x"},
    attributes={"dtype": "@act_dtype", "row_scale": "0.scale"},
    schemes=("w8a16", "w4a16"),
    scope=HEAD,
    takes_bias=False,
)

OPERATORS = (
    Operator(SPEC, fused_tied_lookup_reference, fused_precision(OP_NAME), golden_inputs,
             call_shape=lambda t, a: {"k_in": weight_shape(t)["k_in"]},
             triton="fused_tied_lookup_triton:OP", prepare=prepare, tiles_at={"tied_lookup_fp": DECODE,
                                                                          "tied_lookup_w8": DECODE,
                                                                          "tied_lookup_w4": DECODE},
             fusion=FUSION),
)

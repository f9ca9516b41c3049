"""A tied, quantized LM head read as the embedding table: gathered rows are exactly the head's dequantized rows."""

from __future__ import annotations

import pytest
import torch

from edgekit.errors import QuantizationError
from edgekit.kernels.int4_layout import dequantize_int4, quantize_int4_rtn, unpack_int4
from edgekit.kernels.int8_group_layout import quantize_int8_grouped
from edgekit.kernels.linear import LinearWeights
from edgekit.model.embedding import QuantizedEmbedding, embedding_nbytes, is_tied, lookup, tied_embedding

V, C = 96, 64


def _float_head(seed: int = 0) -> torch.Tensor:
    return torch.randn(V, C, generator=torch.Generator().manual_seed(seed))


def int8_head(smooth: bool = False) -> LinearWeights:
    w = _float_head()
    s = torch.rand(C, generator=torch.Generator().manual_seed(1)) + 0.5 if smooth else None
    ws = w * s[None, :] if smooth else w
    scale = ws.abs().amax(dim=1) / 127.0
    q = torch.clamp(torch.round(ws / scale[:, None]), -127, 127).to(torch.int8)
    return LinearWeights("linear_w8a8" if smooth else "linear_w8a16", q, None, scale, s)


def int4_head(symmetric: bool, group: int = 32) -> LinearWeights:
    q, s, off = quantize_int4_rtn(_float_head(), group, symmetric=symmetric, scale_dtype=torch.float16)
    return LinearWeights("linear_w4a16", q, None, s, offset=off)


def int8_grouped_head() -> LinearWeights:
    q, s = quantize_int8_grouped(_float_head(), 32)
    return LinearWeights("linear_w8a16_grouped", q, None, s)


HEADS = {"int8": lambda: int8_head(), "int8_smooth": lambda: int8_head(smooth=True),
         "int4_asym": lambda: int4_head(False), "int4_sym_g64": lambda: int4_head(True, 64),
         "int8_grouped": int8_grouped_head}


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_gathered_rows_are_the_heads_dequantized_rows(kind):
    head = HEADS[kind]()
    emb = QuantizedEmbedding(head, torch.float32)
    tokens = torch.tensor([[0, 5, 95, 5], [17, 3, 3, 60]])  # (B, T), repeats included
    rows = emb[tokens]
    assert rows.shape == (2, 4, C) and rows.dtype == torch.float32
    assert torch.equal(rows, head.dequantized()[tokens])  # exact: the same arithmetic per element
    assert emb.shape == (V, C) and emb.device == head.weight.device
    assert torch.equal(emb.dequantized(), head.dequantized())


def _oracle_rows(head: LinearWeights, tokens: torch.Tensor) -> torch.Tensor:
    """The rows by the layouts' formulas, written out here in FP64 and rounded to FP32 as the FP32 code rounds them:
    q * s (+ o) for INT4 (each product exact in FP32 for these scales; the sum rounded once), codes x scale for INT8."""
    w, s = head.weight[tokens], head.scale[tokens].double()
    if head.op == "linear_w4a16":
        q = unpack_int4(w).double()
        q = q - 8 if head.offset is None else q
        prod = (q.unflatten(-1, (s.shape[-1], -1)) * s[..., None]).float().double()  # rounded to FP32
        if head.offset is not None:
            prod = prod + head.offset[tokens].double()[..., None]
        return prod.float().flatten(-2)
    if head.op == "linear_w8a16_grouped":
        return (w.double().unflatten(-1, (s.shape[-1], -1)) * s[..., None]).float().flatten(-2)
    return (w.double() * s[:, None]).float()  # INT8 per row (no smooth)


@pytest.mark.parametrize("kind", sorted(k for k in HEADS if k != "int8_smooth"))
@pytest.mark.parametrize("scales", ["stored", "fp32"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rows_in_a_16_bit_dtype_are_the_fp32_rows_rounded_once(kind, scales, dtype):
    # the lookup's last op writes the activation dtype itself (no cast kernel after it): the values must be the FP32
    # dequantization's rounded once, bit for bit (a product computed in 16 bits, or rounded before the offset, differs)
    head = HEADS[kind]()
    if scales == "fp32":  # FP32 scales (GGUF Q4_K's), not FP16 values: products no longer exact in 16 bits
        head = LinearWeights(head.op, head.weight, None, head.scale.float() * 1.0001,
                             offset=None if head.offset is None else head.offset.float() * 1.0001)
    tokens = torch.tensor([0, 5, 95, 5, 17, 60])
    rows = QuantizedEmbedding(head, dtype)[tokens]
    assert rows.dtype == dtype
    assert torch.equal(rows, _oracle_rows(head, tokens).to(dtype))


def test_an_fp64_oracle_asked_for_16_bit_rows_computes_in_fp64():
    head = int4_head(False)
    rows = head.dequantized(torch.tensor([3, 9]), torch.float64, out_dtype=torch.float16)
    exact = dequantize_int4(head.weight, head.scale, head.offset, dtype=torch.float64)[[3, 9]]
    assert rows.dtype == torch.float16 and torch.equal(rows, exact.to(torch.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(HEADS))
def test_rows_gathered_on_the_gpu_are_the_cpus(kind):
    # the GPU's product writing FP16 / BF16 must round the FP32 value once, as the CPU reference does
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    head = HEADS[kind]()
    tokens = torch.tensor([0, 5, 95, 5, 17, 60])
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        cpu = QuantizedEmbedding(head, dtype)[tokens]
        gpu = QuantizedEmbedding(head.to("cuda"), dtype)[tokens.cuda()]
        assert gpu.dtype == dtype and torch.equal(gpu.cpu(), cpu), (kind, dtype)


def test_rows_come_out_in_the_activation_dtype_and_fp64_is_exact():
    head = int4_head(False)
    assert QuantizedEmbedding(head, torch.float16)[torch.tensor([1, 2])].dtype == torch.float16
    exact = QuantizedEmbedding(head, torch.float64)[torch.tensor([7])]
    assert torch.equal(exact[0], dequantize_int4(head.weight, head.scale, head.offset, dtype=torch.float64)[7])


def test_row_bytes_count_codes_and_scales():
    assert QuantizedEmbedding(int8_head(), torch.float32).row_nbytes() == C + 4  # int8 codes + one fp32 scale
    assert QuantizedEmbedding(int4_head(False), torch.float32).row_nbytes() == C // 2 + 2 * 2 * (C // 32)


def test_a_float_head_is_not_wrapped():
    w = _float_head()
    with pytest.raises(QuantizationError, match="cannot be read from a linear head"):
        QuantizedEmbedding(LinearWeights("linear", w), torch.float32)
    assert tied_embedding(LinearWeights("linear", w), torch.float32) is w  # the float head is the table itself


def test_tie_is_seen_and_survives_a_move():
    from edgekit.model.decoder import ModelWeights

    head = int8_head()
    emb = tied_embedding(head, torch.float32)
    assert is_tied(emb, head) and not is_tied(emb, int8_head())
    assert embedding_nbytes(emb) == 0  # the head's record holds the matrix
    w = ModelWeights(tok_embeddings=emb, blocks=[], norm=torch.ones(C), lm_head=head)
    moved = w.to(dtype=torch.float16)
    assert moved.tied and moved.tok_embeddings.head is moved.lm_head and moved.tok_embeddings.dtype == torch.float16
    assert moved.lm_head.weight.dtype == torch.int8  # codes are never cast
    assert w.nbytes() == head.nbytes() + C * 4  # the matrix once, plus the norm


@pytest.mark.parametrize("shape", [(3,), (2, 4), (1, 1)])
def test_lookup_gathers_the_rows_of_a_float_table_or_a_quantized_one(shape):
    tokens = torch.randint(0, V, shape, generator=torch.Generator().manual_seed(len(shape)))
    table = _float_head()
    rows = lookup(table, tokens)
    assert rows.shape == (*shape, C) and torch.equal(rows, table[tokens])
    emb = QuantizedEmbedding(int8_head(), torch.float32)
    assert torch.equal(lookup(emb, tokens), emb[tokens])

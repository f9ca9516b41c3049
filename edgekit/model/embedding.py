"""The token embedding of a model whose tied LM head is quantized: one matrix serves the lookup and the head GEMV.

A tied model's embedding table and LM head are the same (V, C) matrix. Kept in
floating point, ``ModelWeights.tok_embeddings`` is that tensor and the head's
record points at it. Once the head is quantized (INT8 with a per-row scale, or
W4A16 groups), a second FP16 copy for the lookup would cost V*C*2 bytes (28 MB
for SmolLM2-135M) and make the tie a fiction; instead ``QuantizedEmbedding``
wraps the head's own record and dequantizes only the rows it gathers. The rows
are exactly the head's weights as the head operator sees them, so the gate that
scores the quantized head scores the lookup too.

On the fused decode path one kernel gathers and dequantizes the rows
(``kernels/fused_tied_lookup.py``, whose reference is this module's computation);
elsewhere the torch ops below run (3-7 kernels a lookup).

It quacks like the (V, C) tensor where the model reads it: ``emb[tokens]``
(any shape of token ids, returning ``(..., C)`` in the activation dtype),
``.shape``, ``.dtype``, ``.device``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgekit.errors import QuantizationError
from edgekit.kernels.linear import LinearWeights
from edgekit.kernels.precision import accumulate_dtype

# Head operators whose rows can be gathered and dequantized one at a time.
GATHERABLE_OPS = ("linear_w8a16", "linear_w8a8", "linear_w4a16", "linear_w8a16_grouped")


@dataclass(frozen=True)
class QuantizedEmbedding:
    head: LinearWeights  # the tied LM head's quantized record (V, C): the only copy of the matrix
    dtype: torch.dtype  # of the gathered rows (the activations')

    def __post_init__(self):
        if self.head.op not in GATHERABLE_OPS:
            raise QuantizationError(f"a tied embedding cannot be read from a {self.head.op} head; "
                                    f"expected one of {', '.join(GATHERABLE_OPS)}",
                                    hint="keep a floating-point head as the embedding tensor itself")

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.head.out_features, self.head.in_features))

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def __getitem__(self, tokens: torch.Tensor) -> torch.Tensor:
        """Rows ``tokens`` (any shape) dequantized: (..., C) in ``self.dtype``."""
        rows = self.head.dequantized(tokens.reshape(-1), accumulate_dtype(self.dtype), out_dtype=self.dtype)
        return rows.reshape(*tokens.shape, self.shape[1])

    def dequantized(self) -> torch.Tensor:
        """The whole (V, C) table in ``self.dtype`` (for exports and comparisons, never kept by the model)."""
        return self[torch.arange(self.shape[0], device=self.device)]

    def row_nbytes(self) -> int:
        """Bytes one lookup reads: a row of codes and its scale(s)."""
        h = self.head
        parts = (h.weight, h.scale, h.offset)
        return sum(t[0].numel() * t.element_size() for t in parts if t is not None)


def tied_embedding(head: LinearWeights, dtype: torch.dtype) -> torch.Tensor | QuantizedEmbedding:
    """What ``tok_embeddings`` is for a tied model whose head is ``head``: the head's float weight itself, or the
    quantized head read row by row."""
    return head.weight if head.op == "linear" else QuantizedEmbedding(head, dtype)


def is_tied(tok_embeddings, lm_head: LinearWeights) -> bool:
    """Whether the lookup and the head share one matrix (float or quantized)."""
    if isinstance(tok_embeddings, QuantizedEmbedding):
        return tok_embeddings.head is lm_head
    return lm_head.weight is tok_embeddings


def embedding_nbytes(tok_embeddings) -> int:
    """Bytes the table takes of its own: 0 for a quantized tied one (the head's record holds it)."""
    if isinstance(tok_embeddings, QuantizedEmbedding):
        return 0
    return tok_embeddings.numel() * tok_embeddings.element_size()


def lookup(table: "torch.Tensor | QuantizedEmbedding", tokens: torch.Tensor) -> torch.Tensor:
    """``table[tokens]``: the embedding rows of any shape of token ids, ``(..., C)``.

    A float table goes through ``index_select``: on the GPU, advanced indexing launches a general gather kernel that
    took 5.3 us for one 4 KB row of llama-3.2-1b's table (H200, profile_decode.py), about a layer's attention."""
    if isinstance(table, torch.Tensor):
        return table.index_select(0, tokens.reshape(-1)).reshape(*tokens.shape, table.shape[-1])
    return table[tokens]


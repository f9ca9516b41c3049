"""A model's weights, and the decoder that runs its forward graph on them.

The forward itself is written once, per architecture family, in ``edgekit.graph``;
the decoder owns no arithmetic: every operator goes through the dispatch table
``ops``. Shapes are static: a prefill runs on a padded bucket with per-sequence
lengths, a decode step runs one token per sequence against the preallocated KV
cache.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from edgekit.graph.builder import LinearSchemes
from edgekit.graph.executor import ExecContext, run_graph
from edgekit.graph.node import DECODE, PREFILL, Graph
from edgekit.graph.paths import BASE, PER_OPERATOR, path_graph
from edgekit.kernels.dispatch import DispatchTable
from edgekit.kernels.linear import LinearWeights
from edgekit.kernels.rope import rope_frequencies
from edgekit.model.rope_scaling import table_scaling
from edgekit.model.config import ModelConfig
from edgekit.model.embedding import QuantizedEmbedding, embedding_nbytes, is_tied
from edgekit.model.kv_cache import StaticKVCache


@dataclass
class BlockWeights:
    attn_norm: torch.Tensor  # (C,)
    wqkv: LinearWeights  # ((Hq + 2 Hkv) D, C), Q|K|V rows, optional bias
    wo: LinearWeights  # (C, Hq D)
    ffn_norm: torch.Tensor  # (C,)
    w_gate_up: LinearWeights  # (2F, C), gate rows then up rows
    w_down: LinearWeights  # (C, F)
    q_norm: torch.Tensor | None = None  # (D,) per-head RMSNorm of Q (config.qk_norm)
    k_norm: torch.Tensor | None = None  # (D,) per-head RMSNorm of K
    post_attn_norm: torch.Tensor | None = None  # (C,) RMSNorm of the attention output (config.post_norms)
    post_ffn_norm: torch.Tensor | None = None  # (C,) RMSNorm of the MLP output

    def linears(self) -> dict[str, LinearWeights]:
        return {"wqkv": self.wqkv, "wo": self.wo, "w_gate_up": self.w_gate_up, "w_down": self.w_down}

    def norms(self) -> dict[str, torch.Tensor]:
        """Every norm weight the block has, by field name (the optional ones only when present)."""
        return {name: t for name in NORM_FIELDS if (t := getattr(self, name)) is not None}


# BlockWeights' norm fields: attn_norm and ffn_norm always, the rest when the family has them
NORM_FIELDS = ("attn_norm", "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")


@dataclass
class ModelWeights:
    tok_embeddings: torch.Tensor | QuantizedEmbedding  # (V, C); read from lm_head's record when tied and quantized
    blocks: list[BlockWeights]
    norm: torch.Tensor  # (C,)
    lm_head: LinearWeights  # (V, C); shares tok_embeddings when tied

    @property
    def tied(self) -> bool:
        """Whether the embedding lookup and the LM head are one matrix (float, or the head's quantized record)."""
        return is_tied(self.tok_embeddings, self.lm_head)

    def to(self, device=None, dtype=None) -> "ModelWeights":
        def mv(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype if dtype is not None else t.dtype)

        if isinstance(self.tok_embeddings, QuantizedEmbedding):  # tied and quantized: the head moves once
            head = self.lm_head.to(device, dtype)
            emb = QuantizedEmbedding(head, dtype if dtype is not None else self.tok_embeddings.dtype)
        else:
            emb = mv(self.tok_embeddings)
            # a tied LM head stays tied: one tensor, not two copies (and serializers see the tie)
            head = (LinearWeights("linear", emb, mv(self.lm_head.bias) if self.lm_head.bias is not None else None)
                    if self.lm_head.weight is self.tok_embeddings else self.lm_head.to(device, dtype))
        return ModelWeights(
            tok_embeddings=emb,
            blocks=[
                BlockWeights(**{k: mv(t) for k, t in b.norms().items()},
                             **{k: lw.to(device, dtype) for k, lw in b.linears().items()})
                for b in self.blocks
            ],
            norm=mv(self.norm),
            lm_head=head,
        )

    def nbytes(self) -> int:
        n = embedding_nbytes(self.tok_embeddings) + self.norm.numel() * self.norm.element_size()
        for b in self.blocks:
            n += sum(lw.nbytes() for lw in b.linears().values())
            n += sum(t.numel() * t.element_size() for t in b.norms().values())
        if isinstance(self.tok_embeddings, QuantizedEmbedding) or self.lm_head.weight.data_ptr() != self.tok_embeddings.data_ptr():
            n += self.lm_head.nbytes()
        return n


class Decoder:
    """A model's forward passes over static shapes: its architecture family's graph (``edgekit.graph``) run on these
    weights through the dispatch table ``ops``. Not an nn.Module: weights are plain tensors, swapped in as data.

    Prefill and decode run the per-operator path's graph; ``graph(phase, path)`` gives any path's (the fused decode
    step is ``runtime.fused_step.FusedDecoder``), and ``run(graph, ...)`` runs one.
    """

    def __init__(self, config: ModelConfig, weights: ModelWeights, ops: DispatchTable | None = None):
        self.config = config
        self.weights = weights
        self.ops = ops or DispatchTable()
        self.device = weights.tok_embeddings.device
        self.dtype = weights.tok_embeddings.dtype
        self._tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._retired_tables: list[tuple[torch.Tensor, torch.Tensor]] = []  # outgrown, still read by captured graphs
        self._tables_lock = threading.Lock()  # shared with with_ops views, as the tables are

    # Called before each operator of a decode step (None: nothing): a server prefills a newly arrived prompt there
    # rather than after the step (runtime.engine, prefill_mid_step). Set on a ``with_ops`` view, it is that view's.
    between_decode_nodes: Callable[[], None] | None = None

    def with_ops(self, ops: DispatchTable) -> "Decoder":
        """The same model (weights shared, not copied) calling operators through another table."""
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__)
        view.ops = ops
        return view

    def new_cache(self, batch: int, max_seq_len: int) -> StaticKVCache:
        return StaticKVCache(self.config, batch, max_seq_len, self.dtype, self.device)

    @property
    def schemes(self) -> LinearSchemes:
        """The weight scheme of every projection, read from the weights as they are now (a calibration pass swaps
        blocks in and out)."""
        return LinearSchemes.of_weights(self.weights)

    def graph(self, phase: str, path: str = PER_OPERATOR, blocks=None) -> Graph:
        """This model's graph at ``phase`` on ``path``, for its weights (with ``blocks`` standing in for some).

        A table that rewrites projection outputs (``on_linear_output``: norm tweaking's row factors) gets the graph
        unfused: a factor on the QKV rows must act before RoPE, which a fused ``qkv_rope`` would not let it."""
        if path == PER_OPERATOR and getattr(self.ops, "on_linear_output", None) is not None:
            path = BASE
        return path_graph(self.config, LinearSchemes.of_weights(self.weights, blocks), phase, path)

    def rope_tables(self, name: str, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) (S, D/2) of the graph's RoPE table ``name`` on the weights' device, FP32 for every activation
        dtype (FP64 for an FP64 reference run), covering at least ``rows`` positions (a run's cache length; None:
        every position the model was trained for). Sized to what runs ask, as the memory plan counts them: a table
        of every trained position was 32 MB for Llama 3.2 (128k positions) whatever the context. A larger ask makes
        a larger table; the smaller one is kept alive, since a CUDA graph captured with it still reads it."""
        need = self.config.max_position_len if rows is None else rows
        have = self._tables.get(name)
        if have is not None and have[0].shape[0] >= need:
            return have
        with self._tables_lock:  # two threads growing at once must not drop a table a graph was captured with
            have = self._tables.get(name)
            if have is None or have[0].shape[0] < need:
                if have is not None:
                    self._retired_tables.append(have)
                theta = self.graph(PREFILL).rope[name]
                table_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
                cos, sin = rope_frequencies(self.config.head_dim, need, theta, table_dtype,
                                            scaling=table_scaling(self.config, name))
                self._tables[name] = (cos.to(self.device), sin.to(self.device))
            return self._tables[name]

    def context(self, phase: str, cache=None, **state) -> ExecContext:
        """What running one of this decoder's graphs reads besides the graph (``state``: tokens, positions, ...).

        A table that observes projections (calibration: ``on_linear_input(node, record, x)``; tuning:
        ``on_linear_output(node, record, y) -> y``) has them called around each projection node."""
        tokens = state.get("tokens")  # a run without a cache (a whole sequence) reads its own length of positions
        rows = cache.max_seq_len if cache is not None else (tokens.shape[-1] if tokens is not None else None)
        return ExecContext(phase, self.ops, self.weights, functools.partial(self.rope_tables, rows=rows), cache,
                           {f"@{k}": v for k, v in state.items() if v is not None},
                           on_linear_input=getattr(self.ops, "on_linear_input", None),
                           on_linear_output=getattr(self.ops, "on_linear_output", None))

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, seq_lens: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        """tokens (B, T) padded to a bucket, seq_lens (B,) real lengths. Returns logits at each last real token (B, V)."""
        g = self.graph(PREFILL)
        env = run_graph(g, self.context(PREFILL, cache, tokens=tokens, seq_lens=seq_lens))
        return env[g.outputs["logits"]]

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        """tokens (B,) at positions (B,): one step. Returns logits (B, V)."""
        g = self.graph(DECODE)
        ctx = self.context(DECODE, cache, tokens=tokens, positions=positions)
        ctx.before_node = self.between_decode_nodes
        env = run_graph(g, ctx)
        return env[g.outputs["logits"]]

"""Writing a forward as a graph: the calls an architecture family's module makes.

A family's function (``graph/llama.py``, ...) reads like the math: ``h =
b.rmsnorm(x, "blocks.3.attn_norm")``, ``q, k, v = b.qkv_rope(h, ...)``. The
builder turns each call into nodes for the phase it builds: a decode step works
on one token per sequence (rows (B, C)), a prefill and a calibration window on
(B, T, C); the few shape adapters between them (a one-token view, heads merged
back into rows) are glue nodes the builder adds, so the family writes the
forward once for every phase.

Which linear operator a projection node calls comes from ``schemes``: the weight
scheme of each projection (``LinearSchemes``), read from a precision plan or from
loaded weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from edgekit.errors import ConfigError
from edgekit.graph.node import DECODE, PHASES, PREFILL, PROJ, SEQUENCE, Graph, Node
from edgekit.kernels.weight_schemes import scheme, scheme_of_operator

PROJECTIONS = ("wqkv", "wo", "w_gate_up", "w_down")  # every family packs its projections into these four
HEAD = "lm_head"


_SCHEME_OF_OP: dict[str, str] = {}


def _scheme_name(op: str) -> str:
    if op not in _SCHEME_OF_OP:
        _SCHEME_OF_OP[op] = scheme_of_operator(op).name
    return _SCHEME_OF_OP[op]


@dataclass(frozen=True)
class LinearSchemes:
    """The weight scheme of every projection: per layer, one scheme name per projection (PROJECTIONS order), and the
    LM head's. Hashable, so graphs made for it are cached."""

    layers: tuple[tuple[str, ...], ...]
    lm_head: str = "fp16"
    # The token table's: "fp16" for a float table (its own, or a tied float head's weight), else the scheme of the tied
    # quantized head it is read from (model/embedding.py), whose rows the lookup dequantizes
    embedding: str = "fp16"

    def of(self, path: str) -> str:
        """The scheme of the projection at ``path`` ("blocks.3.wqkv" or "lm_head")."""
        if path == HEAD:
            return self.lm_head
        _, i, proj = path.split(".")
        return self.layers[int(i)][PROJECTIONS.index(proj)]

    @classmethod
    def of_layers(cls, layers, lm_head: str = "fp16", embedding: str = "fp16") -> "LinearSchemes":
        """From per-layer mappings projection -> scheme (a precision plan's)."""
        return cls(tuple(tuple(layer[p] for p in PROJECTIONS) for layer in layers), lm_head, embedding)

    @classmethod
    def uniform(cls, n_layers: int, name: str = "fp16", lm_head: str = "fp16") -> "LinearSchemes":
        return cls(tuple((name,) * len(PROJECTIONS) for _ in range(n_layers)), lm_head)

    @classmethod
    def of_weights(cls, weights, blocks: Mapping[int, Any] | None = None) -> "LinearSchemes":
        """Read from model weights (duck-typed ModelWeights: each projection record names its operator), with
        ``blocks`` (index -> block weights) standing in for some of the model's."""
        blocks = blocks or {}
        head = _scheme_name(weights.lm_head.op)
        # a tied quantized head's table is read through the head's record (QuantizedEmbedding.head)
        read_from_head = getattr(weights.tok_embeddings, "head", None) is weights.lm_head
        return cls(tuple(tuple(_scheme_name(getattr(blocks.get(i, b), p).op) for p in PROJECTIONS)
                         for i, b in enumerate(weights.blocks)), head, head if read_from_head else "fp16")

    def used(self) -> list[str]:
        return list(dict.fromkeys([*(s for layer in self.layers for s in layer), self.lm_head]))


@dataclass
class GraphBuilder:
    cfg: Any  # a ModelConfig (duck-typed: this package sits below edgekit.model)
    schemes: LinearSchemes
    phase: str
    family: str
    nodes: list[Node] = field(default_factory=list)
    rope: dict[str, float] = field(default_factory=dict)
    streams: list[tuple[str, str]] = field(default_factory=list)  # per block: (residual stream in, out)
    layer: int | None = None
    _names: set[str] = field(default_factory=set)

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ConfigError(f"unknown graph phase {self.phase!r}; expected one of: {', '.join(PHASES)}")
        if len(self.schemes.layers) != self.cfg.n_layers:
            raise ConfigError(f"weight schemes for {len(self.schemes.layers)} layers; the model has {self.cfg.n_layers}")

    # -- structure -------------------------------------------------------------------------------------------
    def block(self, i: int, x: str, body: Callable[[str, str], str]) -> str:
        """Block ``i``: ``body(prefix, x)`` adds its nodes ("blocks.3" the weight prefix, ``x`` the residual stream
        coming in) and returns the stream going out; the graph records both (a calibration pass starts at a block)."""
        self.layer = i
        try:
            out = body(f"blocks.{i}", x)
        finally:
            self.layer = None
        self.streams.append((x, out))
        return out

    def node(self, op: str, name: str, inputs: Mapping[str, str], outputs: tuple[str, ...] = ("y",),
             weights: Mapping[str, str] | None = None, **attrs) -> dict[str, str]:
        """Add one node; returns its outputs by role (value names are "<node name>.<role>")."""
        full = name if self.layer is None else f"blocks.{self.layer}/{name}"
        if full in self._names:
            raise ConfigError(f"graph node {full!r} is defined twice", hint="this is a bug in the family's graph")
        self._names.add(full)
        out = {role: f"{full}.{role}" for role in outputs}
        self.nodes.append(Node(op, full, inputs, out, weights or {}, attrs, self.layer))
        return out

    def build(self, outputs: Mapping[str, str]) -> Graph:
        return Graph(self.family, self.phase, self.nodes, outputs, self.rope, streams=tuple(self.streams))

    # -- operators -------------------------------------------------------------------------------------------
    @property
    def decode(self) -> bool:
        return self.phase == DECODE

    def embed(self, scale: float | None = None) -> str:
        """The token rows (times ``scale``, Gemma 3's). A table read from a tied quantized head also binds the head's
        record and names its scheme: the fused path's lookup operator (``fused_tied_lookup``) takes those."""
        weights, attrs = {"table": "tok_embeddings"}, {}
        if self.schemes.embedding != "fp16":
            weights[PROJ], attrs["scheme"] = HEAD, self.schemes.embedding
        return self.node("embed", "embed", {"tokens": "@tokens"}, ("x",), weights, scale=scale, **attrs)["x"]

    def rope_tables(self, name: str, theta: float) -> dict[str, str]:
        """The RoPE rows of this step's positions for the table ``name`` (base ``theta``)."""
        self.rope[name] = theta
        inputs = {"tokens": "@tokens", **({"positions": "@positions"} if self.decode else {})}
        return self.node("rope_tables", f"rope.{name}", inputs, ("cos", "sin"), rope=name)

    def seq_lens(self) -> str:
        """The attended length of each sequence: the step's input in a prefill, position + 1 in a decode step."""
        if not self.decode:
            return "@seq_lens"
        return self.node("seq_lens", "seq_lens", {"positions": "@positions"}, ("seq_lens",))["seq_lens"]

    def window_state(self, window: int) -> dict[str, str]:
        """What the sliding-window layers of ``window`` positions attend with: {"seq_lens", "slots"}. In a decode step
        the ring row each token is written to (position % window) and the rows attended (min(position + 1, window));
        in a prefill the sequence lengths (the window is the attention operator's)."""
        if not self.decode:
            return {"seq_lens": "@seq_lens", "slots": "@positions"}
        at = {"positions": "@positions"}
        slots = self.node("kv_slots", f"kv_slots.w{window}", at, ("slots",), window=window)["slots"]
        lens = self.node("window_lens", f"window_lens.w{window}", at, ("seq_lens",), window=window)["seq_lens"]
        return {"seq_lens": lens, "slots": slots}

    def rmsnorm(self, x: str, weight: str, name: str, eps: float) -> str:
        return self.node("rmsnorm", name, {"x": x}, weights={"weight": weight}, eps=eps)["y"]

    def linear(self, x: str, path: str, name: str) -> str:
        """A projection, run by the linear operator of its weight scheme."""
        op = scheme(self.schemes.of(path)).operator
        bias = bool(getattr(self.cfg, "qkv_bias", False)) and path.endswith(".wqkv")
        return self.node(op, name, {"x": x}, weights={PROJ: path}, bias=bias)["y"]

    def qkv_rope(self, h: str, path: str, tables: Mapping[str, str], rope: str,
                 qk_norm: tuple[str, str] | None = None, eps: float | None = None) -> tuple[str, str, str]:
        """The packed QKV projection, split into heads with RoPE applied: q (B, Hq, T, D), k, v (B, Hkv, T, D).
        ``qk_norm``: the weight paths of the per-head RMSNorm of Q and K applied before RoPE (``qk_norm_rope``)."""
        if self.decode:  # a decode step is a one-token sequence for the projection and RoPE
            h = self.node("as_tokens", "qkv_in", {"x": h})["y"]
        qkv = self.linear(h, path, "wqkv")
        heads = dict(n_heads=self.cfg.n_heads, n_kv_heads=self.cfg.n_kv_heads)
        ins = {"qkv": qkv, "cos": tables["cos"], "sin": tables["sin"]}
        if qk_norm is None:
            out = self.node("rope", "rope", ins, ("q", "k", "v"), **heads, rope=rope)
        else:
            out = self.node("qk_norm_rope", "qk_norm_rope", ins, ("q", "k", "v"),
                            {"q_norm": qk_norm[0], "k_norm": qk_norm[1]}, **heads, eps=eps, rope=rope)
        return out["q"], out["k"], out["v"]

    def attention(self, q: str, k: str, v: str, seq_lens: str, scale: float, window: int = 0,
                  slots: str = "@positions") -> str:
        """KV-cache write, attention, heads merged back into rows: (B, T, Hq D), or (B, Hq D) in a decode step.

        A sliding-window layer (``window`` > 0) attends to the last ``window`` positions: its decode step writes its
        ring row ``slots`` and reads ``seq_lens`` rows of the ring (``window_state``); its prefill masks by the
        window and keeps each sequence's last real positions in the ring."""
        if self.decode:
            self.node("kv_store", "kv_store", {"k": k, "v": v, "slots": slots}, ())
            q = self.node("select_token", "q_token", {"x": q})["y"]
            o = self.node("attention_decode", "attention", {"q": q, "k_cache": "@k_read", "v_cache": "@v_read",
                                                            "seq_lens": seq_lens}, ("o",), scale=scale)["o"]
        else:
            kv = self.node("kv_store", "kv_store", {"k": k, "v": v, **({"seq_lens": "@seq_lens"} if window else {})},
                           ("k", "v"))
            o = self.node("attention_prefill", "attention", {"q": q, "k": kv["k"], "v": kv["v"], "seq_lens": seq_lens},
                          ("o",), scale=scale, window=window)["o"]
        return self.node("merge_heads", "merge_heads", {"x": o})["y"]

    def gated_mlp(self, h: str, prefix: str, act: str) -> str:
        """The gated MLP of block ``prefix``: the packed gate/up projection, the gated activation operator ``act``
        ("swiglu", "geglu") over it, the down projection: (B, T, C) rows back."""
        y = self.op(act, act, gate_up=self.linear(h, f"{prefix}.w_gate_up", "w_gate_up"))  # (B, T, F)
        return self.linear(y, f"{prefix}.w_down", "w_down")

    def op(self, op: str, name: str, **inputs: str) -> str:
        """An elementwise operator of one output (swiglu, ...)."""
        return self.node(op, name, inputs)["y"]

    def add(self, residual: str, branch: str, name: str) -> str:
        """residual + branch (the order fused operators bind: ``a`` is the residual stream)."""
        return self.node("add", name, {"a": residual, "b": branch})["y"]

    def head(self, x: str, norm: str, eps: float) -> dict[str, str]:
        """Final norm and LM head: logits at each sequence's last real token (prefill), of the step (decode), or at
        every position (a calibration window, which also returns the hidden states)."""
        hidden = x
        if self.phase == PREFILL:
            x = self.node("last_token", "last_token", {"x": x, "seq_lens": "@seq_lens"})["y"]
        logits = self.linear(self.rmsnorm(x, norm, "final_norm", eps), HEAD, "lm_head")
        return {"logits": logits, **({"hidden": hidden} if self.phase == SEQUENCE else {})}


Family = Callable[[GraphBuilder], Mapping[str, str]]  # builds the nodes, returns the graph's outputs

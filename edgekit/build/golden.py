"""Golden vectors for the build: seeded inputs at the model's shapes, one case per operator and bucket.

Expected outputs are the FP64 reference (edgekit.bundle.golden.make_case).
Activations are FP16, as the plugins run them. Linear layers use the model's
input width but at most ``MAX_GOLDEN_N`` output rows: the kernels are generic
in N, and the full LM head (49152 rows) would make every case tens of MB.
"""

from __future__ import annotations

import torch

from edgekit.bundle.golden import GoldenCase, make_case
from edgekit.kernels.rope import rope_frequencies
from edgekit.model.config import ModelConfig

MAX_GOLDEN_N = 256
# Row-wise operators (each token independent) are checked on at most this many rows per bucket: more
# rows only repeat the same program over a longer grid, and full 2048-row FP64 outputs would make the
# bundle hundreds of MB. Attention keeps the full bucket length, where the length changes the math.
MAX_ROWWISE_ROWS = 256
ROWWISE_OPS = ("rmsnorm", "swiglu", "rope", "qkv_rope", "linear", "linear_w8a16", "linear_w8a8")
ACT = torch.float16


def _rand(g: torch.Generator, *shape: int, std: float = 1.0, dtype=ACT) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * std).to(dtype)


def _rope_tables(cfg: ModelConfig, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = rope_frequencies(cfg.head_dim, T, cfg.rope_theta, torch.float32)
    return cos[None], sin[None]  # (1, T, D/2)


def _int8_weight(g: torch.Generator, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, generator=g) * 0.01 + 1e-3).to(torch.float32)  # (N,) never zero
    return q, scale


def op_inputs(op: str, cfg: ModelConfig, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    """(inputs, attributes) of one call of ``op`` at ``rows`` tokens."""
    C, D, Hq, Hkv = cfg.hidden_size, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    qkv_width = (Hq + 2 * Hkv) * D
    n = min(MAX_GOLDEN_N, C)
    if op == "rmsnorm":
        return {"x": _rand(g, rows, C), "weight": (1 + 0.1 * torch.randn(C, generator=g)).to(ACT)}, {"eps": cfg.rms_norm_eps}
    if op == "swiglu":
        return {"gate_up": _rand(g, rows, 2 * cfg.intermediate_size)}, {}
    if op == "linear":
        inp = {"x": _rand(g, rows, C), "weight": _rand(g, n, C, std=C ** -0.5)}
        if cfg.qkv_bias:
            inp["bias"] = _rand(g, n, std=0.1)
        return inp, {}
    if op == "linear_w8a16":
        q, s = _int8_weight(g, n, C)
        return {"x": _rand(g, rows, C), "qweight": q, "scale": s}, {}
    if op == "linear_w8a8":
        q, s = _int8_weight(g, n, C)
        smooth = (torch.rand(C, generator=g) + 0.5).to(torch.float32)  # (K,) positive divisors
        return {"x": _rand(g, rows, C), "qweight": q, "scale": s, "smooth": smooth}, {}
    if op == "rope":
        cos, sin = _rope_tables(cfg, rows)
        return {"qkv": _rand(g, 1, rows, qkv_width), "cos": cos, "sin": sin}, {"n_heads": Hq, "n_kv_heads": Hkv}
    if op == "qkv_rope":
        cos, sin = _rope_tables(cfg, rows)
        inp = {"x": _rand(g, 1, rows, C), "wqkv": _rand(g, qkv_width, C, std=C ** -0.5)}
        if cfg.qkv_bias:
            inp["bqkv"] = _rand(g, qkv_width, std=0.1)
        inp.update(cos=cos, sin=sin)
        return inp, {"n_heads": Hq, "n_kv_heads": Hkv}
    if op == "attention_prefill":
        real = max(1, rows - rows // 7)  # a padded bucket: the last rows are padding
        return ({"q": _rand(g, 1, Hq, rows, D), "k": _rand(g, 1, Hkv, rows, D), "v": _rand(g, 1, Hkv, rows, D),
                 "seq_lens": torch.tensor([real], dtype=torch.int32)}, {"scale": D ** -0.5})
    if op == "attention_decode":
        return ({"q": _rand(g, 1, Hq, D), "k_cache": _rand(g, 1, Hkv, context, D), "v_cache": _rand(g, 1, Hkv, context, D),
                 "seq_lens": torch.tensor([min(rows, context)], dtype=torch.int32)}, {"scale": D ** -0.5})
    raise ValueError(f"no golden inputs defined for operator {op!r}")


def golden_cases(op: str, cfg: ModelConfig, buckets: tuple[int, ...], context: int, seed: int = 0) -> list[GoldenCase]:
    """One case per bucket (a decode case per context length for attention_decode, and M=1 for linears)."""
    cases = []
    plan = [(b, b) for b in buckets]  # (bucket, rows)
    if op.startswith("linear"):
        plan = [(1, 1)] + plan  # the decode GEMV path
    seen = set()
    for i, (bucket, rows) in enumerate(plan):
        if op in ROWWISE_OPS:
            rows = min(rows, MAX_ROWWISE_ROWS)
        if (op in ROWWISE_OPS) and rows in seen:
            continue  # the same row count again adds nothing
        seen.add(rows)
        g = torch.Generator().manual_seed(seed * 1000 + i)
        inputs, attrs = op_inputs(op, cfg, rows, context, g)
        cases.append(make_case(op, inputs, attrs, name=f"{op}_b{bucket}_r{rows}", seed=seed * 1000 + i, bucket=bucket))
    return cases

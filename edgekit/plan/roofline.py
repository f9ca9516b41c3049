"""Roofline predictions per target and power mode. Every figure here is PREDICTED, not measured.

The model, in three lines:

1. A pass takes the longer of its memory time and its compute time:
   ``t_bound = max(bytes / (mode_bandwidth x bandwidth_efficiency),
                   flops / (mode_peak x compute_efficiency))``,
   where the mode's tensor peak is the module's peak scaled by active SMs x
   clock (``Target.mode_scale``) and the efficiencies are the target's stated
   assumptions (``roofline:`` in its YAML).
2. Kernels run one after another, and each adds a fixed gap (launch and
   drain, even under CUDA-graph replay): ``t = t_bound + n_kernels x
   kernel_overhead_us``. Both ``t_bound`` and ``t`` are reported, so the
   pure roofline stays visible.
3. Energy per token = the mode's power budget x time per token: an upper
   bound that assumes the module draws its whole budget while it works.

Decode (one token per sequence, batch B, KV length L) streams every weight
once per step and reads the KV cache:
``bytes = weights + B x 2 x layers x Hkv x L x D x kv_bytes``;
``flops = 2 x B x params_in_matmuls + 4 x B x layers x Hq x L x D``.
Prefill (a bucket of T tokens, batch B) does
``flops = 2 x B x T x params_in_matmuls + 2 x B x layers x Hq x T^2 x D``
(causal attention: half of the 4 T^2 D) plus the LM head on the last token,
and moves the weights, the KV it writes and its activations once per layer.
A sliding-window layer (window W) reads min(L, W) positions, attends to
T^2/2 - (T - W)^2/2 query-key pairs of a longer bucket and writes min(T, W)
rows of its ring: ``layers x L`` above is summed layer by layer.
Decode is memory-bound for every model and target here; prefill of a
long bucket is compute-bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from edgekit.measured_on import predicted_for
from edgekit.model.config import ModelConfig
from edgekit.plan.precision import LINEAR_SCHEMES, PrecisionPlan
from edgekit.plan.targets import PowerMode, Target


def _matmul_params(cfg: ModelConfig, precision: PrecisionPlan) -> tuple[float, float]:
    """(params run on fp16 tensor cores, params run on int8 tensor cores) per token, LM head included.

    w8a16 dequantizes in the kernel and multiplies in fp16; only w8a8 uses the INT8 peak.
    """
    shapes = cfg.linear_shapes()
    fp16 = int8 = 0.0
    for layer in precision.layers:
        for proj, scheme in layer.items():
            o, i = shapes[proj]
            if LINEAR_SCHEMES[scheme].activations == "int8":
                int8 += o * i
            else:
                fp16 += o * i
    fp16 += cfg.vocab_size * cfg.hidden_size  # LM head (fp16)
    return fp16, int8


def _attended_pairs(cfg: ModelConfig, tokens: int) -> float:
    """Causal query-key pairs of a prefill of ``tokens``, summed over the layers (T^2 / 2 a full-attention layer,
    less the pairs a sliding window hides)."""
    total = 0.0
    for i in range(cfg.n_layers):
        w = cfg.window(i)
        total += tokens * tokens / 2 - ((tokens - w) ** 2 / 2 if 0 < w < tokens else 0)
    return total


def _streamed_weight_bytes(cfg: ModelConfig, precision: PrecisionPlan) -> int:
    """Bytes a decode step reads: every projection, the norms and the LM head (the embedding matrix when tied and
    kept in FP16; a tied quantized head is the matrix itself, in its own scheme)."""
    w = precision.weight_bytes(cfg)
    lm = w["embedding"] if cfg.tie_embeddings and precision.lm_head == "fp16" else w["lm_head"]
    return w["blocks_linear"] + w["norms"] + lm


@dataclass(frozen=True)
class PassEstimate:
    tokens: int  # tokens produced (decode: batch) or consumed (prefill: batch x bucket)
    bytes: float
    flops: float
    t_memory_s: float
    t_compute_s: float
    n_kernels: int
    t_overhead_s: float

    @property
    def t_bound_s(self) -> float:
        return max(self.t_memory_s, self.t_compute_s)

    @property
    def t_s(self) -> float:
        return self.t_bound_s + self.t_overhead_s

    @property
    def bound(self) -> str:
        return "memory" if self.t_memory_s >= self.t_compute_s else "compute"

    def to_dict(self, power_w: float) -> dict:
        per_token = self.t_s / self.tokens
        return {
            "tokens": self.tokens,
            "bytes": int(self.bytes),
            "flops": int(self.flops),
            "bound": self.bound,
            "n_kernels": self.n_kernels,
            "roofline_ms": self.t_bound_s * 1e3,
            "kernel_overhead_ms": self.t_overhead_s * 1e3,
            "pass_ms": self.t_s * 1e3,
            "time_per_token_ms": per_token * 1e3,
            "tokens_per_s": self.tokens / self.t_s,
            "roofline_tokens_per_s": self.tokens / self.t_bound_s,
            "energy_per_token_mj": power_w * per_token * 1e3,
        }


def _times(target: Target, mode: PowerMode, bytes_: float, fp16_flops: float, int8_flops: float) -> tuple[float, float]:
    eff = target.roofline
    t_mem = bytes_ / (mode.dram_bandwidth_gbps * 1e9 * eff.bandwidth_efficiency)
    t_cmp = (fp16_flops / (target.mode_fp16_tflops(mode) * 1e12) + int8_flops / (target.mode_int8_tops(mode) * 1e12)) / eff.compute_efficiency
    return t_mem, t_cmp


def decode_estimate(
    cfg: ModelConfig, precision: PrecisionPlan, target: Target, mode: PowerMode, *, batch: int, kv_len: int, n_kernels: int
) -> PassEstimate:
    """One decode step; ``n_kernels`` (edgekit.plan.launches) each add the target's fixed kernel overhead."""
    p16, p8 = _matmul_params(cfg, precision)
    kv_read = batch * 2 * cfg.kv_positions(kv_len) * cfg.n_kv_heads * cfg.head_dim * precision.kv_bytes_per_element
    bytes_ = _streamed_weight_bytes(cfg, precision) + kv_read
    attn_flops = 4.0 * batch * cfg.kv_positions(kv_len) * cfg.n_heads * cfg.head_dim
    t_mem, t_cmp = _times(target, mode, bytes_, 2 * batch * p16 + attn_flops, 2 * batch * p8)
    n = n_kernels
    return PassEstimate(batch, bytes_, 2 * batch * (p16 + p8) + attn_flops, t_mem, t_cmp, n, n * target.roofline.kernel_overhead_us * 1e-6)


def prefill_estimate(
    cfg: ModelConfig, precision: PrecisionPlan, target: Target, mode: PowerMode, *, batch: int, bucket: int, n_kernels: int
) -> PassEstimate:
    p16, p8 = _matmul_params(cfg, precision)
    lm = cfg.vocab_size * cfg.hidden_size
    bt = batch * bucket
    # Matmuls over every token except the LM head, which runs on the last token of each sequence only.
    lin16, lin8 = 2.0 * bt * (p16 - lm), 2.0 * bt * p8
    attn = 4.0 * batch * cfg.n_heads * cfg.head_dim * _attended_pairs(cfg, bucket)
    head = 2.0 * batch * lm
    kv_write = batch * 2 * cfg.kv_positions(bucket) * cfg.n_kv_heads * cfg.head_dim * precision.kv_bytes_per_element
    per_token_act = 2 * cfg.hidden_size + (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size + 3 * cfg.intermediate_size
    act_traffic = 2 * 2 * bt * per_token_act * cfg.n_layers  # fp16, written once and read once per layer
    bytes_ = _streamed_weight_bytes(cfg, precision) + kv_write + act_traffic
    t_mem, t_cmp = _times(target, mode, bytes_, lin16 + attn + head, lin8)
    n = n_kernels
    return PassEstimate(bt, bytes_, lin16 + lin8 + attn + head, t_mem, t_cmp, n, n * target.roofline.kernel_overhead_us * 1e-6)


def roofline_table(
    cfg: ModelConfig, precision: PrecisionPlan, target: Target, *, batch: int, context: int, prefill_bucket: int,
    kernel_counts: Callable[[PowerMode], tuple[int, int]], short_kv_len: int = 128,
) -> list[dict]:
    """One row per power mode: decode at a short and at a full cache, prefill of one bucket. All predicted.

    ``kernel_counts(mode)`` is (kernels per decode step, kernels per prefill) with the SMs the mode leaves on.
    """
    rows = []
    for mode in target.power_modes:
        n_decode, n_prefill = kernel_counts(mode)
        short = decode_estimate(cfg, precision, target, mode, batch=batch, kv_len=min(short_kv_len, context), n_kernels=n_decode)
        full = decode_estimate(cfg, precision, target, mode, batch=batch, kv_len=context, n_kernels=n_decode)
        pre = prefill_estimate(cfg, precision, target, mode, batch=batch, bucket=prefill_bucket, n_kernels=n_prefill)
        rows.append({
            "power_mode": mode.name,
            "default": mode.name == target.default_power_mode,
            "power_budget_w": mode.power_budget_w,
            "active_sms": mode.active_sms,
            "gpu_clock_mhz": mode.gpu_max_clock_mhz,
            "dram_bandwidth_gbps": mode.dram_bandwidth_gbps,
            "fp16_tflops": round(target.mode_fp16_tflops(mode), 2),
            "int8_tops": round(target.mode_int8_tops(mode), 2),
            "decode_short": {"kv_len": min(short_kv_len, context), **short.to_dict(mode.power_budget_w)},
            "decode_full": {"kv_len": context, **full.to_dict(mode.power_budget_w)},
            "prefill": {"bucket": prefill_bucket, **pre.to_dict(mode.power_budget_w)},
            "label": predicted_for(target.name),
        })
    return rows


def roofline_assumptions(target: Target) -> dict:
    r = target.roofline
    return {
        "label": predicted_for(target.name),
        "bandwidth_efficiency": r.bandwidth_efficiency,
        "compute_efficiency": r.compute_efficiency,
        "kernel_overhead_us": r.kernel_overhead_us,
        "energy": "power-mode budget x time per token (an upper bound)",
    }

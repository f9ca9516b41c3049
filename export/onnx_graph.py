"""Build the prefill graph of one static bucket directly from the weights (no tracing).

The graph is the decoder's ``prefill`` written as ONNX: the same operators in
the same order, each an ``edgekit`` node (see ``onnx_functions``), glued by a
few standard ops (Gather for the embedding, Transpose/Reshape between
attention and the output projection, Add for the residuals, GatherND for the
last real position). Building it by hand keeps it deterministic (same weights
-> same bytes) and fast, and every node and initializer has a readable name
(``blocks.3.wqkv.weight``, ``blocks.3/attention``).

Inputs: ``tokens`` int64 (B, T) padded to the bucket, ``seq_lens`` int64 (B,).
Output: ``logits`` (B, V) at each sequence's last real token, and with
``present_kv`` the rotated keys and values of every layer, (B, Hkv, T, D).
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import torch
from onnx import ModelProto, TensorProto, helper, numpy_helper

import edgekit
from edgekit.errors import OperatorError, ShapeError
from edgekit.kernels.attention import default_scale
from edgekit.kernels.linear import LinearWeights
from edgekit.kernels.registry import OPERATORS
from edgekit.kernels.rope import rope_frequencies
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import ModelWeights
from edgekit.model.embedding import QuantizedEmbedding
from edgekit.export.onnx_embedding import quantized_gather
from edgekit.export.onnx_functions import CUSTOM_OPS, DOMAIN, DOMAIN_VERSION, IR_VERSION, OPSET

EXPORT_DTYPES = {"float32": (torch.float32, TensorProto.FLOAT), "float16": (torch.float16, TensorProto.FLOAT16)}


class _GraphBuilder:
    def __init__(self, dtype: str):
        self.torch_dtype, self.onnx_dtype = EXPORT_DTYPES[dtype]
        self.nodes: list = []
        self.initializers: list[TensorProto] = []
        self.functions: dict[tuple[str, str], object] = {}  # (op_type, overload) -> FunctionProto
        self.op_counts: Counter[str] = Counter()
        self._by_tensor: dict[tuple, str] = {}  # one initializer per distinct tensor (tied embeddings)
        self._keep: list[torch.Tensor] = []  # holds every keyed tensor so its address cannot be reused

    def weight(self, name: str, t: torch.Tensor, *, activation_dtype: bool) -> str:
        """An initializer for ``t``; float tensors that follow the activation dtype are cast to it."""
        key = (t.data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype, activation_dtype)
        if key in self._by_tensor:
            return self._by_tensor[key]
        self._keep.append(t)
        t = t.detach().to("cpu")
        if activation_dtype:
            t = t.to(self.torch_dtype)
        self._by_tensor[key] = name
        return self.const(name, t.numpy())

    def const(self, name: str, value) -> str:
        """An initializer for a small constant of the graph itself (never shared)."""
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op_type: str, inputs: list[str], outputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, **attrs))
        return outputs[0]

    def custom(self, op: str, inputs: dict[str, str | None], outputs: list[str], name: str, **attrs) -> str:
        """One edgekit node, and the fallback function for its overload if not yet in the model."""
        cop = CUSTOM_OPS[op]
        present = frozenset(k for k, v in inputs.items() if v)
        overload = cop.overload(present)
        if (cop.op_type, overload) not in self.functions:
            self.functions[(cop.op_type, overload)] = cop.function(present)
        node = helper.make_node(cop.op_type, cop.node_inputs(inputs), outputs, name=name, domain=DOMAIN,
                                plugin_version=cop.plugin_version, **attrs)
        node.overload = overload
        self.nodes.append(node)
        self.op_counts[cop.op_type] += 1
        return outputs[0]

    def linear(self, x: str, lw: LinearWeights, prefix: str, out: str) -> str:
        """A projection routed to the operator its weights ask for, like DispatchTable.linear."""
        bias = self.weight(f"{prefix}.bias", lw.bias, activation_dtype=True) if lw.bias is not None else None
        if lw.op == "linear":
            w = self.weight(f"{prefix}.weight", lw.weight, activation_dtype=True)
            return self.custom("linear", {"x": x, "weight": w, "bias": bias}, [out], prefix)
        if lw.op not in OPERATORS or OPERATORS[lw.op].scheme in (None, "fp16"):
            known = ", ".join(name for name, op in OPERATORS.items() if op.scheme)
            raise OperatorError(f"{prefix}: unknown linear operator {lw.op!r}; expected one of: {known}")
        if lw.op == "linear_w4a16":
            return self._linear_w4a16(x, lw, out, prefix, bias)
        if lw.weight.dtype != torch.int8 or lw.scale is None:
            raise OperatorError(
                f"{prefix}: {lw.op} needs an int8 weight and an fp32 per-channel scale, got weight {lw.weight.dtype} "
                f"and scale {'None' if lw.scale is None else lw.scale.dtype}",
                hint="quantize the weights with edgekit's quantizer before exporting",
            )
        inputs = {
            "x": x,
            "qweight": self.weight(f"{prefix}.qweight", lw.weight, activation_dtype=False),
            # grouped INT8 scales travel in their stored dtype (a Q8_0 file's fp16, bit for bit); per-channel ones as FP32
            "scale": self.weight(f"{prefix}.scale", lw.scale if lw.op == "linear_w8a16_grouped" else lw.scale.to(torch.float32),
                                 activation_dtype=False),
            "bias": bias,
        }
        if lw.op == "linear_w8a8":
            smooth = lw.smooth.to(torch.float32) if lw.smooth is not None else None
            inputs["smooth"] = self.weight(f"{prefix}.smooth", smooth, activation_dtype=False) if smooth is not None else None
        elif lw.smooth is not None:
            raise OperatorError(f"{prefix}: {lw.op} weights carry a SmoothQuant divisor, which only linear_w8a8 applies")
        return self.custom(lw.op, inputs, [out], prefix)

    def _linear_w4a16(self, x: str, lw: LinearWeights, out: str, prefix: str, bias: str | None) -> str:
        """INT4 weights as stored (packed uint8, group scales and offsets in their own dtype): the node's fallback
        body unpacks them with standard ops (kernels/linear.py: onnx_linear_w4a16)."""
        if lw.weight.dtype != torch.uint8 or lw.scale is None or lw.scale.dtype not in (torch.float16, torch.float32):
            raise OperatorError(
                f"{prefix}: linear_w4a16 needs packed uint8 weights (N, K/2) and float16/float32 group scales, got "
                f"weight {lw.weight.dtype} and scale {'None' if lw.scale is None else lw.scale.dtype}",
                hint="quantize with edgekit (kernels/int4_layout.py) or take the GGUF Q4 tensors in as they are",
            )
        inputs = {
            "x": x,
            "qweight": self.weight(f"{prefix}.qweight", lw.weight, activation_dtype=False),
            "scale": self.weight(f"{prefix}.scale", lw.scale, activation_dtype=False),
            "offset": self.weight(f"{prefix}.offset", lw.offset, activation_dtype=False) if lw.offset is not None else None,
            "bias": bias,
        }
        return self.custom(lw.op, inputs, [out], prefix)


def _value_info(name: str, elem_type: int, shape: list[int]):
    return helper.make_tensor_value_info(name, elem_type, shape)


def build_prefill_model(
    config: ModelConfig, weights: ModelWeights, bucket: int, *, dtype: str = "float32", batch: int = 1,
    present_kv: bool = False,
) -> tuple[ModelProto, Counter]:
    """The prefill graph for one bucket, with every initializer inline. Returns (model, op_type counts)."""
    if dtype not in EXPORT_DTYPES:
        raise ShapeError(f"export dtype {dtype!r} is not supported; expected one of: {', '.join(EXPORT_DTYPES)}")
    if not 1 <= bucket <= config.max_position_len:
        raise ShapeError(f"bucket {bucket} is outside 1..{config.max_position_len} (the model's max_position_len)")
    if batch < 1:
        raise ShapeError(f"batch must be >= 1, got {batch}")
    if len(weights.blocks) != config.n_layers:
        raise ShapeError(f"the weights have {len(weights.blocks)} blocks but the config says n_layers={config.n_layers}")

    g = _GraphBuilder(dtype)
    cfg, B, T = config, batch, bucket
    if isinstance(weights.tok_embeddings, QuantizedEmbedding):  # tied quantized head: its rows, dequantized
        x = quantized_gather(g, weights.tok_embeddings, "tokens", (B, T))  # (B, T, C)
    else:
        emb = g.weight("tok_embeddings", weights.tok_embeddings, activation_dtype=True)
        x = g.node("Gather", [emb, "tokens"], ["embed.out"], "embed", axis=0)  # (B, T, C)

    # RoPE tables for positions [0, T): FP32 like the decoder's, broadcast to the batch.
    cos, sin = rope_frequencies(cfg.head_dim, T, cfg.rope_theta, torch.float32)  # (T, D/2)
    batch_shape = g.const("rope.batch_shape", np.array([B, T, cfg.head_dim // 2], np.int64))
    cos = g.node("Expand", [g.const("rope.cos", cos[None].numpy()), batch_shape], ["rope.cos.out"], "rope.cos")
    sin = g.node("Expand", [g.const("rope.sin", sin[None].numpy()), batch_shape], ["rope.sin.out"], "rope.sin")
    attn_shape = g.const("attention.out_shape", np.array([B, T, cfg.q_size], np.int64))
    scale = default_scale(cfg.head_dim)
    heads = {"n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads}
    outputs_kv = []

    for i, blk in enumerate(weights.blocks):
        p = f"blocks.{i}"
        h = g.custom("rmsnorm", {"x": x, "weight": g.weight(f"{p}.attn_norm", blk.attn_norm, activation_dtype=True)},
                     [f"{p}/attn_norm.out"], f"{p}/attn_norm", eps=cfg.rms_norm_eps)
        q, k, v = f"{p}/q", f"present.{i}.key", f"present.{i}.value"  # (B, H, T, D)
        if blk.wqkv.op == "linear":  # the fused operator for float weights, like DispatchTable.qkv_rope
            bias = g.weight(f"{p}.wqkv.bias", blk.wqkv.bias, activation_dtype=True) if blk.wqkv.bias is not None else None
            w = g.weight(f"{p}.wqkv.weight", blk.wqkv.weight, activation_dtype=True)
            g.custom("qkv_rope", {"x": h, "wqkv": w, "bqkv": bias, "cos": cos, "sin": sin}, [q, k, v], f"{p}/qkv_rope", **heads)
        else:
            qkv = g.linear(h, blk.wqkv, f"{p}.wqkv", f"{p}/wqkv.out")
            g.custom("rope", {"qkv": qkv, "cos": cos, "sin": sin}, [q, k, v], f"{p}/rope", **heads)
        outputs_kv += [(k, cfg.n_kv_heads), (v, cfg.n_kv_heads)]
        o = g.custom("attention_prefill", {"q": q, "k": k, "v": v, "seq_lens": "seq_lens"}, [f"{p}/attention.out"],
                     f"{p}/attention", scale=scale)  # (B, Hq, T, D)
        o = g.node("Transpose", [o], [f"{p}/attention.bthd"], f"{p}/attention.transpose", perm=[0, 2, 1, 3])
        o = g.node("Reshape", [o, attn_shape], [f"{p}/attention.merged"], f"{p}/attention.merge_heads")  # (B, T, Hq D)
        x = g.node("Add", [x, g.linear(o, blk.wo, f"{p}.wo", f"{p}/wo.out")], [f"{p}/attn_residual.out"], f"{p}/attn_residual")
        h = g.custom("rmsnorm", {"x": x, "weight": g.weight(f"{p}.ffn_norm", blk.ffn_norm, activation_dtype=True)},
                     [f"{p}/ffn_norm.out"], f"{p}/ffn_norm", eps=cfg.rms_norm_eps)
        gate_up = g.linear(h, blk.w_gate_up, f"{p}.w_gate_up", f"{p}/w_gate_up.out")  # (B, T, 2F)
        act = g.custom("swiglu", {"gate_up": gate_up}, [f"{p}/swiglu.out"], f"{p}/swiglu")  # (B, T, F)
        x = g.node("Add", [x, g.linear(act, blk.w_down, f"{p}.w_down", f"{p}/w_down.out")], [f"{p}/ffn_residual.out"],
                   f"{p}/ffn_residual")

    # The hidden state at each sequence's last real token, then the head.
    one = g.const("last.one", np.array([1], np.int64))
    last = g.node("Sub", ["seq_lens", one], ["last.index"], "last.index")
    last = g.node("Unsqueeze", [last, one], ["last.index2"], "last.unsqueeze")  # (B, 1)
    x = g.node("GatherND", [x, last], ["last.out"], "last.gather", batch_dims=1)  # (B, C)
    x = g.custom("rmsnorm", {"x": x, "weight": g.weight("norm", weights.norm, activation_dtype=True)}, ["norm.out"], "norm",
                 eps=cfg.rms_norm_eps)
    g.linear(x, weights.lm_head, "lm_head", "logits")  # (B, V)

    outputs = [_value_info("logits", g.onnx_dtype, [B, cfg.vocab_size])]
    if present_kv:
        outputs += [_value_info(name, g.onnx_dtype, [B, h_, T, cfg.head_dim]) for name, h_ in outputs_kv]
    graph = helper.make_graph(
        g.nodes, f"{cfg.name}.prefill.{T}",
        [_value_info("tokens", TensorProto.INT64, [B, T]), _value_info("seq_lens", TensorProto.INT64, [B])],
        outputs, initializer=g.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
        functions=[g.functions[key] for key in sorted(g.functions)],  # sorted: byte-identical output
        producer_name="edgekit",
        producer_version=edgekit.__version__,
        doc_string=f"edgekit prefill graph: {cfg.name}, bucket {T}, batch {B}, {dtype}",
    )
    model.ir_version = IR_VERSION
    meta = {
        "edgekit.graph": "prefill",
        "edgekit.bucket": str(T),
        "edgekit.batch": str(B),
        "edgekit.dtype": dtype,
        "edgekit.model_config": json.dumps(cfg.to_dict(), sort_keys=True),
    }
    helper.set_model_props(model, meta)
    return model, g.op_counts

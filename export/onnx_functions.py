"""The edgekit operators as ONNX nodes, and their portable fallbacks.

Every edgekit operator becomes one node in the ``edgekit`` domain (the unit a
plugin replaces). Beside it the model carries a model-local ``FunctionProto``
of the same domain and name whose body is built from standard ONNX ops:
onnxruntime inlines that body when no kernel is registered for the node, so
the graph runs anywhere. Each body follows its torch reference in
``edgekit.kernels`` step by step (same accumulation dtype, same order of
operations) so the two agree to FP32 rounding.

Optional inputs. A function body cannot test whether an optional input was
given, and ``Cast("")`` is invalid, so each combination of present optional
inputs gets its own function *overload* (ONNX IR 10): ``""`` when none is
given, ``"with_bias"``, ``"with_bias_smooth"`` and so on. The node keeps the
spec's input positions (an absent input in the middle is ``""``, absent
trailing inputs are left off), so a plugin always sees the spec's ABI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from onnx import AttributeProto, FunctionProto, TensorProto, helper, numpy_helper

from edgekit.kernels.linear import INT8_MAX
from edgekit.kernels.registry import OPERATORS
from edgekit.kernels.spec import OpSpec

DOMAIN = "edgekit"
DOMAIN_VERSION = 1
OPSET = 17  # standard ops used by the bodies; 17 is read by onnxruntime >= 1.14 and TensorRT >= 8.6
IR_VERSION = 10  # the first IR with function overloads
FLOAT = TensorProto.FLOAT


class Body:
    """Nodes of one function body, with fresh local names for intermediates."""

    def __init__(self) -> None:
        self.nodes: list = []
        self._count = 0

    def __call__(self, op_type: str, *inputs: str, out: list[str] | None = None, n_out: int = 1, **attrs):
        if out is None:
            out = []
            for _ in range(n_out):
                self._count += 1
                out.append(f"_{op_type.lower()}{self._count}")
        self.nodes.append(helper.make_node(op_type, list(inputs), out, **attrs))
        return out[0] if len(out) == 1 else out

    def const(self, value, dtype=np.float32) -> str:
        return self("Constant", value=numpy_helper.from_array(np.asarray(value, dtype=dtype)))

    def attr_const(self, attribute: str, kind: str) -> str:
        """A scalar Constant whose value is the calling node's attribute ``attribute``."""
        ref = AttributeProto()
        ref.name = "value_float" if kind == "float" else "value_int"
        ref.type = AttributeProto.FLOAT if kind == "float" else AttributeProto.INT
        ref.ref_attr_name = attribute
        self._count += 1
        name = f"_{attribute}{self._count}"
        node = helper.make_node("Constant", [], [name])
        node.attribute.append(ref)
        self.nodes.append(node)
        return name

    def f32(self, x: str) -> str:
        # Every reference accumulates in FP32: cast up on entry (a no-op for FP32 graphs) ...
        return self("Cast", x, to=FLOAT)

    def like(self, y: str, x: str, out: str) -> str:
        # ... and round once to the activation dtype on exit.
        return self("CastLike", y, x, out=[out])


Inputs = dict[str, "str | None"]  # formal input name -> body-local name, None when the optional input is absent


def _matmul_nt(b: Body, x: str, w: str, bias: str | None) -> str:
    """x (..., K) @ w.T (N, K) [+ bias], FP32 in and out, as a Gemm on the flattened rows."""
    rows = b("Flatten", x, axis=-1)  # (M, K)
    y = b("Gemm", rows, w, *([bias] if bias else []), transB=1)  # (M, N)
    shape = b("Concat", b("Shape", x, end=-1), b("Shape", w, start=0, end=1), axis=0)  # [..., N]
    return b("Reshape", y, shape)  # (..., N)


def _rmsnorm(b: Body, i: Inputs, out: list[str]) -> None:
    x = b.f32(i["x"])
    mean_sq = b("ReduceMean", b("Mul", x, x), axes=[-1], keepdims=1)  # (..., 1)
    inv_rms = b("Reciprocal", b("Sqrt", b("Add", mean_sq, b.attr_const("eps", "float"))))
    b.like(b("Mul", b("Mul", x, inv_rms), b.f32(i["weight"])), i["x"], out[0])


def _linear(b: Body, i: Inputs, out: list[str]) -> None:
    bias = b.f32(i["bias"]) if i["bias"] else None
    b.like(_matmul_nt(b, b.f32(i["x"]), b.f32(i["weight"]), bias), i["x"], out[0])


def _linear_w8a16(b: Body, i: Inputs, out: list[str]) -> None:
    # x @ (q * s).T instead of the reference's (x @ q.T) * s: equal up to FP32 rounding,
    # and the DequantizeLinear -> Gemm pattern is the one runtimes recognise as weight-only INT8.
    w = b("DequantizeLinear", i["qweight"], i["scale"], axis=0)  # (N, K) fp32
    bias = b.f32(i["bias"]) if i["bias"] else None
    b.like(_matmul_nt(b, b.f32(i["x"]), w, bias), i["x"], out[0])


def _linear_w8a8(b: Body, i: Inputs, out: list[str]) -> None:
    x = b.f32(i["x"])
    if i["smooth"]:
        x = b("Div", x, i["smooth"])  # SmoothQuant: x' = x / smooth
    # Per-token symmetric INT8, exactly as quantize_per_token: an all-zero row gets scale 1.
    amax = b("ReduceMax", b("Abs", x), axes=[-1], keepdims=1)  # (..., 1)
    sx = b("Where", b("Greater", amax, b.const(0.0)), b("Div", amax, b.const(INT8_MAX)), b.const(1.0))
    xq = b("Clip", b("Round", b("Div", x, sx)), b.const(-INT8_MAX), b.const(INT8_MAX))  # Round: half to even, like torch
    xq = b("Cast", xq, to=TensorProto.INT8)
    # Integer product with int32 accumulation (exact for K < 2^17), then the two scales.
    y_int = b("MatMulInteger", xq, b("Transpose", i["qweight"], perm=[1, 0]))  # (..., N) int32
    y = b("Mul", b("Mul", b("Cast", y_int, to=FLOAT), sx), i["scale"])
    if i["bias"]:
        y = b("Add", y, b.f32(i["bias"]))
    b.like(y, i["x"], out[0])


def _rotate(b: Body, t: str, cos: str, sin: str) -> str:
    # [t1 | t2] -> [t1*cos - t2*sin | t2*cos + t1*sin]  (Hugging Face "rotate half")
    t1, t2 = b("Split", t, axis=-1, n_out=2)
    return b("Concat", b("Sub", b("Mul", t1, cos), b("Mul", t2, sin)), b("Add", b("Mul", t2, cos), b("Mul", t1, sin)), axis=-1)


def _rope(b: Body, i: Inputs, out: list[str]) -> None:
    qkv = i["qkv"]
    x = b.f32(qkv)  # (B, T, (Hq + 2 Hkv) D)
    head_dim = b("Mul", b("Shape", i["cos"], start=-1), b.const([2], np.int64))  # [D]
    shape = b("Concat", b("Shape", qkv, end=-1), b.const([-1], np.int64), head_dim, axis=0)
    x = b("Transpose", b("Reshape", x, shape), perm=[0, 2, 1, 3])  # (B, Hq + 2 Hkv, T, D)
    n_q = b("Reshape", b.attr_const("n_heads", "int"), b.const([1], np.int64))
    n_kv = b("Reshape", b.attr_const("n_kv_heads", "int"), b.const([1], np.int64))
    q, k, v = b("Split", x, b("Concat", n_q, n_kv, n_kv, axis=0), axis=1, n_out=3)
    axis1 = b.const([1], np.int64)
    cos = b("Unsqueeze", b.f32(i["cos"]), axis1)  # (B, 1, T, D/2)
    sin = b("Unsqueeze", b.f32(i["sin"]), axis1)
    b.like(_rotate(b, q, cos, sin), qkv, out[0])
    b.like(_rotate(b, k, cos, sin), qkv, out[1])
    b.like(v, qkv, out[2])


def _qkv_rope(b: Body, i: Inputs, out: list[str]) -> None:
    # Exactly the reference's composition: the projection is rounded to the activation dtype before RoPE.
    qkv = f"_qkv{len(b.nodes)}"
    _linear(b, {"x": i["x"], "weight": i["wqkv"], "bias": i["bqkv"]}, [qkv])
    _rope(b, {"qkv": qkv, "cos": i["cos"], "sin": i["sin"]}, out)


def _attention_prefill(b: Body, i: Inputs, out: list[str]) -> None:
    q, k, v = b.f32(i["q"]), b.f32(i["k"]), b.f32(i["v"])
    axis2 = b.const([2], np.int64)
    # Group query heads by the KV head they read, like the reference: K and V are never repeated.
    group_shape = b("Concat", b("Shape", i["k"], end=2), b.const([-1], np.int64), b("Shape", i["k"], start=2), axis=0)
    qg = b("Reshape", q, group_shape)  # (B, Hkv, G, T, D)
    k5, v5 = b("Unsqueeze", k, axis2), b("Unsqueeze", v, axis2)  # (B, Hkv, 1, T, D)
    scores = b("Mul", b("MatMul", qg, b("Transpose", k5, perm=[0, 1, 2, 4, 3])), b.attr_const("scale", "float"))  # (B, Hkv, G, T, T)
    T = b("Squeeze", b("Shape", i["q"], start=2, end=3))
    pos = b("Range", b.const(0, np.int64), T, b.const(1, np.int64))  # (T,)
    key = b("Unsqueeze", pos, b.const([0], np.int64))  # (1, T): key j
    causal = b("LessOrEqual", key, b("Unsqueeze", pos, b.const([1], np.int64)))  # (T, T): j <= i
    lens = b("Unsqueeze", b("Cast", i["seq_lens"], to=TensorProto.INT64), b.const([1], np.int64))  # (B, 1)
    valid = b("Unsqueeze", b("Less", key, lens), b.const([1, 2, 3], np.int64))  # (B, 1, 1, 1, T): j < seq_lens[b]
    masked = b("Where", b("And", causal, valid), scores, b.const(-np.inf))
    probs = b("Softmax", masked, axis=-1)
    o = b("Reshape", b("MatMul", probs, v5), b("Shape", i["q"]))  # (B, Hq, T, D)
    b.like(o, i["q"], out[0])


def _swiglu(b: Body, i: Inputs, out: list[str]) -> None:
    gate, up = b("Split", b.f32(i["gate_up"]), axis=-1, n_out=2)  # gate first
    b.like(b("Mul", b("Mul", gate, b("Sigmoid", gate)), up), i["gate_up"], out[0])


@dataclass(frozen=True)
class CustomOp:
    """How one edgekit operator appears in ONNX."""

    name: str  # the operator's spec name ("rmsnorm")
    op_type: str  # the node's op_type in the edgekit domain ("RMSNorm"); TensorRT plugins match this
    attributes: tuple[str, ...]  # ONNX attributes the body reads, besides plugin_version/plugin_namespace
    body: Callable[[Body, Inputs, list[str]], None]

    @property
    def spec(self) -> OpSpec:
        return OPERATORS[self.name].spec

    @property
    def plugin_version(self) -> str:
        return str(self.spec.abi_version)

    def overload(self, present: frozenset[str]) -> str:
        """The overload name for a node that passes the optional inputs in ``present``."""
        given = [t.name for t in self.spec.inputs if t.optional and t.name in present]
        return "with_" + "_".join(given) if given else ""

    def node_inputs(self, inputs: Inputs) -> list[str]:
        """Input names in spec order: "" for an absent optional input, absent trailing ones dropped."""
        unknown = set(inputs) - {t.name for t in self.spec.inputs}
        assert not unknown, f"{self.name}: unknown inputs {sorted(unknown)}"
        names = []
        for t in self.spec.inputs:
            value = inputs.get(t.name)
            assert value or t.optional, f"{self.name}: required input {t.name!r} missing"
            names.append(value or "")
        while names and names[-1] == "":
            names.pop()
        return names

    def function(self, present: frozenset[str]) -> FunctionProto:
        """The fallback body for nodes that pass exactly the optional inputs in ``present``."""
        formal = [t.name for t in self.spec.inputs]
        b = Body()
        self.body(b, {t.name: (t.name if (not t.optional or t.name in present) else None) for t in self.spec.inputs},
                  [t.name for t in self.spec.outputs])
        fn = helper.make_function(
            DOMAIN, self.op_type, formal, [t.name for t in self.spec.outputs], b.nodes,
            opset_imports=[helper.make_opsetid("", OPSET)],
            attributes=list(self.attributes) + ["plugin_version", "plugin_namespace"],
            doc_string=f"Portable fallback for edgekit::{self.op_type} (ABI {self.spec.abi_version}): {self.spec.doc}",
        )
        fn.overload = self.overload(present)
        return fn


CUSTOM_OPS: dict[str, CustomOp] = {
    op.name: op
    for op in (
        CustomOp("rmsnorm", "RMSNorm", ("eps",), _rmsnorm),
        CustomOp("rope", "Rope", ("n_heads", "n_kv_heads"), _rope),
        CustomOp("qkv_rope", "QKVRoPE", ("n_heads", "n_kv_heads"), _qkv_rope),
        CustomOp("attention_prefill", "AttentionPrefill", ("scale",), _attention_prefill),
        CustomOp("linear", "Linear", (), _linear),
        CustomOp("linear_w8a16", "LinearW8A16", (), _linear_w8a16),
        CustomOp("linear_w8a8", "LinearW8A8", (), _linear_w8a8),
        CustomOp("swiglu", "SwiGLU", (), _swiglu),
    )
}

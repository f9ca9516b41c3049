"""The edgekit operators as ONNX nodes, and their portable fallbacks.

Every edgekit operator that declares an ONNX function (``Operator.onnx`` in its
module) becomes one node in the ``edgekit`` domain (the unit a plugin replaces). Beside it the model carries a model-local ``FunctionProto``
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

from edgekit.kernels.registry import OPERATORS
from edgekit.kernels.spec import OpSpec

DOMAIN = "edgekit"
DOMAIN_VERSION = 1
OPSET = 17  # standard ops used by the bodies; 17 is read by onnxruntime >= 1.14 and TensorRT >= 8.6
IR_VERSION = 10  # the first IR with function overloads
FLOAT = TensorProto.FLOAT


class Body:
    """Nodes of one function body, with fresh local names for intermediates.

    The operator modules build their bodies through this object only (``b("Op", ...)``, ``b.const``,
    ``b.FLOAT``...), so kernels/ needs no onnx import.
    """

    FLOAT, INT8, INT64 = TensorProto.FLOAT, TensorProto.INT8, TensorProto.INT64

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


# Every registered operator that declares an ONNX function (kernels/<op>.py: Operator.onnx), by name.
CUSTOM_OPS: dict[str, CustomOp] = {
    name: CustomOp(name, op.onnx.op_type, op.onnx.attributes, op.onnx.body)
    for name, op in OPERATORS.items() if op.onnx is not None
}

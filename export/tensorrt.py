"""The TensorRT-flavoured copy of an exported graph.

TensorRT's ONNX parser matches a node by op_type alone (the domain is
ignored) and prefers a model-local function of that name over a plugin, so
the copy drops every fallback function; a plugin is then looked up by op_type
and the node attributes ``plugin_version`` / ``plugin_namespace``, and the
node's other attributes reach the plugin as plugin fields.

TensorRT is not installed on any machine edgekit is developed on: this copy
is checked with ``onnx.checker`` only, never parsed by TensorRT here.
``tensorrt_available()`` says whether this machine could try.
"""

from __future__ import annotations

import importlib.util

from onnx import ModelProto, helper

from edgekit.export.onnx_functions import DOMAIN

PLUGIN_NAMESPACE = "edgekit"
# Opset 17 needs IR >= 8; without function overloads nothing newer is needed, and older parsers accept 8.
TENSORRT_IR_VERSION = 8


def tensorrt_available() -> bool:
    return importlib.util.find_spec("tensorrt") is not None


def make_tensorrt_flavour(model: ModelProto) -> ModelProto:
    """A copy of ``model`` without function bodies, its edgekit nodes tagged for plugin lookup.

    Copy the model after moving its weights to external data when it is large: the copy is deep.
    """
    trt = ModelProto()
    trt.CopyFrom(model)
    del trt.functions[:]
    for node in trt.graph.node:
        if node.domain != DOMAIN:
            continue
        node.ClearField("overload")
        kept = [a for a in node.attribute if a.name != "plugin_namespace"]
        del node.attribute[:]
        node.attribute.extend(kept)
        node.attribute.append(helper.make_attribute("plugin_namespace", PLUGIN_NAMESPACE))
        assert any(a.name == "plugin_version" for a in node.attribute), f"{node.name}: no plugin_version"
    trt.ir_version = TENSORRT_IR_VERSION
    props = {p.key: p.value for p in trt.metadata_props}
    props["edgekit.flavour"] = "tensorrt"
    helper.set_model_props(trt, props)
    trt.doc_string = model.doc_string + " (TensorRT flavour: no fallback functions; needs the edgekit plugins)"
    return trt

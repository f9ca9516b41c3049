"""edgekit.export: ONNX export (and TensorRT plugin definitions where TensorRT exists).

``export_onnx`` writes the prefill graph of one static bucket with every
edgekit operator as an ``edgekit``-domain node plus a portable function body;
``check_parity`` runs it with onnxruntime (CPU) against the torch reference.
"""

from edgekit.export.onnx_export import ExportResult, export_onnx, tensorrt_path_for
from edgekit.export.onnx_functions import CUSTOM_OPS, DOMAIN
from edgekit.export.parity import LOGIT_TOLERANCE, ParityResult, check_parity
from edgekit.export.tensorrt import PLUGIN_NAMESPACE, make_tensorrt_flavour, tensorrt_available

__all__ = [
    "CUSTOM_OPS", "DOMAIN", "LOGIT_TOLERANCE", "PLUGIN_NAMESPACE", "ExportResult", "ParityResult", "check_parity",
    "export_onnx", "make_tensorrt_flavour", "tensorrt_available", "tensorrt_path_for",
]

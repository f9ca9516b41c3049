"""`edgekit build`, host side: intake -> quantize -> plan -> compile -> golden vectors -> ONNX -> signed bundle.

``pipeline`` runs the stages (their deterministic results are kept by content in
``edgekit.cache``), ``golden`` makes the golden vectors every plugin carries.
"""

from edgekit.builder.pipeline import BuildOptions, BuildResult, build_bundle

__all__ = ["BuildOptions", "BuildResult", "build_bundle"]

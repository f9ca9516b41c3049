"""edgekit.export: ONNX export (and TensorRT plugin definitions where TensorRT exists)."""

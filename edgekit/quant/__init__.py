"""FP16 -> INT8 quantization: calibration, SmoothQuant, sensitivity, accuracy gate.

Entry points: ``quantize.quantize_model`` (calibrate, quantize, gate, mixed
precision; what `edgekit quantize` and the build call), ``io.write_quantized``
/ ``io.load_quantized`` (safetensors + report.json). The planner reads the per-layer
choice back (``plan.precision.PrecisionPlan.from_quantization``): quantization comes
before planning and imports nothing of it.

One concept per module: weights (per-channel INT8), smoothquant, kv_int8,
calibration, sensitivity, gate, forward (all-position passes for evaluation),
corpus (the shipped text),
layers (layer names), progress (rich bars), io.
"""

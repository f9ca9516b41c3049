"""FP16 -> INT8 quantization: calibration, SmoothQuant, sensitivity, accuracy gate.

Entry points: ``quantize.quantize_model`` (calibrate, quantize, gate, mixed
precision; what `edgekit quantize` and the build call), ``io.write_quantized``
/ ``io.load_quantized`` (safetensors + report.json), ``quantize.to_precision_plan``
(the per-layer choice as the planner's PrecisionPlan).

One concept per module: weights (per-channel INT8), smoothquant, kv_int8,
calibration, sensitivity, gate, forward (all-position passes for evaluation),
corpus (the shipped text),
layers (layer names), progress (rich bars), io.
"""

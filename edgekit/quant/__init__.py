"""FP16 -> INT8 / INT4 quantization: calibration, SmoothQuant, GPTQ, AWQ, sensitivity, accuracy gate.

Entry points: ``quantize.quantize_model`` (calibrate, quantize, gate, mixed
precision; what `edgekit quantize` and the build call), ``io.write_quantized``
/ ``io.load_weights_file`` (safetensors + report.json). The planner reads the per-layer
choice back (``plan.precision.PrecisionPlan.from_quantization``): quantization comes
before planning and imports nothing of it.

One concept per module: weights (per-channel INT8), smoothquant, kv_int8,
calibration, sensitivity, gate, forward (all-position passes for evaluation),
corpus (the shipped text),
layers (layer names), progress (rich bars), io; for W4A16: int4_rounding
(group-wise rounding scored by H = X^T X), int4_group_search (group scales and
offsets searched and refitted under H: the default), gptq (error compensation), awq
(activation-aware scale search), awq_fold (folding the scales exactly),
int4_calibration (block-by-block calibration of a whole model), int4_tuning
(norm tweaking: the float parameters next to the codes tuned end to end towards
the FP logits), mixed (the fallback schedule: INT4 -> INT8 -> FP).
"""

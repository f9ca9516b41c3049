"""FP16 -> INT8 quantization: calibration, SmoothQuant, sensitivity, accuracy gate."""

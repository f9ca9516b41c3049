"""The real default model (SmolLM2-135M-Instruct, FP32) exported for one bucket and run by onnxruntime (CPU).

Tolerance: max |logit difference| against Decoder.prefill <= LOGIT_TOLERANCE["float32"] = 1e-3 on a chat prompt
padded to bucket 64 (3.9e-5 measured; logits are O(10)), and the same greedy token.
"""

from __future__ import annotations

import pytest
import torch

from edgekit.export import LOGIT_TOLERANCE, check_parity, export_onnx

BUCKET = 64


@pytest.mark.slow
def test_default_model_export_matches_reference(default_model, tmp_path):
    m = default_model
    r = export_onnx(m.config, m.weights, BUCKET, tmp_path / "model.onnx")
    assert r.op_counts["AttentionPrefill"] == m.config.n_layers
    assert r.data_path is None  # ~540 MB: inline, under the protobuf limit
    ids = m.tokenizer.encode_chat("What is the capital of France?")
    tokens = torch.full((1, BUCKET), m.tokenizer.pad_token_id)
    tokens[0, : len(ids)] = torch.tensor(ids)
    p = check_parity(m.config, m.weights, r.path, tokens, torch.tensor([len(ids)]))
    print(f"export {r.seconds:.1f} s, {r.size_bytes / 1e6:.1f} MB (measured on this CPU); "
          f"max |logit diff| = {p.max_abs_diff:.3e} (tolerance {p.tolerance})")
    assert p.tolerance == LOGIT_TOLERANCE["float32"]
    assert p.ok and p.argmax_equal, p

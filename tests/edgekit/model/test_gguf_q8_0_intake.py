"""Lossless intake of a GGUF Q8_0 embedding / LM head as grouped INT8 (kernels/int8_group_layout.py).

Every file is written by gguf-py in the test; bit exactness is checked against gguf-py's own dequantize, and the
model taken in losslessly must compute exactly what the dequantized reference computes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgekit.kernels.int8_group_layout import Q8_0_BLOCK_BYTES, dequantize_int8_grouped, from_q8_0
from edgekit.model.embedding import QuantizedEmbedding
from edgekit.model.loader import load_model
from edgekit.quant.forward import all_logits

from .conftest import hf_model, write_llama_gguf  # noqa: TID252


def test_q8_0_blocks_are_byte_copies_that_dequantize_like_gguf():
    import gguf

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((24, 128)) * rng.uniform(0.01, 3.0, (24, 1))).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)  # (24, 4 * 34) uint8
    q, s = from_q8_0(raw)
    assert q.dtype == torch.int8 and q.shape == (24, 128) and s.dtype == torch.float16 and s.shape == (24, 4)
    blocks = raw.reshape(24, 4, Q8_0_BLOCK_BYTES)
    assert np.array_equal(q.numpy().view(np.uint8).reshape(24, 4, 32), blocks[..., 2:])  # the codes' bytes
    assert np.array_equal(s.numpy().view(np.uint8).reshape(24, 4, 2), blocks[..., :2])  # the scales' bits
    want = np.array(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0), dtype=np.float32)
    assert torch.equal(dequantize_int8_grouped(q, s), torch.from_numpy(want))  # bit for bit


@pytest.fixture(scope="module")
def q8_0_table_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("q8") / "tied-q8_0-table.gguf"
    write_llama_gguf(path, hf_model("llama", seed=2), table_type="Q8_0", tied=True,
                     projection_types={"ffn_up.weight": "Q8_0"})  # a Q8_0 projection stays on the dequantized path
    return path


def test_tied_q8_0_table_is_taken_in_bit_for_bit_and_computes_like_the_dequantized_reference(q8_0_table_gguf):
    import gguf

    ref = load_model(str(q8_0_table_gguf), tokenizer=False)
    lossless = load_model(str(q8_0_table_gguf), tokenizer=False, keep_q8_0=True)
    assert ref.config.tie_embeddings
    head = lossless.weights.lm_head
    assert head.op == "linear_w8a16_grouped" and head.scale.dtype == torch.float16
    assert isinstance(lossless.weights.tok_embeddings, QuantizedEmbedding) and lossless.weights.tied
    t = next(t for t in gguf.GGUFReader(str(q8_0_table_gguf)).tensors if t.name == "token_embd.weight")
    q, s = from_q8_0(np.asarray(t.data))
    assert torch.equal(head.weight, q) and torch.equal(head.scale, s)  # the file's bytes
    assert torch.equal(head.dequantized(), ref.weights.lm_head.weight)  # = gguf-py's dequantize
    assert all(b.w_gate_up.op == "linear" for b in lossless.weights.blocks)  # Q8_0 projections: dequantized
    tokens = torch.arange(3, 60)[None]
    assert torch.equal(all_logits(lossless.decoder(), tokens), all_logits(ref.decoder(), tokens))


def test_quantize_keeps_the_q8_0_table_and_reports_it(q8_0_table_gguf, tmp_path):
    import json
    import subprocess
    import sys
    from dataclasses import replace

    from edgekit.quant.gate import GateConfig
    from edgekit.model.weights_file import load_weights_file
    from edgekit.quant.io import write_quantized
    from edgekit.quant.quantize import QuantizeOptions, quantize_model

    lossless = load_model(str(q8_0_table_gguf), tokenizer=False, keep_q8_0=True)
    gate = replace(GateConfig.for_mode("w8a16"), ppl_tokens=256, window_len=128, n_prompts=1, new_tokens=16,
                   max_ppl_increase=1.0, min_greedy_agreement=0.0, min_logits_snr_db=0.0)
    r = quantize_model(lossless, "w8a16", gate=gate, options=QuantizeOptions(quantize_head=True))
    assert r.weights.lm_head is not None and r.weights.lm_head.op == "linear_w8a16_grouped"
    assert torch.equal(r.weights.lm_head.weight, lossless.weights.lm_head.weight)  # passed through, not re-quantized
    assert r.report["lossless_intake"] == ["lm_head"] and r.report["layers"]["lm_head"] == "w8a16g"
    assert r.report["head_embedding"]["lm_head"].startswith("int8 g32 (float16 scales")
    write_quantized(tmp_path, r)
    back = load_weights_file(tmp_path)
    assert torch.equal(back.weights.lm_head.scale, lossless.weights.lm_head.scale)  # fp16 scales kept bit for bit
    tokens = torch.arange(3, 40)[None]
    assert torch.equal(all_logits(back.decoder(), tokens), all_logits(r.decoder(), tokens))
    out = subprocess.run([sys.executable, "-m", "edgekit", "info", str(tmp_path), "--json"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["lossless_intake"] == ["lm_head"]


def test_a_bundle_built_with_quantize_head_ships_the_q8_0_table_as_it_came(q8_0_table_gguf, tmp_path):
    from safetensors import safe_open

    from edgekit.builder import BuildOptions, build_bundle
    from edgekit.bundle.keys import development_key
    from edgekit.bundle.verify import verify_bundle
    from edgekit.generate import Generator
    from edgekit.runtime.bundle_runtime import open_bundle

    opts = BuildOptions(model=str(q8_0_table_gguf), target="orin", out=tmp_path / "bundle", dev_key=True,
                        precision="int8", quantize_head=True, context=64, buckets=(16, 32), onnx=True,
                        cache_dir=tmp_path / "cache")
    result = build_bundle(opts)
    assert verify_bundle(result.out, [development_key().public_key], allow_dev_key=True).ok
    with safe_open(str(result.out / "weights" / "model.safetensors"), "pt") as f:
        assert "tok_embeddings" not in set(f.keys())
        scale = f.get_tensor("lm_head.scale")
    lossless = load_model(str(q8_0_table_gguf), tokenizer=False, keep_q8_0=True)
    assert scale.dtype == torch.float16 and torch.equal(scale, lossless.weights.lm_head.scale)
    assert result.summary["quantization"]["head_embedding"]["lm_head"].startswith("int8 g32")
    b = open_bundle(result.out, [], allow_dev_key=True, device="cpu")
    got, _ = Generator(b.decoder(), b.shapes).generate([5, 9, 200, 31], 8)
    from edgekit.model.weights_file import load_weights_file

    q = load_weights_file(result.out / "weights")  # the grouped INT8 record, its rows gathered by the lookup
    assert isinstance(q.weights.tok_embeddings, QuantizedEmbedding)
    want, _ = Generator(q.decoder(), b.shapes).generate([5, 9, 200, 31], 8)
    assert got == want


def test_a_head_precision_re_quantizes_the_table_instead(tmp_path):
    from edgekit.builder import BuildOptions
    from edgekit.builder.pipeline import keeps_q8_0_table

    base = dict(model=None, target="orin", out=tmp_path)
    assert keeps_q8_0_table(BuildOptions(**base, quantize_head=True))
    assert not keeps_q8_0_table(BuildOptions(**base, quantize_head=True, head_scheme="w8a16"))  # the fused head's form
    assert not keeps_q8_0_table(BuildOptions(**base))

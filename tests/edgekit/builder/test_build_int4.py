"""`edgekit build --precision int4` end to end on the CPU, from a GGUF whose projections are Q4_1: the 4-bit
weights reach the bundle bit for bit (group 32), the bundle verifies, and it generates the reference's tokens.

Needs the w4a16 route through quantize_model (issue #14, lane 14c); skipped on a branch without it.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from edgekit.builder import BuildOptions, build_bundle
from edgekit.bundle.keys import development_key
from edgekit.bundle.verify import verify_bundle
from edgekit.generate import Generator
from edgekit.kernels.variants import op_kernels
from edgekit.kernels.linear import LinearWeights
from edgekit.kernels.registry import operator
from edgekit.model.decoder import Decoder, ModelWeights
from edgekit.model.loader import load_model
from edgekit.model.weights_file import load_weights_file
from edgekit.model.layers import named_linears
from edgekit.runtime.bundle_runtime import open_bundle

if "w4a16" not in importlib.import_module("edgekit.quant.quantize").MODES:
    pytest.skip("quantize_model has no w4a16 mode on this branch (issue #14, lane 14c)", allow_module_level=True)

PROJECTIONS = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
               "ffn_up.weight", "ffn_down.weight")


def _model_files():
    """tests/edgekit/model/conftest.py: tiny models written by transformers and gguf-py."""
    path = Path(__file__).parents[1] / "model" / "conftest.py"
    spec = importlib.util.spec_from_file_location("model_files_conftest", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def int4_bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("build-int4")
    files = _model_files()
    gguf_path = d / "tiny-q4_1.gguf"
    files.write_llama_gguf(gguf_path, files.hf_model("llama", seed=5), projection_types={p: "Q4_1" for p in PROJECTIONS})
    opts = BuildOptions(model=str(gguf_path), target="orin", out=d / "bundle", dev_key=True, precision="int4",
                        context=128, buckets=(16, 64), cache_dir=d / "cache")
    return build_bundle(opts), gguf_path


def test_int4_bundle_carries_the_gguf_nibbles_and_verifies(int4_bundle):
    result, gguf_path = int4_bundle
    report = verify_bundle(result.out, [development_key().public_key], allow_dev_key=True)
    assert report.ok, [c.to_dict() for c in report.failures]
    shipped = load_weights_file(result.out / "weights", dtype=torch.float32)
    source = load_model(str(gguf_path), tokenizer=False, keep_int4=True).weights
    blocks = {n: lw for n, lw in named_linears(shipped.weights).items() if n != "lm_head"}
    for name, lw in blocks.items():
        want = named_linears(source)[name]
        assert lw.op == "linear_w4a16" and torch.equal(lw.weight, want.weight), name  # the file's bytes
        assert lw.scale.dtype == torch.float16 and torch.equal(lw.scale, want.scale) and torch.equal(lw.offset, want.offset)
    precision = json.loads((result.out / "plan.json").read_text())["precision"]
    assert {s for layer in precision["layers"] for s in layer.values()} == {"w4a16"}
    assert precision["int4"] == {"group": 32, "group_bytes": 4}  # Q4_1: fp16 scale + fp16 offset per 32 weights
    plugins = {p.op for p in result.manifest.plugins}
    # until the W4A16 Triton kernels exist the bundle ships no plugin for it: the runtime runs the reference
    assert ("linear_w4a16" in plugins) == ("linear_w4a16" in op_kernels())
    # and no model.onnx until it has an ONNX function (the build says why instead of failing)
    if operator("linear_w4a16").onnx is None:
        assert "linear_w4a16" in result.summary["onnx"]["skipped"] and "onnx/model.onnx" not in result.manifest.files
    else:
        assert "onnx/model.onnx" in result.manifest.files


def test_int4_bundle_generates_the_tokens_of_the_dequantized_file(int4_bundle):
    result, gguf_path = int4_bundle
    b = open_bundle(result.out, [], allow_dev_key=True, device="cpu")
    prompt = [5, 9, 200, 31, 77, 4]
    out, _ = Generator(b.decoder(), b.shapes).generate(prompt, 12)
    # the reference: the GGUF dequantized to FP32 (the 4-bit values exactly), with the tensors the bundle keeps in
    # floating point (norms, embedding, the untied LM head) rounded through FP16 as stored
    fp = load_model(str(gguf_path)).weights

    def half(t: torch.Tensor) -> torch.Tensor:
        return t.half().float()

    ref_weights = ModelWeights(
        tok_embeddings=half(fp.tok_embeddings), norm=half(fp.norm), lm_head=LinearWeights("linear", half(fp.lm_head.weight)),
        blocks=[replace(blk, attn_norm=half(blk.attn_norm), ffn_norm=half(blk.ffn_norm)) for blk in fp.blocks])
    m = load_model(str(gguf_path), weights=False, tokenizer=False)
    ref, _ = Generator(Decoder(m.config, ref_weights), b.shapes).generate(prompt, 12)
    assert out == ref


def test_a_copied_model_file_takes_its_quantized_weights_from_the_cache(int4_bundle, tmp_path):
    """The quantize cache is keyed on the file's content, not its path: a copy elsewhere does not re-quantize."""
    import shutil

    result, gguf_path = int4_bundle
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copyfile(gguf_path, copy)
    opts = BuildOptions(model=str(copy), target="orin", out=tmp_path / "bundle", dev_key=True, precision="int4",
                        context=128, buckets=(16, 64), cache_dir=result.out.parent / "cache")
    again = build_bundle(opts)
    assert "quantize" in again.summary["cache"]["hits"] and "quantize" not in again.summary["cache"]["misses"]
    assert again.manifest.files["weights/model.safetensors"] == result.manifest.files["weights/model.safetensors"]

"""A tied model built with --quantize-head: the bundle stores one INT8 matrix for the lookup and the head (no
FP16 table), verifies, and every runtime path answers like the quantized reference (CPU: per-operator and fused
references); a tied INT4 head runs on the fused path with the layers."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from edgekit.builder import BuildOptions, build_bundle
from edgekit.bundle.keys import development_key
from edgekit.bundle.verify import verify_bundle
from edgekit.generate import Generator
from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.decoder import Decoder
from edgekit.model.embedding import QuantizedEmbedding
from edgekit.model.weights_file import load_weights_file
from edgekit.runtime.bundle_runtime import open_bundle

PROMPT = [5, 9, 200, 31, 77, 4]


def _tied_hf_dir(d):
    """A tiny Qwen2 (tied embeddings) written by transformers' save_pretrained."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=2, bos_token_id=1)
    transformers.Qwen2ForCausalLM(cfg).eval().save_pretrained(str(d), safe_serialization=True)
    return d


@pytest.fixture(scope="module")
def tied_bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("tied-build")
    opts = BuildOptions(model=str(_tied_hf_dir(d / "hf")), target="orin", out=d / "bundle", dev_key=True,
                        precision="int8", quantize_head=True, context=64, buckets=(16, 32), onnx=True,
                        cache_dir=d / "cache")
    return build_bundle(opts)


def test_bundle_stores_the_tied_matrix_once_in_int8_and_verifies(tied_bundle):
    out = tied_bundle.out
    with safe_open(str(out / "weights" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "tok_embeddings" not in keys and "lm_head.qweight" in keys
    plan = json.loads((out / "plan.json").read_bytes())
    assert plan["precision"]["lm_head"] == "w8a16" and plan["precision"]["embedding"] == "w8a16"
    he = json.loads((out / "quantization" / "report.json").read_bytes())["head_embedding"]
    assert he["tied"] and he["embedding_bytes"] == 0 and he["lm_head"].startswith("int8")
    assert tied_bundle.summary["quantization"]["head_embedding"] == he
    report = verify_bundle(out, [development_key().public_key], allow_dev_key=True)
    assert report.ok, [c.to_dict() for c in report.failures]


def test_bundle_answers_like_the_quantized_reference_on_every_cpu_path(tied_bundle):
    from edgekit.runtime.fused_decode import FusedDecoder

    b = open_bundle(tied_bundle.out, [], allow_dev_key=True, device="cpu")
    got, _ = Generator(b.decoder(), b.shapes).generate(PROMPT, 12)
    q = load_weights_file(tied_bundle.out / "weights")  # INT8 records, the embedding read from the head
    assert isinstance(q.weights.tok_embeddings, QuantizedEmbedding)
    ref_dec = Decoder(q.config, q.weights, DispatchTable())
    want, _ = Generator(ref_dec, b.shapes).generate(PROMPT, 12)
    assert got == want
    # the fused step (CPU: its torch references) takes the INT8 head and the quantized lookup as they are
    cache_a, cache_b = ref_dec.new_cache(1, 32), ref_dec.new_cache(1, 32)
    tokens, lens = torch.tensor([PROMPT]), torch.tensor([len(PROMPT)])
    ref_dec.prefill(tokens, lens, cache_a)
    ref_dec.prefill(tokens, lens, cache_b)
    fused, tok, pos = FusedDecoder(ref_dec), torch.tensor([7]), lens.clone()
    for _ in range(3):
        logits = ref_dec.decode(tok, pos, cache_a)
        token, fused_logits = fused.decode_token(tok, pos, cache_b)
        torch.testing.assert_close(fused_logits, logits, rtol=1e-5, atol=1e-5)
        tok, pos = token, pos + 1


def test_a_tied_int4_head_runs_fused_with_the_layers(tied_bundle):
    from edgekit.kernels.int4_layout import quantize_int4_rtn
    from edgekit.kernels.linear import LinearWeights
    from edgekit.model.layers import HEAD, with_layers
    from edgekit.graph.paths import fused_operators, fused_step_operators
    from edgekit.runtime.fused_decode import fused_path_blocker

    q = load_weights_file(tied_bundle.out / "weights")
    qw, s, off = quantize_int4_rtn(q.weights.lm_head.dequantized(), 32, symmetric=False, scale_dtype=torch.float16)
    w = with_layers(q.weights, {HEAD: LinearWeights("linear_w4a16", qw, None, s, offset=off)})
    assert isinstance(w.tok_embeddings, QuantizedEmbedding) and w.tok_embeddings.head.op == "linear_w4a16"
    table = DispatchTable()
    for op in fused_operators():
        table.set(op, table.get(op), source="triton")
    int8, int4 = Decoder(q.config, q.weights, table), Decoder(q.config, w, table)
    cache = int8.new_cache(1, 16)
    int8.device = int4.device = torch.device("cuda")  # only the blocker's device check reads it
    assert fused_path_blocker(int8, cache, table, table.sources()) is None  # the tied INT8 head runs fused
    assert "fused_head_argmax" in fused_step_operators(q.config, int8.schemes)
    # the tied INT4 head (the embedding's table) runs fused too, with the layers on the fused path
    assert fused_path_blocker(int4, cache, table, table.sources()) is None
    assert "fused_head_argmax" in fused_step_operators(q.config, int4.schemes)
    assert "fused_norm_swiglu" in fused_step_operators(q.config, int4.schemes)


def test_a_folder_without_a_tokenizer_builds_a_bundle_that_says_so_and_runs_on_token_ids(tied_bundle, capsys):
    """The folder has no tokenizer.json: the build said nothing of it and `run` printed token ids as the answer."""
    from typer.testing import CliRunner

    from edgekit.cli import app
    from edgekit.commands.build_commands import _print_build_summary

    assert tied_bundle.summary["has_tokenizer"] is False and not (tied_bundle.out / "tokenizer").exists()
    _print_build_summary(tied_bundle.summary)
    assert "no tokenizer" in " ".join(capsys.readouterr().out.split())
    r = CliRunner().invoke(app, ["run", str(tied_bundle.out), "--allow-dev-key", "-p", "hi", "-n", "3", "--json",
                                 "--device", "cpu"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["prompt_ids"] == [ord("h"), ord("i")] and doc["text"] == " ".join(map(str, doc["token_ids"]))
    assert any("no tokenizer" in n for n in doc["notes"])

"""The LM head of a tied model quantized (INT8 or INT4) and kept tied: one matrix for the lookup and the head,
behind the accuracy gate, written once, read back the same, reported with its bytes per token."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from safetensors import safe_open

from edgekit.errors import QuantizationError
from edgekit.model.embedding import QuantizedEmbedding
from edgekit.model.loader import LoadedModel, ModelSource
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights
from edgekit.quant.forward import all_logits, embed
from edgekit.quant.gate import GateConfig, GateFailedError
from edgekit.quant.io import REPORT_FILE, write_quantized
from edgekit.model.weights_file import WEIGHTS_FILE, load_weights_file
from edgekit.model.layers import named_linears
from edgekit.quant.quantize import QuantizeOptions, quantize_model

LOOSE = replace(GateConfig.for_mode("w8a16"), ppl_tokens=256, window_len=128, n_prompts=1, new_tokens=16,
                max_ppl_increase=1.0, min_greedy_agreement=0.0, min_logits_snr_db=0.0)
TOKENS = torch.arange(1, 40)[None]


@pytest.fixture(scope="module")
def tied():
    cfg = replace(preset_config("tiny"), tie_embeddings=True, name="tiny-tied")
    return LoadedModel(cfg, ModelSource("preset", "tiny-tied", seed=0), random_weights(cfg, seed=0))


@pytest.fixture(scope="module")
def int8_tied(tied):
    return quantize_model(tied, "w8a16", gate=LOOSE, options=QuantizeOptions(quantize_head=True))


def _float_tensors(weights) -> list[torch.Tensor]:
    out = [weights.norm] + [t for b in weights.blocks for t in (b.attn_norm, b.ffn_norm)]
    if isinstance(weights.tok_embeddings, torch.Tensor):
        out.append(weights.tok_embeddings)
    return out + [t for lw in named_linears(weights).values() for t in (lw.weight, lw.bias) if t is not None
                  and t.is_floating_point()]


def test_int8_head_is_the_embedding_and_no_float_copy_remains(tied, int8_tied):
    w, cfg = int8_tied.weights, tied.config
    assert w.lm_head.op == "linear_w8a16" and isinstance(w.tok_embeddings, QuantizedEmbedding)
    assert w.tok_embeddings.head is w.lm_head and w.tied
    big = [t for t in _float_tensors(w) if t.numel() >= cfg.vocab_size * cfg.hidden_size]
    assert big == []  # no (V, C) float table anywhere
    # the lookup returns the head's own dequantized rows: the gate scored the one matrix both use
    dec = int8_tied.decoder()
    assert torch.equal(embed(dec, TOKENS), w.lm_head.dequantized()[TOKENS])
    # ... and the model differs from the FP one in its lookup too (not just the head)
    fp_rows = tied.weights.tok_embeddings.to(torch.float32)[TOKENS]
    assert not torch.equal(embed(dec, TOKENS), fp_rows)
    assert int8_tied.report["layers"]["lm_head"] == "w8a16"


def test_tied_quantized_file_holds_the_matrix_once_and_reads_back_identically(int8_tied, tmp_path):
    write_quantized(tmp_path, int8_tied)
    with safe_open(str(tmp_path / WEIGHTS_FILE), "pt") as f:
        keys = set(f.keys())
    assert "tok_embeddings" not in keys and {"lm_head.qweight", "lm_head.scale"} <= keys
    back = load_weights_file(tmp_path)
    assert back.header["format_version"] == 2 and back.header["embedding"] == "lm_head"
    assert back.header["layers"]["lm_head"]["tied"] is True
    assert isinstance(back.weights.tok_embeddings, QuantizedEmbedding) and back.weights.tied
    assert torch.equal(back.weights.lm_head.weight, int8_tied.weights.lm_head.weight)
    assert torch.equal(all_logits(back.decoder(), TOKENS), all_logits(int8_tied.decoder(), TOKENS))


def test_report_says_how_head_and_embedding_are_stored(tied, int8_tied):
    cfg = tied.config
    V, C = cfg.vocab_size, cfg.hidden_size
    he = int8_tied.report["head_embedding"]
    assert he["tied"] and he["embedding_bytes"] == 0 and "int8" in he["lm_head"] and "lm_head" in he["embedding"]
    assert he["lm_head_bytes"] == V * C + 4 * V
    fp_head = quantize_model(tied, "w8a16", gate=LOOSE)  # the head kept FP16 (the default)
    he_fp = fp_head.report["head_embedding"]
    assert he_fp["tied"] and "fp16" in he_fp["lm_head"] and he_fp["embedding_bytes"] == V * C * 2
    # one decode step reads the INT8 head instead of the FP16 one; the looked-up row is C int8 + a scale vs C fp16
    assert he_fp["bytes_per_token"] - he["bytes_per_token"] == (2 * V * C - (V * C + 4 * V)) + (2 * C - (C + 4))
    assert he["fp16_bytes_per_token"] == he_fp["fp16_bytes_per_token"] and he["vs_fp16"] < he_fp["vs_fp16"]
    # the stored model drops the FP16 table: V*C*2 bytes, for V*C + 4V of INT8 head (that the old copy added)
    assert fp_head.report["weight_bytes"]["quantized"] - int8_tied.report["weight_bytes"]["quantized"] == 2 * V * C - (V * C + 4 * V)


@pytest.mark.parametrize("head_scheme,head_op", [(None, "linear_w4a16"), ("w8a16", "linear_w8a16")])
def test_int4_blocks_with_a_tied_int8_or_int4_head(tied, tmp_path, head_scheme, head_op):
    r = quantize_model(tied, "w4a16", gate=LOOSE, options=QuantizeOptions(quantize_head=True, head_scheme=head_scheme,
                                                                       int4_group=32))
    w = r.weights
    assert w.lm_head.op == head_op and all(b.wo.op == "linear_w4a16" for b in w.blocks)
    assert isinstance(w.tok_embeddings, QuantizedEmbedding) and w.tok_embeddings.head is w.lm_head
    assert torch.equal(embed(r.decoder(), TOKENS), w.lm_head.dequantized()[TOKENS])
    write_quantized(tmp_path, r)
    back = load_weights_file(tmp_path)
    assert back.weights.lm_head.op == head_op and back.weights.tied
    assert torch.equal(all_logits(back.decoder(), TOKENS), all_logits(r.decoder(), TOKENS))
    assert r.report["options"]["head_scheme"] == head_scheme


def test_untied_model_keeps_its_own_embedding_and_head(tiny):
    assert not tiny.config.tie_embeddings
    r = quantize_model(tiny, "w8a16", gate=LOOSE, options=QuantizeOptions(quantize_head=True))
    assert isinstance(r.weights.tok_embeddings, torch.Tensor) and r.weights.lm_head.op == "linear_w8a16"
    assert not r.weights.tied and not r.report["head_embedding"]["tied"]
    assert r.report["head_embedding"]["embedding_bytes"] == tiny.config.vocab_size * tiny.config.hidden_size * 2


def test_gate_failure_names_the_layers_with_the_tied_head_ranked(tied):
    strict = replace(LOOSE, min_logits_snr_db=200.0)  # no quantized model passes this
    with pytest.raises(GateFailedError, match="the layers that hurt most: ") as e:
        quantize_model(tied, "w8a16", gate=strict, options=QuantizeOptions(quantize_head=True))
    ranked = [r["layer"] for r in e.value.report["sensitivity"]["layers"]]
    assert "lm_head" in ranked  # the tied matrix is ranked as one layer (head and lookup together)


def test_head_scheme_errors_say_what_is_allowed(tied):
    with pytest.raises(QuantizationError, match="expected one of w8a16"):
        quantize_model(tied, "w8a16", gate=LOOSE, options=QuantizeOptions(quantize_head=True, head_scheme="w4a16"))
    with pytest.raises(QuantizationError, match="the head is not quantized"):
        quantize_model(tied, "w4a16", gate=LOOSE, options=QuantizeOptions(head_scheme="w8a16"))


def _edgekit(*args, timeout=120):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "edgekit", *args], capture_output=True, text=True, timeout=timeout)


def test_info_on_a_quantized_dir_says_how_head_and_embedding_are_stored(int8_tied, tmp_path):
    import json

    write_quantized(tmp_path, int8_tied)
    r = _edgekit("info", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["head_embedding"] == json.loads((tmp_path / REPORT_FILE).read_text())["head_embedding"]
    assert d["layer_precisions"] == {"w8a16": 2 * 4 + 1} and d["format_version"] == 2
    r = _edgekit("info", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "the lm_head matrix" in r.stdout and "x FP16" in r.stdout


def test_head_precision_option_is_checked_against_the_precision(tmp_path):
    r = _edgekit("quantize", "preset:tiny", "--precision", "int8", "--head-precision", "int4", "-o", str(tmp_path / "q"))
    assert r.returncode != 0
    assert "--head-precision int4 with --precision int8: expected one of int8" in r.stderr + r.stdout

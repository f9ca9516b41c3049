"""Lossless intake of GGUF 4-bit tensors as W4A16 records (edgekit/model/gguf_types.py).

Every file here is written by gguf-py in the test; bit exactness is checked against gguf-py's own dequantize.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgekit.errors import ModelLoadError
from edgekit.kernels.int4_layout import dequantize_int4
from edgekit.model.gguf_types import Int4Tensor, concat_int4, int4_from_gguf
from edgekit.model.loader import load_model

from .conftest import hf_model, write_llama_gguf  # noqa: TID252

PROJECTIONS = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
               "ffn_up.weight", "ffn_down.weight")


def _write_one(path, name: str, qtype: str, data: np.ndarray) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _read_one(path):
    import gguf

    return gguf.GGUFReader(str(path)).tensors[0]


def _gguf_dequantized(t) -> torch.Tensor:
    import gguf

    return torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_q4_0_and_q4_1_are_a_byte_copy_that_dequantizes_like_gguf(tmp_path, qtype):
    import gguf

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((24, 128)) * rng.uniform(0.01, 3.0, (24, 1))).astype(np.float32)
    path = tmp_path / "one.gguf"
    _write_one(path, "blk.0.ffn_up.weight", qtype, gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype]))
    t = _read_one(path)
    rec = int4_from_gguf(qtype, np.asarray(t.data))
    assert rec.qweight.dtype == torch.uint8 and rec.qweight.shape == (24, 64)
    assert rec.scale.dtype == torch.float16 and rec.scale.shape == (24, 4)  # group 32
    assert (rec.offset is None) == (qtype == "Q4_0")
    # a byte copy: the packed nibbles are the file's own bytes
    block = 18 if qtype == "Q4_0" else 20
    file_nibbles = np.asarray(t.data).reshape(24, 4, block)[..., block - 16:].reshape(24, 64)
    assert np.array_equal(rec.qweight.numpy(), file_nibbles)
    assert torch.equal(dequantize_int4(rec.qweight, rec.scale, rec.offset), _gguf_dequantized(t))


def _random_q4_k_blocks(rng, rows: int, k: int) -> np.ndarray:
    """Raw Q4_K super-blocks with every scale/min bit pattern possible and sane fp16 d, dmin."""
    nb = rows * k // 256
    blocks = rng.integers(0, 256, (nb, 144), dtype=np.uint8)
    blocks[:, 0:2] = rng.uniform(1e-4, 1e-2, (nb, 1)).astype(np.float16).view(np.uint8)
    blocks[:, 2:4] = rng.uniform(1e-4, 1e-2, (nb, 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, k // 256 * 144)


def test_q4_k_maps_exactly_to_w4a16_g32_with_fp32_scales(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "qk.gguf"
    _write_one(path, "blk.0.ffn_down.weight", "Q4_K", _random_q4_k_blocks(rng, 8, 512))
    t = _read_one(path)
    rec = int4_from_gguf("Q4_K", np.asarray(t.data))
    assert rec.scale.dtype == torch.float32 and rec.scale.shape == (8, 16) and rec.offset.shape == (8, 16)
    ref = _gguf_dequantized(t)
    assert ref.shape == (8, 512)
    assert torch.equal(dequantize_int4(rec.qweight, rec.scale, rec.offset), ref)


def test_mixed_4bit_parts_concatenate_without_rounding():
    g = torch.Generator().manual_seed(0)
    q = lambda n: torch.randint(0, 256, (n, 16), generator=g, dtype=torch.uint8)  # noqa: E731
    s = lambda n, dt: (torch.rand(n, 1, generator=g) * 0.1 + 1e-3).to(dt)  # noqa: E731
    sym = Int4Tensor(q(4), s(4, torch.float16), None)
    asym = Int4Tensor(q(2), s(2, torch.float16), -s(2, torch.float16))
    wide = Int4Tensor(q(3), s(3, torch.float32), -s(3, torch.float32))
    for parts in ([sym, asym], [sym, wide], [asym, wide, sym]):
        got = concat_int4(parts)
        assert torch.equal(got.dequantized(), torch.cat([p.dequantized() for p in parts]))
    assert concat_int4([sym, sym]).offset is None  # all symmetric stays symmetric


@pytest.fixture(scope="module")
def q4_1_llama(tmp_path_factory):
    """A tiny Llama whose projections are Q4_1 (Q/K permuted as llama.cpp stores them), the rest F32."""
    path = tmp_path_factory.mktemp("q41") / "tiny-q4_1.gguf"
    write_llama_gguf(path, hf_model("llama", seed=2), projection_types={p: "Q4_1" for p in PROJECTIONS})
    return path


def test_4bit_projections_stay_packed_and_undo_the_qk_permutation(q4_1_llama):
    packed = load_model(str(q4_1_llama), keep_int4=True)
    expanded = load_model(str(q4_1_llama))  # the dequantizing path, checked against transformers elsewhere
    for bp, be in zip(packed.weights.blocks, expanded.weights.blocks):
        for name, lw in bp.linears().items():
            assert lw.op == "linear_w4a16", name
            assert lw.weight.dtype == torch.uint8 and lw.in_features == be.linears()[name].weight.shape[1]
            # the Q/K rows were permuted back on the packed bytes and their scales, not after dequantizing
            assert torch.equal(lw.dequantized(), be.linears()[name].weight), name
    assert packed.weights.nbytes() < expanded.weights.nbytes()


def test_lossless_model_gives_the_dequantized_models_logits(q4_1_llama):
    packed = load_model(str(q4_1_llama), keep_int4=True).decoder()
    expanded = load_model(str(q4_1_llama)).decoder()
    tokens = torch.tensor([[5, 17, 42, 99, 7, 3]])
    lens = torch.tensor([6])
    a = packed.prefill(tokens, lens, packed.new_cache(1, 16))
    b = expanded.prefill(tokens, lens, expanded.new_cache(1, 16))
    assert torch.equal(a, b)


def test_a_part_not_stored_4bit_makes_the_fused_projection_fp(tmp_path):
    path = tmp_path / "mixed.gguf"
    types = {p: "Q4_0" for p in PROJECTIONS} | {"attn_v.weight": "Q8_0"}
    write_llama_gguf(path, hf_model("llama", seed=3), projection_types=types)
    b = load_model(str(path), keep_int4=True).weights.blocks[0]
    assert b.wqkv.op == "linear" and b.wqkv.weight.dtype == torch.float32
    assert b.wo.op == b.w_down.op == "linear_w4a16" and b.wo.offset is None  # Q4_0: symmetric


def test_unmappable_type_is_a_one_line_error_naming_tensor_and_type(tmp_path):
    path = tmp_path / "iq.gguf"
    write_llama_gguf(path, hf_model("llama", seed=4), projection_types={"blk.1.ffn_up.weight": "IQ4_NL:zeros"})
    for keep in (False, True):
        with pytest.raises(ModelLoadError) as e:
            load_model(str(path), keep_int4=keep)
        assert "\n" not in str(e.value)
        assert "blk.1.ffn_up.weight" in str(e.value) and "IQ4_NL" in str(e.value)


def test_info_says_per_tensor_type_how_an_int4_build_takes_it_in(q4_1_llama):
    import json

    from typer.testing import CliRunner

    from edgekit.cli import _register_commands, app

    _register_commands()
    res = CliRunner().invoke(app, ["info", str(q4_1_llama), "--json"])
    assert res.exit_code == 0, res.output
    stored = json.loads(res.output)["stored_as"]
    assert stored["tensor_types"] == {"Q4_1": 14, "F32": 7}
    assert stored["intake_int4"]["Q4_1"].startswith("projections lossless: W4A16 g32")
    assert stored["intake_int4"]["F32"] == "floating point"


def test_plan_int4_of_a_4bit_gguf_costs_the_group_it_will_keep(q4_1_llama, tmp_path):
    import json

    from typer.testing import CliRunner

    from edgekit.cli import _register_commands, app
    from edgekit.model.gguf_types import lossless_int4_layout

    assert lossless_int4_layout({"Q4_1": 14}) == (32, 4) and lossless_int4_layout({"Q4_K": 3}) == (32, 8)
    assert lossless_int4_layout({"Q4_K": 10, "Q6_K": 4}) is None  # some layers go through calibration
    _register_commands()
    res = CliRunner().invoke(app, ["plan", str(q4_1_llama), "--target", "orin", "--precision", "int4", "--no-tiles", "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    assert plan["precision"]["int4"] == {"group": 32, "group_bytes": 4}
    # exactly the bytes the loaded W4A16 records hold (projections) + FP16 norms, embedding and untied head
    w = load_model(str(q4_1_llama), keep_int4=True, tokenizer=False).weights
    proj = sum(lw.nbytes() for b in w.blocks for lw in b.linears().values())
    fp16 = 2 * (w.tok_embeddings.numel() + w.lm_head.weight.numel() + w.norm.numel()
                + sum(b.attn_norm.numel() + b.ffn_norm.numel() for b in w.blocks))
    assert plan["memory"]["weights_bytes"] == proj + fp16


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_qwen3_and_gemma3_4bit_projections_are_taken_in_bit_for_bit(tmp_path, family, qtype):
    from .conftest import small_gemma3_llamacpp, small_qwen3, write_family_gguf  # noqa: TID252

    path = tmp_path / f"{family}-{qtype}.gguf"
    write_family_gguf(path, small_qwen3() if family == "qwen3" else small_gemma3_llamacpp(), projections=qtype)
    packed = load_model(str(path), tokenizer=False, keep_int4=True)
    float_ = load_model(str(path), tokenizer=False)  # the same file dequantized to FP32
    for b, f in zip(packed.weights.blocks, float_.weights.blocks):
        for name, lw in b.linears().items():
            assert lw.op == "linear_w4a16", name
            assert torch.equal(dequantize_int4(lw.weight, lw.scale, lw.offset), getattr(f, name).weight)
        assert all(torch.equal(t, f.norms()[k]) for k, t in b.norms().items())  # QK- and post-norms as written
    ids = torch.randint(3, 320, (1, 14), generator=torch.Generator().manual_seed(2))
    logits = [m.decoder().prefill(ids, torch.tensor([14]), m.decoder().new_cache(1, 16)) for m in (packed, float_)]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)

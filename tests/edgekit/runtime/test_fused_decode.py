"""The fused decode path computes what the per-operator decoder computes, and says when it cannot run.

On the CPU the fused operators run their torch references (the composition of
the per-operator references), so a fused step must give the same logits and
write the same KV cache as ``Decoder.decode``; the GPU test does the same
through the Triton kernels.
"""

from __future__ import annotations

import pytest
import torch

from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.decoder import Decoder
from edgekit.model.kv_cache import StaticKVCache
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights
from edgekit.graph.builder import LinearSchemes
from edgekit.graph.paths import fused_operators, fused_step_operators
from edgekit.runtime.fused_decode import FusedDecoder, fused_path_blocker, select_decode_path

# the fused operators of the tiny (Llama-family) model's fused step; fused_operators() lists every family's
FUSED_OPS = fused_step_operators(preset_config("tiny"), LinearSchemes.uniform(preset_config("tiny").n_layers))


def _w8a16(weights):
    """Every block projection as INT8 per-channel (W8A16)."""
    from edgekit.kernels.linear import LinearWeights

    def q(lw):
        w = lw.weight.float()
        scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0
        return LinearWeights("linear_w8a16", torch.round(w / scale[:, None]).to(torch.int8), lw.bias, scale)

    for b in weights.blocks:
        b.wqkv, b.wo, b.w_gate_up, b.w_down = q(b.wqkv), q(b.wo), q(b.w_gate_up), q(b.w_down)
    return weights


def _w4a16(weights):
    """Every block projection as packed INT4 (W4A16, groups of 32): QKV symmetric with FP32 scales, the others with
    FP16 scales and offsets (GGML Q4_1 style), so both forms and both scale dtypes run."""
    from edgekit.kernels.int4_layout import quantize_int4_rtn
    from edgekit.kernels.linear import LinearWeights

    def q(lw, symmetric=False, scale_dtype=torch.float16):
        qw, s, m = quantize_int4_rtn(lw.weight.float(), 32, symmetric=symmetric, scale_dtype=scale_dtype)
        return LinearWeights("linear_w4a16", qw, lw.bias, s, offset=m)

    for b in weights.blocks:
        b.wqkv = q(b.wqkv, symmetric=True, scale_dtype=torch.float32)
        b.wo, b.w_gate_up, b.w_down = q(b.wo), q(b.w_gate_up), q(b.w_down)
    return weights


def _preset(name: str):
    from edgekit.errors import ModelLoadError

    try:
        return preset_config(name)
    except ModelLoadError:  # the Qwen3 / Gemma 3 presets come with their families' graphs (issue 30)
        pytest.skip(f"no preset {name!r} on this branch: it arrives with the Qwen3 / Gemma 3 families")


# the Llama family (Qwen2 shape), Qwen3 (QK-norm) and Gemma 3 (QK-norm, post-norms, GeGLU, a 4-row ring that the
# 6-token prompt and the decode steps wrap around): each on the fused operators of its own fused step
FAMILY_OPS = {"tiny": "fused_norm_qkv_rope", "tiny-qwen3": "fused_norm_qkv_qknorm_rope",
              "tiny-gemma3": "fused_norm_geglu"}


@pytest.mark.parametrize("preset", sorted(FAMILY_OPS))
@pytest.mark.parametrize("precision", ["fp", "int8", "int4"])
def test_fused_steps_match_the_per_operator_decoder(precision, preset):
    cfg = _preset(preset)
    w = random_weights(cfg, seed=3)
    w = {"fp": lambda w: w, "int8": _w8a16, "int4": _w4a16}[precision](w)
    dec = Decoder(cfg, w, DispatchTable())
    fused = FusedDecoder(dec)
    assert FAMILY_OPS[preset] in fused_step_operators(cfg, dec.schemes)
    cache_a, cache_b = dec.new_cache(2, 32), dec.new_cache(2, 32)
    tokens = torch.tensor([5, 17])
    prompt = torch.randint(0, cfg.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    lens = torch.tensor([6, 4])
    dec.prefill(prompt, lens, cache_a)
    dec.prefill(prompt, lens, cache_b)
    positions = lens.clone()
    for _ in range(4):
        want = dec.decode(tokens, positions, cache_a)  # (B, V)
        token, got = fused.decode_token(tokens, positions, cache_b)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(token, want.argmax(-1))
        for ka, kb in zip(cache_a.k + cache_a.v, cache_b.k + cache_b.v):
            torch.testing.assert_close(kb, ka, rtol=1e-5, atol=1e-5)
        tokens, positions = token, positions + 1


def test_the_path_falls_back_and_says_why():
    cfg = preset_config("tiny")
    dec = Decoder(cfg, random_weights(cfg, seed=1), DispatchTable())
    cache = dec.new_cache(1, 16)
    step, path = select_decode_path(dec, cache)
    assert step is dec and path.name == "per-operator" and "CUDA" in path.reason

    # the checks after the device one, with a table whose fused entries are set (as on a GPU)
    table = DispatchTable()
    for op in FUSED_OPS:
        table.set(op, table.get(op), source="triton")
    baseline = table.sources()
    cuda_like = dec.with_ops(table)
    cuda_like.device = torch.device("cuda")  # only the blocker's device check reads it
    assert fused_path_blocker(cuda_like, cache, table, baseline) is None
    swapped = table.copy()
    swapped.set("swiglu", table.get("swiglu"), source="plugin:v2")
    why = fused_path_blocker(cuda_like, cache, swapped, baseline)
    assert why is not None and "swiglu" in why and "plugin:v2" in why
    swapped = table.copy()  # the attention the fused attention + o-proj operator subsumes
    swapped.set("attention_decode", table.get("attention_decode"), source="plugin:v3")
    assert "attention_decode" in (fused_path_blocker(cuda_like, cache, swapped, baseline) or "")

    class QuantizedCache(StaticKVCache):
        pass

    qcache = QuantizedCache(cfg, 1, 16, torch.float32)
    assert "QuantizedCache" in fused_path_blocker(cuda_like, qcache, table, baseline)
    table_ref = table.copy()
    table_ref.reset("fused_head_argmax")
    why = fused_path_blocker(cuda_like, cache, table_ref, baseline)
    assert "fused_head_argmax" in why and "rebuild the bundle" in why  # what to do about it


def test_a_device_without_triton_decodes_per_operator(monkeypatch):
    import edgekit.runtime.fused_decode as fd

    cfg = preset_config("tiny")
    dec = Decoder(cfg, random_weights(cfg, seed=1), DispatchTable())
    cuda_like = dec.with_ops(dec.ops)
    cuda_like.device = torch.device("cuda")  # only the path selection reads it

    def no_triton(table, operators=None):
        raise ImportError("No module named 'triton'")

    monkeypatch.setattr(fd, "with_fused_kernels", no_triton)
    step, path = fd.select_decode_path(cuda_like, dec.new_cache(1, 16))
    assert step is cuda_like and path.name == "per-operator" and "triton" in path.reason


def test_select_decode_path_takes_only_known_paths():
    from edgekit.errors import EdgekitError

    cfg = preset_config("tiny")
    dec = Decoder(cfg, random_weights(cfg, seed=1), DispatchTable())
    cache = dec.new_cache(1, 16)
    with pytest.raises(EdgekitError, match="unknown decode path 'giant'"):
        select_decode_path(dec, cache, prefer="giant")
    step, path = select_decode_path(dec, cache, prefer="per-operator")
    assert step is dec and path.name == "per-operator"


def test_the_fused_decoder_calls_the_fused_graphs_operators_in_graph_order():
    """FusedDecoder runs the fused path's graph (what the planner ships and counts): the calls it makes are the
    graph's registry nodes, in order."""
    from edgekit.graph.node import DECODE
    from edgekit.graph.paths import FUSED, registry_ops

    cfg = preset_config("tiny")
    dec = Decoder(cfg, random_weights(cfg, seed=2), DispatchTable())
    calls: list[str] = []
    table = DispatchTable()
    graph = dec.graph(DECODE, FUSED)
    for op in registry_ops(graph):
        table.set(op, lambda *a, _op=op, _fn=table.get(op): (calls.append(_op), _fn(*a))[1], source="plugin:v1")
    cache = dec.new_cache(1, 16)
    FusedDecoder(dec, table).decode_token(torch.tensor([3]), torch.tensor([0]), cache)
    assert calls == [n.op for n in graph.nodes if n.op in registry_ops(graph)]
    assert calls == ["fused_norm_qkv_rope", "fused_attn_proj_residual", "fused_norm_swiglu",
                     "fused_proj_residual"] * cfg.n_layers + ["fused_head_argmax"]


def test_shipped_fused_plugins_are_kept_and_reported_as_the_source():
    """A bundle's fused plugins run as they are: nothing is JIT-compiled, and the path names each plugin."""
    import edgekit.runtime.fused_decode as fd

    cfg = preset_config("tiny")
    table = DispatchTable()
    for op in FUSED_OPS:
        table.set(op, table.get(op), source="plugin:v1")
    kept = fd.with_fused_kernels(table)
    assert {op: kept.sources()[op] for op in FUSED_OPS} == {op: "plugin:v1" for op in FUSED_OPS}

    dec = Decoder(cfg, random_weights(cfg, seed=1), table)
    cuda_like = dec.with_ops(table)
    cuda_like.device = torch.device("cuda")  # only the path selection reads it
    step, path = fd.select_decode_path(cuda_like, dec.new_cache(1, 16))
    assert isinstance(step, FusedDecoder) and path.name == "fused"
    assert path.to_dict()["operator_sources"] == {op: "plugin:v1" for op in FUSED_OPS}
    assert "signed plugins" in path.reason


def test_a_bundle_without_fused_plugins_jit_compiles_only_the_missing_ones(monkeypatch):
    import edgekit.kernels.triton_backend as tb
    import edgekit.runtime.fused_decode as fd

    table = DispatchTable()
    shipped = FUSED_OPS[0]
    missing = [op for op in fused_operators() if op != shipped]
    table.set(shipped, table.get(shipped), source="plugin:v1")
    monkeypatch.setattr(tb, "triton_ops", lambda: {op: (lambda *a: None) for op in missing})
    out = fd.with_fused_kernels(table)
    assert out.sources()[shipped] == "plugin:v1"
    assert all(out.sources()[op] == "triton" for op in missing)


def _cuda_like_with_fused_entries(dec):
    """The decoder as the path selection sees it on a GPU: fused entries set (their references, labelled "triton")."""
    table = DispatchTable()
    for op in FUSED_OPS:
        table.set(op, table.get(op), source="triton")
    cuda_like = dec.with_ops(table)
    cuda_like.device = torch.device("cuda")  # only the path selection reads it
    return cuda_like, table


def test_an_int4_model_decodes_on_the_fused_path_with_the_per_operator_tokens():
    cfg = preset_config("tiny")
    dec = Decoder(cfg, _w4a16(random_weights(cfg, seed=5)), DispatchTable())
    assert {lw.op for b in dec.weights.blocks for lw in b.linears().values()} == {"linear_w4a16"}
    step, path = select_decode_path(dec, dec.new_cache(1, 32), allow_cpu=True, baseline={}, prefer="fused")
    # on the CPU the table's fused entries are references; the path selection takes the INT4 weights
    assert path.name == "per-operator" and "no GPU implementation" in path.reason  # not the weights
    cuda_like, table = _cuda_like_with_fused_entries(dec)
    step, path = select_decode_path(cuda_like, dec.new_cache(1, 32), jit=False)
    assert isinstance(step, FusedDecoder) and path.name == "fused", path.reason

    prompt = torch.randint(0, cfg.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    lens = torch.tensor([5])
    fused = FusedDecoder(dec, table)
    caches = dec.new_cache(1, 32), dec.new_cache(1, 32)
    for c in caches:
        dec.prefill(prompt, lens, c)
    tokens = {"per-operator": [], "fused": []}
    tok = {k: torch.tensor([7]) for k in tokens}
    for pos in range(5, 13):
        positions = torch.tensor([pos])
        tok["per-operator"] = dec.decode(tok["per-operator"], positions, caches[0]).argmax(-1)
        tok["fused"], _ = fused.decode_token(tok["fused"], positions, caches[1])
        for k in tokens:
            tokens[k].append(int(tok[k]))
    assert tokens["fused"] == tokens["per-operator"], tokens


def test_an_int4_lm_head_is_fused_with_the_layers():
    """The fused head takes INT4 weights as the layers' GEMVs do (its INT4 kernel passes the FP64 oracle on the GPU):
    the rewrite fuses the final norm and the INT4 head into fused_head_argmax beside every layer's operators, and the
    step gives the per-operator decode's logits and their argmax."""
    from edgekit.graph.node import DECODE
    from edgekit.graph.paths import FUSED, fused_step_operators
    from edgekit.kernels.int4_layout import quantize_int4_rtn
    from edgekit.kernels.linear import LinearWeights

    cfg = preset_config("tiny")
    w = _w4a16(random_weights(cfg, seed=5))
    qw, s, m = quantize_int4_rtn(w.lm_head.weight.float(), 64)
    w.lm_head = LinearWeights("linear_w4a16", qw, None, s, offset=m)
    dec = Decoder(cfg, w, DispatchTable())
    assert "fused_head_argmax" in fused_step_operators(cfg, dec.schemes)
    counts = dec.graph(DECODE, FUSED).counts()
    assert counts["fused_norm_swiglu"] == cfg.n_layers and counts["fused_head_argmax"] == 1
    assert "linear_w4a16" not in counts and "rmsnorm" not in counts
    cache_a, cache_b = dec.new_cache(1, 16), dec.new_cache(1, 16)
    want = dec.decode(torch.tensor([3]), torch.tensor([0]), cache_a)
    token, got = FusedDecoder(dec).decode_token(torch.tensor([3]), torch.tensor([0]), cache_b)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(token, want.argmax(-1))

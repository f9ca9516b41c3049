"""run_graph's ``keep``: a pass returns only the values asked for and lets every other one go after its last reader,
so a teacher-forced pass over many layers holds about one layer's intermediates, not all of them. Its run attributes,
and the projection hooks it refuses on fused nodes that hide a projection."""

from __future__ import annotations

import torch

from edgekit.graph.executor import block_nodes, run_graph
from edgekit.graph.node import SEQUENCE
from edgekit.model.decoder import Decoder
from edgekit.model.loader import load_model
from edgekit.quant.forward import _window, embed


class _PeakDict(dict):
    """An env that remembers how many values it held at once."""

    peak = 0

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.peak = max(self.peak, len(self))


def _pass(dec: Decoder, x: torch.Tensor, keep=None) -> _PeakDict:
    g = dec.graph(SEQUENCE)
    env = _PeakDict({g.streams[0][0]: x})
    return run_graph(g, _window(dec, x, None), env, block_nodes(g, 0, len(g.streams)), keep=keep)


def test_keep_returns_the_same_output_and_only_what_was_kept():
    for preset in ("preset:tiny-qwen3", "preset:tiny-gemma3"):  # QK-norm; post-norms and sliding-window layers
        m = load_model(preset, tokenizer=False)
        dec = Decoder(m.config, m.weights)
        g = dec.graph(SEQUENCE)
        x = embed(dec, torch.arange(3, 40)[None] % m.config.vocab_size)
        out = g.streams[-1][1]
        full, kept = _pass(dec, x), _pass(dec, x, keep=(out,))
        assert torch.equal(kept[out], full[out]), preset
        assert set(kept) == {out}, sorted(kept)  # the seeded stream too is let go (the caller holds its own)
        assert len(full) > 4 * m.config.n_layers  # without keep: every layer's values stay


def test_keep_holds_about_one_layers_values_at_a_time():
    m = load_model("preset:tiny-qwen3", tokenizer=False)
    dec = Decoder(m.config, m.weights)
    g = dec.graph(SEQUENCE)
    x = embed(dec, torch.arange(5, 37)[None])
    per_layer = max(sum(len(n.outputs) for n in g.layer_nodes(i)) for i in range(m.config.n_layers))
    prelude = sum(len(g.nodes[i].outputs) for i in block_nodes(g, 0, 0))  # RoPE rows, sequence lengths
    kept = _pass(dec, x, keep=(g.streams[-1][1],))
    full = _pass(dec, x)
    assert kept.peak <= prelude + per_layer + 2, (kept.peak, prelude, per_layer)
    assert full.peak >= prelude + m.config.n_layers * (per_layer - 1), (full.peak, per_layer)


def test_a_run_attribute_is_the_forwards_and_an_unknown_one_is_refused():
    """``@act_dtype`` (bound by fused_tied_lookup's fusion) is the dtype of the model's embedding, as a decoder reads
    its activation dtype; any other "@" name is a declaration bug, said as such."""
    import pytest

    from edgekit.errors import OperatorError
    from edgekit.graph.executor import ExecContext

    m = load_model("preset:tiny", tokenizer=False)
    for dtype, name in ((torch.float32, "float32"), (torch.float64, "float64"), (torch.float16, "float16")):
        ctx = ExecContext(SEQUENCE, None, m.weights.to(dtype=dtype), None)
        assert ctx.run_attribute("@act_dtype") == name
    with pytest.raises(OperatorError, match="unknown run attribute '@act_dtypes'"):
        ctx.run_attribute("@act_dtypes")


class _HookTable:
    """A dispatch table (the references) that observes projections, as a calibration's does."""

    def __init__(self, output_hook: bool = False):
        from edgekit.kernels.dispatch import DispatchTable

        self.table, self.seen = DispatchTable(), []
        if output_hook:
            self.on_linear_output = lambda node, record, y: y

    def __getattr__(self, name):
        return getattr(self.table, name)

    def on_linear_input(self, node, record, x):
        self.seen.append(node.name)


def _decode_step(dec: Decoder, path: str):
    from edgekit.graph.node import DECODE

    cache = dec.new_cache(1, 16)
    ctx = dec.context(DECODE, cache, tokens=torch.tensor([3]), positions=torch.tensor([0]))
    return run_graph(dec.graph(DECODE, path), ctx)


def test_projection_hooks_are_refused_where_a_fused_operator_hides_the_projection():
    """A norm + projection kernel never makes the normalized x its projection multiplies, and a fused node's output
    is not the projection's alone: a calibration or tuning table running the fused decode graph is told so by name
    (it would otherwise have recorded the pre-norm x, or silently skipped the rewrite). The per-operator graph runs."""
    import pytest

    from edgekit.errors import OperatorError
    from edgekit.graph.paths import FUSED, PER_OPERATOR
    from edgekit.kernels.registry import operator

    for op in ("fused_proj_residual", "qkv_rope"):  # x is the projection's input (o / down; the float QKV)
        assert operator(op).fusion.projects() and operator(op).fusion.x_is_projection_input(), op
    for op in ("fused_norm_swiglu", "fused_norm_qkv_rope", "fused_head_argmax", "fused_attn_proj_residual"):
        assert operator(op).fusion.projects() and not operator(op).fusion.x_is_projection_input(), op
    assert not operator("fused_tied_lookup").fusion.projects()  # a lookup in the head's record: no projection
    m = load_model("preset:tiny", tokenizer=False)
    hooks = _HookTable()
    dec = Decoder(m.config, m.weights, hooks)
    _decode_step(dec, PER_OPERATOR)
    assert len(hooks.seen) >= 4 * m.config.n_layers, hooks.seen  # every projection's input seen
    with pytest.raises(OperatorError, match=r"fused_norm_qkv_rope .*on_linear_input"):
        _decode_step(dec, FUSED)
    # every fused projection of the step refuses the hooks it cannot honour (the first one met raises above)
    from edgekit.graph.executor import _plan
    from edgekit.graph.node import DECODE

    refused = {c.node.op: c.hooks_refused for c in _plan(dec.graph(DECODE, FUSED)) if c.hooks_refused}
    both = ("on_linear_input", "on_linear_output")
    assert refused == {"fused_norm_qkv_rope": both, "fused_attn_proj_residual": both, "fused_norm_swiglu": both,
                       "fused_proj_residual": ("on_linear_output",), "fused_head_argmax": both}, refused
    dec = Decoder(m.config, m.weights, _HookTable(output_hook=True))
    with pytest.raises(OperatorError, match="on_linear_output"):
        _decode_step(dec, FUSED)

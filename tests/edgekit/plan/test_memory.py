"""The memory plan adds up, and a misfit names what would fit — and those suggestions really fit."""

from __future__ import annotations

import dataclasses
import re
import shlex

import pytest

from edgekit.errors import PlanError
from edgekit.model.presets import PRESETS, preset_config
from edgekit.plan.memory import activation_bytes, plan_memory
from edgekit.plan.planner import make_plan
from edgekit.plan.precision import PrecisionPlan, linear_bytes
from edgekit.plan.targets import load_target


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_fp16_weights_are_two_bytes_per_parameter(name):
    cfg = preset_config(name)
    # ModelConfig.n_params counts every parameter once (tied head = 0); fp16 is 2 bytes each.
    assert sum(PrecisionPlan.uniform(cfg).weight_bytes(cfg).values()) == 2 * cfg.n_params


def test_int8_weights_save_one_byte_per_projection_weight_minus_scales():
    cfg = preset_config("qwen2.5-0.5b")
    fp16 = sum(PrecisionPlan.uniform(cfg, "fp16").weight_bytes(cfg).values())
    int8 = sum(PrecisionPlan.uniform(cfg, "w8a16").weight_bytes(cfg).values())
    proj_weights = sum(o * i for o, i in cfg.linear_shapes().values()) * cfg.n_layers
    scales = 4 * sum(o for o, _ in cfg.linear_shapes().values()) * cfg.n_layers
    assert fp16 - int8 == proj_weights - scales


def test_mixed_precision_is_costed_per_layer():
    cfg = preset_config("smollm2-135m")
    pp = PrecisionPlan.uniform(cfg, "w8a16")
    before = sum(pp.weight_bytes(cfg).values())
    pp.set(3, "w_down", "fp16")
    o, i = cfg.linear_shapes()["w_down"]
    assert sum(pp.weight_bytes(cfg).values()) - before == linear_bytes(o, i, "fp16", False) - linear_bytes(o, i, "w8a16", False)
    assert pp.label().startswith("mixed")


@pytest.mark.parametrize("target", ["orin", "h200", "orin-nano-4gb"])
def test_memory_map_adds_up(target):
    cfg = preset_config("smollm2-360m")
    t = load_target(target)
    pp = PrecisionPlan.uniform(cfg, "w8a16", "int8")
    m = plan_memory(cfg, t, pp, context=4096, batch=2, max_bucket=1024, decode_slots=64)
    assert sum(v for _, v in m.items()) + m.free_bytes == t.memory_bytes
    assert m.kv_cache == cfg.kv_cache_bytes(4096, 2, 1.0)
    assert m.weights == sum(pp.weight_bytes(cfg).values())
    assert m.activations == activation_bytes(cfg, 2, 1024)
    assert m.os_headroom == (0 if not t.memory.unified else int(t.memory.os_headroom_gib * 1024**3))
    d = m.to_dict()
    assert d["free_bytes"] + sum(d[f"{k}_bytes"] for k, _ in m.items()) == d["total_bytes"]


def test_qwen_1_5b_fits_agx_orin_64gb():
    cfg = preset_config("qwen2.5-1.5b")
    p = make_plan(cfg, load_target("agx-orin-64gb"), solve_tiles=False)
    assert p.memory.fits and p.memory.free_bytes > 0


def _replan_with(flags: str, cfg, target, **base):
    """Apply a suggestion such as '--precision int8 --context 1024' to the base arguments."""
    args = dict(base)
    toks = shlex.split(flags)
    for k, v in zip(toks[::2], toks[1::2]):
        key = k.removeprefix("--").replace("-", "_")
        args[key] = int(v) if v.isdigit() else v
    return make_plan(cfg, target, solve_tiles=False, **args)


@pytest.mark.parametrize(
    "preset,target,context,batch",
    [
        ("qwen2.5-1.5b", "orin-nano-4gb", 32768, 8),
        ("qwen2.5-1.5b", "orin-nano-4gb", 32768, 1),
        ("llama-3.2-3b", "orin-nano-8gb", 32768, 4),
        ("llama-3.2-1b", "orin-nano-4gb", 8192, 16),
    ],
)
def test_misfit_says_by_how_much_and_every_suggestion_fits(preset, target, context, batch):
    cfg, t = preset_config(preset), load_target(target)
    base = dict(context=context, batch=batch)
    with pytest.raises(PlanError) as e:
        make_plan(cfg, t, solve_tiles=False, **base)
    msg = str(e.value)
    assert f"does not fit {target}" in msg and " over" in msg
    assert "\n" not in msg
    suggestions = re.search(r"(?:would fit|these would): (.*)\)$", msg).group(1).split("; ")
    assert suggestions
    for s in suggestions:
        flags = s.split(" (needs")[0]
        plan = _replan_with(flags, cfg, t, **base)
        assert plan.memory.fits, flags


def test_nothing_fits_says_so():
    with pytest.raises(PlanError, match="nothing fits"):
        make_plan(preset_config("mistral-7b"), load_target("orin-nano-4gb"), solve_tiles=False)


def test_qwen3_4b_int4_with_a_4096_token_cache_fits_an_8gb_orin_nano_with_the_os_headroom():
    """The issue's question, answered by the memory plan: yes, with 2.5 GiB to spare (PREDICTED from shapes)."""
    cfg, t = preset_config("qwen3-4b"), load_target("orin-nano-8gb")
    m = make_plan(cfg, t, precision="int4", context=4096, solve_tiles=False).memory
    assert m.fits and m.os_headroom == int(t.memory.os_headroom_gib * 1024**3) > 0
    assert m.kv_cache == 36 * 2 * 8 * 4096 * 128 * 2 == 576 * 1024**2  # 36 layers of K and V, FP16
    assert 2.4 * 1024**3 < m.weights < 2.6 * 1024**3  # INT4 blocks + the tied FP16 embedding (389 M parameters)
    assert 2.4 * 1024**3 < m.free_bytes < 2.6 * 1024**3


def test_a_sliding_window_layer_caches_only_its_window():
    gemma = preset_config("gemma-3-1b")  # 22 local layers (window 512), 4 global
    full = dataclasses.replace(gemma, sliding_window=None)
    assert full.kv_cache_bytes(32768, 1, 2.0) == 26 * 2 * 1 * 32768 * 256 * 2  # 3.25 GiB if every layer kept all
    assert gemma.kv_cache_bytes(32768, 1, 2.0) == (4 * 32768 + 22 * 512) * 2 * 256 * 2  # 0.52 GiB with rings
    assert gemma.kv_cache_bytes(300, 1, 2.0) == full.kv_cache_bytes(300, 1, 2.0)  # a context inside the window
    m = make_plan(gemma, load_target("orin-nano-4gb"), precision="int4", context=32768, solve_tiles=False).memory
    assert m.kv_cache == gemma.kv_cache_bytes(32768, 1, 2.0)

"""The fused decode step as data: which operators it needs, and which weights it takes."""

from __future__ import annotations

from edgekit.kernels.decode_paths import DECODE_STEPS, FUSED_STEP, model_weights_blocker, step_operators, weights_blocker
from edgekit.kernels.registry import OPERATORS
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights


def test_every_operator_of_every_step_is_a_registry_record_with_kernels():
    for step in DECODE_STEPS:
        for op in step.operators():
            assert op in OPERATORS, f"{step.name} calls {op}, which the registry does not know"
            assert OPERATORS[op].triton is not None, f"{op} has no GPU kernels to ship"
        for op in step.swap_sensitive():
            assert op in OPERATORS


def test_the_fused_step_runs_its_own_operators_and_subsumes_attention():
    assert FUSED_STEP.own_operators() == ["fused_norm_qkv_rope", "fused_attn_proj_residual", "fused_norm_swiglu",
                                          "fused_proj_residual", "fused_head_argmax"]
    # the split-KV attention and its combine run inside fused_attn_proj_residual: a swap of attention_decode
    # must take the path down, like a swap of any other operator the step does the work of
    assert "attention_decode" not in FUSED_STEP.operators() and "attention_decode" in FUSED_STEP.swap_sensitive()
    assert step_operators([FUSED_STEP, FUSED_STEP]) == FUSED_STEP.operators()  # each once


def test_weights_blocker_names_the_projection_that_rules_the_path_out():
    ok = {"layer 0 wqkv": "linear", "layer 0 wo": "linear_w8a16", "the LM head": "linear"}
    assert weights_blocker(ok, kv_cache="fp16") is None
    why = weights_blocker({**ok, "layer 3 w_down": "linear_w8a8"}, kv_cache="fp16")
    assert "layer 3 w_down uses linear_w8a8" in why
    assert "KV cache" in weights_blocker(ok, kv_cache="int8")
    assert "bias" in weights_blocker(ok, kv_cache="fp16", gate_up_bias=True)


def test_model_weights_blocker_reads_a_models_weights():
    w = random_weights(preset_config("tiny"), seed=0)
    assert model_weights_blocker(w) is None
    from edgekit.kernels.linear import LinearWeights

    b = w.blocks[1]
    b.wo = LinearWeights("linear_w8a8", b.wo.weight, None, None)
    assert "layer 1 wo uses linear_w8a8" in model_weights_blocker(w)

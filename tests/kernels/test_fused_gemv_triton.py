"""Host side of the fused GEMVs' weight formats (kernels/fused_gemv_triton.py), no GPU and no interpreter: the
launch program picks the float, INT8 or INT4 kernel by the call's weight format, refuses a format whose kernel was
not built (naming the built ones), and the host checks refuse malformed weight operands with a clear error."""

from __future__ import annotations

import pytest
import torch

from edgekit.errors import OperatorError
from edgekit.kernels.fused_gemv_triton import weight_operands
from edgekit.kernels.int4_layout import quantize_int4_rtn
from edgekit.kernels.launch_rule import LaunchCheckError, resolve_program
from edgekit.kernels.variants import default_variants, op_kernels, op_program

OP = "fused_proj_residual"
N, K = 48, 256


def _launched(variants, weight, scale, offset):
    """The kernels the op's program launches for these weight operands (prepared as the host step does)."""
    x = torch.zeros(2, K, dtype=torch.float16)
    operands, attrs = weight_operands(OP, x, weight, scale, offset, N, K)
    tensors = {"x": x, **operands, "bias": None, "residual": torch.zeros(2, N, dtype=torch.float16)}
    _, launches = resolve_program(op_program(OP, variants), tensors, attrs, {"sm_count": 8, "max_shared_bytes": 0},
                                  lambda name, shape, dt: torch.empty(shape))
    return launches


def _int4(group=64, scale_dtype=torch.float16, symmetric=False):
    return quantize_int4_rtn(torch.randn(N, K), group, symmetric=symmetric, scale_dtype=scale_dtype)


def test_the_weights_format_picks_the_kernel():
    variants = default_variants(OP, n_out=N, k_in=K)
    assert sorted(variants) == ["proj_residual_fp", "proj_residual_w4", "proj_residual_w8"]
    assert [ln.kernel for ln in _launched(variants, torch.zeros(N, K, dtype=torch.float16), None, None)] == ["proj_residual_fp"]
    q8, s8 = torch.zeros(N, K, dtype=torch.int8), torch.ones(N)
    assert [ln.kernel for ln in _launched(variants, q8, s8, None)] == ["proj_residual_w8"]
    for group, sdt, symmetric in ((32, torch.float16, False), (128, torch.float32, True)):
        q, s, m = _int4(group, sdt, symmetric)
        (ln,) = _launched(variants, q, s, m)
        assert ln.kernel == "proj_residual_w4"
        args = dict(zip((p.name for p in op_kernels()[OP].kernels[2].params), ln.args))
        # the group-scale slot of the scale's dtype, the other one null; flags and G = 32 << group_shift
        assert (args["s_ptr"] != 0, args["sh_ptr"] != 0) == ((True, False) if sdt == torch.float32 else (False, True))
        assert (args["has_offset"], args["scale_f32"], 32 << args["group_shift"]) == (int(not symmetric), int(sdt == torch.float32), group)
        assert args["stride_sn"] == K // group and args["K"] == K


def test_a_format_without_a_built_kernel_is_refused_by_name():
    variants = {k: v for k, v in default_variants(OP, n_out=N, k_in=K).items() if not k.endswith("_w4")}
    with pytest.raises(LaunchCheckError, match=r"no kernel for INT4 \(W4A16\) weights was built \(this build has float, INT8"):
        _launched(variants, *_int4())
    only_w4 = {k: v for k, v in default_variants(OP, n_out=N, k_in=K).items() if k.endswith("_w4")}
    with pytest.raises(LaunchCheckError, match=r"no kernel for float weights was built \(this build has INT4"):
        _launched(only_w4, torch.zeros(N, K, dtype=torch.float16), None, None)


def test_malformed_int4_operands_get_clear_errors():
    x = torch.zeros(1, K, dtype=torch.float16)
    q, s, m = _int4()
    with pytest.raises(OperatorError, match=r"weight has shape \(48, 256\); expected \(48, 128\) \(packed INT4"):
        weight_operands(OP, x, torch.zeros(N, K, dtype=torch.uint8), s, m, N, K)
    with pytest.raises(OperatorError, match="came without group scales"):
        weight_operands(OP, x, q, None, None, N, K)
    with pytest.raises(OperatorError, match=r"scale has shape \(48, 16\) for K = 256.*G in \(32, 64, 128\)"):
        weight_operands(OP, x, q, torch.ones(N, 16, dtype=torch.float16), None, N, K)  # groups of 16
    with pytest.raises(OperatorError, match="offset has dtype torch.float32 but scale has torch.float16"):
        weight_operands(OP, x, q, s, m.float(), N, K)
    with pytest.raises(OperatorError, match="offsets belong to INT4"):
        weight_operands(OP, x, torch.zeros(N, K, dtype=torch.float16), None, m, N, K)
    with pytest.raises(OperatorError, match=r"fused_head_argmax: takes float or INT8 \(W8A16\) weights; got packed INT4"):
        weight_operands("fused_head_argmax", x, q, s, None, N, K, int4=False)

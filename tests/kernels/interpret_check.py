"""Run every Triton kernel under Triton's CPU interpreter and print its error against the FP64 oracle (JSON).

Run by test_interpreter.py in a subprocess with TRITON_INTERPRET=1 (the variable
must be set before Triton is imported). Not a test module itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402
import triton.runtime.interpreter as _interp  # noqa: E402

# Triton 3.6's interpreter converts 1-element scalar arrays with int(), which NumPy >= 2.4 refuses for
# arrays of one dimension; loops over runtime bounds need it. Shim only the interpreter, only here.
_orig_patch = _interp._patch_lang_tensor


def _patch(tensor, scope):
    _orig_patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


_interp._patch_lang_tensor = _patch

# Triton 3.6's interpreter re-patches triton.language (inspect.getmembers over its modules) at every call of a
# @triton.jit helper inside a kernel, although the launch running that kernel has already patched the same modules
# with the same interpreter builder, and restores them when it ends: about half the time of the interpreter checks
# (cProfile of a serve-pattern check: 150k re-patches for 174 launches). Patch once per launch: a helper
# call whose language modules the running launch has already patched reuses them; anything else (a launch, a helper
# seeing a module not yet patched) goes through Triton's own patching. The semantics the kernels run are unchanged.
_orig_patch_lang = _interp._patch_lang
_patched_langs: set[int] = set()  # id() of the language modules patched by the launch in progress


class _LaunchScope:
    """The launch's patch scope; restoring it (the launch's end) also forgets what it patched."""

    def __init__(self, scope):
        self._scope = scope

    def restore(self) -> None:
        self._scope.restore()
        _patched_langs.clear()


def _patch_lang_once(fn):
    langs = {id(v) for v in fn.__globals__.values() if _interp.inspect.ismodule(v) and v in (_interp.tl, _interp.tl.core)}
    if _patched_langs and langs <= _patched_langs:  # a helper inside a launch that patched these modules already
        return _interp._LangPatchScope()
    first = not _patched_langs
    scope = _orig_patch_lang(fn)
    _patched_langs.update(langs)
    return _LaunchScope(scope) if first else scope


_interp._patch_lang = _patch_lang_once

sys.path.insert(0, str(Path(__file__).parent))
import fp64_oracle as oracle  # noqa: E402

from edgekit.kernels import attention, linear, rmsnorm, rope, swiglu  # noqa: E402
from edgekit.kernels.rope import rope_frequencies  # noqa: E402
from edgekit.kernels.launch_rule import resolve_program  # noqa: E402
from edgekit.kernels.program_runner import device_properties  # noqa: E402
from edgekit.kernels.triton_backend import TritonOp, triton_ops  # noqa: E402
from edgekit.kernels.variants import default_variants, op_program  # noqa: E402


def main() -> None:
    torch.manual_seed(0)
    h = torch.float16
    ops = triton_ops()
    results = []

    def record(name, spec, got, want):
        tol = spec.tolerance_for("float16")
        got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
        ratio = max(oracle.within(g, w, tol.atol, tol.rtol)[1] for g, w in zip(got, want))
        results.append({"case": name, "ratio": ratio})

    x = torch.randn(3, 5, 96, dtype=h)
    w = torch.randn(96, dtype=h)
    record("rmsnorm (3,5,96)", rmsnorm.SPEC, ops["rmsnorm"](x, w, 1e-5), oracle.rmsnorm(x, w, 1e-5))
    gu = torch.randn(4, 2 * 80, dtype=h)
    record("swiglu (4,160)", swiglu.SPEC, ops["swiglu"](gu), oracle.swiglu(gu))

    for m in (1, 3, 37):  # a one-row decode call takes the GEMV kernel, more rows the GEMM
        xx = torch.randn(m, 64, dtype=h)
        W = (torch.randn(40, 64) * 0.125).to(h)
        b = torch.randn(40, dtype=h)
        record(f"linear M={m}", linear.LINEAR_SPEC, ops["linear"](xx, W, b), oracle.linear(xx, W, b))
        q8 = torch.randint(-128, 128, (40, 64), dtype=torch.int8)
        sc = torch.rand(40) * 0.002
        record(f"linear_w8a16 M={m}", linear.W8A16_SPEC, ops["linear_w8a16"](xx, q8, sc, b), oracle.linear_w8a16(xx, q8, sc, b))
        sm = torch.rand(64) + 0.5
        # W8A8 is held to its reference in the kernel's own FP32 arithmetic (see test_references)
        record(f"linear_w8a8 M={m}", linear.W8A8_SPEC, ops["linear_w8a8"](xx, q8.clamp(-127), sc, None, sm),
               linear.linear_w8a8_reference(xx.float(), q8.clamp(-127), sc, None, sm))

    # split-K GEMV: on the interpreter's pretend 8-SM device a K of 2032 (8 blocks of 256, the last one partial)
    # is split across programs whose FP32 partials a second launch of the same kernel sums
    # (M=3: a GEMV-only program, as planned for a batch-1 LM head, runs one row per program)
    for m in (1, 3):
        xx = torch.randn(m, 2032, dtype=h)
        q8 = torch.randint(-128, 128, (48, 2032), dtype=torch.int8)
        sc = torch.rand(48) * 0.002
        b = torch.randn(48, dtype=h)
        W = (torch.randn(48, 2032) * 0.03).to(h)
        gemv_only = {k: {f"{p}_gemv": default_variants(k, rows=1)[f"{p}_gemv"]}
                     for k, p in (("linear_w8a16", "w8a16"), ("linear", "linear"))}
        _, launches = resolve_program(op_program("linear_w8a16", gemv_only["linear_w8a16"]),
                                      {"x": xx, "weight": q8, "scale": sc, "bias": b}, {},
                                      device_properties(xx.device), lambda n, s, d: torch.empty(s))
        assert [ln.grid[2] > 1 for ln in launches] == [True, False], [ln.grid for ln in launches]
        record(f"linear_w8a16 split-K M={m}", linear.W8A16_SPEC,
               TritonOp("linear_w8a16", gemv_only["linear_w8a16"])(xx, q8, sc, b), oracle.linear_w8a16(xx, q8, sc, b))
        record(f"linear split-K M={m}", linear.LINEAR_SPEC, TritonOp("linear", gemv_only["linear"])(xx, W, None),
               oracle.linear(xx, W, None))

    for hq, hkv, d, t in ((4, 2, 16, 37), (3, 1, 64, 19)):
        q = torch.randn(2, hq, t, d, dtype=h)
        k, v = torch.randn(2, hkv, t, d, dtype=h), torch.randn(2, hkv, t, d, dtype=h)
        sl = torch.tensor([t, t // 2 + 1])
        record(f"attention_prefill GQA {hq // hkv} d{d} T{t}", attention.PREFILL_SPEC,
               ops["attention_prefill"](q, k, v, sl, None), oracle.attention_prefill(q, k, v, sl))
        s = 3 * t + 2
        qd = torch.randn(2, hq, d, dtype=h)
        kc, vc = torch.randn(2, hkv, s, d, dtype=h), torch.randn(2, hkv, s, d, dtype=h)
        sl = torch.tensor([s, 7])
        record(f"attention_decode GQA {hq // hkv} d{d} S{s}", attention.DECODE_SPEC,
               ops["attention_decode"](qd, kc, vc, sl, None), oracle.attention_decode(qd, kc, vc, sl))

    B, T, C, hq, hkv, d = 2, 7, 32, 4, 2, 16
    xr = torch.randn(B, T, C, dtype=h)
    wq = (torch.randn((hq + 2 * hkv) * d, C) * 0.2).to(h)
    bq = torch.randn((hq + 2 * hkv) * d, dtype=h)
    cos, sin = rope_frequencies(d, T, 10000.0)
    cos, sin = cos[None].expand(B, T, -1), sin[None].expand(B, T, -1)  # stride 0 over the batch, as in prefill
    record("qkv_rope (2,7,32) d16", rope.QKV_ROPE_SPEC, ops["qkv_rope"](xr, wq, bq, cos, sin, hq, hkv),
           oracle.qkv_rope(xr, wq, bq, cos, sin, hq, hkv))
    qkv = torch.randn(B, T, (hq + 2 * hkv) * d, dtype=h)
    record("rope (2,7,128) d16", rope.ROPE_SPEC, ops["rope"](qkv, cos, sin, hq, hkv), oracle.rope(qkv, cos, sin, hq, hkv))
    print(json.dumps(results))


if __name__ == "__main__":
    main()

"""Plugins made from really compiled Triton kernels (kernels/aot.py, cross-compiled on the CPU).

The CPU tests check that the plugin schema accepts what the compiler produces
and hands the launcher what it reads; the GPU tests load the verified plugin
with the launcher and run its golden vectors on the GPU (cubin for the local
arch; the sm_87 PTX JIT-compiled on a newer GPU).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from edgekit.bundle.golden import check_case, golden_to_bytes, make_case, read_golden
from edgekit.bundle.plugin import pack_plugin, plugin_from_compiled, verify_plugin_package


def _compiled_rmsnorm(arch: int, hidden: int = 576):
    aot = pytest.importorskip("edgekit.kernels.aot")
    from edgekit.kernels.variants import default_variants, op_program

    variants = default_variants("rmsnorm", dtype="fp16", hidden=hidden)
    compiled = {k: aot.compile_variant(v, arch, with_ptxas_stats=False) for k, v in variants.items()}
    return compiled, op_program("rmsnorm", variants, aot=True)


def _golden(hidden: int = 576, rows: int = 32) -> bytes:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, hidden, generator=g).half()  # (T, C)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).half()  # (C,)
    return golden_to_bytes("rmsnorm", [make_case("rmsnorm", {"x": x, "weight": w}, {"eps": 1e-5}, name=f"t{rows}", seed=0, bucket=rows)])


@pytest.fixture(scope="module")
def orin_rmsnorm():
    return _compiled_rmsnorm(87)


def test_compiled_kernels_make_a_valid_signed_plugin(orin_rmsnorm, signing_key, public_key):
    compiled, program = orin_rmsnorm
    meta, files = plugin_from_compiled("rmsnorm", 1, compiled, program, _golden())
    (k,) = meta.kernels
    ck = compiled[k.kernel]
    assert (k.name, k.shared_bytes, k.num_warps) == (ck.name, ck.shared_bytes, ck.num_warps)
    assert set(files) == {"kernel.cubin", "kernel.ptx", "golden.safetensors"}
    vp = verify_plugin_package(pack_plugin(meta, files, signing_key), [public_key])
    assert vp.files["kernel.cubin"] == ck.cubin and vp.target_arch == "sm_87"


def test_loader_metadata_is_what_the_launcher_reads(orin_rmsnorm):
    launcher = pytest.importorskip("edgekit.kernels.launcher")
    compiled, program = orin_rmsnorm
    meta, _ = plugin_from_compiled("rmsnorm", 1, compiled, program, _golden())
    (k,) = meta.kernels
    lm = meta.loader_metadata(k.kernel)
    ck_meta = compiled[k.kernel].metadata()
    for key in ("name", "shared_bytes", "num_warps", "triton_version", "hidden_args", "global_scratch_size", "global_scratch_align", "arch"):
        assert lm[key] == ck_meta[key], key
    assert lm["signature"] == [list(p) for p in ck_meta["signature"]]
    src = inspect.getsource(launcher.LoadedKernel.from_metadata)
    assert all(f'meta["{key}"]' in src or f'meta.get("{key}"' in src for key in lm)


@pytest.mark.gpu
@pytest.mark.parametrize("build_arch", ["local", 87])
def test_plugin_golden_vectors_pass_on_the_gpu(build_arch, signing_key, public_key):
    """Cubin for this GPU's arch, and the Orin (sm_87) plugin through its PTX: both meet the FP64 golden tolerance."""
    from edgekit.runtime.gpu_runner import call_with_spec_order, load_plugin_op
    from edgekit.kernels.launcher import device_arch

    arch = device_arch() if build_arch == "local" else build_arch
    compiled, program = _compiled_rmsnorm(arch)
    meta, files = plugin_from_compiled("rmsnorm", 1, compiled, program, _golden())
    vp = verify_plugin_package(pack_plugin(meta, files, signing_key), [public_key])
    op = load_plugin_op(vp.metadata, vp.files.__getitem__, torch.device("cuda"))

    def run(op_name, inputs, attrs, plugin):
        out = call_with_spec_order(op, op_name, {k: v.cuda() for k, v in inputs.items()}, attrs)
        torch.cuda.synchronize()
        return out

    for case in read_golden(vp.golden).cases:
        verdict = check_case("rmsnorm", case, run)
        print(f"measured on GPU (sm_{device_arch()}), plugin built for sm_{arch}: {verdict.to_dict()}")
        assert verdict.ok, verdict
    op.unload()


@pytest.mark.gpu
def test_verify_bundle_runs_plugins_on_the_gpu(tmp_path, signing_key, public_key, monkeypatch):
    """The golden check launches the plugin's own kernels on CUDA tensors (its answers come back to the host: the
    check runs on a stream of its own, gpu_runner.on_own_stream, so the outputs it compares are host copies)."""
    from edgekit.bundle.manifest import Buckets, ModelIdentity, Target
    from edgekit.bundle.verify import verify_bundle
    from edgekit.bundle.writer import BundleWriter
    from edgekit.kernels import launcher
    from edgekit.kernels.launcher import device_arch
    from edgekit.runtime.gpu_runner import plugin_runner

    arch = device_arch()
    compiled, program = _compiled_rmsnorm(arch)
    with BundleWriter(tmp_path / "b") as w:
        w.add_plugin(*plugin_from_compiled("rmsnorm", 1, compiled, program, _golden()))
        w.add_bytes("golden/rmsnorm.safetensors", _golden(rows=64))
        w.finish(key=signing_key, target=Target(name="gpu", arch=arch), model=ModelIdentity(name="m", source_kind="preset"),
                 plan={}, precision={"rmsnorm": "fp16"}, buckets=Buckets(prompt_lengths=(32, 64), max_seq_len=64, batch=1))
    seen = []
    launch = launcher.PluginOp.__call__

    def spy(self, *args):
        seen.append(next(a.device.type for a in args if isinstance(a, torch.Tensor)))
        return launch(self, *args)

    monkeypatch.setattr(launcher.PluginOp, "__call__", spy)
    report = verify_bundle(tmp_path / "b", [public_key], runner_for_root=plugin_runner)
    assert report.ok, [c.to_dict() for c in report.failures]
    assert seen == ["cuda", "cuda"]  # the plugin's golden case and the model-level one, both on the plugin's kernels

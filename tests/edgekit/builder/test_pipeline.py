"""`edgekit build` end to end on the CPU: a signed bundle that verifies, runs, and rebuilds identically."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from edgekit.builder import BuildOptions, build_bundle
from edgekit.bundle.keys import development_key
from edgekit.bundle.verify import verify_bundle
from edgekit.errors import BundleError
from edgekit.generate import Generator
from edgekit.model.loader import load_model
from edgekit.runtime.bundle_runtime import open_bundle


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("build")
    opts = BuildOptions(model="preset:tiny", target="orin", out=d / "bundle", dev_key=True, precision="fp16",
                        context=128, buckets=(16, 64), cache_dir=d / "cache")
    return build_bundle(opts), opts


def test_bundle_has_every_part_and_verifies(tiny_bundle):
    result, _ = tiny_bundle
    files = set(result.manifest.files)
    for must in ("weights/model.safetensors", "plan.json", "onnx/model.onnx"):
        assert must in files
    ops = {p.op for p in result.manifest.plugins}
    assert {"rmsnorm", "qkv_rope", "attention_prefill", "attention_decode", "linear", "swiglu"} <= ops
    for op in ops:
        assert f"plugins/{op}/1/golden.safetensors" in files and f"plugins/{op}/1/kernel.ptx" in files or \
            any(f.startswith(f"plugins/{op}/1/") and f.endswith(".ptx") for f in files)
    # every shared-memory figure is from a kernel compiled for sm_87 and within the budget
    assert all(o["arch"] == "sm_87" and o["shared_bytes"] <= 131072 for o in result.summary["operators"])
    report = verify_bundle(result.out, [development_key().public_key], allow_dev_key=True)
    assert report.ok, [c.to_dict() for c in report.failures]


def test_the_fused_decode_operators_ship_as_signed_plugins_that_verify(tiny_bundle):
    from edgekit.graph.builder import LinearSchemes
    from edgekit.graph.paths import fused_step_operators
    from edgekit.model.presets import preset_config

    result, _ = tiny_bundle
    cfg = preset_config("tiny")
    own = fused_step_operators(cfg, LinearSchemes.uniform(cfg.n_layers))  # the Llama family's fused operators
    plan = json.loads((result.out / "plan.json").read_bytes())
    assert plan["decode"]["path"]["path"] == "fused" and set(plan["decode"]["path"]["operators"]) == set(own)
    shipped = {p.op: p for p in result.manifest.plugins}
    for op in own:
        assert op in shipped, f"{op} is not a plugin of the bundle"
        kernels = [o for o in result.summary["operators"] if o["op"] == op]
        assert kernels and all(o["arch"] == "sm_87" and o["shared_bytes"] <= 131072 for o in kernels)
        assert {o["kernel"] for o in kernels} == {t["kernel"] for t in plan["tiles"] if t["op"] == op}  # the plan's variants
    report = verify_bundle(result.out, [development_key().public_key], allow_dev_key=True)
    for op in own:
        plugin = [c for c in report.checks if c.check == "plugin" and c.file == f"{shipped[op].path}/plugin.json"]
        golden = [c for c in report.checks if c.check == "golden" and c.file.startswith(f"{shipped[op].path}/golden")]
        assert plugin and plugin[0].status == "pass"
        assert golden and all(c.status == "pass" for c in golden), [c.to_dict() for c in golden]


def test_rebuild_is_deterministic_and_uses_the_cache(tiny_bundle, tmp_path):
    result, opts = tiny_bundle
    again = build_bundle(BuildOptions(**{**vars(opts), "out": tmp_path / "again"}))
    assert {k: v.sha256 for k, v in again.manifest.files.items()} == {k: v.sha256 for k, v in result.manifest.files.items()}
    assert (again.out / "manifest.json").read_bytes() == (result.out / "manifest.json").read_bytes()
    assert "onnx" in again.summary["cache"]["hits"]


def test_a_build_prunes_the_cache_to_its_limit_but_keeps_what_it_used(tiny_bundle, tmp_path, monkeypatch):
    from edgekit.cache import BuildCache

    _, opts = tiny_bundle
    older = BuildCache(opts.cache_dir)
    older.put("golden", "f" * 64, {"golden.safetensors": b"an older build's entry"})
    monkeypatch.setenv("EDGEKIT_CACHE_MAX_GB", "0")  # nothing beyond what this build uses
    pruned = build_bundle(BuildOptions(**{**vars(opts), "out": tmp_path / "pruned"})).summary["cache"]["pruned"]
    assert pruned["removed"] >= 1 and pruned["limit_bytes"] == 0
    assert not older._entry("golden", "f" * 64).exists(), pruned
    again = build_bundle(BuildOptions(**{**vars(opts), "out": tmp_path / "again"}))
    assert not again.summary["cache"]["misses"], again.summary["cache"]  # every stage this build needs was kept


def test_bundle_runs_the_same_tokens_as_the_reference_model(tiny_bundle):
    result, _ = tiny_bundle
    b = open_bundle(result.out, [], allow_dev_key=True, device="cpu")
    prompt = [5, 9, 200, 31, 77, 4]
    out, _ = Generator(b.decoder(), b.shapes).generate(prompt, 12)
    # the reference: the preset's weights rounded to FP16 (what the bundle stores), on the reference ops in FP32
    m = load_model("preset:tiny")
    ref_weights = m.weights.to(dtype=torch.float16).to(dtype=torch.float32)
    from edgekit.model.decoder import Decoder

    ref, _ = Generator(Decoder(m.config, ref_weights), b.shapes).generate(prompt, 12)
    assert out == ref


def test_existing_output_and_missing_key_are_refused(tiny_bundle, tmp_path):
    result, opts = tiny_bundle
    with pytest.raises(BundleError, match="already exists"):
        build_bundle(BuildOptions(**{**vars(opts), "out": result.out}))
    with pytest.raises(BundleError, match="edgekit keys generate"):
        build_bundle(BuildOptions(**{**vars(opts), "out": tmp_path / "x", "dev_key": False}))


def test_allow_mixed_on_fp16_is_refused_before_the_model_loads(tmp_path):
    """--precision fp16 --allow-mixed built an FP16 bundle, exit 0, the flag dropped without a word (fp16 has no
    accuracy gate to fail). The model path does not exist: the refusal comes before anything reads it."""
    opts = BuildOptions(model=str(tmp_path / "missing.gguf"), target="orin", out=tmp_path / "b", dev_key=True,
                        precision="fp16", allow_mixed=True, cache_dir=tmp_path / "cache")
    with pytest.raises(BundleError, match="--allow-mixed acts when the accuracy gate fails") as e:
        build_bundle(opts)
    assert "--precision int8, w8a8 or int4" in e.value.hint
    assert not (tmp_path / "b").exists() and not (tmp_path / "cache").exists()


def test_force_is_refused_before_any_work_where_it_would_delete_a_users_directory(tiny_bundle, tmp_path):
    _, opts = tiny_bundle
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_bytes(b"keep me")
    cache = tmp_path / "cache-untouched"
    with pytest.raises(BundleError, match="not an edgekit bundle"):
        build_bundle(BuildOptions(**{**vars(opts), "out": precious, "force": True, "cache_dir": cache}))
    assert (precious / "notes.txt").read_bytes() == b"keep me"
    assert not cache.exists()  # refused before the model was loaded or anything compiled


def test_an_existing_archive_is_refused_before_the_build_and_only_a_bundle_archive_is_replaced(tiny_bundle, tmp_path):
    _, opts = tiny_bundle
    (tmp_path / "b.tar").write_bytes(b"someone's file")
    with pytest.raises(BundleError, match="b.tar already exists"):
        build_bundle(BuildOptions(**{**vars(opts), "out": tmp_path / "b", "archive": True}))
    with pytest.raises(BundleError, match="not an edgekit bundle archive"):
        build_bundle(BuildOptions(**{**vars(opts), "out": tmp_path / "b", "archive": True, "force": True}))
    assert not (tmp_path / "b").exists() and (tmp_path / "b.tar").read_bytes() == b"someone's file"
    (tmp_path / "b.tar").unlink()
    first = build_bundle(BuildOptions(**{**vars(opts), "out": tmp_path / "b", "archive": True}))
    again = build_bundle(BuildOptions(**{**vars(opts), "out": tmp_path / "b", "archive": True, "force": True}))
    assert first.summary["archive"] == again.summary["archive"] == str(tmp_path / "b.tar")
    versioned = build_bundle(BuildOptions(**{**vars(opts), "out": tmp_path / "m-v1.2", "archive": True}))
    assert versioned.summary["archive"] == str(tmp_path / "m-v1.2.tar")  # not m-v1.tar


def test_run_refuses_a_tampered_bundle(tiny_bundle, tmp_path):
    import shutil

    result, _ = tiny_bundle
    bad = tmp_path / "bad"
    shutil.copytree(result.out, bad)
    w = bad / "weights" / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    r = subprocess.run([sys.executable, "-m", "edgekit", "run", str(bad), "--allow-dev-key", "-p", "hi", "-n", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "weights/model.safetensors" in r.stderr and "Traceback" not in r.stderr


def test_cli_build_json_and_run(tmp_path):
    out = tmp_path / "cli-bundle"
    r = subprocess.run([sys.executable, "-m", "edgekit", "build", "preset:tiny", "--target", "orin", "--dev-key",
                        "--precision", "fp16", "--context", "64", "--buckets", "16,32", "-o", str(out), "--json", "--no-onnx"],
                       capture_output=True, text=True, timeout=600, env={**__import__("os").environ, "EDGEKIT_CACHE_DIR": str(tmp_path / "c")})
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["target"]["arch"] == "sm_87" and s["buckets"] == [16, 32] and s["signed_with_dev_key"] is True
    assert s["build_measured_on"] == "cpu"  # edgekit.measured_on's vocabulary, as every command writes it
    r = subprocess.run([sys.executable, "-m", "edgekit", "run", str(out), "--allow-dev-key", "-p", "hello", "-n", "3", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert len(d["token_ids"]) == 3 and d["backend"] == "reference"
    assert d["stats"]["measured_on"] == "cpu"  # the word generate, eval, quantize and serve write (it said a sentence)
    assert d["decode_path"]["path"] == "per-operator" and "no GPU" in d["decode_path"]["reason"]
    r = subprocess.run([sys.executable, "-m", "edgekit", "run", str(out), "--allow-dev-key", "-p", "hello", "-n", "3",
                        "--decode-path", "giant"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "--decode-path" in r.stderr and "fused, per-operator" in r.stderr


def test_the_bundled_onnx_matches_the_reference_logits(tiny_bundle):
    """The bundle's own model.onnx (FP16, the bundle's weights) run by onnxruntime vs the torch reference."""
    from edgekit.export import check_parity

    result, _ = tiny_bundle
    b = open_bundle(result.out, [], allow_dev_key=True, device="cpu", golden=False)
    bucket = result.summary["onnx"]["bucket"]
    tokens = torch.zeros(1, bucket, dtype=torch.long)
    tokens[0, :10] = torch.arange(3, 13)
    parity = check_parity(b.config, b.weights, result.out / "onnx" / "model.onnx", tokens, torch.tensor([10]), dtype="float16")
    assert parity.max_abs_diff <= parity.tolerance, parity
    assert parity.ok and parity.argmax_equal

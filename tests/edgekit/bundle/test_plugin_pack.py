"""`edgekit plugin pack|list|show`: a bundle's compiled plugin becomes a signed package a device accepts;
bytes the bundle did not sign, or kernels for another GPU, are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edgekit.builder import BuildOptions, build_bundle
from edgekit.bundle.keys import development_key, generate_keypair, load_public_key, load_signing_key
from edgekit.bundle.plugin import verify_plugin_package
from edgekit.bundle.plugin_pack import describe_bundle, describe_package, pack_from_bundle
from edgekit.errors import BundleError, VerificationError


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("pack")
    opts = BuildOptions(model="preset:tiny", target="orin", out=d / "bundle", dev_key=True, precision="fp16",
                        context=128, buckets=(16, 64), cache_dir=d / "cache")
    return build_bundle(opts).out


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    priv, pub = generate_keypair(tmp_path_factory.mktemp("keys"))
    return load_signing_key(priv), load_public_key(pub)


def edgekit(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra} if env_extra else None
    return subprocess.run([sys.executable, "-m", "edgekit", *args], capture_output=True, text=True, timeout=300, env=env)


def test_packed_plugin_verifies_with_the_new_version_and_the_bundles_kernels(bundle, keys):
    signer, public = keys
    meta, data = pack_from_bundle(bundle, "rmsnorm", version=7, key=signer, description="renumbered")
    vp = verify_plugin_package(data, [public])
    assert (vp.op, vp.version, vp.target_arch, vp.metadata.description) == ("rmsnorm", 7, "sm_87", "renumbered")
    ptx = (bundle / "plugins" / "rmsnorm" / "1" / "kernel.ptx").read_bytes()
    assert vp.files["kernel.ptx"] == ptx  # the bundle's own compiled code, unchanged
    row = describe_package(data, name="p.tar", trusted_keys=[public])
    assert row["signature"].startswith("verified") and row["version"] == 7
    assert describe_package(data, name="p.tar")["signature"].startswith("not checked")


def test_a_file_changed_after_the_build_is_refused(bundle, tmp_path):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    ptx = copy / "plugins" / "rmsnorm" / "1" / "kernel.ptx"
    ptx.write_bytes(ptx.read_bytes().replace(b".version", b".version ", 1))
    with pytest.raises(VerificationError, match="does not match the bundle's manifest"):
        pack_from_bundle(copy, "rmsnorm", version=2, key=development_key())


def test_kernels_for_another_gpu_and_unknown_operators_are_refused(bundle):
    with pytest.raises(BundleError, match="compiled for sm_87, the target is sm_90"):
        pack_from_bundle(bundle, "rmsnorm", version=2, key=development_key(), target_arch=90)
    with pytest.raises(BundleError, match="no plugin nope"):
        pack_from_bundle(bundle, "nope", version=2, key=development_key())


def test_list_and_show_a_bundle(bundle):
    ops = {r["op"] for r in describe_bundle(bundle)}
    assert {"rmsnorm", "swiglu", "linear", "attention_decode"} <= ops
    r = edgekit("plugin", "list", str(bundle), "--json")
    assert r.returncode == 0, r.stderr
    assert {row["op"] for row in json.loads(r.stdout)} == ops
    # the table names the kernels' dtype as what it is: an INT8 bundle's plugins say fp16 there, their activations
    table = edgekit("plugin", "list", str(bundle), env_extra={"COLUMNS": "400"}).stdout
    assert " activations " in table and " precision " not in table
    r = edgekit("plugin", "show", str(bundle), "rmsnorm")
    shown = json.loads(r.stdout)
    assert shown["version"] == 1 and shown["metadata"]["kernels"][0]["kernel"] == "rmsnorm_fwd"
    r = edgekit("plugin", "show", str(bundle))
    assert r.returncode == 2 and "which operator" in r.stderr and "rmsnorm" in r.stderr


def test_pack_command_writes_a_package_and_refuses_to_overwrite(bundle, tmp_path):
    out = tmp_path / "rmsnorm-v2.tar"
    r = edgekit("plugin", "pack", "rmsnorm", "--bundle", str(bundle), "--version", "2", "--dev-key", "-o", str(out),
                "--target", "orin", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert (info["op"], info["version"], info["arch"]) == ("rmsnorm", 2, "sm_87") and out.stat().st_size == info["bytes"]
    r = edgekit("plugin", "pack", "rmsnorm", "--bundle", str(bundle), "--version", "3", "--dev-key", "-o", str(out))
    assert r.returncode == 2 and "already exists" in r.stderr
    r = edgekit("plugin", "pack", "rmsnorm", "--bundle", str(bundle), "--version", "3", "-o", str(tmp_path / "x.tar"))
    assert r.returncode == 2 and "no signing key" in r.stderr


# ---- --kernel-source: the operator compiled from a developer's edited kernel file ------------------------

def kernel_file(tmp_path, name: str, old: str = "", new: str = "", op: str = "rmsnorm"):
    """A copy of the shipped kernels/<op>_triton.py, with one edit (``old`` must occur in it)."""
    from pathlib import Path

    from edgekit.kernels.registry import operator

    text = Path(operator(op).kernels.kernels[0].fn.fn.__code__.co_filename).read_text()
    if old:
        assert old in text
        text = text.replace(old, new, 1)
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_kernel_source_packs_at_the_bundles_tiles_verifies_and_installs(bundle, keys, tmp_path):
    from edgekit.builder.kernel_source import pack_from_kernel_source
    from edgekit.runtime.bundle_runtime import open_bundle
    from edgekit.runtime.serving import open_store

    signer, public = keys
    # An edit that changes the generated code, not the math: the package must carry this file's compile.
    source = kernel_file(tmp_path, "rmsnorm_fast.py", "(x * rstd * w)", "(x * w * rstd)")
    meta, data = pack_from_kernel_source(bundle, "rmsnorm", source, version=2, key=signer)
    vp = verify_plugin_package(data, [public])
    shipped = json.loads((bundle / "plugins" / "rmsnorm" / "1" / "plugin.json").read_bytes())
    assert (vp.op, vp.version, vp.target_arch) == ("rmsnorm", 2, "sm_87")
    assert [(k.kernel, dict(k.constexprs), k.num_warps, k.num_stages) for k in vp.metadata.kernels] == [
        (k["kernel"], k["constexprs"], k["num_warps"], k["num_stages"]) for k in shipped["kernels"]]  # the plan's tiles
    assert vp.metadata.model_dump(mode="json")["launch"] == shipped["launch"]
    assert vp.files["kernel.ptx"] != (bundle / "plugins" / "rmsnorm" / "1" / "kernel.ptx").read_bytes()
    # golden vectors: the FP64 reference at the bundle's config and shapes, exactly as the build wrote them
    assert vp.files["golden.safetensors"] == (bundle / "plugins" / "rmsnorm" / "1" / "golden.safetensors").read_bytes()

    opened = open_bundle(bundle, [], allow_dev_key=True, device="cpu")
    store = open_store(tmp_path / "store", opened, [public], allow_dev_key=False)
    store.install(data)
    assert store.pointer("rmsnorm").version == "2"


def test_pack_command_from_a_kernel_source_and_show_the_package(bundle, tmp_path):
    out = tmp_path / "rmsnorm-v2.tar"
    r = edgekit("plugin", "pack", "rmsnorm", "--kernel-source", str(kernel_file(tmp_path, "k.py")), "--bundle", str(bundle),
                "--version", "2", "--dev-key", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert (json.loads(r.stdout)["op"], json.loads(r.stdout)["version"]) == ("rmsnorm", 2)
    r = edgekit("plugin", "show", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["metadata"]["description"].startswith("rmsnorm from k.py for sm_87")


@pytest.mark.parametrize("edit, message", [
    ({"old": "OP = OpKernels(", "new": "NOT_AN_OP = dict("}, "declares no OpKernels for operator 'rmsnorm' (it declares: none)"),
    ({"op": "swiglu"}, "declares no OpKernels for operator 'rmsnorm' (it declares: swiglu)"),
    ({"old": "tl.sum(x * x, axis=0)", "new": "tl.sum(x * not_defined, axis=0)"},
     "Triton failed to compile rmsnorm_fwd"),
])
def test_pack_command_refuses_a_bad_kernel_source_in_one_line(bundle, tmp_path, edit, message):
    source = kernel_file(tmp_path, "bad.py", **edit)
    r = edgekit("plugin", "pack", "rmsnorm", "--kernel-source", str(source), "--bundle", str(bundle), "--version", "2",
                "--dev-key", "-o", str(tmp_path / "x.tar"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line = " ".join(r.stderr.split())  # rich may wrap the one line on a narrow terminal
    assert f"--kernel-source {source}" in line and message in line, r.stderr
    assert not (tmp_path / "x.tar").exists()


def test_pack_of_a_kernel_source_one_percent_off_is_refused_before_anything_is_signed(bundle, tmp_path):
    """On a host without a GPU the golden check runs the torch reference; pack runs the kernel itself, under
    Triton's interpreter, on the package's golden vectors (issue 33: `* 1.01` packed and uploaded)."""
    source = kernel_file(tmp_path, "off.py", "(x * rstd * w)", "(x * rstd * w * 1.01)")
    out = tmp_path / "rmsnorm-v2.tar"
    r = edgekit("plugin", "pack", "rmsnorm", "--kernel-source", str(source), "--bundle", str(bundle), "--version", "2",
                "--dev-key", "-o", str(out))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line = " ".join(r.stderr.split())
    assert f"--kernel-source {source}: rmsnorm is wrong in" in line and "run under Triton's interpreter" in line, line
    assert "outside tolerance" in line and "nothing was signed" in line
    assert not out.exists()


def test_plugin_list_of_a_package_takes_the_trust_flag_its_table_suggests(bundle, tmp_path):
    """The signature column said "pass --trust PUBFILE", which `plugin list` refused as an unknown option."""
    from edgekit.bundle.plugin_pack import pack_from_bundle

    priv, pub = generate_keypair(tmp_path / "keys")
    _, data = pack_from_bundle(bundle, "rmsnorm", version=2, key=load_signing_key(priv))
    package = tmp_path / "rmsnorm-v2.tar"
    package.write_bytes(data)
    r = edgekit("plugin", "list", str(package), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["signature"] == "not checked (pass --trust PUBFILE)"
    r = edgekit("plugin", "list", str(package), "--trust", str(pub), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["signature"].startswith("verified (key ")


def test_plugin_show_of_a_package_refuses_an_operator_it_does_not_hold(bundle, tmp_path):
    """`plugin show rmsnorm-v2.tar swiglu` printed the rmsnorm plugin, exit 0: OP was ignored for a package."""
    package = tmp_path / "rmsnorm-v2.tar"
    package.write_bytes(pack_from_bundle(bundle, "rmsnorm", version=2, key=development_key())[1])
    r = edgekit("plugin", "show", str(package), "swiglu")
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert "holds rmsnorm, not 'swiglu'" in r.stderr and "Traceback" not in r.stderr
    r = edgekit("plugin", "show", str(package), "rmsnorm")  # its own operator, named: shown as before
    assert r.returncode == 0 and json.loads(r.stdout)["op"] == "rmsnorm", r.stderr


def test_pack_refuses_a_version_no_device_admits(bundle, tmp_path):
    """--version 99999999999999999999 was signed and written (exit 0); every store and `publish` then refused the
    package as 'not a non-negative integer'. Refused at pack now, nothing written; the largest admitted one packs."""
    from edgekit.bundle.plugin_identity import MAX_VERSION_PART, canonical_version

    out = tmp_path / "p.tar"
    for version in (MAX_VERSION_PART + 1, 10**20):
        r = edgekit("plugin", "pack", "rmsnorm", "--bundle", str(bundle), "--version", str(version), "--dev-key",
                    "-o", str(out))
        assert r.returncode == 2 and f"above {MAX_VERSION_PART}" in r.stderr and not out.exists(), r.stderr
    r = edgekit("plugin", "pack", "rmsnorm", "--bundle", str(bundle), "--version", str(MAX_VERSION_PART), "--dev-key",
                "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert canonical_version(json.loads(r.stdout)["version"]) == str(MAX_VERSION_PART)


def test_plugin_list_and_show_say_a_missing_path_is_not_found(tmp_path):
    """`plugin list MISSING` said 'MISSING is not a bundle, a plugin store or a plugin package': it is not there."""
    for command in ("list", "show"):
        r = edgekit("plugin", command, str(tmp_path / "rmsnorm-v2.tar"))
        assert r.returncode == 2 and f"{tmp_path / 'rmsnorm-v2.tar'} not found" in r.stderr, r.stderr

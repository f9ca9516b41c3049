"""Plugin metadata schema (ranges, consistency) and signed plugin packages (pack / verify)."""

from __future__ import annotations

import copy
import io
import json
import tarfile

import pytest
from bundle_builders import ARCH, fake_cubin, fake_ptx, rmsnorm_metadata, rmsnorm_plugin_files

from edgekit.bundle.archive import tar_bytes
from edgekit.bundle.canonical import canonical_json
from edgekit.bundle.keys import development_key
from edgekit.bundle.plugin import (
    PluginMetadata,
    check_operator_compat,
    pack_plugin,
    parse_plugin_metadata,
    verify_plugin_package,
)
from edgekit.errors import VerificationError


def _meta(**over) -> PluginMetadata:
    d = rmsnorm_metadata()
    d.update(over)
    return PluginMetadata.model_validate(d)


def _parse(doc: dict) -> PluginMetadata:
    return parse_plugin_metadata(canonical_json(doc))


def test_metadata_round_trip():
    m = _meta()
    assert parse_plugin_metadata(m.to_bytes()) == m
    assert m.target_arch == "sm_87"
    assert m.file_names() == ["golden.safetensors", "kernel.cubin", "kernel.ptx", "plugin.json"]


def _with_kernel(**k) -> dict:
    d = rmsnorm_metadata()
    d["kernels"][0].update(k)
    return d


@pytest.mark.parametrize(
    "doc, field",
    [
        (_with_kernel(num_warps=3), "num_warps 3 is not one of"),
        (_with_kernel(num_warps=32), "num_warps 32"),
        (_with_kernel(shared_bytes=-1), "shared_bytes"),
        (_with_kernel(shared_bytes=232449), "shared_bytes"),
        (_with_kernel(shared_bytes=200_000), "exceeds sm_87's 166912"),  # fits H200, not Orin
        (_with_kernel(num_stages=0), "num_stages"),
        (_with_kernel(signature=[["x", "*fp16"], ["n", "int"]]), "not one the launcher passes"),
        (_with_kernel(signature=[["x", "*fp16"], ["x", "i32"]]), "duplicate parameter names"),
        (_with_kernel(signature=["*fp16"]), "signature"),
        (_with_kernel(global_scratch_align=3), "power of two"),
        (_with_kernel(registers=300), "registers"),
        (_with_kernel(name="bad symbol"), "name"),
        (_with_kernel(cubin="../kernel.cubin"), "cubin"),
        (_with_kernel(cubin="kernel.ptx"), "cubin"),
        ({**rmsnorm_metadata(), "hidden_args": 5}, "hidden_args"),
        ({**rmsnorm_metadata(), "hidden_args": 1}, "does not match Triton 3.6"),
        ({**rmsnorm_metadata(), "triton_version": "2.1.0", "hidden_args": 1}, "no known kernel ABI"),
        ({**rmsnorm_metadata(), "triton_version": "three"}, "triton_version"),
        ({**rmsnorm_metadata(), "arch": 75}, "sm_75 is not one of the known"),
        ({**rmsnorm_metadata(), "op": "RMSNorm"}, "op"),
        ({**rmsnorm_metadata(), "version": 0}, "version"),
        ({**rmsnorm_metadata(), "abi_version": 0}, "abi_version"),
        ({**rmsnorm_metadata(), "version": "1"}, "version"),  # strict: no "1" -> 1
        ({**rmsnorm_metadata(), "format_version": 2}, "format_version 2 is not supported"),
        ({**rmsnorm_metadata(), "kernels": []}, "kernels"),
        ({**rmsnorm_metadata(), "surprise": True}, "surprise"),
    ],
)
def test_attack_plugin_metadata_out_of_range_is_refused(doc, field):
    with pytest.raises(VerificationError, match="schema") as e:
        _parse(doc)
    assert field in str(e.value)
    assert e.value.file == "plugin.json"


def _with_launch(mutate) -> dict:
    d = rmsnorm_metadata()
    d["launch"] = copy.deepcopy(d["launch"])
    mutate(d["launch"])
    return d


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda p: p["launches"][0]["args"].pop(), "takes 6 arguments, the rule passes 5"),
        (lambda p: p["launches"][0].update(kernel="other"), "not in the plugin"),
        (lambda p: p["launches"][0].update(grid=[1, 1]), "3 dimensions"),
        (lambda p: p["launches"][0]["grid"].__setitem__(0, {"shape": ["nope", 0]}), "unknown tensor"),
        (lambda p: p["launches"][0]["grid"].__setitem__(0, {"python": "__import__('os')"}), "unknown expression"),
        (lambda p: p.update(op="swiglu"), "launch program is for op 'swiglu'"),
    ],
)
def test_attack_malformed_launch_rule_is_refused(mutate, reason):
    with pytest.raises(VerificationError, match="launch") as e:
        _parse(_with_launch(mutate))
    assert reason in str(e.value)


def test_attack_duplicate_kernel_files_are_refused():
    d = rmsnorm_metadata()
    second = dict(d["kernels"][0], kernel="rmsnorm_fwd2")
    d["kernels"].append(second)
    with pytest.raises(VerificationError, match="appears twice"):
        _parse(d)


def test_operator_compat_refuses_unknown_op_and_abi():
    check_operator_compat(_meta())
    with pytest.raises(VerificationError, match="ABI 2"):
        check_operator_compat(_meta(abi_version=2))


# ---- packages -----------------------------------------------------------------


@pytest.fixture()
def package(signing_key) -> bytes:
    return pack_plugin(_meta(version=2), rmsnorm_plugin_files(), signing_key)


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf.getmembers()}


def test_package_round_trip(package, public_key, signing_key):
    vp = verify_plugin_package(package, [public_key])
    assert (vp.op, vp.version, vp.target_arch, vp.abi_version, vp.triton_abi) == ("rmsnorm", 2, "sm_87", 1, "3.6")
    assert vp.key_id == signing_key.key_id and not vp.dev_key
    assert set(vp.files) == {"plugin.json", "kernel.cubin", "kernel.ptx", "golden.safetensors"}
    assert vp.files["kernel.cubin"] == fake_cubin()


def test_package_is_deterministic(signing_key):
    a = pack_plugin(_meta(), rmsnorm_plugin_files(), signing_key)
    b = pack_plugin(_meta(), rmsnorm_plugin_files(), signing_key)
    assert a == b


@pytest.mark.parametrize("member", ["plugin.json", "kernel.cubin", "kernel.ptx", "golden.safetensors", "index.json"])
def test_attack_tampered_byte_in_any_member_is_refused(package, public_key, member):
    files = _members(package)
    blob = bytearray(files[member])
    blob[len(blob) // 2] ^= 0x01
    files[member] = bytes(blob)
    with pytest.raises(VerificationError) as e:
        verify_plugin_package(tar_bytes(files), [public_key])
    expected_file = "package.sig" if member == "index.json" else member
    assert e.value.file.endswith(expected_file)
    assert ("does not match" in e.value.reason) or ("sha256" in e.value.reason)


def test_attack_package_signed_by_untrusted_key_is_refused(other_key, public_key):
    data = pack_plugin(_meta(), rmsnorm_plugin_files(), other_key)
    with pytest.raises(VerificationError, match="not trusted") as e:
        verify_plugin_package(data, [public_key])
    assert e.value.file.endswith("package.sig")


def test_attack_dev_key_package_is_refused_unless_allowed(public_key):
    data = pack_plugin(_meta(), rmsnorm_plugin_files(), development_key())
    with pytest.raises(VerificationError, match="not trusted"):
        verify_plugin_package(data, [public_key])
    with pytest.raises(VerificationError, match="development key"):  # even if someone "trusts" it
        verify_plugin_package(data, [public_key, development_key().public_key])
    assert verify_plugin_package(data, [public_key], allow_dev_key=True).dev_key


def test_attack_extra_member_is_refused(package, public_key):
    files = _members(package)
    files["payload.so"] = b"\x7fELF evil"
    with pytest.raises(VerificationError, match="not listed in the signed index") as e:
        verify_plugin_package(tar_bytes(files), [public_key])
    assert e.value.file.endswith("payload.so")


def test_attack_missing_member_is_refused(package, public_key):
    files = _members(package)
    del files["kernel.ptx"]
    with pytest.raises(VerificationError, match="missing from the package") as e:
        verify_plugin_package(tar_bytes(files), [public_key])
    assert e.value.file.endswith("kernel.ptx")


def test_attack_missing_signature_is_refused(package, public_key):
    files = _members(package)
    del files["package.sig"]
    with pytest.raises(VerificationError, match="signed index"):
        verify_plugin_package(tar_bytes(files), [public_key])


def _raw_tar(add) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        add(tf)
    return buf.getvalue()


def _add(tf, name, data=b"x", **attrs):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in attrs.items():
        setattr(info, k, v)
    tf.addfile(info, io.BytesIO(data) if info.isreg() else None)


@pytest.mark.parametrize(
    "add, reason",
    [
        (lambda tf: _add(tf, "../kernel.cubin"), "'..'"),
        (lambda tf: _add(tf, "/etc/kernel.cubin"), "absolute"),
        (lambda tf: _add(tf, "kernel.cubin", b"", type=tarfile.SYMTYPE, linkname="/etc/passwd"), "symbolic link"),
        (lambda tf: _add(tf, "kernel.cubin", b"", type=tarfile.LNKTYPE, linkname="plugin.json"), "hard link"),
        (lambda tf: _add(tf, "dev", b"", type=tarfile.CHRTYPE), "device"),
        (lambda tf: (_add(tf, "plugin.json", b"a"), _add(tf, "plugin.json", b"b")), "duplicate"),
        (lambda tf: _add(tf, "sub/kernel.cubin"), "plain file names"),
    ],
)
def test_attack_unsafe_package_members_are_refused(add, reason, public_key):
    with pytest.raises(VerificationError, match=reason):
        verify_plugin_package(_raw_tar(add), [public_key])


def test_attack_oversized_package_is_refused(package, public_key):
    with pytest.raises(VerificationError, match="exceeds"):
        verify_plugin_package(package, [public_key], max_bytes=len(package) - 1)


def test_attack_garbage_is_refused(public_key):
    with pytest.raises(VerificationError, match="not a readable tar"):
        verify_plugin_package(b"\x00garbage" * 100, [public_key])


def _resigned(signing_key, mutate_index, mutate_files=None) -> bytes:
    """A version-2 package changed by a signer (an attacker holding a trusted key, or a buggy builder): the
    index is edited and signed again, so only the checks after the signature can refuse it."""
    files = _members(pack_plugin(_meta(version=2), rmsnorm_plugin_files(), signing_key))
    if mutate_files is not None:
        mutate_files(files)
    index = json.loads(files["index.json"])
    mutate_index(index, files)
    files["index.json"] = canonical_json(index)
    files["package.sig"] = signing_key.sign(files["index.json"])
    return tar_bytes(files)


def test_attack_index_and_metadata_disagree(signing_key, public_key):
    """A validly signed package whose signed index says version 3 but plugin.json says 2."""
    data = _resigned(signing_key, lambda index, files: index.update(version=3))
    with pytest.raises(VerificationError, match="version 2 differs from the signed index's 3"):
        verify_plugin_package(data, [public_key])


def test_ptx_for_another_arch_is_refused_at_pack_time(signing_key):
    files = rmsnorm_plugin_files()
    files["kernel.ptx"] = fake_ptx(arch=90)
    with pytest.raises(VerificationError, match="PTX targets sm_90, plugin.json says sm_87"):
        pack_plugin(_meta(), files, signing_key)


def test_ptx_without_the_declared_entry_point_is_refused(signing_key):
    files = rmsnorm_plugin_files()
    files["kernel.ptx"] = fake_ptx(symbol="something_else")
    with pytest.raises(VerificationError, match="no entry point 'rmsnorm_fwd_kernel'"):
        pack_plugin(_meta(), files, signing_key)


def test_golden_for_another_op_is_refused(signing_key):
    from edgekit.bundle.golden import golden_to_bytes, make_case
    import torch

    case = make_case("swiglu", {"gate_up": torch.randn(2, 8)}, {}, name="c", seed=0)
    files = {**rmsnorm_plugin_files(), "golden.safetensors": golden_to_bytes("swiglu", [case])}
    with pytest.raises(VerificationError, match="golden vectors are for op 'swiglu'"):
        pack_plugin(_meta(), files, signing_key)


def test_verified_plugin_satisfies_the_runtime_admission_protocol(package, public_key):
    policy = pytest.importorskip("edgekit.runtime.plugin_policy")
    vp = verify_plugin_package(package, [public_key])
    assert isinstance(vp, policy.VerifiedPluginLike)
    dp = policy.DevicePolicy(device_arch=f"sm_{ARCH}", known_abi={"rmsnorm": 1}, triton_abis={"3.6"})
    assert policy.admit(vp, dp, policy.OpState(active="1")) == "2"


# ---- issue 19: kernel files, limits at their edge ------------------------------------------------------------------


@pytest.mark.parametrize("cubin", [b"", b"ELF\x7f" + fake_cubin()[4:], b"\x7fEL", b"// PTX text\n.target sm_87\n"])
def test_attack_cubin_without_an_elf_header_is_refused(signing_key, cubin):
    files = {**rmsnorm_plugin_files(), "kernel.cubin": cubin}
    with pytest.raises(VerificationError, match="not a cubin \\(no ELF header\\)") as e:
        pack_plugin(_meta(), files, signing_key)
    assert e.value.file == "kernel.cubin"


def test_attack_signed_package_with_a_non_elf_cubin_is_refused(signing_key, public_key):
    """A trusted signer's build that shipped the wrong file as the cubin (checked again at verify time)."""
    import hashlib

    def list_the_new_cubin(index, files):
        cubin = files["kernel.cubin"]
        index["files"]["kernel.cubin"] = {"sha256": hashlib.sha256(cubin).hexdigest(), "size": len(cubin)}

    data = _resigned(signing_key, list_the_new_cubin, lambda files: files.update({"kernel.cubin": b"garbage, not ELF"}))
    with pytest.raises(VerificationError, match="no ELF header") as e:
        verify_plugin_package(data, [public_key])
    assert e.value.file == "package:kernel.cubin"


@pytest.mark.parametrize("ptx, message", [
    (b"// no target here\n.visible .entry rmsnorm_fwd_kernel(\n", "no .target directive"),
    (fake_ptx().replace(b".target sm_87", b".target sm_87a"), None),  # arch-specific suffix is the same arch
    (fake_ptx().replace(b".entry rmsnorm_fwd_kernel(", b".entry rmsnorm_fwd_kernel_2("), "no entry point"),
    (fake_ptx().replace(b".entry rmsnorm_fwd_kernel(", b".func rmsnorm_fwd_kernel("), "no entry point"),
])
def test_ptx_must_target_the_arch_and_define_the_entry(signing_key, ptx, message):
    files = {**rmsnorm_plugin_files(), "kernel.ptx": ptx}
    if message is None:
        pack_plugin(_meta(), files, signing_key)
        return
    with pytest.raises(VerificationError, match=message):
        pack_plugin(_meta(), files, signing_key)


def test_package_size_limit_holds_at_its_edge(package, public_key):
    assert verify_plugin_package(package, [public_key], max_bytes=len(package)).version == 2
    with pytest.raises(VerificationError, match=f"{len(package)} bytes exceeds the {len(package) - 1}-byte limit"):
        verify_plugin_package(package, [public_key], max_bytes=len(package) - 1)


def test_default_package_size_limit_is_64_mib(public_key):
    from edgekit.bundle.plugin import MAX_PACKAGE_BYTES

    assert MAX_PACKAGE_BYTES == 64 << 20
    with pytest.raises(VerificationError, match="exceeds the 67108864-byte limit"):
        verify_plugin_package(b"\0" * (MAX_PACKAGE_BYTES + 1), [public_key])
    with pytest.raises(VerificationError, match="not a readable tar"):  # at the limit: the size check lets it by
        verify_plugin_package(b"\1" * MAX_PACKAGE_BYTES, [public_key])


def test_package_member_count_limit_holds_at_its_edge(package, public_key):
    files = _members(package)
    padding = {f"pad{i:02}": b"" for i in range(64 - len(files))}
    with pytest.raises(VerificationError, match="not listed in the signed index"):  # 64 members: read, then refused
        verify_plugin_package(tar_bytes({**files, **padding}), [public_key])
    with pytest.raises(VerificationError, match="more than 64 members"):
        verify_plugin_package(tar_bytes({**files, **padding, "pad_one_more": b""}), [public_key])


def test_attack_package_without_plugin_json_is_refused(signing_key, public_key):
    data = _resigned(signing_key, lambda index, files: index["files"].pop("plugin.json"),
                     lambda files: files.pop("plugin.json"))
    with pytest.raises(VerificationError, match="missing") as e:
        verify_plugin_package(data, [public_key])
    assert e.value.file == "package:plugin.json"


def test_attack_signed_index_that_does_not_follow_its_schema_is_refused(signing_key, public_key):
    for mutate in (lambda i, f: i.update(version="2"), lambda i, f: i["files"].update({"../x": i["files"]["plugin.json"]}),
                   lambda i, f: i["files"].update({"index.json": i["files"]["plugin.json"]}),
                   lambda i, f: i.update(version=0)):
        with pytest.raises(VerificationError, match="schema") as e:
            verify_plugin_package(_resigned(signing_key, mutate), [public_key])
        assert e.value.file == "package:index.json"


def test_attack_signed_member_of_the_wrong_size_is_refused(signing_key, public_key):
    def one_byte_more(index, files):
        index["files"]["kernel.cubin"]["size"] += 1

    with pytest.raises(VerificationError, match="the signed index says"):
        verify_plugin_package(_resigned(signing_key, one_byte_more), [public_key])


@pytest.mark.parametrize("field", ["op", "arch"])
def test_attack_index_and_metadata_disagree_on_op_or_arch(signing_key, public_key, field):
    data = _resigned(signing_key, lambda index, files: index.update({field: {"op": "swiglu", "arch": 90}[field]}))
    with pytest.raises(VerificationError, match=f"{field} .* differs from the signed index"):
        verify_plugin_package(data, [public_key])


def test_pack_refuses_files_that_do_not_match_the_metadata(signing_key):
    with pytest.raises(VerificationError, match=r"files missing \['kernel.ptx'\], unexpected \['other.bin'\]"):
        files = {**rmsnorm_plugin_files(), "other.bin": b"x"}
        del files["kernel.ptx"]
        pack_plugin(_meta(), files, signing_key)
    with pytest.raises(VerificationError, match="differs from the metadata object"):
        pack_plugin(_meta(), {**rmsnorm_plugin_files(), "plugin.json": _meta(version=5).to_bytes()}, signing_key)
    same = pack_plugin(_meta(), {**rmsnorm_plugin_files(), "plugin.json": _meta().to_bytes()}, signing_key)
    assert same == pack_plugin(_meta(), rmsnorm_plugin_files(), signing_key)


@pytest.mark.parametrize("doc, field", [
    (_with_kernel(num_warps=1), None), (_with_kernel(num_warps=16), None),
    (_with_kernel(num_stages=1), None), (_with_kernel(num_stages=8), None), (_with_kernel(num_stages=9), "num_stages"),
    (_with_kernel(shared_bytes=0), None), (_with_kernel(shared_bytes=166912), None),
    (_with_kernel(shared_bytes=166913), "exceeds sm_87's 166912"),
    (_with_kernel(global_scratch_size=0), None), (_with_kernel(global_scratch_size=1 << 30), None),
    (_with_kernel(global_scratch_size=(1 << 30) + 1), "global_scratch_size"),
    (_with_kernel(global_scratch_size=-1), "global_scratch_size"),
    (_with_kernel(global_scratch_align=1), None), (_with_kernel(global_scratch_align=4096), None),
    (_with_kernel(global_scratch_align=8192), "global_scratch_align"), (_with_kernel(global_scratch_align=0), "global_scratch_align"),
    (_with_kernel(registers=0), None), (_with_kernel(registers=255), None), (_with_kernel(registers=256), "registers"),
    (_with_kernel(registers=-1), "registers"),
    (_with_kernel(ptx_version=60), None), (_with_kernel(ptx_version=200), None),
    (_with_kernel(ptx_version=59), "ptx_version"), (_with_kernel(ptx_version=201), "ptx_version"),
    (_with_kernel(kernel="k" * 64), "is not in the plugin"), (_with_kernel(kernel="k" * 65), "at most 64 characters"),
    (_with_kernel(name="n" * 256), None), (_with_kernel(name="n" * 257), "at most 256 characters"),
    (_with_kernel(cubin="c" * 74 + ".cubin"), None), (_with_kernel(cubin="c" * 75 + ".cubin"), "at most 80 characters"),
    (_with_kernel(ptx="p" * 76 + ".ptx"), None), (_with_kernel(ptx="p" * 77 + ".ptx"), "at most 80 characters"),
    (_with_kernel(constexprs={"BLOCK_C": 1024, "1bad": 2}), "not an identifier"),
    (_with_kernel(precision={"in put": "fp16"}), "not an identifier"),
    (_with_kernel(spills={"stores": 0, "loads": 0}), None),
    (_with_kernel(signature=[["1x", "*fp16"]] + rmsnorm_metadata()["kernels"][0]["signature"][1:]), "not an identifier"),
    ({**rmsnorm_metadata(), "hidden_args": 0, "triton_version": "3.4.0"}, "does not match Triton 3.4"),
    ({**rmsnorm_metadata(), "hidden_args": -1}, "greater than or equal to 0"),
    ({**rmsnorm_metadata(), "hidden_args": 4}, "hidden_args 4 does not match Triton 3.6"),
    ({**rmsnorm_metadata(), "hidden_args": 5}, "less than or equal to 4"),
    ({**rmsnorm_metadata(), "version": 1}, None), ({**rmsnorm_metadata(), "abi_version": 1}, None),
    ({**rmsnorm_metadata(), "op": "r" * 64}, "launch program is for op"), ({**rmsnorm_metadata(), "op": "r" * 65}, "at most 64 characters"),
    ({**rmsnorm_metadata(), "description": "d" * 500}, None), ({**rmsnorm_metadata(), "description": "d" * 501}, "at most 500 characters"),
    ({**rmsnorm_metadata(), "triton_version": "3." + "6" * 62}, "no known kernel ABI"),
    ({**rmsnorm_metadata(), "triton_version": "3.6." + "0" * 61}, "triton_version"),
    ({**rmsnorm_metadata(), "kernels": [dict(rmsnorm_metadata()["kernels"][0], kernel=f"k{i}", cubin=f"k{i}.cubin",
                                              ptx=f"k{i}.ptx") for i in range(17)]}, "kernels"),
    ({**rmsnorm_metadata(), "format": "edgekit-bundle"}, "not edgekit plugin metadata"),
])
def test_plugin_metadata_bounds_hold_at_their_edges(doc, field):
    if field is None:
        _parse(doc)
        return
    with pytest.raises(VerificationError) as e:
        _parse(doc)
    assert field in str(e.value)


def test_optional_kernel_fields_default_to_no_scratch_and_no_statistics():
    kernel = {k: v for k, v in rmsnorm_metadata()["kernels"][0].items() if k not in ("global_scratch_size", "global_scratch_align")}
    m = _parse({**rmsnorm_metadata(), "kernels": [kernel]})
    k = m.kernels[0]
    assert (k.global_scratch_size, k.global_scratch_align, k.registers, k.spills, k.dtype) == (0, 1, None, None, None)
    with pytest.raises(Exception):
        k.num_warps = 8  # frozen: what was verified is what is launched


def test_signature_of_at_most_64_parameters_is_accepted():
    from edgekit.bundle.plugin import KernelEntry

    base = rmsnorm_metadata()["kernels"][0]
    KernelEntry.model_validate(dict(base, signature=[[f"p{i}", "i32"] for i in range(64)]))
    with pytest.raises(Exception, match="signature"):
        KernelEntry.model_validate(dict(base, signature=[[f"p{i}", "i32"] for i in range(65)]))


def test_plugin_metadata_that_is_not_json_or_not_an_object_is_refused():
    with pytest.raises(VerificationError, match="not valid JSON"):
        parse_plugin_metadata(b"{nope")
    with pytest.raises(VerificationError, match="format is 'list'"):
        parse_plugin_metadata(b"[1, 2]")


def test_loader_metadata_is_what_the_launcher_reads():
    m = _meta()
    md = m.loader_metadata("rmsnorm_fwd")
    assert md["name"] == "rmsnorm_fwd_kernel" and md["hidden_args"] == 2 and md["arch"] == 87
    assert md["signature"][0] == ["x_ptr", "*fp16"] and md["num_warps"] == 4
    with pytest.raises(KeyError):
        m.kernel_entry("nope")


def test_operator_compat_refuses_an_unknown_operator():
    with pytest.raises(VerificationError, match="operator 'rmsnorm' is not one of this edgekit's: swiglu"):
        check_operator_compat(_meta(), operators={"swiglu": object()})


@pytest.mark.parametrize("doc", [
    _with_kernel(signature=[["x_ptr\n", "*fp16"]] + rmsnorm_metadata()["kernels"][0]["signature"][1:]),
    _with_kernel(signature=[["x_ptr", "*fp16\n"]] + rmsnorm_metadata()["kernels"][0]["signature"][1:]),
    _with_kernel(constexprs={"BLOCK_C\n": 1024}),
])
def test_attack_metadata_names_with_a_trailing_newline_are_refused(doc):
    with pytest.raises(VerificationError, match="schema"):
        _parse(doc)


def test_attack_index_file_name_with_a_trailing_newline_is_refused():
    from edgekit.bundle.plugin import PackageIndex

    entry = {"sha256": "0" * 64, "size": 1}
    with pytest.raises(Exception, match="not allowed in a package index"):
        PackageIndex.model_validate({"format": "edgekit-plugin-package", "format_version": 1, "op": "rmsnorm",
                                     "version": 1, "arch": 87, "files": {"kernel.cubin\n": entry}})


# ---- plugin_from_compiled: the bridge from the compiler (stand-in compiled kernels, no Triton run) -------------------

class _Compiled:
    """What plugin_from_compiled reads from kernels/aot.py's CompiledKernel."""

    def __init__(self, symbol="rmsnorm_fwd_kernel", arch=ARCH, triton_version="3.6.0", hidden_args=2, ptx_str=True):
        self.arch, self.triton_version, self.hidden_args = arch, triton_version, hidden_args
        self.cubin = bytearray(fake_cubin(symbol.encode()))
        ptx = fake_ptx(arch, symbol)
        self.ptx = ptx.decode() if ptx_str else ptx
        self._symbol = symbol

    def metadata(self):
        return {
            "name": self._symbol, "num_warps": 4, "num_stages": 1, "shared_bytes": 0, "global_scratch_size": 0,
            "global_scratch_align": 1, "signature": rmsnorm_metadata()["kernels"][0]["signature"],
            "variant": {"constexprs": {"BLOCK_C": 1024}, "dtype": "fp16"},
            "precision": {"input": "fp16", "accumulate": "fp32", "output": "fp16"},
            "registers": 40, "spills": {"stores": 0, "loads": 0}, "ptx_version": 84,
        }


def _two_kernel_program():
    prog = copy.deepcopy(rmsnorm_metadata()["launch"])
    first = prog["launches"][0]
    prog["launches"] = [dict(first, kernel="k_a"), dict(first, kernel="k_b")]
    return prog


def test_plugin_from_one_compiled_kernel_packs_and_verifies(signing_key, public_key):
    from edgekit.bundle.plugin import plugin_from_compiled

    meta, files = plugin_from_compiled("rmsnorm", 3, {"rmsnorm_fwd": _Compiled()}, rmsnorm_metadata()["launch"],
                                       rmsnorm_plugin_files()["golden.safetensors"], description="d")
    assert sorted(files) == ["golden.safetensors", "kernel.cubin", "kernel.ptx"]
    assert isinstance(files["kernel.cubin"], bytes) and isinstance(files["kernel.ptx"], bytes)
    (k,) = meta.kernels
    assert (meta.version, meta.abi_version, meta.arch, meta.hidden_args, meta.description) == (3, 1, ARCH, 2, "d")
    assert (k.kernel, k.name, k.cubin, k.registers, k.dtype, k.constexprs) == (
        "rmsnorm_fwd", "rmsnorm_fwd_kernel", "kernel.cubin", 40, "fp16", {"BLOCK_C": 1024})
    assert verify_plugin_package(pack_plugin(meta, files, signing_key), [public_key]).version == 3


def test_plugin_from_several_compiled_kernels_names_files_after_them():
    from edgekit.bundle.plugin import plugin_from_compiled

    compiled = {"k_b": _Compiled("kb_kernel", ptx_str=False), "k_a": _Compiled("ka_kernel")}
    meta, files = plugin_from_compiled("rmsnorm", 1, compiled, _two_kernel_program(), b"golden")
    assert sorted(files) == ["golden.safetensors", "k_a.cubin", "k_a.ptx", "k_b.cubin", "k_b.ptx"]
    assert [(k.kernel, k.name, k.ptx) for k in meta.kernels] == [("k_a", "ka_kernel", "k_a.ptx"), ("k_b", "kb_kernel", "k_b.ptx")]


@pytest.mark.parametrize("op, compiled, message", [
    ("conv2d", {"rmsnorm_fwd": _Compiled()}, "unknown operator"),
    ("rmsnorm", {}, "at least one compiled kernel"),
    ("rmsnorm", {"k_a": _Compiled("ka"), "k_b": _Compiled("kb", arch=90)}, "kernels disagree on arch"),
    ("rmsnorm", {"k_a": _Compiled("ka"), "k_b": _Compiled("kb", triton_version="3.5.0")}, "disagree on triton_version"),
    ("rmsnorm", {"k_a": _Compiled("ka"), "k_b": _Compiled("kb", hidden_args=1)}, "disagree on hidden_args"),
])
def test_plugin_from_compiled_refuses_inconsistent_input(op, compiled, message):
    from edgekit.bundle.plugin import plugin_from_compiled

    with pytest.raises(VerificationError, match=message):
        plugin_from_compiled(op, 1, compiled, _two_kernel_program(), b"golden")


def test_plugin_from_compiled_checks_the_kernel_files():
    from edgekit.bundle.plugin import plugin_from_compiled

    bad = _Compiled()
    bad.cubin = b"not an ELF"
    with pytest.raises(VerificationError, match="no ELF header"):
        plugin_from_compiled("rmsnorm", 1, {"rmsnorm_fwd": bad}, rmsnorm_metadata()["launch"], b"golden")


def test_plugin_files_are_read_back_from_a_plugin_directory(tmp_path):
    from edgekit.bundle.plugin import plugin_files_from_dir

    files = {**rmsnorm_plugin_files(), "plugin.json": _meta().to_bytes()}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "unrelated.txt").write_bytes(b"not part of the plugin")
    assert plugin_files_from_dir(tmp_path) == files


def test_a_verified_plugin_cannot_be_altered(package, public_key):
    import dataclasses

    vp = verify_plugin_package(package, [public_key])
    with pytest.raises(dataclasses.FrozenInstanceError):
        vp.key_id = "0" * 64
    assert vp.golden == vp.files["golden.safetensors"] and not vp.dev_key


def test_attack_signed_extra_member_that_plugin_json_does_not_name_is_refused(signing_key, public_key):
    """A signer lists an unreferenced payload in the index: every hash checks out, but plugin.json does not
    name the file, so it must not reach the device (the store would write it into the slot)."""
    import hashlib

    payload = b"\x7fELF not a kernel"

    def list_payload(index, files):
        index["files"]["payload.so"] = {"sha256": hashlib.sha256(payload).hexdigest(), "size": len(payload)}

    data = _resigned(signing_key, list_payload, lambda files: files.update({"payload.so": payload}))
    with pytest.raises(VerificationError, match=r"members do not match plugin.json: missing \[\], unexpected \['payload.so'\]"):
        verify_plugin_package(data, [public_key])

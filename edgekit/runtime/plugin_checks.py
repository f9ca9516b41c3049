"""The real verifier and golden-vector check for the plugin store, built on edgekit.bundle.

``package_verifier`` wraps the pure ``verify_plugin_package`` (signature,
schema, hashes) and turns its ``VerificationError`` into a ``SwapRefused``
with a stable reason code. ``golden_checker`` runs a plugin's golden vectors
(and the bundle's vectors for the same operator) through a runner and refuses
the plugin on the first case outside tolerance.

Which runner proves the *kernel* right depends on the device: on a GPU the
launcher loads the plugin's cubin/PTX from the verified bytes
(``runner_for(plugin)``). Without one, the default runs the torch reference,
which checks the vectors themselves (right operator semantics, sane
tolerances, uncorrupted expectations) but not the kernel; reports say which.
"""

from __future__ import annotations

from typing import Callable, Mapping

from edgekit.bundle.golden import GoldenRunner, check_case, read_golden, run_reference
from edgekit.bundle.keys import TrustedKeys
from edgekit.bundle.plugin import MAX_PACKAGE_BYTES, PACKAGE_SIG_FILE, VerifiedPlugin, verify_plugin_package
from edgekit.errors import EdgekitError, VerificationError
from edgekit.runtime.gpu_admin_lock import gpu_admin_work
from edgekit.runtime.plugin_policy import SwapRefused

RunnerFactory = Callable[[VerifiedPlugin], GoldenRunner]


def refusal_reason(e: VerificationError) -> str:
    """Which refusal a VerificationError from verify_plugin_package is. Pure.

    Order follows the verifier's: size, archive, signature, then (the bytes being
    signed) schema; anything else after the signature is a member that does not
    match the signed index, i.e. corruption or tampering.
    """
    file, text = e.file, e.reason.lower()
    if "exceeds" in text and "limit" in text:
        return "oversized"
    if file.endswith(PACKAGE_SIG_FILE):
        if "not trusted" in text or "development key" in text:
            return "untrusted_key"
        return "bad_signature"
    if "kernel abi" in text:
        return "triton_abi"
    if "schema" in text or "format" in text or "not valid json" in text:
        return "schema"
    return "corrupted"


def package_verifier(
    trusted_keys: TrustedKeys, *, allow_dev_key: bool = False, max_bytes: int = MAX_PACKAGE_BYTES
) -> Callable[[bytes], VerifiedPlugin]:
    """A store verifier: bytes in, VerifiedPlugin out, SwapRefused(reason) otherwise; ``name``: what a refusal calls
    the package (its file, where the caller knows it)."""
    keys = dict(trusted_keys)

    def verify(data: bytes, name: str = "package") -> VerifiedPlugin:
        try:
            return verify_plugin_package(data, keys, allow_dev_key=allow_dev_key, max_bytes=max_bytes, name=name)
        except VerificationError as e:
            raise SwapRefused(refusal_reason(e), e.message, hint=e.hint) from e

    return verify


def reference_runner(plugin: VerifiedPlugin) -> GoldenRunner:
    """The CPU stand-in: the torch reference (checks the vectors, not the kernel)."""
    return run_reference


def gpu_runner(device: str = "cuda") -> RunnerFactory:
    """Run the plugin's own kernels: loaded by the trusted launcher from the verified in-memory bytes
    (cubin for this GPU's arch, else PTX JIT). The module is unloaded again after the check."""

    def runner_for(plugin: VerifiedPlugin) -> GoldenRunner:
        import torch

        from edgekit.runtime.gpu_runner import call_with_spec_order, load_plugin_op, on_own_stream

        dev = torch.device(device)
        op = load_plugin_op(plugin.metadata, plugin.files.__getitem__, dev)

        def run(op_name, inputs, attributes, label):
            # its own stream: a check beside serving neither waits for the serving stream nor syncs the device
            return on_own_stream(dev, lambda: call_with_spec_order(
                op, op_name, {k: v.to(dev) for k, v in inputs.items()}, attributes))

        run.unload = op.unload  # type: ignore[attr-defined]
        return run

    return runner_for


def runner_factory(backend: str) -> RunnerFactory:
    """'cpu' (torch reference: checks the vectors), 'gpu' (the plugin's kernels), 'auto' (gpu if CUDA is up)."""
    if backend not in ("auto", "cpu", "gpu"):
        raise EdgekitError(f"golden backend {backend!r} is not one of auto, cpu, gpu")
    if backend == "cpu":
        return reference_runner
    import torch

    if torch.cuda.is_available():
        return gpu_runner()
    if backend == "gpu":
        raise EdgekitError("--golden-backend gpu needs a CUDA GPU; none is available here", hint="use --golden-backend cpu")
    return reference_runner


def golden_checker(
    runner_for: RunnerFactory = reference_runner, *, bundle_golden: Mapping[str, bytes] | None = None
) -> Callable[[VerifiedPlugin], None]:
    """A store golden check: every case of the plugin's vectors and of the bundle's vectors for its op."""

    def check(plugin: VerifiedPlugin) -> None:
        sources = [("plugin", plugin.golden)]
        if bundle_golden and plugin.op in bundle_golden:
            sources.append(("bundle", bundle_golden[plugin.op]))
        # load, run and unload never overlap a graph capture on another admin thread (gpu_admin_lock says why)
        with gpu_admin_work():
            run = runner_for(plugin)
            try:
                _check_sources(plugin, run, sources)
            finally:
                unload = getattr(run, "unload", None)
                if unload is not None:
                    unload()

    # without a GPU the vectors run the torch reference: a wrong kernel passes, and the answer must say so
    check.runs_kernels = runner_for is not reference_runner  # type: ignore[attr-defined]
    return check


UNCHECKED_KERNELS = ("no GPU here: the golden vectors ran the operator's torch reference, not this plugin's kernels, "
                     "so its numbers are unchecked (`edgekit plugin pack --kernel-source` checks them under Triton's "
                     "interpreter before signing; a GPU device checks them on upload)")


def golden_check_summary(check) -> dict:
    """What a store's golden check ran, for an install's answer and the server's log."""
    if check is None:
        return {"kernels_checked": False, "ran": "nothing", "note": "this store runs no golden check"}
    if getattr(check, "runs_kernels", True):
        return {"kernels_checked": True, "ran": "the plugin's kernels on the GPU"}
    return {"kernels_checked": False, "ran": "the torch reference on the CPU", "note": UNCHECKED_KERNELS}


def _check_sources(plugin: VerifiedPlugin, run: GoldenRunner, sources: list[tuple[str, bytes]]) -> None:
    label = f"ota:{plugin.op}/{plugin.version}"
    for where, data in sources:
        try:
            golden = read_golden(data, name=f"{where} golden vectors")
        except VerificationError as e:
            raise SwapRefused("golden_mismatch", f"{where} golden vectors unreadable: {e}") from e
        if golden.op != plugin.op:
            raise SwapRefused("golden_mismatch", f"{where} golden vectors are for {golden.op}, the plugin is {plugin.op}")
        for case in golden.cases:
            verdict = check_case(plugin.op, case, run, label)
            if not verdict.ok:
                raise SwapRefused(
                    "golden_mismatch",
                    f"{plugin.op} {plugin.version}, {where} case {verdict.case}: {verdict.reason}; worst at "
                    f"{verdict.where} got {verdict.actual!r} expected {verdict.expected!r} "
                    f"({verdict.max_ratio:.3g}x the tolerance)",
                    hint="the kernel is numerically wrong for this input; fix it and publish a new version",
                )

"""CLI commands for the build area: `edgekit keys generate`, `edgekit verify` (and `edgekit build`).

Registered on edgekit.cli.app when imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from edgekit.cli import app
from edgekit.cli_common import console, print_json
from edgekit.errors import BundleError

# ---------------------------------------------------------------------------- keys

keys_app = typer.Typer(help="Ed25519 signing keys for bundles and plugin packages.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@keys_app.command("generate")
def keys_generate(
    directory: Path = typer.Argument(..., help="Directory to write edgekit.key (private, mode 0600) and edgekit.pub into."),
    force: bool = typer.Option(False, "--force", help="Replace an existing key pair (old signatures will no longer verify with the new key)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (paths and key id)."),
) -> None:
    """Make a signing key pair: sign with DIR/edgekit.key (`build --key`), trust DIR/edgekit.pub (`verify --trust`)."""
    from edgekit.bundle.keys import generate_keypair, key_id, load_public_key

    key_path, pub_path = generate_keypair(directory, force=force)
    kid = key_id(load_public_key(pub_path))
    if json_out:
        print_json({"private_key": str(key_path), "public_key": str(pub_path), "key_id": kid})
        return
    console.print(f"private key  {key_path}  (mode 0600: keep it secret, keep it off devices)")
    console.print(f"public key   {pub_path}  (copy to devices and CI: `edgekit verify --trust {pub_path}`)")
    console.print(f"key id       {kid}")


# ---------------------------------------------------------------------------- build
# `edgekit build` (load -> plan -> quantize -> compile -> golden -> ONNX -> BundleWriter)
# is added here by the build orchestration; it signs with edgekit.bundle.keys.load_signing_key
# (--key) or, only with an explicit flag, edgekit.bundle.keys.development_key().


# ---------------------------------------------------------------------------- verify

_STATUS_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim"}


@app.command()
def verify(
    bundle: Path = typer.Argument(..., help="A bundle directory or its single-file .tar archive."),
    trust: Optional[List[Path]] = typer.Option(
        None, "--trust", help="A trusted public key (edgekit.pub, or a directory holding one). Repeat for several keys."
    ),
    allow_dev_key: bool = typer.Option(False, "--allow-dev-key", help="Accept a bundle signed with the public development key (local testing only)."),
    skip_golden: bool = typer.Option(False, "--skip-golden", help="Do not run the golden vectors (signature, hashes and schemas only)."),
    backend: str = typer.Option(
        "auto", "--golden-backend", help="Where golden vectors run: cpu (torch reference), gpu (the plugins' own kernels), auto (gpu if CUDA is available)."
    ),
    show_all: bool = typer.Option(False, "--all", help="List every file check instead of summarizing the passing ones."),
    json_out: bool = typer.Option(False, "--json", help="Print the full report as JSON."),
) -> None:
    """Check a bundle: signature by a trusted key, every file's sha256 and size, schemas, format version,
    target arch vs this machine, and the golden vectors (the plugins themselves on a GPU, the torch reference on a CPU).
    Exits non-zero on any failure."""
    from edgekit.bundle.golden import run_reference
    from edgekit.bundle.keys import load_public_key
    from edgekit.bundle.verify import verify_bundle

    keys = [load_public_key(p) for p in (trust or [])]
    if not keys and not allow_dev_key:
        raise BundleError(
            "no trusted key given: a bundle is only accepted if it is signed by a key you trust",
            hint="pass --trust DIR/edgekit.pub, the public half of the key that signed it",
        )
    if backend not in ("auto", "cpu", "gpu"):
        raise BundleError(f"--golden-backend {backend!r} is not one of auto, cpu, gpu")
    run = None if skip_golden else run_reference
    runner_for_root = None
    if not skip_golden and backend != "cpu":
        import torch

        if torch.cuda.is_available():
            from edgekit.bundle.gpu_runner import plugin_runner

            runner_for_root = plugin_runner
        elif backend == "gpu":
            raise BundleError("--golden-backend gpu needs a CUDA GPU; none is available here", hint="use --golden-backend cpu")
    kwargs = dict(allow_dev_key=allow_dev_key, run_golden=run, runner_for_root=runner_for_root)
    if json_out:
        report = verify_bundle(bundle, keys, **kwargs)
        print_json(report.to_dict())
    else:
        where = "the plugins on the GPU" if runner_for_root else ("the CPU reference" if run else "no golden vectors")
        with console.status(f"verifying {bundle} (golden vectors: {where}) ..."):
            report = verify_bundle(bundle, keys, **kwargs)
        _print_report(report, show_all)
    report.raise_if_failed()


def _print_report(report, show_all: bool) -> None:
    m = report.manifest
    title = f"{report.bundle}"
    if m is not None:
        title += f"  [{m.model.name} for {m.target.name} (sm_{m.target.arch}), {len(m.plugins)} plugins, {len(m.files)} files]"
    t = Table(title=title, title_justify="left")
    t.add_column("check")
    t.add_column("file", overflow="fold")
    t.add_column("status")
    t.add_column("reason", overflow="fold")
    passed_files = [c for c in report.checks if c.check == "file" and c.status == "pass"]
    summarized = False
    for c in report.checks:
        if c.check == "file" and c.status == "pass" and not show_all:
            if not summarized:  # one row where the file checks are, instead of one per file
                t.add_row("file", f"{len(passed_files)} files", f"[{_STATUS_STYLE['pass']}]pass[/]", "sha256 and size match the signed manifest (--all lists them)")
                summarized = True
            continue
        t.add_row(c.check, c.file, f"[{_STATUS_STYLE[c.status]}]{c.status}[/]", c.reason)
    console.print(t)
    n_fail = len(report.failures)
    if n_fail:
        console.print(f"[bold red]REFUSED[/]: {n_fail} check(s) failed")
    else:
        warns = sum(c.status == "warn" for c in report.checks)
        console.print(f"[green]OK[/]: bundle verified" + (f" ({warns} warning(s))" if warns else ""))

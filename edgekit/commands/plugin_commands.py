"""CLI for operator plugin packages: `edgekit plugin pack|list|show`.

`pack` makes the signed .tar that the server's /v1/plugins upload, `edgekit store
install` and `edgekit publish` take; `list` and `show` read a bundle, a device
store or a package without changing anything. Registered on edgekit.cli.app when imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from edgekit.cli import app
from edgekit.cli_common import console, print_json
from edgekit.commands.ota_commands import TRUST_HELP, _device_arch
from edgekit.errors import BundleError

plugin_app = typer.Typer(help="Make and inspect operator plugin packages (the unit of an over-the-air swap).",
                         no_args_is_help=True)
app.add_typer(plugin_app, name="plugin")

PATH_HELP = "A bundle directory, a device plugin store directory (--store of serve/agent), or a plugin package (.tar)."


def _path_kind(path: Path) -> str:
    from edgekit.bundle.manifest import MANIFEST_FILE

    if not path.exists():  # once 'is not a bundle, a plugin store or a plugin package', as if it were something
        raise BundleError(f"{path} not found", hint="pass a bundle directory, a store directory or a .tar package")
    if path.is_file():
        return "package"
    if (path / MANIFEST_FILE).is_file():
        return "bundle"
    if (path / "ops").is_dir():
        return "store"
    raise BundleError(f"{path} is not a bundle, a plugin store or a plugin package",
                      hint="pass a bundle directory (manifest.json), a store directory (ops/) or a .tar package")


def _rows(path: Path, bundle: Optional[Path], trust: Optional[List[Path]], allow_dev_key: bool) -> tuple[str, list[dict]]:
    from edgekit.bundle.plugin_pack import bundle_plugin_versions, describe_bundle, describe_package

    kind = _path_kind(path)
    if kind == "package":
        from edgekit.bundle.keys import load_public_key

        keys = [load_public_key(p) for p in trust or []]
        return kind, [describe_package(path.read_bytes(), name=path.name, trusted_keys=keys, allow_dev_key=allow_dev_key)]
    if kind == "bundle":
        return kind, describe_bundle(path)
    from edgekit.runtime.store_view import describe_store

    return kind, describe_store(path, bundle_plugin_versions(bundle) if bundle else None)


@plugin_app.command("pack")
def pack(
    op: str = typer.Argument(..., help="The operator, e.g. rmsnorm (`edgekit plugin list BUNDLE` lists them)."),
    bundle: Path = typer.Option(..., "--bundle", "-b", help="A bundle built by `edgekit build`: the plugin's compiled kernels come from it (with --kernel-source: its tiles, arch, model shapes)."),
    kernel_source: Optional[Path] = typer.Option(None, "--kernel-source", help="Compile OP from this .py file instead (a copy of edgekit's kernels/<op>_triton.py with changed kernel bodies) for the bundle's target."),
    version: int = typer.Option(..., "--version", min=1, help="The new plugin version; a device installs only versions above the one it runs."),
    out: Path = typer.Option(..., "--out", "-o", help="The package file to write, e.g. rmsnorm-v2.tar."),
    key: Optional[Path] = typer.Option(None, "--key", help="Ed25519 private key to sign with (`edgekit keys generate DIR` makes DIR/edgekit.key)."),
    dev_key: bool = typer.Option(False, "--dev-key", help="Sign with the public development key (local tests only; devices refuse it by default)."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Refuse unless the kernels are compiled for this target (a profile name such as orin, or sm_87)."),
    from_version: Optional[int] = typer.Option(None, "--from-version", min=1, help="Which of the bundle's versions of OP to pack (default: the newest it ships)."),
    description: Optional[str] = typer.Option(None, "--description", help="A note stored in plugin.json (what changed)."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (op, version, arch, sha256, bytes, path)."),
) -> None:
    """Sign one operator's compiled plugin as a package for an over-the-air swap.

    The kernels come from a bundle (checked against its manifest first) or, with --kernel-source, are
    compiled from your edited kernel file at the tiles the bundle's plan chose, for the bundle's GPU.
    The package goes to a device with `curl -F file=@OUT .../v1/plugins`, `edgekit store install`
    or `edgekit publish` + `edgekit agent`."""
    from edgekit.bundle.canonical import atomic_write_bytes, sha256_hex
    from edgekit.builder.kernel_source import pack_from_kernel_source
    from edgekit.bundle.plugin_pack import pack_from_bundle
    from edgekit.bundle.plugin_identity import MAX_VERSION_PART
    from edgekit.kernels.arch import arch_number
    from edgekit.output_path import check_output_path

    if version > MAX_VERSION_PART:  # once signed and written, then refused by every store and by publish
        raise BundleError(f"--version {version} is above {MAX_VERSION_PART}, the largest version a device admits",
                          hint="pass a smaller --version (versions only need to increase)")
    if out.exists() and not force:
        raise BundleError(f"{out} already exists", hint="pass --force to replace it, or another --out")
    check_output_path(out, "-o", kind="file")
    if kernel_source is not None and from_version is not None:
        raise BundleError("--from-version picks a bundle's compiled plugin; --kernel-source compiles a new one",
                          hint="pass one of them, not both")
    target_arch = arch_number(_device_arch(target)) if target else None
    from edgekit.bundle.keys import chosen_signing_key

    signer = chosen_signing_key(key, dev_key, "a plugin package")
    if kernel_source is not None:
        meta, data = pack_from_kernel_source(bundle, op, kernel_source, version=version, key=signer,
                                             target_arch=target_arch, description=description)
    else:
        meta, data = pack_from_bundle(bundle, op, version=version, key=signer, from_version=from_version,
                                      target_arch=target_arch, description=description)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, data)
    info = {"path": str(out), "op": meta.op, "version": meta.version, "arch": meta.target_arch,
            "kernels": [k.kernel for k in meta.kernels], "sha256": sha256_hex(data), "bytes": len(data),
            "signed_with": "development key" if key is None else str(key)}
    if json_out:
        print_json(info)
        return
    console.print(f"wrote {out}: {meta.op} v{meta.version} for {meta.target_arch} ({len(data)} bytes, "
                  f"signed with {info['signed_with']})")


def _text(version, none: str) -> str:
    """A version (a number in the rows, as in plugin.json) as table text; ``none`` where there is none."""
    return none if version is None else str(version)


@plugin_app.command("list")
def list_cmd(
    path: Path = typer.Argument(..., help=PATH_HELP),
    bundle: Optional[Path] = typer.Option(None, "--bundle", "-b", help="With a store: the bundle it serves, whose plugins are the versions below the store's."),
    trust: Optional[List[Path]] = typer.Option(None, "--trust", help=TRUST_HELP + " With a package: verify its signature (and everything else) first."),
    allow_dev_key: bool = typer.Option(False, "--allow-dev-key", help="With --trust: also accept the public development key."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON rows instead of a table."),
) -> None:
    """One row per plugin: operator, version, where it comes from (bundle, store, package), arch, kernels.

    The activations column (JSON: precision) is the activation dtype the kernels were compiled for. It is not the
    weights' format: one plugin carries kernels for each weight format (e.g. norm_qkv_rope_fp / _w8 / _w4), and the
    bundle's weights say which one each layer runs (edgekit info BUNDLE)."""
    kind, rows = _rows(path, bundle, trust, allow_dev_key)
    if json_out:
        print_json([{k: v for k, v in r.items() if k != "metadata"} for r in rows])
        return
    t = Table(title=f"plugins in {kind} {path}")
    if kind == "store":
        for col in ("op", "serving", "from", "state", "previous", "blocked"):
            t.add_column(col)
        for r in rows:
            t.add_row(r["op"], _text(r["version"], "reference"), r["source"], r["state"], _text(r["previous"], "-"),
                      ", ".join(map(str, r["blocked"])) or "-")
    else:
        # "activations", not "precision": an INT8 bundle's plugins read as "fp16" here, the activations they take
        for col in ("op", "version", "arch", "kernels", "activations", "signature" if kind == "package" else "path"):
            t.add_column(col)
        for r in rows:
            t.add_row(r["op"], str(r["version"]), r["arch"], ", ".join(r["kernels"]), ", ".join(r["precision"]),
                      r.get("signature") or r.get("path", ""))
    console.print(t)


@plugin_app.command("show")
def show(
    path: Path = typer.Argument(..., help=PATH_HELP),
    op: Optional[str] = typer.Argument(None, help="The operator to show (required for a bundle or a store)."),
    bundle: Optional[Path] = typer.Option(None, "--bundle", "-b", help="With a store: the bundle it serves."),
    trust: Optional[List[Path]] = typer.Option(None, "--trust", help=TRUST_HELP + " With a package: verify it completely first."),
    allow_dev_key: bool = typer.Option(False, "--allow-dev-key", help="With --trust: also accept the public development key."),
) -> None:
    """Every field of one plugin as JSON: metadata (kernels, launch rule, precision), version, where it is."""
    kind, rows = _rows(path, bundle, trust, allow_dev_key)
    if kind == "package" and op is not None and op != rows[0]["op"]:  # a package holds one: OP was ignored
        raise BundleError(f"the package {path} holds {rows[0]['op']}, not {op!r}",
                          hint=f"pass {rows[0]['op']} or no OP to show it, or the package of {op}")
    if kind != "package":
        if op is None:
            raise BundleError(f"which operator of the {kind} {path}?", hint="pass OP, one of: " + ", ".join(r["op"] for r in rows))
        rows = [r for r in rows if r["op"] == op]
        if not rows:
            raise BundleError(f"the {kind} {path} has no plugin for {op!r}", hint="`edgekit plugin list PATH` lists them")
    print_json(rows[0] if len(rows) == 1 else rows)

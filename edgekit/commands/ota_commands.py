"""CLI for over-the-air plugins: `edgekit publish`, `edgekit agent`, `edgekit store ...`.

Registered on edgekit.cli.app when imported.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from edgekit.cli import app
from edgekit.cli_common import console, err_console, print_json
from edgekit.errors import EdgekitError

TRUST_HELP = "Public key (edgekit.pub, or a directory holding one) of a trusted plugin signer. Repeat for several."
TARGET_HELP = "This device's GPU: a target profile name (orin, h200, ...) or an SM arch (sm_87, sm_90)."
STORE_HELP = "The device's plugin store directory (created if missing)."
EXISTING_STORE_HELP = "The device's plugin store directory (the --store of serve or agent)."
DEV_KEY_HELP = "Also accept plugins signed with the public development key (local testing only)."
GOLDEN_HELP = (
    "Where a new plugin's golden vectors run before it may become active: gpu (the plugin's own kernels), "
    "cpu (torch reference: checks the vectors, not the kernel), auto (gpu if CUDA is available)."
)

# edgekit.publish.DEFAULT_EXPIRY["snapshot"] (7 days), not imported here: tuf loads only when a command runs. A longer
# timestamp promised what the snapshot re-signed with it did not keep (devices refused it after 7 days), and inf or
# 1e30 hours ended in an OverflowError traceback.
SNAPSHOT_EXPIRY_HOURS = 168.0
# inf or 1e12 was taken, a pass ran (installing what it found), then time.sleep raised OverflowError: a traceback
# and, under systemd's Restart=, a pass every restart instead of one per interval. A week: 168 h, the longest
# timestamp `publish` signs, after which a device that has not refreshed refuses the repository anyway.
MAX_AGENT_INTERVAL_S = SNAPSHOT_EXPIRY_HOURS * 3600


# ---------------------------------------------------------------------------- helpers

def _trusted_keys(paths: Optional[List[Path]], allow_dev_key: bool):
    from edgekit.bundle.keys import load_public_key, trust

    if not paths and not allow_dev_key:
        raise EdgekitError("no trusted plugin signer given", hint="pass --trust PUBFILE (the edgekit.pub of whoever signs plugins)")
    return trust([load_public_key(p) for p in paths or []])


def _device_arch(target: str) -> str:
    from edgekit.runtime.plugin_policy import SwapRefused, normalize_arch

    try:
        return normalize_arch(target)
    except SwapRefused:
        from edgekit.plan.targets import load_target

        return load_target(target).arch


def _device_checks(target: str, trust: Optional[List[Path]], allow_dev_key: bool):
    """(the device's policy, the package verifier): what a store admits a package by."""
    from edgekit.bundle.plugin import TRITON_HIDDEN_ARGS
    from edgekit.runtime.plugin_checks import package_verifier
    from edgekit.runtime.plugin_policy import DevicePolicy
    from edgekit.runtime.plugin_store import default_known_abi

    policy = DevicePolicy(device_arch=_device_arch(target), known_abi=default_known_abi(), triton_abis=set(TRITON_HIDDEN_ARGS))
    return policy, package_verifier(_trusted_keys(trust, allow_dev_key), allow_dev_key=allow_dev_key)


def _open_store(store: Path, target: str, trust: Optional[List[Path]], allow_dev_key: bool, *,
                golden_backend: str | None = None, rollback_unconfirmed: bool = False):
    """The store as these commands see it; ``golden_backend``: where an install's golden vectors run (install and the
    agent, which say it); None for the commands that run none (status, confirm, rollback)."""
    from edgekit.runtime.plugin_checks import golden_checker, reference_runner, runner_factory
    from edgekit.runtime.plugin_store import PluginStore

    policy, verify = _device_checks(target, trust, allow_dev_key)
    runner = runner_factory(golden_backend or "auto")
    if golden_backend is not None:
        where = "cpu: torch reference (checks the vectors, not the kernels)" if runner is reference_runner else "gpu: the plugins' own kernels"
        err_console.print(f"golden vectors run on {where}", highlight=False)
    return PluginStore.open(
        store,
        policy=policy,
        verify=verify,
        golden_check=golden_checker(runner),
        rollback_unconfirmed=rollback_unconfirmed,
        refuse_policy_drops=True,  # a mistyped --trust / --target must not revoke what the device serves
    )


def _existing_store(store: Path) -> Path:
    """--store of a command that installs nothing (status, confirm, rollback): a path that is no store is refused, not
    made. A mistyped --store once created an empty store there and answered from it ('no operators', 'unknown
    operator'), as if the device's store were empty."""
    if not (store / "ops").is_dir():
        what = "does not exist" if not store.exists() else "is not a plugin store (no ops/ folder)"
        raise EdgekitError(f"--store {store} {what}",
                           hint="pass the --store that serve or agent use; `edgekit store install` creates a store")
    return store


def _package_file(package: Path) -> Path:
    """A plugin package named on the command line: an existing file, checked before a repository or a store is
    opened. `store install` once created the --store folder first and then failed with the bare OSError ('cannot read
    plugin package X: [Errno 2] No such file or directory: 'X''), leaving an empty store behind a typo."""
    if not package.is_file():  # a directory was 'not found' too
        what = "is a directory, expected a package file" if package.is_dir() else "not found"
        raise EdgekitError(f"plugin package {package} {what}", hint="pass the .tar written when the plugin was packed")
    return package


def _print_recovery(store) -> None:
    for line in store.recovery:
        err_console.print(f"[yellow]recovered:[/] {line}", highlight=False)


def _status_table(rows: list[dict]) -> Table:
    t = Table(title="operator plugins")
    for col in ("op", "serving", "from", "rollback steps to", "state", "blocked", "changed"):
        t.add_column(col)
    for r in rows:  # versions are numbers in the rows (as in plugin.json): text here
        older = [*map(str, reversed(r.get("history", []))),
                 *([f"{r['bundle_version']} (bundle)"] if r.get("bundle_version") is not None and r["source"] == "store" else [])]
        below = ([str(r["previous"])] if r["previous"] is not None else []) + older
        t.add_row(r["op"], "reference" if r["version"] is None else str(r["version"]),
                  r.get("source", "store" if r["version"] is not None else "reference"),
                  " -> ".join(below + (["reference"] if r.get("source") != "reference" else [])) or "-",
                  r["state"], ", ".join(map(str, r["blocked"])) or "-", r["changed_at"])
    return t


# ---------------------------------------------------------------------------- publish

@app.command()
def publish(
    plugins: Optional[List[Path]] = typer.Argument(
        None, help="Signed plugin packages to publish. None: only re-sign snapshot and timestamp (run it before the timestamp "
                   "expires), and targets and root when they would expire before the new snapshot."
    ),
    repo: Path = typer.Option(..., "--repo", help="The TUF repository directory to create or update; serve it with any static HTTP server."),
    keys: Optional[Path] = typer.Option(
        None, "--keys", help="Directory of the TUF role keys (root/targets/snapshot/timestamp .pem, created on first use). Default: REPO-keys beside REPO; never inside it."
    ),
    trust: Optional[List[Path]] = typer.Option(None, "--trust", help=TRUST_HELP + " Each package is verified before it is published."),
    allow_dev_key: bool = typer.Option(False, "--allow-dev-key", help=DEV_KEY_HELP),
    timestamp_hours: float = typer.Option(
        24.0, "--timestamp-expiry-hours", min=0.1, max=SNAPSHOT_EXPIRY_HOURS,
        help="How long the timestamp stays valid; devices refuse the repository after that until you publish again. "
             f"At most {SNAPSHOT_EXPIRY_HOURS:.0f} (the snapshot's expiry, which devices hold the repository to too)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (targets added, metadata versions, expiry, trusted root path)."),
) -> None:
    """Publish plugin packages as TUF targets (python-tuf metadata, consistent snapshots, ed25519).

    Devices run `edgekit agent --repo URL --trusted-root REPO/metadata/1.root.json` to pick them up.
    """
    from edgekit.output_path import check_output_path
    from edgekit.publish import publish_plugins
    from edgekit.runtime.plugin_checks import package_verifier

    check_output_path(repo, "--repo", kind="dir")
    if keys is not None:
        check_output_path(keys, "--keys", kind="dir")
    describe = package_verifier(_trusted_keys(trust, allow_dev_key), allow_dev_key=allow_dev_key) if plugins else None
    # Each package verified here first, named by its file, before the repository or its keys are made or touched: a
    # refusal said 'package:kernel.cubin' (which of several?) after a new REPO and REPO-keys had been created.
    # publish_plugins verifies them again, as it trusts no caller.
    packages = []
    for p in plugins or []:
        data = _package_file(p).read_bytes()
        describe(data, name=str(p))
        packages.append(data)
    result = publish_plugins(
        repo, packages, describe=describe, keys_dir=keys, expiry={"timestamp": dt.timedelta(hours=timestamp_hours)}
    )
    if json_out:
        print_json(result.to_dict())
        return
    for a in result.added:
        console.print(f"published {a['path']}  ({a['op']} {a['version']} for {a['target_arch']}, {a['length']} bytes)")
    if not result.added:
        console.print("re-signed snapshot and timestamp (no new plugins)")
    if result.renewed:
        console.print(f"renewed {' and '.join(result.renewed)}: each would have expired before the new snapshot")
    v = result.versions
    console.print(f"metadata  root v{v['root']}  targets v{v['targets']}  snapshot v{v['snapshot']}  timestamp v{v['timestamp']}")
    console.print(f"timestamp expires {result.expires['timestamp']}: publish again before then")
    console.print(f"ship to devices: {result.trusted_root}  (--trusted-root)")


# ---------------------------------------------------------------------------- agent

@app.command()
def agent(
    repo: str = typer.Option(..., "--repo", help="Base URL of the TUF repository (it serves REPO/metadata/ and REPO/targets/)."),
    trusted_root: Path = typer.Option(..., "--trusted-root", help="The root metadata shipped with the device (REPO/metadata/1.root.json)."),
    store: Path = typer.Option(..., "--store", help=STORE_HELP),
    target: str = typer.Option(..., "--target", help=TARGET_HELP),
    trust: Optional[List[Path]] = typer.Option(None, "--trust", help=TRUST_HELP),
    allow_dev_key: bool = typer.Option(False, "--allow-dev-key", help=DEV_KEY_HELP),
    golden_backend: str = typer.Option("auto", "--golden-backend", help=GOLDEN_HELP),
    cache: Optional[Path] = typer.Option(None, "--cache", help="Where verified TUF metadata is kept between passes. Default: STORE/tuf."),
    once: bool = typer.Option(False, "--once", help="One refresh-and-apply pass, then exit: 0 if everything was applied or up to date, 2 if anything was refused (the exit code of every command's refusal)."),
    interval: float = typer.Option(300.0, "--interval", min=1.0, max=MAX_AGENT_INTERVAL_S,
                                   help="Seconds between passes when not --once (at most a week)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON report per pass (JSON lines when looping)."),
) -> None:
    """Keep this device's plugins current: refresh TUF metadata, install newer plugins for this GPU.

    Rolled-back, expired or wrongly signed metadata and tampered downloads are refused
    and change nothing; installed plugins start on probation, like an upload to the server.
    """
    from edgekit.runtime.agent import check_repo_url, run_once, trusted_root_problem

    check_repo_url(repo)
    root_hint = "copy REPO/metadata/1.root.json from the publisher onto the device"
    if not trusted_root.is_file():
        what = "is not a file" if trusted_root.exists() else "not found"
        raise EdgekitError(f"trusted root {trusted_root} {what}", hint=root_hint)
    root_bytes = trusted_root.read_bytes()
    problem = trusted_root_problem(root_bytes)
    if problem is not None:  # the device's own file: refused once, here, not retried every --interval as a repository fault
        raise EdgekitError(f"trusted root {trusted_root}: {problem}", hint=root_hint)
    plugin_store = _open_store(store, target, trust, allow_dev_key, golden_backend=golden_backend)
    _print_recovery(plugin_store)
    cache_dir = cache or (store / "tuf")
    while True:
        try:
            report = run_once(plugin_store, repo_url=repo, trusted_root=root_bytes, cache_dir=cache_dir)
        except EdgekitError as e:
            if once:
                raise
            err_console.print(f"[bold red]pass failed:[/] {e} (retrying in {interval:.0f} s)", highlight=False, soft_wrap=True)
            time.sleep(interval)
            continue
        if json_out and once:
            print_json(report.to_dict())
        elif json_out:  # JSON lines: one compact report per pass, flushed for log shippers; strict as print_json's
            from edgekit.strict_json import strict_dumps

            print(strict_dumps(report.to_dict()), flush=True)
        else:
            _print_report(report)
        if once:
            # a refusal exits as every command's does (an EdgekitError's code), the report already printed
            raise typer.Exit(0 if report.ok else EdgekitError.exit_code)
        time.sleep(interval)


def _print_report(report) -> None:
    stamp = dt.datetime.now().isoformat(timespec="seconds")
    if report.error is not None:
        err_console.print(f"{stamp} [bold red]refused:[/] {report.error}", highlight=False, soft_wrap=True)
        return
    if not report.outcomes:
        console.print(f"{stamp} up to date (targets v{report.metadata_versions.get('targets', '?')})")
    for o in report.outcomes:
        if o.action == "applied":
            console.print(f"{stamp} [green]applied[/] {o.detail}", highlight=False)
        else:
            err_console.print(f"{stamp} [bold red]refused[/] {o.op} {o.version}: {o.detail}", highlight=False, soft_wrap=True)


# ---------------------------------------------------------------------------- store

store_app = typer.Typer(help="Inspect and change the device's operator plugin store directly.", no_args_is_help=True)
app.add_typer(store_app, name="store")


@store_app.command("status")
def store_status(
    store: Path = typer.Option(..., "--store", help=EXISTING_STORE_HELP),
    target: str = typer.Option(..., "--target", help=TARGET_HELP),
    trust: Optional[List[Path]] = typer.Option(None, "--trust", help=TRUST_HELP),
    allow_dev_key: bool = typer.Option(False, "--allow-dev-key", help=DEV_KEY_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Recover the store (as the runtime does at start-up) and show each operator's active version. A version that
    --trust or --target refuse although its bytes are intact is not dropped: the command is refused, nothing changed."""
    s = _open_store(_existing_store(store), target, trust, allow_dev_key)
    if json_out:
        print_json({"operators": s.status(), "recovery": s.recovery})
        return
    _print_recovery(s)
    console.print(_status_table(s.status()))


@store_app.command("install")
def store_install(
    package: Path = typer.Argument(..., help="A signed plugin package."),
    store: Path = typer.Option(..., "--store", help=STORE_HELP),
    target: str = typer.Option(..., "--target", help=TARGET_HELP),
    trust: Optional[List[Path]] = typer.Option(None, "--trust", help=TRUST_HELP),
    allow_dev_key: bool = typer.Option(False, "--allow-dev-key", help=DEV_KEY_HELP),
    allow_downgrade: bool = typer.Option(False, "--allow-downgrade", help="Install a version older than the active one on purpose."),
    golden_backend: str = typer.Option("auto", "--golden-backend", help=GOLDEN_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (op, version, previous, state, per-step ms)."),
) -> None:
    """Verify, golden-check, stage and switch to a plugin package; it starts on probation."""
    _package_file(package)
    if not (store / "ops").is_dir():
        # a new store is made only for a package it would admit: one refused on its signature or its arch left an
        # empty store behind, which status then showed as the device's (the store checks it again on install)
        from edgekit.runtime.plugin_policy import check_compatible

        policy, verify = _device_checks(target, trust, allow_dev_key)
        check_compatible(verify(package.read_bytes(), name=str(package)), policy)
    s = _open_store(store, target, trust, allow_dev_key, golden_backend=golden_backend)
    _print_recovery(s)
    result = s.install(package, allow_downgrade=allow_downgrade)
    if json_out:
        print_json(result.to_dict())
        return
    console.print(f"{result.op} {result.version} active on probation (previous: {result.previous or 'reference'})")
    console.print("steps (ms, measured here): " + ", ".join(f"{k} {v:.1f}" for k, v in result.step_ms.items()))


@store_app.command("confirm")
def store_confirm(
    op: str = typer.Argument(..., help="The operator whose probation ends."),
    store: Path = typer.Option(..., "--store", help=EXISTING_STORE_HELP),
    target: str = typer.Option(..., "--target", help=TARGET_HELP),
    trust: Optional[List[Path]] = typer.Option(None, "--trust", help=TRUST_HELP),
    allow_dev_key: bool = typer.Option(False, "--allow-dev-key", help=DEV_KEY_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print the new pointer as JSON."),
) -> None:
    """End probation: keep the active version (the previous one stays for a later rollback)."""
    s = _open_store(_existing_store(store), target, trust, allow_dev_key)
    on_probation = s.pointer(op).state == "probation" if op in s.ops() else False
    p = s.confirm(op)  # an unknown operator is refused here, naming the known ones
    if json_out:
        print_json(p.to_json())
    elif not on_probation:
        version, source = s.serving(p)
        console.print(f"{op}: nothing on probation to confirm ({source}{' ' + version if version else ''} serves it)")
    else:
        console.print(f"{op} {p.version or 'reference'} {p.state}")


@store_app.command("rollback")
def store_rollback(
    op: str = typer.Argument(..., help="The operator to roll back."),
    store: Path = typer.Option(..., "--store", help=EXISTING_STORE_HELP),
    target: str = typer.Option(..., "--target", help=TARGET_HELP),
    trust: Optional[List[Path]] = typer.Option(None, "--trust", help=TRUST_HELP),
    allow_dev_key: bool = typer.Option(False, "--allow-dev-key", help=DEV_KEY_HELP),
    reason: str = typer.Option("manual rollback", "--reason", help="Recorded in the pointer."),
    json_out: bool = typer.Option(False, "--json", help="Print the new pointer as JSON."),
) -> None:
    """Flip OP back to its previous version (or the reference); the rolled-back version is blocked."""
    p = _open_store(_existing_store(store), target, trust, allow_dev_key).rollback(op, reason)
    if json_out:
        print_json(p.to_json())
    else:
        console.print(f"{op} now on {p.version or 'reference'} (blocked: {', '.join(p.blocked)})")

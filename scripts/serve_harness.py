"""Shared by bench_serve.py and load_serve.py: a bundle served on 127.0.0.1 in this process, clients in another.

The clients run in a spawned process so their HTTP parsing does not share the
server's GIL (the numbers are the server's, not the load generator's).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from edgekit.runtime.engine import DEFAULT_MAX_QUEUE_WAIT_S

ADMIN_TOKEN = "serve-bench-admin-token-0123456789"


def add_bundle_args(ap) -> None:
    ap.add_argument("bundle", type=Path, nargs="?", help="a bundle made by `edgekit build` (signed; see --allow-dev-key)")
    ap.add_argument("--tiny", action="store_true", help="build a tiny-preset bundle in a temp dir (CPU runs)")
    ap.add_argument("--allow-dev-key", action="store_true", help="accept the development key (swap packages are signed with it)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")


def open_bench_bundle(ap, args):
    """The bundle the arguments name (or a freshly built tiny one), opened for serving."""
    from edgekit.runtime.bundle_runtime import open_bundle

    if args.bundle is None and not args.tiny:
        ap.error("pass a BUNDLE or --tiny")
    path = args.bundle or build_tiny_bundle(scratch_dir())
    return open_bundle(path, [], allow_dev_key=args.allow_dev_key or args.tiny, golden=False, device=args.device)


def scratch_dir() -> Path:
    """A temp folder removed when this process exits (bundles and plugin stores of repeated runs would fill /tmp).

    EDGEKIT_KEEP_SCRATCH=1 keeps it, for reading the server log the JSON names after the run.
    """
    path = Path(tempfile.mkdtemp(prefix="edgekit-serve-bench-"))
    if os.environ.get("EDGEKIT_KEEP_SCRATCH") != "1":
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def build_tiny_bundle(out: Path) -> Path:
    """A small fp16 bundle of the tiny preset planned for 4 sequences at once, signed with the development key (CPU
    smoke runs)."""
    from edgekit.builder import BuildOptions, build_bundle

    opts = BuildOptions(model="preset:tiny", target="orin", out=out / "bundle", dev_key=True, precision="fp16",
                        context=256, buckets=(16, 32, 64), batch=4, onnx=False, cache_dir=out / "cache")
    return build_bundle(opts).out


def plugin_packages(bundle, op: str, versions) -> list[bytes]:
    """The bundle's own plugin for `op`, re-signed (dev key) under other versions: real swaps, same math."""
    from edgekit.bundle.keys import development_key
    from edgekit.bundle.plugin import pack_plugin, parse_plugin_metadata, plugin_files_from_dir

    d = bundle.plugin_dir(op)
    meta = parse_plugin_metadata((d / "plugin.json").read_bytes())
    files = {k: v for k, v in plugin_files_from_dir(d).items() if k != "plugin.json"}
    return [pack_plugin(meta.model_copy(update={"version": v}), files, development_key()) for v in versions]


@contextlib.contextmanager
def serving(bundle, *, max_waiting: int, batch_buckets=None, max_queue_wait_s: float = DEFAULT_MAX_QUEUE_WAIT_S,
            cuda_graphs: bool = True, decode_path: str | None = None):
    """(base URL, stack) of the bundle served on loopback, with a fresh plugin store and a JSON-lines log."""
    from edgekit.power.jsonl import JsonlLogger
    from edgekit.runtime.http_guard import make_uvicorn_server
    from edgekit.runtime.server import create_app
    from edgekit.runtime.serving import ServingStack, open_store

    tmp = scratch_dir()
    stack = ServingStack(bundle, open_store(tmp / "store", bundle, [], allow_dev_key=True), max_waiting=max_waiting,
                         batch_buckets=tuple(batch_buckets) if batch_buckets else None, max_queue_wait_s=max_queue_wait_s, cuda_graphs=cuda_graphs,
                         log=JsonlLogger(tmp / "store" / "server.jsonl"), decode_path=decode_path)
    app = create_app(stack.engine, admin_token=ADMIN_TOKEN, plugins=stack.admin, log=stack.log)
    gc.freeze()  # as `serve` does: start-up objects out of the collector's way (no long gen-2 pauses under load)
    srv = make_uvicorn_server(app, "127.0.0.1", 0, on_shutdown=stack.engine.finish_all)
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    while not srv.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}", stack
    finally:
        srv.should_exit = True
        th.join(10)
        stack.close()


@contextlib.contextmanager
def client_process():
    """One spawned process for the load generator (CUDA hidden from it)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"), initializer=_hide_gpu) as pool:
        yield pool


def _hide_gpu() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def where(bundle) -> str:
    """The run's ``measured_on`` (edgekit.measured_on's vocabulary: "cpu", "gpu (NAME)"); a CPU run adds its cores and
    load after a comma, since a loaded CPU's figures are not the machine's best."""
    from edgekit.measured_on import CPU, measured_on

    value = measured_on(bundle.device)
    if value == CPU:
        return f"{value}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end"
    return value

#!/usr/bin/env python
"""Load test on loopback: N concurrent clients while S signed plugins are hot-swapped in.

Builds nothing: pass a bundle made by `edgekit build`. Starts the server in this
process on 127.0.0.1 (ephemeral port), uploads S packages of one operator's
plugin (versions 2..S+1, signed with the development key, so the bundle must be
trusted with --allow-dev-key semantics), and reports failed requests and the
swap pause (the dispatch switch) p50/p99, plus the whole upload-to-active time.
Prints a table and JSON (--json PATH). Labelled with where it was measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--op", default="rmsnorm")
    ap.add_argument("--swaps", type=int, default=100)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--max-seconds", type=float, default=500)
    ap.add_argument("--json", dest="json_path", type=Path)
    args = ap.parse_args()

    import torch
    import uvicorn

    from edgekit.bundle.keys import development_key
    from edgekit.bundle.plugin import pack_plugin, parse_plugin_metadata, plugin_files_from_dir
    from edgekit.runtime.bundle_runtime import open_bundle
    from edgekit.runtime.server import create_app
    from edgekit.runtime.serving import ServingStack, open_store
    from edgekit.runtime.swap_load import run_swap_load

    b = open_bundle(args.bundle, [], allow_dev_key=True, golden=False)
    d = b.plugin_dir(args.op)
    meta = parse_plugin_metadata((d / "plugin.json").read_bytes())
    files = {k: v for k, v in plugin_files_from_dir(d).items() if k != "plugin.json"}
    packages = [pack_plugin(meta.model_copy(update={"version": v}), files, development_key()) for v in range(2, args.swaps + 2)]
    tmp = Path(tempfile.mkdtemp(prefix="edgekit-swapload-"))
    stack = ServingStack(b, open_store(tmp / "store", b, [], allow_dev_key=True), max_waiting=args.clients + 2)
    (tmp / "token").write_text("swap-load-admin-token-0123456789")
    app = create_app(stack.engine, admin_token_file=str(tmp / "token"), plugins=stack.admin)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    while not srv.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"
    prompt = b.tokenizer.encode_chat("Write one sentence about the sea.") if b.tokenizer else [1, 2, 3, 4, 5]
    res = run_swap_load(url, "swap-load-admin-token-0123456789", packages, clients=args.clients, prompt=prompt,
                        max_tokens=args.max_tokens, max_seconds=args.max_seconds)
    srv.should_exit = True
    th.join(10)
    pauses_ms = sorted(1000 * p for p in stack.engine.swap_pauses_s[-args.swaps:])
    where = f"measured on {'GPU ' + torch.cuda.get_device_name(0) if b.device.type == 'cuda' else 'CPU'}"
    out = {
        "measured_on": where, "backend": b.backend, "op": args.op, "clients": args.clients, **res.to_dict(),
        "switch_pause_ms_p50": statistics.median(pauses_ms) if pauses_ms else None,
        "switch_pause_ms_p99": pauses_ms[int(0.99 * (len(pauses_ms) - 1))] if pauses_ms else None,
        "switch_pause_ms_max": pauses_ms[-1] if pauses_ms else None,
        "active_after": stack.engine.table.sources()[args.op],
        "events": [e["kind"] for e in stack.events][-20:],
    }
    print(f"{'requests ok / failed':<32}{res.requests_ok} / {res.requests_failed}")
    print(f"{'swaps ok / failed':<32}{res.swaps_ok} / {len(res.swaps_failed)}")
    print(f"{'switch pause p50 / p99 (ms)':<32}{out['switch_pause_ms_p50']:.4f} / {out['switch_pause_ms_p99']:.4f}  ({where})")
    print(f"{'upload->active p50 / p99 (ms)':<32}{out['swap_request_ms_p50']:.1f} / {out['swap_request_ms_p99']:.1f}")
    if args.json_path:
        args.json_path.write_text(json.dumps(out, indent=2))
    print(json.dumps(out))
    sys.exit(0 if res.requests_failed == 0 and not res.swaps_failed else 1)


if __name__ == "__main__":
    main()

"""A device plugin store as it is on disk, read-only: what `edgekit plugin list STORE` prints.

No recovery and no verification happen here (``edgekit store status`` opens the
store for real: it repairs an interrupted swap and re-verifies every slot), so
listing needs no trusted keys and never changes the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from edgekit.runtime.plugin_store import POINTER_FILE, SLOT_RECORD, Pointer, SlotRecord, serving_of, versions_as_numbers


def describe_store(store: Path, bundle_plugins: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per operator of the store or of the bundle it serves (``bundle_plugins``: op -> version)."""
    ops_dir = Path(store) / "ops"
    bundle = {op: str(v) for op, v in (bundle_plugins or {}).items()}
    ops = {p.name for p in ops_dir.iterdir() if p.is_dir() and not p.name.startswith(".")} if ops_dir.is_dir() else set()
    rows = []
    for op in sorted(ops | set(bundle)):
        path = ops_dir / op / POINTER_FILE
        p = Pointer.model_validate_json(path.read_bytes()) if path.is_file() else Pointer(op=op, version=None)
        version, source = serving_of(p, bundle)
        record = ops_dir / op / str(p.version) / SLOT_RECORD
        arch = SlotRecord.model_validate_json(record.read_bytes()).target_arch if p.version and record.is_file() else None
        rows.append(versions_as_numbers(
            {"kind": "store", "op": op, "version": version, "source": source, "state": p.state,
             "previous": p.previous, "history": list(p.history), "bundle_version": bundle.get(op),
             "blocked": list(p.blocked), "arch": arch, "changed_at": p.changed_at, "note": p.note}))
    return rows

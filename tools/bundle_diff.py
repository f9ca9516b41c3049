"""Compare two bundle directories file by file, and the JSON files that differ field by field.

    python tools/bundle_diff.py BEFORE AFTER [--json]

Used to check that a refactor rebuilds the default bundle byte-identically (or to list each
difference). Reads only; prints a table, or one JSON document with --json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _json_diff(a, b, path: str = "") -> list[dict]:
    if type(a) is not type(b):
        return [{"path": path or "/", "before": a, "after": b}]
    if isinstance(a, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append({"path": f"{path}/{k}", "before": a.get(k, "<absent>"), "after": b.get(k, "<absent>")})
            else:
                out += _json_diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [{"path": path, "before": f"{len(a)} items", "after": f"{len(b)} items"}]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _json_diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [{"path": path or "/", "before": a, "after": b}]


def bundle_diff(before: Path, after: Path) -> dict:
    da, db = _digests(before), _digests(after)
    common = sorted(set(da) & set(db))
    differ = [f for f in common if da[f] != db[f]]
    fields = {f: _json_diff(json.loads((before / f).read_text()), json.loads((after / f).read_text()))
              for f in differ if f.endswith(".json")}
    return {"only_before": sorted(set(da) - set(db)), "only_after": sorted(set(db) - set(da)),
            "identical": len(common) - len(differ), "differ": differ, "json_fields": fields}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    args = ap.parse_args()
    for d in (args.before, args.after):
        if not (d / "manifest.json").is_file():
            print(f"error: {d} is not a bundle directory (no manifest.json); expected the -o DIR of `edgekit build`",
                  file=sys.stderr)
            return 2
    r = bundle_diff(args.before, args.after)
    if args.json:
        print(json.dumps(r, indent=2, default=str))
        return 0
    print(f"identical files: {r['identical']}   differ: {len(r['differ'])}   only before: {len(r['only_before'])}   "
          f"only after: {len(r['only_after'])}")
    for f in r["only_before"] + r["only_after"]:
        print(f"  {'-' if f in r['only_before'] else '+'} {f}")
    for f in r["differ"]:
        print(f"  ~ {f}")
        for d in r["json_fields"].get(f, [])[:40]:
            print(f"      {d['path']}: {str(d['before'])[:70]} -> {str(d['after'])[:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

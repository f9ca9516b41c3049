#!/usr/bin/env bash
# Build the wheel, install it into a fresh venv WITHOUT the source tree, import every module and run
# the commands a device runs first. This is how a Jetson installs edgekit; the editable install used
# by the tests cannot notice a module left out of the wheel.
# Then a device install: a second venv holding only what `pip install edgekit[device]` would bring (no Triton,
# transformers, gguf or ONNX) verifies and runs a bundle on the CPU and loads every plugin without Triton.
#
# The fresh venv reuses the dependencies already installed in ./.venv through a .pth file (a plain
# path entry: the editable-install hook in that site-packages is a .pth of its own and is NOT run),
# so this takes seconds, not a second download of torch. The wheel itself is installed with pip.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
. .venv/bin/activate
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The build backend pyproject.toml asks for (SPDX license string: setuptools >= 77); torch usually brought it.
python -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' \
  || python -m pip install -q "setuptools>=77"

echo "== building the wheel (from a copy of the files git would ship: no stale build/ folder, no .venv)"
mkdir "$WORK/src"
git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - | tar -xf - -C "$WORK/src"
(cd "$WORK/src" && python -m pip wheel --no-deps --no-build-isolation -w "$WORK/dist" .) >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
if grep -E "SetuptoolsDeprecationWarning|SetuptoolsWarning|_Warning|would be ignored" "$WORK/build.log"; then
  echo "setuptools warned while building the wheel (see above)"; exit 1
fi
WHEEL=$(ls "$WORK"/dist/edgekit-*.whl)
echo "   $(basename "$WHEEL")"

echo "== fresh venv, dependencies from ./.venv, the wheel installed by pip"
python -m venv "$WORK/venv"
DEPS=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
FRESH=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$DEPS" > "$FRESH/zz_edgekit_deps.pth"
"$WORK/venv/bin/python" -m pip install -q --no-deps --no-index "$WHEEL"

# Run from an empty directory: nothing of the source tree may be importable.
cd "$WORK"
export ROOT
"$WORK/venv/bin/python" - <<'PY'
import importlib, os, pathlib, sys

import edgekit

root = pathlib.Path(os.environ["ROOT"])
where = pathlib.Path(edgekit.__file__).resolve()
assert root not in where.parents, f"edgekit was imported from the source tree ({where}), not the wheel"
# Every module of the source tree, by import name, must import from the installed wheel.
mapping = {"edgekit": "edgekit", "edgekit.kernels": "kernels", "edgekit.power": "power", "edgekit.export": "export", "edgekit.targets": "targets"}
names = []
for pkg, folder in mapping.items():
    for f in sorted((root / folder).rglob("*.py")):
        rel = f.relative_to(root / folder).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        if "__pycache__" in rel.parts or "__main__" in parts:
            continue
        names.append(".".join([pkg, *parts]))
failed = []
for n in sorted(set(names)):
    try:
        mod = importlib.import_module(n)
        assert root not in pathlib.Path(mod.__file__).resolve().parents, f"{n} came from the source tree"
    except Exception as e:  # report every failure, not only the first
        failed.append(f"{n}: {type(e).__name__}: {e}")
from importlib import resources
for pkg, folder, pattern in (("edgekit.targets", "targets", "*.yaml"), ("edgekit.quant.data", "edgekit/quant/data", "*.txt")):
    shipped = sorted(p.name for p in resources.files(pkg).iterdir() if p.name.endswith(pattern[1:]))
    source = sorted(p.name for p in (root / folder).glob(pattern))
    if shipped != source:
        failed.append(f"{pkg}: data files {shipped} in the wheel, {source} in the source tree")
print(f"   imported {len(set(names)) - len(failed)} of {len(set(names))} modules from {where.parent}")
if failed:
    sys.exit("modules or data missing from the wheel:\n  " + "\n  ".join(failed))
PY

echo "== the installed command"
E="$WORK/venv/bin/edgekit"
"$E" --version
"$E" monitor --samples 1 --json >"$WORK/monitor.json"
"$WORK/venv/bin/python" -c "import json,sys; d=json.load(open(sys.argv[1])); print('   monitor --json:', sorted(d)[:6], '...')" "$WORK/monitor.json"
"$E" targets >/dev/null && echo "   targets: ok"

echo "== a device install: the wheel with edgekit[device]'s dependencies only (from ./.venv, linked)"
DEVICE_DEPS="$WORK/device-deps"
"$ROOT/.venv/bin/python" - "$WHEEL" "$DEVICE_DEPS" <<'PY'
# The requirement closure of edgekit[device] read from the wheel's own metadata, resolved against the
# distributions installed in ./.venv, each linked (its top-level files) into one folder: a site that holds
# exactly what pip would install for a device, so anything edgekit imports beyond it fails here as it would there.
import importlib.metadata as md, pathlib, re, sys, zipfile
from packaging.requirements import Requirement

wheel, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
with zipfile.ZipFile(wheel) as z:
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
todo = [Requirement(line.split(":", 1)[1].strip()) for line in meta.splitlines() if line.startswith("Requires-Dist:")]
todo = [r for r in todo if r.marker is None or r.marker.evaluate({"extra": "device"})]
seen, links = set(), set()
while todo:
    req = todo.pop()
    key = re.sub(r"[-_.]+", "-", req.name).lower()
    if key in seen:
        continue
    seen.add(key)
    dist = md.distribution(req.name)  # missing: ./.venv lacks a device dependency (scripts/setup.sh installs them)
    for f in dist.files or []:
        if f.parts and f.parts[0] not in ("..", "__pycache__") and not f.parts[0].endswith(".pth"):
            links.add(f.parts[0])
    extras = req.extras or {""}
    for r in map(Requirement, dist.requires or []):
        if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras):
            todo.append(r)
site = pathlib.Path(md.distribution("torch").locate_file(""))
out.mkdir()
for name in sorted(links):
    (out / name).symlink_to(site / name)
host_only = {"triton", "transformers", "gguf", "onnx", "onnxruntime", "onnxscript", "matplotlib"}
assert not host_only & seen, f"edgekit[device] would install {sorted(host_only & seen)}"
print(f"   {len(seen)} distributions: {', '.join(sorted(seen))}")
PY
python -m venv "$WORK/device"
DEVICE_SITE=$("$WORK/device/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$DEVICE_DEPS" > "$DEVICE_SITE/zz_edgekit_device_deps.pth"
"$WORK/device/bin/python" -m pip install -q --no-deps --no-index "$WHEEL"
if "$WORK/device/bin/python" -c "import triton" 2>/dev/null; then echo "the device venv can import triton"; exit 1; fi
"$E" build preset:tiny --target orin --dev-key --precision fp16 --context 64 --buckets 16,32 --no-onnx \
  -o "$WORK/tiny-bundle" >"$WORK/device-build.log" 2>&1 || { cat "$WORK/device-build.log"; exit 1; }
D="$WORK/device/bin/edgekit"
"$D" verify "$WORK/tiny-bundle" --allow-dev-key --json >/dev/null
echo "   device verify: ok (no Triton)"
"$D" run "$WORK/tiny-bundle" --allow-dev-key -p hello -n 4 --device cpu >/dev/null 2>"$WORK/device-run.log" \
  || { cat "$WORK/device-run.log"; exit 1; }
echo "   device run on the CPU: ok"
"$WORK/device/bin/python" "$ROOT/tests/edgekit/runtime/plugin_loader_probe.py" "$WORK/tiny-bundle" >"$WORK/probe.json"
"$WORK/device/bin/python" -c "import json,sys; p=json.load(open(sys.argv[1])); assert p['triton_modules'] == [], p; print(f\"   {len(p['plugins'])} plugins loaded and launched without Triton\")" "$WORK/probe.json"
echo "wheel check passed"

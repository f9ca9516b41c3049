#!/usr/bin/env bash
# The GPU suite as a gate: every @pytest.mark.gpu test, on a machine with a CUDA GPU, in one command.
#
#   bash scripts/test_gpu.sh            # JOBS=8 PER_FILE_S=420 BUDGET_S=470 OUT=out/test_gpu by default
#
# Each test file runs in a pytest process of its own, JOBS at a time: no file sees another's state (CUDA
# contexts, caches, dispatch tables), so neither order nor neighbours decide an outcome. A test that outlasts
# PER_TEST_S is failed by pytest-timeout where it is installed, a file that outlasts PER_FILE_S is killed; both
# are reported as TIMEOUT, loudly. Files that time the GPU (swap pauses, power ramps: SERIAL_FILES) run
# afterwards, one at a time, on an otherwise idle GPU. Whatever the budget (BUDGET_S) leaves unstarted is
# reported as NOT RUN. Writes $OUT/test_gpu.json (one record per test) and a log per file; exits 1 unless every
# collected test passed (on a machine without CUDA every test is skipped: the exit is 0 and the summary says so).
#
# On the GPU machine (no network) carry the wheels it lacks in .whl/ (README): tools/gpu_setup.sh installs them.
set -uo pipefail
R=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-8}; PER_TEST_S=${PER_TEST_S:-300}; PER_FILE_S=${PER_FILE_S:-420}; BUDGET_S=${BUDGET_S:-470}
OUT=${OUT:-$R/out}/test_gpu; mkdir -p "$OUT/junit" "$OUT/logs"
SERIAL_FILES="tests/edgekit/runtime/test_engine_gpu.py tests/power/test_nvml.py tests/edgekit/bench/test_sm_partition_gpu.py"
cd "$R"
if [ -x .venv/bin/python ]; then
  . .venv/bin/activate; RUN_DIR=$R
else
  source tools/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
  RUN_DIR=$EDGEKIT_RUN_DIR  # outside the repo: ./edgekit must not shadow the mapped package
fi
export PYTHONSAFEPATH=1 R OUT PER_TEST_S PER_FILE_S
cd "$RUN_DIR"
T0=$(date +%s); export T0 BUDGET_S
TIMEOUT_FLAG=""; python3 -c "import pytest_timeout" 2>/dev/null && TIMEOUT_FLAG="--timeout=$PER_TEST_S"
export TIMEOUT_FLAG

python3 -m pytest -c "$R/pyproject.toml" --rootdir "$R" -p no:cacheprovider -q -m gpu --collect-only "$R/tests" \
  2>"$OUT/collect.err" | grep "::" > "$OUT/ids.txt"
cut -d: -f1 "$OUT/ids.txt" | sort -u > "$OUT/files.txt"
echo "== $(wc -l < "$OUT/ids.txt") GPU tests in $(wc -l < "$OUT/files.txt") files; $JOBS at a time, then $SERIAL_FILES alone"

run_file() {  # one test file in a process of its own; a budget already spent leaves it NOT RUN
  local f=$1 name
  name=$(echo "$f" | tr '/' '_')
  if [ $(( $(date +%s) - T0 )) -ge "$BUDGET_S" ]; then echo -e "$f\tnot_run\t0" >> "$OUT/files.tsv"; return; fi
  local t=$(date +%s)
  timeout "$PER_FILE_S" python3 -m pytest -c "$R/pyproject.toml" --rootdir "$R" -p no:cacheprovider -p no:randomly \
    -q -m gpu -rfE $TIMEOUT_FLAG --junitxml="$OUT/junit/$name.xml" "$R/$f" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  echo -e "$f\t$rc\t$(( $(date +%s) - t ))" >> "$OUT/files.tsv"
  echo "   $f: rc $rc in $(( $(date +%s) - t )) s"
}
export -f run_file
: > "$OUT/files.tsv"
grep -v -x -F -f <(tr ' ' '\n' <<< "$SERIAL_FILES") "$OUT/files.txt" | xargs -d '\n' -P "$JOBS" -I{} bash -c 'run_file "$1"' _ {}
for f in $SERIAL_FILES; do grep -qx "$f" "$OUT/files.txt" && run_file "$f"; done

python3 - "$OUT" "$(( $(date +%s) - T0 ))" <<'PY'
import json, pathlib, sys, xml.etree.ElementTree as ET

out, wall = pathlib.Path(sys.argv[1]), int(sys.argv[2])
ids = [l.strip() for l in (out / "ids.txt").read_text().splitlines() if l.strip()]
files = {}
for line in (out / "files.tsv").read_text().splitlines():
    f, rc, s = line.split("\t")
    files[f] = (rc, int(s))
outcome = {}
for xml in (out / "junit").glob("*.xml"):
    for case in ET.parse(xml).getroot().iter("testcase"):
        path = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        key = f"{case.get('classname')}::{case.get('name')}"
        state = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                state = "timeout" if "Timeout" in (child.get("message") or "") else "failed"
            elif child.tag == "skipped":
                state = "skipped"
        outcome[key] = (state, float(case.get("time") or 0))
tests = []
for tid in ids:
    f, _, rest = tid.partition("::")
    key = f"{f[:-3].replace('/', '.')}::{rest}"
    rc = files.get(f, ("not_run", 0))[0]
    if key in outcome:
        state, secs = outcome[key]
    elif rc == "not_run":
        state, secs = "not_run", 0.0
    elif rc == "124":
        state, secs = "timeout", 0.0  # the file was killed before pytest wrote its report
    else:
        state, secs = "failed", 0.0  # the file ended without a result for it (a crash)
    tests.append({"test": tid, "outcome": state, "seconds": round(secs, 2)})
counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "timeout", "skipped", "not_run")}
doc = {"measured_on": "the GPU this ran on", "wall_s": wall, **counts, "files": {f: {"rc": rc, "seconds": s} for f, (rc, s) in files.items()},
       "tests": tests}
(out / "test_gpu.json").write_text(json.dumps(doc, indent=1))
print(f"== GPU suite: {counts['passed']} passed, {counts['failed']} failed, {counts['timeout']} timed out, "
      f"{counts['skipped']} skipped, {counts['not_run']} not run, in {wall} s")
for t in tests:
    if t["outcome"] in ("failed", "timeout", "not_run"):
        print(f"   {t['outcome'].upper()}: {t['test']}")
bad = counts["failed"] + counts["timeout"] + counts["not_run"]
sys.exit(1 if bad or not tests else 0)
PY

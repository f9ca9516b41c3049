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
# A suite that outgrows one bounded run (the GPU machine's calls end at 10 minutes) finishes in a second one:
# RESUME=1 with the same OUT keeps the files that passed (their rows and reports) and runs the rest (failed, timed
# out, not run, or whose report lacks a test collected now); test_gpu.json then holds every test of both runs.
# FILES="tests/a_gpu.py ..." runs only those files (with RESUME=1, files outside FILES are not kept).
# (H100, 2026-12-06: 135 tests, six files at a time; the two longest files, 225 s and 245 s side by side, were killed
# at PER_FILE_S while sharing the machine with four others, and passed in a second run.)
#
# On the GPU machine (no network) carry the wheels it lacks in .whl/ (README): tools/gpu_setup.sh installs them.
set -uo pipefail
R=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-8}; PER_TEST_S=${PER_TEST_S:-300}; PER_FILE_S=${PER_FILE_S:-420}; BUDGET_S=${BUDGET_S:-470}
RESUME=${RESUME:-0}; FILES=${FILES:-}
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

targets=("$R/tests"); [ -n "$FILES" ] && { targets=(); for f in $FILES; do targets+=("$R/$f"); done; }
python3 -m pytest -c "$R/pyproject.toml" --rootdir "$R" -p no:cacheprovider -q -m gpu --collect-only "${targets[@]}" \
  2>"$OUT/collect.err" | grep "::" > "$OUT/ids.txt"
cut -d: -f1 "$OUT/ids.txt" | sort -u > "$OUT/files.txt"
[ -s "$OUT/ids.txt" ] || { echo "== no GPU tests collected:"; tail -5 "$OUT/collect.err"; }
for f in $FILES; do grep -qx -F "$f" "$OUT/files.txt" || echo "== FILES names $f, which holds no GPU test here"; done
if [ "$RESUME" = 1 ] && [ -s "$OUT/files.tsv" ]; then
  # keep a file that passed before only if its report holds every test collected now (the tree may have changed)
  python3 - "$OUT" <<'PY'
import pathlib, sys, xml.etree.ElementTree as ET

out = pathlib.Path(sys.argv[1])
ids: dict[str, set[str]] = {}
for tid in (out / "ids.txt").read_text().split():
    f, _, rest = tid.partition("::")
    ids.setdefault(f, set()).add(rest)
kept = []
for line in (out / "files.tsv").read_text().splitlines():
    f, rc, _ = line.split("\t")
    report = out / "junit" / (f.replace("/", "_") + ".xml")
    if rc != "0" or f not in ids or not report.exists():
        continue
    names = {c.get("name") for c in ET.parse(report).getroot().iter("testcase")}
    if all(rest.split("::")[-1] in names for rest in ids[f]):
        kept.append(line)
(out / "files.tsv").write_text("".join(line + "\n" for line in kept))
PY
  echo "== resuming: $(wc -l < "$OUT/files.tsv") files passed before and are kept"
else
  [ "$RESUME" = 1 ] && echo "== RESUME=1, but no earlier run in $OUT: running every file"
  : > "$OUT/files.tsv"
fi
cut -f1 "$OUT/files.tsv" > "$OUT/kept.txt"
# only the kept files' reports stand (none in a fresh run): a report an earlier run left must not stand for this one
for xml in "$OUT"/junit/*.xml; do
  [ -e "$xml" ] || continue
  grep -qx -F "$(basename "$xml" .xml)" <(tr '/' '_' < "$OUT/kept.txt") || rm -f "$xml"
done
echo "== $(wc -l < "$OUT/ids.txt") GPU tests in $(wc -l < "$OUT/files.txt") files; $JOBS at a time, then $SERIAL_FILES alone"

run_file() {  # one test file in a process of its own; a budget already spent leaves it NOT RUN
  local f=$1 name
  name=$(echo "$f" | tr '/' '_')
  if [ $(( $(date +%s) - T0 )) -ge "$BUDGET_S" ]; then echo -e "$f\tnot_run\t0" >> "$OUT/files.tsv"; return; fi
  local t=$(date +%s)
  rm -f "$OUT/junit/$name.xml"  # a killed run writes none: an older one must not be read as this run's
  timeout "$PER_FILE_S" python3 -m pytest -c "$R/pyproject.toml" --rootdir "$R" -p no:cacheprovider -p no:randomly \
    -q -m gpu -rfE $TIMEOUT_FLAG --junitxml="$OUT/junit/$name.xml" "$R/$f" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  echo -e "$f\t$rc\t$(( $(date +%s) - t ))" >> "$OUT/files.tsv"
  echo "   $f: rc $rc in $(( $(date +%s) - t )) s"
}
export -f run_file
grep -v -x -F -f "$OUT/kept.txt" "$OUT/files.txt" > "$OUT/todo.txt"
grep -v -x -F -f <(tr ' ' '\n' <<< "$SERIAL_FILES") "$OUT/todo.txt" | xargs -r -d '\n' -P "$JOBS" -I{} bash -c 'run_file "$1"' _ {}
for f in $SERIAL_FILES; do grep -qx -F "$f" "$OUT/todo.txt" && run_file "$f"; done

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
kept = [l for l in (out / "kept.txt").read_text().splitlines() if l]  # files an earlier run passed (RESUME=1)
doc = {"measured_on": "the GPU this ran on", "wall_s": wall, **counts, "files": {f: {"rc": rc, "seconds": s} for f, (rc, s) in files.items()},
       "kept_from_earlier_run": kept, "tests": tests}
(out / "test_gpu.json").write_text(json.dumps(doc, indent=1))
print(f"== GPU suite: {counts['passed']} passed, {counts['failed']} failed, {counts['timeout']} timed out, "
      f"{counts['skipped']} skipped, {counts['not_run']} not run, in {wall} s"
      + (f" (this run; {len(kept)} files passed in an earlier run and were kept)" if kept else ""))
for t in tests:
    if t["outcome"] in ("failed", "timeout", "not_run"):
        print(f"   {t['outcome'].upper()}: {t['test']}")
bad = counts["failed"] + counts["timeout"] + counts["not_run"]
sys.exit(1 if bad or not tests else 0)
PY

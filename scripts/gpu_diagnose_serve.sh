#!/usr/bin/env bash
# Issue 13: which factor gives the persistent path non-finite logits under the serving engine (one device call,
# <= 300 s). Builds the 135m fp16 h200 bundle as scripts/gpu_serve_bench.sh does (context 512), then runs
# scripts/diagnose_persistent_serve.py once per configuration (a fresh process each): decode path fused/persistent,
# lookahead on/off, PDL default/off, 1 and 8 requests. Results: $OUT/diag_serve.jsonl, one line per configuration.
# SET picks the configurations, in the order the H200 diagnosis of 2026-12-01 ran them: 1 (engine factors), 2 (the
# ServingStack, a fused stack first, longer prompts), 3 (no golden check), 4 (bench_serve's prompt, run's generator,
# HTTP: only HTTP reproduced it), 5 (after the fix: HTTP again, then the short serve bench with persistent swaps).
# The cause: a captured graph outlived the PersistentDecoder whose barrier counter it replays (step_runner.py).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
cd "$EDGEKIT_RUN_DIR"
B=/tmp/b-serve
[ -d $B ] || timeout 80 python3 -m edgekit build ${MODEL:-preset:smollm2-135m} --target h200 --dev-key --precision fp16 \
  --no-onnx --context 512 --buckets 16,64 -o $B --force --json > "$OUT/build.json" 2> "$OUT/build.log"
echo "build rc=$?"
run() {  # label env... -- args...
  local label=$1; shift
  local t=$(date +%s)
  env "$@" timeout 90 python3 "$R/scripts/diagnose_persistent_serve.py" $B $EXTRA > /tmp/d.json 2> "$OUT/diag_$label.log"
  local rc=$?
  python3 - "$label" "$rc" $(( $(date +%s) - t )) <<'PY' | tee -a "$OUT/diag_serve.jsonl"
import json, sys
label, rc, s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    d = json.load(open("/tmp/d.json"))
except Exception as e:
    d = {"unreadable": str(e)}
toks = d.pop("tokens", None)
d.update(label=label, rc=rc, wall_s=s, first_tokens=[t[:12] for t in toks] if toks else None)
print(json.dumps(d))
PY
}
if [ "${SET:-1}" = 1 ]; then
EXTRA="--path fused --lookahead 1" run fused_la1 X=1
EXTRA="--path persistent --lookahead 1" run pers_la1 X=1
EXTRA="--path persistent --lookahead 0" run pers_la0 X=1
EXTRA="--path persistent --lookahead 1" run pers_la1_pdl0 EDGEKIT_PDL=0
EXTRA="--path persistent --lookahead 1 --buckets 1" run pers_la1_b1 X=1
EXTRA="--path persistent --lookahead 1 --requests 8" run pers_la1_r8 X=1
elif [ "${SET:-1}" = 3 ]; then  # set 3: the bundle opened without its golden check, as bench_serve opens it
EXTRA="--path persistent --no-golden" run eng_pers_nogolden X=1
EXTRA="--stack --path persistent --no-golden" run stack_pers_nogolden X=1
EXTRA="--path fused --no-golden" run eng_fused_nogolden X=1
(cd "$R" && SWAPS=0 PSWAPS=1 BATCH1_S=3 LOAD_S=3 PSWAP_BUDGET=10 OUT=$OUT/sb bash scripts/gpu_serve_bench.sh $B > "$OUT/sb.txt" 2>&1)
grep -E "events under|persistent: requests" "$OUT/sb.txt"
elif [ "${SET:-1}" = 4 ]; then  # set 4: bench_serve's prompt and length, the run baseline, HTTP
BP="--bench-prompt --prompt-len 16 --tokens 128 --no-golden"
EXTRA="--path persistent $BP" run eng_pers_bench X=1
EXTRA="--stack --path persistent $BP" run stack_pers_bench X=1
EXTRA="--run-baseline --path persistent $BP" run rb_eng_pers_bench X=1
EXTRA="--http 3 --path persistent $BP" run http_pers_bench X=1
EXTRA="--run-baseline --http 3 --path persistent $BP" run rb_http_pers_bench X=1
elif [ "${SET:-1}" = 5 ]; then  # set 5: after the fix (graphs keep their decode step alive), over HTTP + serve bench
BP="--bench-prompt --prompt-len 16 --tokens 128 --no-golden"
EXTRA="--http 3 --path persistent $BP" run http_pers_bench X=1
(cd "$R" && SWAPS=${SWAPS:-10} SWAP_BUDGET=${SWAP_BUDGET:-20} PSWAPS=${PSWAPS:-20} PSWAP_BUDGET=${PSWAP_BUDGET:-60} \
  BATCH1_S=${BATCH1_S:-4} LOAD_S=${LOAD_S:-4} OUT=$OUT/sb bash scripts/gpu_serve_bench.sh $B > "$OUT/sb.txt" 2>&1)
grep -v '^{' "$OUT/sb.txt" | tail -34
else  # set 2: what bench_serve's persistent phase had and set 1 did not (2026-12-01: set 1 gave no non-finite step)
EXTRA="--stack --path fused" run stack_fused X=1
EXTRA="--stack --path persistent" run stack_pers X=1
EXTRA="--stack --path persistent --before-fused" run stack_pers_before X=1
EXTRA="--path persistent --before-fused" run eng_pers_before X=1
EXTRA="--path persistent --prompt-len 50 --tokens 128" run eng_pers_p50_t128 X=1
fi

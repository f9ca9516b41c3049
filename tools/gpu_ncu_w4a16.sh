#!/usr/bin/env bash
# GPU machine, one call (~2-3 min): Nsight Compute on the W4A16 GEMV at the >= 32 MB goal shapes (llama-3.1-8b
# w_gate_up, llama-3.2-1b lm_head), the half2 tiles without (DECODE 3) and with (DECODE 4) the next step's words
# loaded ahead: speed of light, occupancy, launch stats (registers), warp stall reasons, memory workload, as CSV
# under $OUT/ncu/ plus a short summary of the metrics that say why a tile stops short of the copy bandwidth.
# Then fused decode kernels of a preset's step (FUSED_SPECS; default the norm + gate/up + SwiGLU kernel at
# llama-3.2-1b for each of SWIGLU_PRECISIONS, default int4).
# Usage from the repo root on the GPU machine: [GEMV_SPECS=...] [SWIGLU_PRECISIONS="int4 int8 fp16"]
#   [FUSED_SPECS="KERNEL_REGEX:PRESET:PRECISION ..."] bash tools/gpu_ncu_w4a16.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/ncu"
source tools/gpu_setup.sh > "$OUT/ncu/setup.log" 2>&1 || { tail -5 "$OUT/ncu/setup.log"; exit 1; }
cd "$EDGEKIT_RUN_DIR"
# GEMV_SPECS="N K BLOCK_N,BLOCK_K,warps,DECODE;..." (empty: skip the GEMV part)
IFS=';' read -ra SPECS <<< "${GEMV_SPECS-28672 4096 64,256,2,3;28672 4096 128,256,4,4;128256 2048 64,256,2,3;128256 2048 128,256,4,4}"
for spec in "${SPECS[@]}"; do
  set -- $spec
  tag="n$1_k$2_t${3//,/_}"
  timeout 120 ncu --clock-control none --cache-control all -k regex:w4a16_gemv --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --csv --page details \
    python3 "$R/tools/ncu_w4a16_gemv.py" --n "$1" --k "$2" --tile "$3" > "$OUT/ncu/$tag.csv" 2> "$OUT/ncu/$tag.err"
  echo "== $tag rc=$?"
  grep -E '"(Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Limit Registers|Grid Size|Stall Long Scoreboard|Warp Cycles Per Issued Instruction|Issued Warp Per Scheduler|No Eligible)"' \
    "$OUT/ncu/$tag.csv" | awk -F'","' '{print "   " $(NF-2) " = " $NF " " $(NF-1)}' | tr -d '"' | sort -u | head -20
  # warp stall reasons (cycles a warp spends stalled per issued instruction), largest first
  timeout 120 ncu --clock-control none --cache-control all -k regex:w4a16_gemv --launch-skip 2 --launch-count 1 \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" --csv --page raw \
    python3 "$R/tools/ncu_w4a16_gemv.py" --n "$1" --k "$2" --tile "$3" > "$OUT/ncu/${tag}_stalls.csv" 2>> "$OUT/ncu/$tag.err"
  python3 - "$OUT/ncu/${tag}_stalls.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next((i for i, r in enumerate(rows) if "ID" in r[:2]), None)
if head is None or len(rows) < head + 3:
    print("   no stall metrics:", " | ".join(",".join(r)[:120] for r in rows[-3:]))
    sys.exit(0)
names, vals = rows[head], rows[head + 2]
stalls = sorted(((float(v), n.split("stalled_")[1].split("_per_issue")[0]) for n, v in zip(names, vals)
                 if "stalled_" in n and v.replace(".", "", 1).isdigit()), reverse=True)
print("   stalls/issue: " + ", ".join(f"{n} {v:.2f}" for v, n in stalls[:7]))
PY
done
# fused decode kernels, one launch each from a fused decode under ncu (random preset weights, depth 512):
# FUSED_SPECS="KERNEL_REGEX:PRESET:PRECISION ..." (default: the llama-3.2-1b norm + gate/up + SwiGLU kernel, the
# step's largest, at each of SWIGLU_PRECISIONS, default int4). For #30's lever, e.g.
# FUSED_SPECS="norm_qkv_qknorm_rope:qwen3-1.7b:fp16 norm_qkv_rope:llama-3.2-1b:fp16 norm_swiglu:qwen3-1.7b:fp16"
# (GEMV_SPECS= skips the W4A16 part): the QKV kernels ran at ~46-48% of copy where norm_swiglu ran at ~80%.
# FUSED_COUNT launches each (2: both proj_residual launches of a layer, the o-projection and the down projection);
# the stall reasons (cycles stalled per issued instruction) are in the CSV's command-line metrics.
specs=${FUSED_SPECS:-$(for p in ${SWIGLU_PRECISIONS:-int4}; do printf 'norm_swiglu:llama-3.2-1b:%s ' "$p"; done)}
for spec in $specs; do
  IFS=: read -r kern preset prec <<< "$spec"
  tag="${kern}_${preset}_${prec}"
  timeout "${FUSED_S:-${SWIGLU_S:-150}}" ncu --clock-control none --cache-control all -k "regex:$kern" \
    --launch-skip 40 --launch-count "${FUSED_COUNT:-1}" --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" --csv --page details \
    python3 "$R/tools/profile_decode.py" "preset:$preset" --precision "$prec" --engine fused --steps 4 \
    > "$OUT/ncu/$tag.csv" 2> "$OUT/ncu/$tag.err"
  echo "== fused $tag rc=$?"
  grep -E '"(Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Grid Size|Block Size|Warp Cycles Per Issued Instruction|Issued Warp Per Scheduler|No Eligible|Block Limit Registers)"' \
    "$OUT/ncu/$tag.csv" | awk -F'","' '{print "   " $(NF-2) " = " $NF " " $(NF-1)}' | tr -d '"' | sort -u | head -14
done

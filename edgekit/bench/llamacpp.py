"""llama.cpp as a baseline: run ``llama-bench`` on GGUF files and read its JSON.

``llama-bench -m A.gguf,B.gguf -ngl 99 -fa 1 -p P -n N -d D -r R -o json``
prints one record per (model, test); ``n_prompt`` > 0 is the prefill test
(pp), ``n_gen`` > 0 the decode test (tg), both at depth ``n_depth``;
``avg_ts`` is tokens/s. Only the arguments are ours: the binary is the user's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from edgekit.errors import BenchmarkError


def llama_bench_command(binary: Path, models: list[Path], prompt: int, gen: int, depth: int, repeats: int) -> list[str]:
    return [str(binary), "-m", ",".join(str(m) for m in models), "-ngl", "99", "-fa", "1", "-p", str(prompt),
            "-n", str(gen), "-d", str(depth), "-r", str(repeats), "-o", "json"]


def parse_llama_bench(text: str) -> list[dict]:
    """llama-bench's JSON records -> [{"model", "test": "pp"|"tg", "tokens", "depth", "tokens_per_s", "stdev"}]."""
    start = text.find("[")
    try:
        records = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError as e:
        raise BenchmarkError(f"llama-bench printed no JSON list ({e}); output starts {text[:200]!r}") from e
    if not isinstance(records, list):
        raise BenchmarkError(f"llama-bench printed no JSON list; output starts {text[:200]!r}")
    out = []
    for r in records:
        pp = int(r.get("n_prompt", 0)) > 0
        out.append({"model": Path(str(r.get("model_filename", ""))).name, "test": "pp" if pp else "tg",
                    "tokens": int(r["n_prompt"] if pp else r["n_gen"]), "depth": int(r.get("n_depth", 0)),
                    "tokens_per_s": float(r["avg_ts"]), "stdev": float(r.get("stddev_ts", 0.0)),
                    "build": r.get("build_commit"), "gpu": r.get("gpu_info")})
    return out


def run_llama_bench(binary: Path, models: list[Path], *, prompt: int = 512, gen: int = 128, depth: int = 512,
                    repeats: int = 3, timeout_s: float = 600) -> list[dict]:
    cmd = llama_bench_command(binary, models, prompt, gen, depth, repeats)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BenchmarkError(f"llama-bench did not run: {e}", hint="pass the path of a llama-bench binary") from e
    if r.returncode != 0:
        raise BenchmarkError(f"llama-bench exited with {r.returncode}: {r.stderr[-800:]}")
    return parse_llama_bench(r.stdout)


def quantize_gguf(binary: Path, src: Path, dst: Path, kind: str = "Q8_0", timeout_s: float = 600) -> Path:
    """``llama-quantize src dst kind`` (llama.cpp's own quantizer, so the Q8_0 file is llama.cpp's)."""
    try:
        r = subprocess.run([str(binary), str(src), str(dst), kind], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BenchmarkError(f"llama-quantize did not run: {e}") from e
    if r.returncode != 0:
        raise BenchmarkError(f"llama-quantize exited with {r.returncode}: {r.stderr[-800:]}")
    return dst

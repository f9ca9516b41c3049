"""llama.cpp as a baseline: run ``llama-bench`` on the GGUF files edgekit loads, and read its JSON.

``llama-bench -m A.gguf,B.gguf -ngl 99 -fa 1 -p P -n N -d D1,D2 -r R -o json``
prints one record per (model, depth, test); ``n_prompt`` > 0 is the prefill
test (pp), ``n_gen`` > 0 the decode test (tg), at depth ``n_depth`` (tokens
already in the cache); ``avg_ts`` is tokens/s. Only the arguments are ours:
the binaries are the user's, found where ``--llama-bench`` / ``--llama-quantize``
say (a path, or a name on PATH) and checked before any work starts.

For a preset, edgekit writes a random-weight F16 GGUF of its shape
(``gguf_preset``) and loads that very file; ``llama-quantize`` makes the Q8_0
and Q4_K_M copies, so llama.cpp's quantized files are llama.cpp's own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from edgekit.errors import BenchmarkError

QUANTIZED_COPIES = ("Q8_0", "Q4_K_M")  # what llama-quantize makes of a preset's F16 file
USER_FILE = "file"  # the label of a GGUF file the user gave (its type is what llama-bench reports)
BUILD_HINT = ("build llama.cpp with CUDA (cmake -B build -DGGML_CUDA=ON -DLLAMA_CURL=OFF && cmake --build build "
              "--target llama-bench llama-quantize) and pass build/bin/{name}")


def resolve_binary(given: str | Path, name: str, flag: str) -> Path:
    """The executable ``given`` names (a path, or a command on PATH); BenchmarkError saying what is wrong otherwise."""
    p = Path(given).expanduser()
    if p.exists():
        if p.is_file() and os.access(p, os.X_OK):
            return p
        why = "is a directory" if p.is_dir() else "is not executable"
        raise BenchmarkError(f"{flag} {given}: {why}; expected llama.cpp's {name} executable",
                             hint=f"pass the binary itself (chmod +x if needed), or {BUILD_HINT.format(name=name)}")
    found = shutil.which(str(given)) if os.sep not in str(given) else None
    if found is None:
        raise BenchmarkError(f"{flag} {given}: no such file, and no {given!r} command on PATH; expected llama.cpp's {name}",
                             hint=BUILD_HINT.format(name=name))
    return Path(found)


def llama_bench_command(binary: Path, models: Sequence[Path], prompt: int, gen: int, depths: Sequence[int] | int,
                        repeats: int) -> list[str]:
    depths = [depths] if isinstance(depths, int) else list(depths)
    return [str(binary), "-m", ",".join(str(m) for m in models), "-ngl", "99", "-fa", "1", "-p", str(prompt),
            "-n", str(gen), "-d", ",".join(str(d) for d in depths), "-r", str(repeats), "-o", "json"]


def file_kind(model_type: str | None) -> str | None:
    """llama-bench's ``model_type`` ("llama 1B Q8_0") -> the file's type ("Q8_0"); None when absent."""
    return model_type.split()[-1] if model_type and model_type.split() else None


def parse_llama_bench(text: str) -> list[dict]:
    """llama-bench's JSON records -> [{"model", "test": "pp"|"tg", "tokens", "depth", "tokens_per_s", "stdev", ...}]."""
    start = text.find("[")
    try:
        records = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError as e:
        raise BenchmarkError(f"llama-bench printed no JSON list ({e}); output starts {text[:200]!r}",
                             hint="run it with -o json (edgekit does) and check it is llama.cpp's llama-bench") from e
    if not isinstance(records, list):
        raise BenchmarkError(f"llama-bench printed no JSON list; output starts {text[:200]!r}",
                             hint="run it with -o json (edgekit does) and check it is llama.cpp's llama-bench")
    out = []
    for i, r in enumerate(records):
        try:
            pp = int(r.get("n_prompt", 0)) > 0
            out.append({"model": Path(str(r.get("model_filename", ""))).name, "path": str(r.get("model_filename", "")),
                        "kind": file_kind(r.get("model_type")), "test": "pp" if pp else "tg",
                        "tokens": int(r["n_prompt"] if pp else r["n_gen"]), "depth": int(r.get("n_depth", 0)),
                        "tokens_per_s": float(r["avg_ts"]), "stdev": float(r.get("stddev_ts", 0.0)),
                        "build": r.get("build_commit"), "gpu": r.get("gpu_info")})
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise BenchmarkError(f"llama-bench record {i} lacks {e} or has a bad value: {str(r)[:200]}",
                                 hint="expected llama-bench's -o json records (n_prompt, n_gen, n_depth, avg_ts)") from e
    return out


def _run(cmd: list[str], what: str, timeout_s: float) -> subprocess.CompletedProcess:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise BenchmarkError(f"{what} ran longer than {timeout_s:.0f} s: {' '.join(cmd)}",
                             hint="fewer contexts or repeats, or check the GPU is free") from e
    except OSError as e:
        raise BenchmarkError(f"{what} did not start: {e}", hint=BUILD_HINT.format(name=what)) from e
    if r.returncode != 0:
        raise BenchmarkError(f"{what} exited with {r.returncode}: {' '.join(cmd)}\n{(r.stderr or r.stdout)[-800:]}",
                             hint=f"run the command by hand to see why; {BUILD_HINT.format(name=what)}")
    return r


def run_llama_bench(binary: Path, models: Sequence[Path], *, prompt: int = 512, gen: int = 128,
                    depth: int | Sequence[int] = 512, repeats: int = 3, timeout_s: float = 600) -> list[dict]:
    cmd = llama_bench_command(binary, models, prompt, gen, depth, repeats)
    return parse_llama_bench(_run(cmd, "llama-bench", timeout_s).stdout)


def quantize_gguf(binary: Path, src: Path, dst: Path, kind: str = "Q8_0", timeout_s: float = 600) -> Path:
    """``llama-quantize src dst kind`` (llama.cpp's own quantizer, so the Q8_0 file is llama.cpp's)."""
    _run([str(binary), str(src), str(dst), kind], "llama-quantize", timeout_s)
    if not Path(dst).is_file():
        raise BenchmarkError(f"llama-quantize exited 0 but wrote no {dst}", hint="check the binary is llama.cpp's llama-quantize")
    return Path(dst)


def preset_files(cfg, name: str, workdir: Path, seed: int, quantize: Path | None) -> dict[str, Path]:
    """{"F16": file, "Q8_0": ..., "Q4_K_M": ...}: the preset's random-weight F16 GGUF and llama.cpp's quantized copies
    (only F16 without ``quantize``). The F16 file is what edgekit loads too."""
    from edgekit.bench.gguf_preset import write_random_gguf

    workdir.mkdir(parents=True, exist_ok=True)
    stem = name.removeprefix("preset:")
    files = {"F16": write_random_gguf(cfg, workdir / f"{stem}-f16-seed{seed}.gguf", seed=seed)}
    if quantize is not None:
        for kind in QUANTIZED_COPIES:
            files[kind] = quantize_gguf(quantize, files["F16"], workdir / f"{stem}-{kind.lower()}-seed{seed}.gguf", kind)
    return files


@dataclass(frozen=True)
class LlamaMeasurement:
    """llama.cpp's figures for one file at one context: decode at that depth, prefill of that many tokens from empty."""

    kind: str  # the file's type ("F16", "Q8_0", ...)
    file: str
    context: int
    decode_tokens_per_s: float
    decode_stdev: float
    prefill_tokens_per_s: float | None
    build: str | None
    gpu: str | None


def measure_files(binary: Path, files: dict[str, Path], contexts: Sequence[int], new_tokens: int, repeats: int,
                  timeout_s: float = 600) -> tuple[list[LlamaMeasurement], list[str]]:
    """One llama-bench run per context over every file: tg ``new_tokens`` at depth T and pp T at depth 0.

    Returns the measurements and the commands run.
    """
    by_path = {str(p): kind for kind, p in files.items()}
    out, commands = [], []
    for T in contexts:
        cmd = llama_bench_command(binary, list(files.values()), T, new_tokens, [0, T], repeats)
        commands.append(" ".join(cmd))
        records = parse_llama_bench(_run(cmd, "llama-bench", timeout_s).stdout)
        for path, kind in by_path.items():
            mine = [r for r in records if r["path"] == path or r["model"] == Path(path).name]
            tg = next((r for r in mine if r["test"] == "tg" and r["depth"] == T), None)
            pp = next((r for r in mine if r["test"] == "pp" and r["depth"] == 0 and r["tokens"] == T), None)
            if tg is None:
                got = sorted({(r["test"], r["tokens"], r["depth"]) for r in mine})
                raise BenchmarkError(f"llama-bench gave no decode record at depth {T} for {path} (got {got})",
                                     hint="check the llama-bench version supports -d (depth): llama.cpp b5000 or later")
            named = tg["kind"] or kind if kind == USER_FILE else kind  # a user's file: the type llama.cpp reports
            out.append(LlamaMeasurement(kind=named, file=Path(path).name, context=T,
                                        decode_tokens_per_s=tg["tokens_per_s"], decode_stdev=tg["stdev"],
                                        prefill_tokens_per_s=pp["tokens_per_s"] if pp else None,
                                        build=tg["build"], gpu=tg["gpu"]))
    return out, commands

"""Batch-1 decode of edgekit (per-operator and fused paths) against llama.cpp, on the same GGUF files (GPU).

What ``scripts/bench_decode_vs_llamacpp.py`` runs (the script parses arguments and calls ``run``). For each
preset: write a random-weight F16 GGUF of its shape (edgekit), make llama.cpp's Q8_0 copy with
llama-quantize, load the F16 file back with edgekit's GGUF loader, and measure in one process:

- edgekit fp16 and int8 (W8A16 blocks, made from the same F16 file), each on the per-operator graphed
  decode step and on the fused one: decode tokens/s at depth D (prefill D tokens, then N greedy tokens fed
  back on the device, median of R loops), graphed prefill time for D tokens (TTFT), kernels per token
  (torch.profiler), the bandwidth roofline (device copy bandwidth measured in the same run);
- agreement of the two paths on one step from the same cache: logits difference, argmax, the cache rows written;
- llama.cpp: ``llama-bench -p D -n N -d D -fa 1 -ngl 99`` on F16 and Q8_0 (``edgekit.bench.llamacpp``).

int4 (W4A16 g128 RTN blocks, FP16 head) runs on the fused path like the others, as do int8-head and int4-head (the
LM head quantized too, compared with the same llama.cpp file as int8 / int4) where the decode graph's fusions take
them (``engines_for``). Every row records the decode path it ran, and the table prints it and the INT4 / INT8
tokens/s of each (model, engine) measured in the same run (``INT4_PAIRS``).

All figures are measured on the local GPU (random weights: speed does not depend on values).
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

import torch

from edgekit.bench import release_goals
from edgekit.measured_on import measured_on
from edgekit.strict_json import write_json_file

ENGINES = ("edgekit", "edgekit-fused")  # per-operator, fused super-operators
DEFAULT_ENGINES = ("edgekit-fused",)
# the llama.cpp file each edgekit precision is compared with (llama-quantize makes the quantized ones from the F16 file)
LLAMA_KIND = {"fp16": "F16", "int8": "Q8_0", "int4": "Q4_K_M", "int8-head": "Q8_0", "int4-head": "Q4_K_M"}


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _agreement(per_op_engine, first, depth: int) -> dict:
    """One decode step from the same cache on both paths (not graphed): how close are they?"""
    from edgekit.model.kv_cache import StaticKVCache
    from edgekit.runtime.fused_decode import FusedDecoder, with_fused_kernels

    dec = per_op_engine.decoder
    src = per_op_engine.cache
    twin = object.__new__(StaticKVCache)
    twin.__dict__.update(src.__dict__)
    twin.k, twin.v = [t.clone() for t in src.k], [t.clone() for t in src.v]
    pos = torch.tensor([depth], device=dec.device)
    want = dec.decode(first, pos, src).float()  # (1, V)
    token, got = FusedDecoder(dec, with_fused_kernels(dec.ops)).decode_token(first, pos, twin)
    got = got.float()
    scale = float(want.abs().max())
    # the row each layer wrote: the position, or position % window in a sliding-window layer's ring
    kv = max(float((a[:, :, depth % a.shape[2]] - b[:, :, depth % a.shape[2]]).abs().max())
             for a, b in zip(src.k + src.v, twin.k + twin.v))
    return {"max_abs_logit_diff": float((got - want).abs().max()), "max_abs_logit": scale,
            "argmax_equal": int(token[0]) == int(want.argmax(-1)[0]), "max_abs_kv_diff_at_position": kv}


def _measure_engine(engine, prompt, depth: int, n: int, repeats: int, dev) -> dict:
    from edgekit.bench.measure import median, timed
    from edgekit.bench.profile import profile_decode

    first = engine.prefill(prompt)
    engine.decode(first, depth, n)  # warm
    times = [timed(lambda: engine.decode(first, depth, n), dev)[1] for _ in range(repeats)]
    tokens = engine.decode(first, depth, 16).tolist()
    engine.prefill_graphed(prompt)
    ttft = median([timed(lambda: engine.prefill_graphed(prompt), dev)[1] for _ in range(repeats)])
    prof = profile_decode(engine, first, depth, 16, top=8)
    return {"decode_tokens_per_s": n / median(times), "decode_ms_per_token": 1000 * median(times) / n,
            "decode_loops_s": times, "ttft_graphed_ms": 1000 * ttft, "kernels_per_token": prof["kernels_per_token"],
            "kernel_ms_per_token": prof["kernel_ms_per_token"], "between_kernels_ms_per_token": prof["between_kernels_ms_per_token"],
            "top_kernels": prof["top_kernels"], "first_tokens": tokens[:8], "_first": first}


def bench_edgekit(preset: str, f16: Path, args, dev, bw: dict, precisions: tuple[str, ...] | None = None) -> list[dict]:
    from edgekit.bench.engines import RuntimeEngine
    from edgekit.bench.fused_engine import FusedRuntimeEngine
    from edgekit.bench.roofline import decode_bytes, mean_attended_len, roofline_tokens_per_s
    from edgekit.bench.runner import _cast, quantized
    from edgekit.model.gguf_loader import load_gguf
    from edgekit.model.weights import weights_from_hf_state_dict

    t = time.perf_counter()
    if f16 is None:  # --random-weights: the preset's shape, weights made here (no file, no llama.cpp rows)
        from edgekit.model.presets import preset_config
        from edgekit.model.weights import random_weights

        cfg = preset_config(preset)
        w16 = random_weights(cfg, seed=0, dtype=torch.float16, device=dev)
    else:
        cfg, sd, _ = load_gguf(f16)
        w = _cast(weights_from_hf_state_dict(cfg, sd, str(f16)), "cpu", torch.float16)
        del sd
        w16 = _cast(w, dev, torch.float16)
        del w
    _log(f"{preset}: weights ready in {time.perf_counter() - t:.1f}s ({f16.name if f16 else 'random, no file'})")
    depth, n = args.depth, args.tokens
    max_seq = -(-(depth + n + 32) // 64) * 64
    prompt = torch.randint(0, cfg.vocab_size, (1, depth), generator=torch.Generator().manual_seed(1)).to(dev)
    rows = []
    for precision in precisions or args.precisions:
        wp = quantized(w16, precision)
        attended = mean_attended_len(depth, n)
        nbytes = decode_bytes(cfg, wp, attended, 2.0).total
        tokens = {}
        engines = {c.name: c for c in (RuntimeEngine, FusedRuntimeEngine)}
        row_agree = None
        names, note = engines_for(cfg, wp, getattr(args, "engines", DEFAULT_ENGINES))
        for cls in (engines[e] for e in names):
            row = {"model": preset, "file": f16.name if f16 else None, "engine": cls.name, "precision": precision, "depth": depth,
                   "new_tokens": n, "measured_on": measured_on(dev)}
            if note:
                row["engine_note"] = note
            try:
                t = time.perf_counter()
                eng = cls(cfg, wp, max_seq, max_tokens=max(n, 16))
                row["setup_s"] = time.perf_counter() - t
                m = _measure_engine(eng, prompt, depth, n, args.repeats, dev)
                first = m.pop("_first")
                row.update(m)
                row["decode_path"] = eng.path.to_dict() if hasattr(eng, "path") else {"path": "per-operator"}
                row["bytes_per_token"] = nbytes
                row["roofline_tokens_per_s"] = roofline_tokens_per_s(nbytes, bw["bytes_per_s"])
                row["roofline_fraction"] = row["decode_tokens_per_s"] / row["roofline_tokens_per_s"]
                tokens[cls.name] = m["first_tokens"]
                if cls is RuntimeEngine:
                    row_agree = _agreement(eng, first, depth)
                eng.close()
                del eng
            except Exception as e:  # recorded, the run goes on
                row["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            rows.append(row)
            torch.cuda.empty_cache()
            _log(f"{preset} {precision} {row['engine']}: {row.get('decode_tokens_per_s', float('nan')):.0f} tok/s "
                 f"{row.get('kernels_per_token', float('nan')):.0f} kernels/token {row.get('error', '')}")
        if row_agree is not None and "edgekit-fused" in tokens:
            fused_row = next(r for r in rows[::-1] if r["engine"] == "edgekit-fused")
            fused_row["agreement_with_per_operator"] = {**row_agree, "first_8_tokens_equal": tokens["edgekit"] == tokens["edgekit-fused"]}
        if len(tokens) > 1:  # every engine's first greedy tokens against the first engine's
            first_engine, first_tokens = next(iter(tokens.items()))
            for r in rows[-len(tokens):]:
                if r["engine"] in tokens and r["engine"] != first_engine:
                    r[f"first_8_tokens_equal_to_{first_engine}"] = tokens[r["engine"]] == first_tokens
        del wp
    del w16
    torch.cuda.empty_cache()
    return rows


def engines_for(config, weights, requested: tuple[str, ...]) -> tuple[list[str], str | None]:
    """The engines to measure these weights on, and why the list differs from ``requested`` (None: it does not).

    Weights the fused path cannot take (e.g. W8A8) are measured once on the per-operator step, so the precision
    still gets a row, labelled."""
    from edgekit.graph.builder import LinearSchemes
    from edgekit.graph.paths import fused_blocker

    why_not = fused_blocker(config, LinearSchemes.of_weights(weights))
    fast = [e for e in requested if e != "edgekit"]
    if why_not is not None and fast:
        return ["edgekit"], (f"{', '.join(fast)} cannot take these weights ({why_not}): measured on the per-operator "
                             f"step instead")
    return list(requested), None


def _wait_for(path: Path | None, seconds: float) -> bool:
    if path is None:
        return False
    end = time.time() + seconds
    while not path.exists() and time.time() < end:
        time.sleep(5)
    return path.exists()


def llama_cpp_error_row(preset: str, e: BaseException) -> dict:
    """The llama_cpp row of a model llama.cpp did not measure: no figure (null in the file, read as missing)."""
    return {"model": preset, "error": f"{type(e).__name__}: {e}", "file_kind": "-", "test": "-", "tokens_per_s": None}


def table(doc: dict) -> str:
    llama = {(r["model"], r["file_kind"], r["test"]): r["tokens_per_s"] for r in doc.get("llama_cpp", [])}
    lines = [f"decode tokens/s, batch 1, depth {doc['depth']}, {doc['tokens']} new tokens; measured on the GPU "
             f"({doc['device']}); copy bandwidth {doc['bandwidth']['bytes_per_s'] / 1e9:.0f} GB/s",
             f"{'model':14} {'prec':9} {'engine':18} {'path':12} {'tok/s':>7} {'kern/tok':>8} {'roofline':>8} "
             f"{'llama.cpp':>9} {'ratio':>6} {'TTFT ms':>8} {'llama pp ms':>11}"]
    for r in doc["edgekit"]:
        kind = LLAMA_KIND.get(r["precision"], "Q8_0")
        base = llama.get((r["model"], kind, "tg"))
        pp = llama.get((r["model"], kind, "pp"))
        tps = r.get("decode_tokens_per_s")
        if tps is None:
            lines.append(f"{r['model']:14} {r['precision']:9} {r['engine']:18} error: {r.get('error', '')[:80]}")
            continue
        path = (r.get("decode_path") or {}).get("path", "-")  # the decode path the row ran (select_decode_path's)
        lines.append(f"{r['model']:14} {r['precision']:9} {r['engine']:18} {path:12} {tps:7.0f} {r['kernels_per_token']:8.0f} "
                     f"{100 * r['roofline_fraction']:7.1f}% {base or float('nan'):9.0f} "
                     f"{(tps / base) if base else float('nan'):6.2f} {r['ttft_graphed_ms']:8.2f} "
                     f"{(1000 * doc['depth'] / pp) if pp else float('nan'):11.2f}")
    lines += [f"{model} {engine}: {pair} decode tokens/s = {ratio:.2f} (the roofline issue's goal: >= {INT4_OVER_INT8_GOAL})"
              for (model, engine, pair), ratio in int4_over_int8(doc).items()]
    goals = release_goals.evaluate(doc, LLAMA_KIND)
    if goals:
        lines += ["the issues' speed goals, in this run (release_goals.py):", *release_goals.goal_lines(goals)]
    return "\n".join(lines)


INT4_OVER_INT8_GOAL = release_goals.INT4_OVER_INT8  # the roofline issue's (#31, was #14)


# the INT4 rows set against INT8 ones: the FP16-head pair, and INT4 with its INT4 head (#31 reads its goal "with the
# INT4 head") against INT8 with its FP16 head and with its INT8 head
INT4_PAIRS = (("int4", "int8"), ("int4-head", "int8"), ("int4-head", "int8-head"))


def int4_over_int8(doc: dict) -> dict[tuple[str, str, str], float]:
    """(model, engine, "int4 / int8") -> INT4 tokens/s / INT8 tokens/s for each of INT4_PAIRS that both rows of
    one run measured."""
    tps = {(r["model"], r["engine"], r["precision"]): r["decode_tokens_per_s"] for r in doc["edgekit"]
           if r.get("decode_tokens_per_s")}
    return {(m, e, f"{four} / {eight}"): tps[(m, e, four)] / v for four, eight in INT4_PAIRS
            for (m, e, p), v in tps.items() if p == eight and (m, e, four) in tps}


def preset_precisions(presets: str, default: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """"smollm2-135m:fp16,qwen3-0.6b" -> {"smollm2-135m": ("fp16",), "qwen3-0.6b": default}: a ``:p1+p2`` suffix
    narrows one preset's precisions (the llama.cpp copies made for it follow)."""
    out = {}
    for spec in presets.split(","):
        preset, _, only = spec.strip().partition(":")
        precisions = tuple(only.split("+")) if only else default
        unknown = [p for p in precisions if p not in LLAMA_KIND]
        if not preset or unknown:
            raise ValueError(f"preset spec {spec!r}: expected PRESET or PRESET:P1+P2 with precisions from "
                             f"{', '.join(LLAMA_KIND)}")
        out[preset] = precisions
    return out


def run(args) -> dict:
    """The whole measurement; ``args`` has the script's options (presets, precisions, depth, tokens, repeats, workdir,
    llama_bench, llama_quantize, wait_llama_s, json, random_weights). Writes ``args.json`` after every model."""
    from edgekit.bench.gguf_preset import write_random_gguf
    from edgekit.bench.measure import copy_bandwidth
    from edgekit.model.presets import preset_config

    dev = torch.device("cuda")
    args.workdir.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth(dev)
    doc = {"depth": args.depth, "tokens": args.tokens, "repeats": args.repeats, "device": torch.cuda.get_device_name(dev),
           "bandwidth": bw, "edgekit": [], "llama_cpp": [], "files": {},
           "note": "measured on the GPU; random weights of each preset's shape, written once as F16 GGUF and read by both engines"}

    def save():
        doc["goals"] = release_goals.evaluate(doc, LLAMA_KIND)
        if args.json:
            # atomic (a run cut short by its time limit keeps the last whole document) and strict JSON
            write_json_file(args.json, doc, indent=1)

    files = {}
    precisions_of = preset_precisions(args.presets, tuple(args.precisions))
    for preset in precisions_of:
        f16 = None
        if not args.random_weights:
            f16 = args.workdir / f"{preset}-f16.gguf"
            t = time.perf_counter()
            write_random_gguf(preset_config(preset), f16, seed=0)
            _log(f"{preset}: wrote {f16.name} ({f16.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.1f}s")
            files[preset] = f16
            doc["files"][preset] = {"F16": f16.name}
        doc["edgekit"].extend(bench_edgekit(preset, f16, args, dev, bw, precisions_of[preset]))
        save()
        print(table(doc), flush=True)
    if files and _wait_for(args.llama_bench, args.wait_llama_s) and _wait_for(args.llama_quantize, 5):
        from edgekit.bench.llamacpp import quantize_gguf, run_llama_bench

        for preset, f16 in files.items():
            try:
                by_name = {f16.name: "F16"}
                for kind in sorted({LLAMA_KIND[p] for p in precisions_of[preset] if p in LLAMA_KIND} - {"F16"}):
                    q = quantize_gguf(args.llama_quantize, f16, f16.with_name(f"{preset}-{kind.lower()}.gguf"), kind)
                    doc["files"][preset][kind] = q.name
                    by_name[q.name] = kind
                paths = [f16.with_name(name) for name in by_name]
                for r in run_llama_bench(args.llama_bench, paths, prompt=args.depth, gen=args.tokens,
                                         depth=args.depth, repeats=args.repeats):
                    r["model"], r["file_kind"] = preset, by_name.get(r["model"], r["model"])
                    doc["llama_cpp"].append(r)
            except Exception as e:
                doc["llama_cpp"].append(llama_cpp_error_row(preset, e))
            save()
    else:
        doc["llama_cpp_note"] = "llama.cpp binaries not available: no baseline rows"
    save()
    return doc

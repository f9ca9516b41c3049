#!/usr/bin/env python
"""Lossless INT4 intake on a real model: the 4-bit GGUF taken in as W4A16 vs the same file dequantized to FP32.

Default: the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) on edgekit's shipped held-out text with the accuracy
gate's budget (2048 tokens in windows of 256, 4 prompts x 128 greedy tokens). Both models run on this machine's
CPU with FP32 activations and the reference operators. Prints a table and JSON (stdout with --json, or --out PATH).
Done-when of issue #14: perplexity within 0.1% and the same greedy tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None, help="a 4-bit GGUF file (default: the default model)")
    ap.add_argument("--ppl-tokens", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true", help="print only the JSON")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()

    import torch

    from edgekit.model.gguf_loader import stored_tensor_types
    from edgekit.model.loader import load_model
    from edgekit.quant.gate import GateConfig
    from edgekit.quant.int4_intake import compare_lossless_int4
    from edgekit.quant.quantize import heldout_eval_text

    torch.manual_seed(0)
    t0 = time.perf_counter()
    dequantized = load_model(args.model)
    lossless = load_model(args.model, tokenizer=False, keep_int4=True)
    gate = GateConfig(ppl_tokens=args.ppl_tokens, new_tokens=args.new_tokens)
    text = heldout_eval_text(dequantized, gate)
    res = compare_lossless_int4(dequantized, lossless, text, gate)
    from pathlib import Path

    res.update(model=dequantized.config.name, file=dequantized.source.location,
               tensor_types=stored_tensor_types(Path(dequantized.source.location)),
               text="edgekit/quant/data/heldout.txt", torch_threads=torch.get_num_threads(),
               seconds=round(time.perf_counter() - t0, 1),
               done_when={"perplexity_within_0.1%": abs(res["perplexity_increase"]) <= 0.001,
                          "same_greedy_tokens": res["greedy_tokens_identical"]})
    doc = json.dumps(res, indent=2, default=str)
    if args.out:
        Path(args.out).write_text(doc + "\n")
    if args.json:
        print(doc)
        return 0
    rows = [
        ("perplexity, dequantized FP32 reference", f"{res['fp_perplexity']:.6f}"),
        ("perplexity, lossless INT4 intake", f"{res['quant_perplexity']:.6f}"),
        ("perplexity change", f"{100 * res['perplexity_increase']:+.6f}%"),
        ("teacher-forced greedy agreement", f"{100 * res['greedy_agreement']:.2f}% of {res['greedy_positions']}"),
        ("free-running greedy tokens identical", f"{res['greedy_tokens_identical']} "
                                                 f"({res['greedy_tokens_same']}/{res['greedy_tokens_total']})"),
        ("logits SNR", f"{res['logits_snr_db']} dB"),
        ("W4A16 / FP projections", f"{res['w4a16_layers']} / {res['fp_layers']}"),
        ("weight bytes in memory, INT4 vs FP32", f"{res['weight_bytes']['lossless_int4'] / 1e6:.1f} MB vs "
                                                 f"{res['weight_bytes']['dequantized_fp32'] / 1e6:.1f} MB"),
        ("tokens scored", str(res["tokens_scored"])),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"{res['model']} ({res['file']}), held-out text, measured on the CPU, FP32 activations")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print(json.dumps(res, default=str))
    return 0 if all(res["done_when"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

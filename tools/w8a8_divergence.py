#!/usr/bin/env python3
"""Where a quantized model on the GPU parts from its CPU reference (GPU machine; the default model's real weights).

For each mode (w8a16, w8a8) the teacher-forced logits of the prompt + 32 greedy tokens are computed on the CPU
reference operators and on several GPU tables, and compared as an SNR (dB) against the CPU:

- ``torch``: the same torch reference operators, on the GPU (the floor: only the device's rounding differs);
- ``triton``: every operator on its Triton kernel (what test_quant_gpu checks);
- ``triton-linear``: only the mode's linear operator on Triton, the rest torch on the GPU;
- ``triton-but-linear``: every operator on Triton except the mode's linear.

Then, per block, the SNR of one block's output on the GPU (fed the CPU's input to that block) and of the running
hidden state, for ``torch`` and ``triton``: where the error is made and how the blocks amplify it.

  python tools/w8a8_divergence.py --json out.json [--model preset:smollm2-135m]
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch


def _snr(ref: torch.Tensor, got: torch.Tensor) -> float:
    ref, got = ref.double().cpu(), got.double().cpu()
    noise = (ref - got).pow(2).sum()
    return float("inf") if noise == 0 else 10 * math.log10(float(ref.pow(2).sum() / noise))


def _tables(mode: str):
    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.kernels.triton_backend import triton_dispatch_table, triton_ops

    linear = "linear_" + mode
    only = DispatchTable()
    only.set(linear, triton_ops()[linear], source="triton")
    but = triton_dispatch_table()
    but.reset(linear)
    return {"torch": DispatchTable(), "triton": triton_dispatch_table(), "triton-linear": only,
            "triton-but-linear": but}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model reference (default: the default model)")
    ap.add_argument("--modes", default="w8a16,w8a8")
    ap.add_argument("--tables", default="torch,triton,triton-linear,triton-but-linear")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the torch table only")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()

    from edgekit.generate import Generator
    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.model.kv_int8 import make_decoder
    from edgekit.model.loader import load_model
    from edgekit.quant.forward import all_logits, embed, logits, run_blocks
    from edgekit.quant.quantize import QuantizeOptions, prepare_quantization
    from edgekit.shapes import StaticShapes

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = load_model(args.model) if args.model else load_model()
    prompt = list(range(100, 132)) if model.tokenizer is None else model.tokenizer.encode(
        "The lighthouse keeper climbed the spiral stairs a little after four o'clock")
    doc = {"model": args.model or "default", "measured": "GPU vs CPU, this machine", "modes": {}}
    for mode in args.modes.split(","):
        prep = prepare_quantization(model, mode, kv_int8=False, options=QuantizeOptions(quantize_head=True))
        weights = prep.assemble()
        cpu = make_decoder(prep.config, weights, DispatchTable(), None)
        want, _ = Generator(cpu, StaticShapes.for_context(128)).generate(prompt, 32)
        seq = torch.tensor([prompt + want])
        ref = all_logits(cpu, seq)[0]
        gw = weights.to(device=args.device)
        entry = {"logits_snr_db": {}, "per_block": {}}
        tables = {n: t for n, t in _tables(mode).items() if n in args.tables.split(",")} if args.tables != "torch" \
            else {"torch": DispatchTable()}
        for name, table in tables.items():
            dec = make_decoder(prep.config, gw, table, None)
            entry["logits_snr_db"][name] = round(_snr(ref, all_logits(dec, seq.to(args.device))[0]), 2)
            if name not in ("torch", "triton"):
                continue
            rows = []
            x_cpu = embed(cpu, seq)
            x_gpu = embed(dec, seq.to(args.device))
            for i in range(prep.config.n_layers):
                one = run_blocks(dec, x_cpu.to(args.device), i, i + 1)  # this block alone, from the CPU's input
                x_next = run_blocks(cpu, x_cpu, i, i + 1)
                x_gpu = run_blocks(dec, x_gpu, i, i + 1)
                rows.append({"block": i, "one_block_snr_db": round(_snr(x_next, one), 2),
                             "running_snr_db": round(_snr(x_next, x_gpu), 2)})
                x_cpu = x_next
            head = logits(dec, x_cpu.to(args.device))
            rows.append({"block": "head", "one_block_snr_db": round(_snr(logits(cpu, x_cpu), head), 2)})
            entry["per_block"][name] = rows
        doc["modes"][mode] = entry
        print(mode, json.dumps(entry["logits_snr_db"]), flush=True)
        for name, rows in entry["per_block"].items():
            print(f"  {name:8s} one-block SNR: " + " ".join(f"{r['one_block_snr_db']:.0f}" for r in rows))
            print(f"  {name:8s} running   SNR: " + " ".join(f"{r['running_snr_db']:.0f}" for r in rows[:-1]))
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

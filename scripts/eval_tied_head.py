#!/usr/bin/env python
"""CPU accuracy and bytes per token of the LM head/embedding quantized and kept tied, on the default model.

The default model (SmolLM2-135M-Instruct, tied embeddings) quantized five ways, each scored by the accuracy
gate's own `evaluate` on the shipped held-out text against one FP reference (the model as loaded: its Q4_1 GGUF
dequantized to FP32, FP32 activations, reference operators):

    int8                 W8A16 blocks, FP16 tied head/embedding (the default build)
    int8 + int8 head     W8A16 blocks, one INT8 matrix (per-row scales) serving the lookup and the head
    int4                 W4A16 blocks (the default recipe of --precision int4), FP16 tied head/embedding
    int4 + int8 head     W4A16 blocks, tied INT8 head/embedding
    int4 + int4 head     W4A16 blocks, tied INT4 head/embedding (GPTQ on the head's inputs, largest group dividing C)

Each quantization mode is prepared once (with the head quantized); the rows differ only in the head record the
model is assembled with, exactly as quantize_model's gate assembles them. No mixed-precision fallback: every
block projection is in the row's precision. Bytes per token are computed from the stored weights
(edgekit.quant.stored_bytes: every projection and the head, the norms, one embedding row) and compared with the
same model in FP16. Every figure is measured on this machine's CPU (times are wall-clock on a shared machine).

    python scripts/eval_tied_head.py --json tied_head.json     # ~5 minutes on this 2-core machine
    python scripts/eval_tied_head.py --modes int4 --lossless-intake    # INT4 blocks as the GGUF holds them
    python scripts/eval_tied_head.py --lossless-intake --q8-0-table    # and the Q8_0 table as it is (grouped INT8)
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="int8,int4", help="comma-separated: int8 (W8A16), int4 (W4A16)")
    ap.add_argument("--ppl-tokens", type=int, default=None, help="held-out tokens scored (default: the gate's)")
    ap.add_argument("--prompts", type=int, default=None, help="greedy prompts (default: the gate's)")
    ap.add_argument("--lossless-intake", action="store_true",
                    help="int4: take the GGUF's 4-bit projections in bit for bit (what `build --precision int4` does) "
                         "instead of calibrating INT4 from the dequantized weights")
    ap.add_argument("--q8-0-table", action="store_true",
                    help="take the GGUF's Q8_0 embedding/LM head table in bit for bit as grouped INT8 (what --quantize-head "
                         "does with such a file): one row per mode, blocks quantized, head/embedding lossless")
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args()

    import torch

    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.model.decoder import Decoder
    from edgekit.model.loader import load_model
    from edgekit.quant.gate import GateConfig, build_reference, check, evaluate
    from edgekit.model.layers import HEAD
    from edgekit.quant.quantize import QuantizeOptions, heldout_eval_text, prepare_quantization
    from edgekit.quant.stored_bytes import head_embedding_summary

    t0 = time.perf_counter()
    loaded = load_model()
    fp = Decoder(loaded.config, loaded.weights.to(dtype=torch.float32), DispatchTable())
    # the same file with its 4-bit projections kept as W4A16 records (the reference stays the dequantized model)
    lossless = load_model(keep_int4=True, keep_q8_0=args.q8_0_table) if args.lossless_intake else None
    table = load_model(keep_q8_0=True) if args.q8_0_table else None
    rows = []
    refs = {}
    for mode_name in args.modes.split(","):
        mode = {"int8": "w8a16", "int4": "w4a16"}[mode_name]
        gate = GateConfig.for_mode(mode, ppl_tokens=args.ppl_tokens, n_prompts=args.prompts)
        key = json.dumps(gate.to_dict(), sort_keys=True)
        if key not in refs:
            refs[key] = build_reference(fp, heldout_eval_text(loaded, gate), gate.new_tokens)
        ref = refs[key]
        t = time.perf_counter()
        source = lossless if (lossless is not None and mode == "w4a16") else table or loaded
        prepared = prepare_quantization(source, mode, options=QuantizeOptions(quantize_head=True))
        prep_s = time.perf_counter() - t
        variants = {mode_name: dict(fp_layers=[HEAD]), f"{mode_name} + {mode_name} head": {}}
        if args.q8_0_table:
            variants = {f"{mode_name} + q8_0 head": {}}
        elif mode == "w4a16":
            variants = {mode_name: dict(fp_layers=[HEAD]), "int4 + int8 head": dict(int8_layers=[HEAD]),
                        "int4 + int4 head": {}}
        for label, how in variants.items():
            weights = prepared.assemble(**how)
            t = time.perf_counter()
            m = evaluate(Decoder(loaded.config, weights, DispatchTable()), ref)
            fails = check(m, gate)
            he = head_embedding_summary(weights, prepared.storage_dtype)
            rows.append({
                "config": label, "mode": mode, "gate": gate.to_dict(),
                "int4_blocks": None if mode != "w4a16" else "lossless intake" if source is lossless else "calibrated", "perplexity_fp": m["fp_perplexity"],
                "perplexity": m["quant_perplexity"], "perplexity_increase": m["perplexity_increase"],
                "greedy_agreement": m["greedy_agreement"], "greedy_positions": m["greedy_positions"],
                "logits_snr_db": m["logits_snr_db"], "mean_kl_nats": m["mean_kl_nats"],
                "gate_passed": not fails, "gate_failures": fails, "head_embedding": he,
                "prepare_cpu_s": round(prep_s, 1), "eval_cpu_s": round(time.perf_counter() - t, 1),
            })
            print(f"{label}: ppl +{100 * m['perplexity_increase']:.2f}%, greedy {m['greedy_agreement']:.3f}, "
                  f"{he['bytes_per_token'] / 1e6:.1f} MB/token ({he['vs_fp16']:.3f} of FP16)", flush=True)

    out = {"model": loaded.config.name, "source": loaded.source.to_dict(), "measured_on": "cpu", "activations": "fp32",
           "reference": "the model as loaded (Q4_1 GGUF dequantized to FP32)", "heldout_text": "edgekit/quant/data/heldout.txt",
           "bytes": "computed from the stored weights (not measured)", "cpu_threads": torch.get_num_threads(),
           "total_cpu_s": round(time.perf_counter() - t0, 1), "results": rows}
    print(f"\n{'config':<18} {'ppl':>8} {'ppl +%':>7} {'greedy':>7} {'SNR dB':>7} {'MB/tok':>7} {'xFP16':>6} {'gate':>5}  head / embedding")
    for r in rows:
        he = r["head_embedding"]
        print(f"{r['config']:<18} {r['perplexity']:>8.3f} {100 * r['perplexity_increase']:>7.2f} {r['greedy_agreement']:>7.3f} "
              f"{r['logits_snr_db']:>7.2f} {he['bytes_per_token'] / 1e6:>7.2f} {he['vs_fp16']:>6.3f} "
              f"{'pass' if r['gate_passed'] else 'FAIL':>5}  {he['lm_head']} / {he['embedding']}")
    if rows:
        print(f"(FP perplexity {rows[0]['perplexity_fp']:.3f}; measured on the CPU, FP32 activations; MB/tok = weight "
              f"bytes one decode step reads, computed; xFP16 = the same over the model in FP16, "
              f"{rows[0]['head_embedding']['fp16_bytes_per_token'] / 1e6:.2f} MB/token)")
    print(json.dumps(out, indent=2))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""CPU accuracy of W4A16 calibration on the default model: RTN vs GPTQ vs AWQ, scored by the accuracy gate.

The FP reference is the default model as loaded (its Q4_1 GGUF dequantized to FP32: FP32 weights, FP32
activations, reference operators). Each method re-quantizes every projection to INT4 with the requested group
(128, or the largest supported group dividing K: 64 for SmolLM2's K = 576), calibrated on the shipped calibration
text, with nothing kept in higher precision (no mixed-precision fallback) and the LM head as the build keeps it
(FP16 unless --quantize-head). Each candidate is scored with the gate's own `evaluate` and `check` on the shipped
held-out text, against one FP reference computed once. Prints a table and JSON (--json PATH). Every figure is
measured on this machine's CPU; times are wall-clock on a shared machine.

    python scripts/eval_int4_calibration.py --methods rtn,gptq,awq,awq_gptq --json int4.json
"""

from __future__ import annotations

import argparse
import json
import time


def run_mixed(method, loaded, prepared, ref, gate, opts, m, fails) -> dict:
    """quantize_model's --allow-mixed path (sensitivity ranking, then fallback_attempts) on this result."""
    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.model.decoder import Decoder
    from edgekit.quant.gate import check, evaluate
    from edgekit.quant.mixed import fallback_attempts
    from edgekit.quant.quantize import calibration_windows
    from edgekit.quant.sensitivity import rank_layers

    t = time.perf_counter()
    sens = calibration_windows(loaded, opts.sensitivity_tokens, opts.sensitivity_tokens)
    ranking = rank_layers(loaded.config, prepared.stored_fp, prepared.candidates(), sens)
    tried = [{"int8_layers": 0, "fp_layers": 0, "metrics": m, "failures": fails}]
    limit = max(1, int(opts.max_fp_fraction * len(prepared.candidates())))
    for a in fallback_attempts([r["layer"] for r in ranking], limit, int4=True) if fails else []:
        m = evaluate(Decoder(loaded.config, prepared.assemble(a.fp_layers, a.int8_layers), DispatchTable()), ref)
        fails = check(m, gate)
        tried.append({"int8_layers": len(a.int8_layers), "fp_layers": len(a.fp_layers), "metrics": m,
                      "failures": fails, "layers_int8": a.int8_layers, "layers_fp": a.fp_layers})
        print(f"mixed: {a.label}: ppl +{100 * m['perplexity_increase']:.2f}%, "
              f"greedy {m['greedy_agreement']:.3f}, {'pass' if not fails else 'fail'}", flush=True)
        if not fails:
            break
    return {"method": method, "passed": not fails, "attempts": tried, "most_sensitive": ranking[:10],
            "cpu_s": round(time.perf_counter() - t, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="rtn,gptq,awq,awq_gptq")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--symmetric", action="store_true")
    ap.add_argument("--quantize-head", action="store_true")
    ap.add_argument("--damp", type=float, default=None, help="GPTQ dampening (default: QuantizeOptions.int4_damp)")
    ap.add_argument("--calibration-tokens", type=int, default=None,
                    help="calibration tokens (default: QuantizeOptions.calibration_tokens)")
    ap.add_argument("--ppl-tokens", type=int, default=None, help="held-out tokens scored (default: the gate's 2048)")
    ap.add_argument("--prompts", type=int, default=None, help="greedy prompts (default: the gate's 4)")
    ap.add_argument("--mixed", default=None, metavar="METHOD",
                    help="also run --allow-mixed's fallback (INT8, then FP16, for the most sensitive layers) on METHOD's "
                         "result, as quantize_model does, and report where it stops")
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args()

    import torch

    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.model.decoder import Decoder
    from edgekit.model.loader import load_model
    from edgekit.quant.gate import GateConfig, build_reference, check, evaluate
    from edgekit.quant.quantize import QuantizeOptions, heldout_eval_text, prepare_quantization

    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.perf_counter()
    loaded = load_model()
    gate = GateConfig.for_mode("w4a16", ppl_tokens=args.ppl_tokens, n_prompts=args.prompts)
    text = heldout_eval_text(loaded, gate)
    fp = Decoder(loaded.config, loaded.weights.to(dtype=torch.float32), DispatchTable())
    t = time.perf_counter()
    ref = build_reference(fp, text, gate.new_tokens)
    ref_s = time.perf_counter() - t

    rows, mixed = [], None
    methods = args.methods.split(",")
    if args.mixed and args.mixed not in methods:
        methods.append(args.mixed)
    for method in methods:
        opts = QuantizeOptions(int4_group=args.group, int4_symmetric=args.symmetric, int4_method=method,
                               quantize_head=args.quantize_head)
        if args.damp is not None:
            opts.int4_damp = args.damp
        if args.calibration_tokens is not None:
            opts.calibration_tokens = args.calibration_tokens
        t = time.perf_counter()
        prepared = prepare_quantization(loaded, "w4a16", options=opts)
        cal_s = time.perf_counter() - t
        t = time.perf_counter()
        m = evaluate(Decoder(loaded.config, prepared.assemble(), DispatchTable()), ref)
        eval_s = time.perf_counter() - t
        fails = check(m, gate)
        errs = prepared.int4.errors
        rows.append({
            "method": method, "gptq_damp": opts.int4_damp, "calibration_tokens": prepared.int4.n_tokens, "group_requested": args.group, "groups_used": sorted(set(prepared.int4.groups.values())),
            "symmetric": args.symmetric, "int4_layers": len(prepared.int4.layers),
            "perplexity_fp": m["fp_perplexity"], "perplexity": m["quant_perplexity"],
            "perplexity_increase": m["perplexity_increase"], "greedy_agreement": m["greedy_agreement"],
            "greedy_positions": m["greedy_positions"], "logits_snr_db": m["logits_snr_db"],
            "mean_kl_nats": m["mean_kl_nats"],
            # summed over layers, on the calibration inputs; None where RTN is already exact (e.g. G = 32 on a Q4_1 file)
            "layer_output_error_vs_rtn": (sum(e["error"] for e in errs.values()) / rtn_err) if (
                rtn_err := sum(e["rtn_error"] for e in errs.values())) > 0 else None,
            "gate_passed": not fails, "gate_failures": fails,
            "calibrate_and_quantize_cpu_s": round(cal_s, 1), "gate_eval_cpu_s": round(eval_s, 1),
        })
        print(f"{method}: done in {cal_s:.0f} s + {eval_s:.0f} s", flush=True)
        if method == args.mixed:
            mixed = run_mixed(method, loaded, prepared, ref, gate, opts, m, fails)

    out = {
        "model": loaded.config.name, "source": loaded.source.to_dict(), "measured_on": "cpu",
        "activations": "fp32", "reference": "the model as loaded (Q4_1 GGUF dequantized to FP32)",
        "gate": gate.to_dict(), "heldout_text": "edgekit/quant/data/heldout.txt",
        "cpu_threads": torch.get_num_threads(), "fp_reference_cpu_s": round(ref_s, 1),
        "total_cpu_s": round(time.perf_counter() - t0, 1), "results": rows, "allow_mixed": mixed,
    }
    print(f"\n{'method':<10} {'groups':<8} {'ppl':>8} {'ppl +%':>7} {'greedy':>7} {'SNR dB':>7} {'err/RTN':>8} "
          f"{'gate':>5} {'calib s':>8}")
    for r in rows:
        print(f"{r['method']:<10} {','.join(map(str, r['groups_used'])):<8} {r['perplexity']:>8.3f} "
              f"{100 * r['perplexity_increase']:>7.2f} {r['greedy_agreement']:>7.3f} {r['logits_snr_db']:>7.2f} "
              f"{r['layer_output_error_vs_rtn'] if r['layer_output_error_vs_rtn'] is None else round(r['layer_output_error_vs_rtn'], 3)!s:>8} "
              f"{'pass' if r['gate_passed'] else 'FAIL':>5} "
              f"{r['calibrate_and_quantize_cpu_s']:>8.1f}")
    print(f"(FP perplexity {rows[0]['perplexity_fp']:.3f}; measured on the CPU, FP32 activations, "
          f"{rows[0]['greedy_positions']} greedy positions)" if rows else "")
    if mixed:
        last = mixed["attempts"][-1]
        print(f"--allow-mixed on {mixed['method']}: {last['int8_layers']} layer(s) INT8, {last['fp_layers']} FP16 -> "
              f"ppl +{100 * last['metrics']['perplexity_increase']:.2f}%, greedy "
              f"{last['metrics']['greedy_agreement']:.3f}, gate {'pass' if mixed['passed'] else 'FAIL'}")
    print(json.dumps(out, indent=2))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

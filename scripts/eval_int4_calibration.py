#!/usr/bin/env python
"""CPU accuracy of W4A16 calibration on the default model: one row per recipe, scored by the accuracy gate.

The FP reference is the default model as loaded (its Q4_1 GGUF dequantized to FP32: FP32 weights, FP32
activations, reference operators). A recipe is METHOD[+LEVER...]: "gptq+act_order+damp=0.1" is GPTQ with its
columns in decreasing order of diag H (static groups) and 0.1 dampening; levers are QuantizeOptions fields (FLAGS,
VALUED below): a flag not named is off, and so is norm tweaking (tune=STEPS) unless named (so "rtn" is plain
round-to-nearest, "gptq+search+tune=48" the default of `--precision int4`), the rest at QuantizeOptions' defaults. Each recipe re-quantizes every projection to INT4 with the requested group
(128, or the largest supported group dividing K: 64 for SmolLM2's K = 576), calibrated on the shipped calibration
text, with nothing kept in higher precision (no mixed-precision fallback) and the LM head as the build keeps it
(FP16 unless --quantize-head). Each candidate is scored with the gate's own `evaluate` and `check` on the shipped
held-out text, against one FP reference computed once. Prints a table and JSON (--json PATH). Every figure is
measured on this machine's CPU; times are wall-clock on a shared machine.

    python scripts/eval_int4_calibration.py --json int4.json    # every lever (DEFAULT_VARIANTS), ~55 CPU-minutes
    python scripts/eval_int4_calibration.py --variants gptq+search --mixed gptq+search --max-mixed-fraction 0.5
"""

from __future__ import annotations

import argparse
import json
import time


# Levers a variant may add to its method, "METHOD+LEVER+...": flags, then KEY=VALUE ones.
FLAGS = {"act_order": "int4_act_order", "search": "int4_group_search", "true_seq": "int4_true_sequential",
         "sym": "int4_symmetric", "rows": "int4_tuning_rows"}
VALUED = {"damp": ("int4_damp", float), "tokens": ("calibration_tokens", int),
          "tune": ("int4_tuning_steps", int), "gen": ("int4_tuning_generated", int),
          "val": ("int4_tuning_validation_tokens", int)}
OFF = {"int4_tuning_steps": 0, "int4_tuning_generated": 0, "int4_tuning_validation_tokens": 0}  # valued levers that are off unless named (the rest keep QuantizeOptions' defaults)


# Every lever on its own against GPTQ as it was (damp 0.01, min-max groups), then the group search combined with
# each, then norm tweaking on the best of them; "gptq+search+tune=48" is the default of --precision int4.
DEFAULT_VARIANTS = ("rtn,awq,gptq+damp=0.01,gptq+damp=0.1,gptq+damp=0.01+act_order,gptq+damp=0.01+true_seq,"
                    "gptq+damp=0.01+tokens=4096,gptq+damp=0.01+sym,awq_gptq+damp=0.01,rtn+search,rtn+search+true_seq,"
                    "awq+search,gptq+search+damp=0.1,gptq+search,gptq+search+damp=0.9,gptq+search+tune=48,"
                    "gptq+search+tune=48+rows")


def variant_options(variant: str, base: dict) -> dict:
    """QuantizeOptions fields for a variant such as "gptq+act_order+damp=0.1" (on top of ``base``)."""
    method, *levers = variant.split("+")
    fields = {**base, "int4_method": method, **{f: False for f in FLAGS.values()}, **OFF}  # a variant is what it names
    for lever in levers:
        key, _, value = lever.partition("=")
        if key in FLAGS and not value:
            fields[FLAGS[key]] = True
        elif key in VALUED and value:
            fields[VALUED[key][0]] = VALUED[key][1](value)
        else:
            raise SystemExit(f"unknown lever {lever!r} in variant {variant!r}; expected one of "
                             f"{', '.join(FLAGS)}, {', '.join(k + '=VALUE' for k in VALUED)}")
    return fields


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
    tried = [{"int8_layers": 0, "fp_layers": 0, "metrics": m, "failures": fails, **bytes_summary(prepared.assemble())}]
    limit = max(1, int(opts.max_fp_fraction * len(prepared.candidates())))
    for a in fallback_attempts([r["layer"] for r in ranking], limit, int4=True) if fails else []:
        weights = prepared.assemble(a.fp_layers, a.int8_layers)
        m = evaluate(Decoder(loaded.config, weights, DispatchTable()), ref)
        fails = check(m, gate)
        tried.append({"int8_layers": len(a.int8_layers), "fp_layers": len(a.fp_layers), "metrics": m,
                      "failures": fails, "layers_int8": a.int8_layers, "layers_fp": a.fp_layers, **bytes_summary(weights)})
        print(f"mixed: {a.label}: ppl +{100 * m['perplexity_increase']:.2f}%, "
              f"greedy {m['greedy_agreement']:.3f}, INT4 {100 * tried[-1]['int4_fraction_of_block_linear_bytes']:.1f}% of "
              f"block linear bytes, {'pass' if not fails else 'fail'}", flush=True)
        if not fails:
            break
    return {"method": method, "passed": not fails, "attempts": tried, "most_sensitive": ranking[:10],
            "cpu_s": round(time.perf_counter() - t, 1)}


def record_bytes(lw) -> int:
    """Bytes one stored linear record streams per decoded token: weight (packed INT4, INT8 or FP16) + scales/offsets/bias."""
    w = lw.weight.numel() * (2 if lw.weight.is_floating_point() else lw.weight.element_size())
    return w + sum(t.numel() * t.element_size() for t in (lw.scale, lw.offset, lw.smooth) if t is not None) + (
        0 if lw.bias is None else 2 * lw.bias.numel())


def bytes_summary(weights) -> dict:
    """Linear weight bytes by precision (block projections and LM head) of an assembled model."""
    from edgekit.model.layers import named_linears

    from edgekit.model.layers import HEAD

    by_op: dict[str, int] = {}
    for name, lw in named_linears(weights).items():
        if name != HEAD:
            by_op[lw.op] = by_op.get(lw.op, 0) + record_bytes(lw)
    blocks = sum(by_op.values())
    head = record_bytes(weights.lm_head)
    return {"block_linear_bytes_by_operator": by_op, "lm_head_bytes": head, "lm_head_operator": weights.lm_head.op,
            "linear_bytes_per_token": blocks + head,
            "int4_fraction_of_block_linear_bytes": round(by_op.get("linear_w4a16", 0) / blocks, 4),
            "int4_fraction_of_linear_bytes": round(by_op.get("linear_w4a16", 0) / (blocks + head), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", "--methods", dest="variants", default=DEFAULT_VARIANTS,
                    help="comma-separated METHOD[+LEVER...]: methods rtn, gptq, awq, awq_gptq; levers act_order, search "
                         "(group scale/offset search + refit), true_seq, sym, damp=X, tokens=N, tune=STEPS (norm tweaking: the norms tuned end to end towards the FP logits, STEPS Adam steps), rows (with tune: the INT4 row factors too), gen=N (with tune: N sequences sampled from the FP model added to the tuning data), val=TOKENS (with tune: early stopping on up to TOKENS calibration tokens after the first calibration_tokens) (default: %(default)s)")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--quantize-head", action="store_true")
    ap.add_argument("--ppl-tokens", type=int, default=None, help="held-out tokens scored (default: the gate's 2048)")
    ap.add_argument("--prompts", type=int, default=None, help="greedy prompts (default: the gate's 4)")
    ap.add_argument("--mixed", default=None, metavar="VARIANT",
                    help="also run --allow-mixed's fallback (INT8, then FP16, for the most sensitive layers) on VARIANT's "
                         "result, as quantize_model does, and report where it stops")
    ap.add_argument("--max-mixed-fraction", type=float, default=None,
                    help="--mixed: the share of layers the fallback may move (default: QuantizeOptions.max_fp_fraction)")
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
    variants = args.variants.split(",")
    if args.mixed and args.mixed not in variants:
        variants.append(args.mixed)
    base = {"int4_group": args.group, "quantize_head": args.quantize_head,
            **({"max_fp_fraction": args.max_mixed_fraction} if args.max_mixed_fraction is not None else {})}
    for variant in variants:
        opts = QuantizeOptions(**variant_options(variant, base))
        t = time.perf_counter()
        prepared = prepare_quantization(loaded, "w4a16", options=opts)
        cal_s = time.perf_counter() - t
        t = time.perf_counter()
        weights = prepared.assemble()
        m = evaluate(Decoder(loaded.config, weights, DispatchTable()), ref)
        eval_s = time.perf_counter() - t
        fails = check(m, gate)
        errs = prepared.int4.errors
        rows.append({
            "variant": variant, "method": opts.int4_method, "gptq_damp": opts.int4_damp,
            "act_order": opts.int4_act_order, "group_search": opts.int4_group_search,
            "true_sequential": opts.int4_true_sequential, "symmetric": opts.int4_symmetric,
            "tuning_steps": opts.int4_tuning_steps, "tuning_rows": opts.int4_tuning_rows,
            "calibration_tokens": prepared.int4.n_tokens, "group_requested": args.group,
            "groups_used": sorted(set(prepared.int4.groups.values())), "int4_layers": len(prepared.int4.layers),
            "perplexity_fp": m["fp_perplexity"], "perplexity": m["quant_perplexity"],
            "perplexity_increase": m["perplexity_increase"], "greedy_agreement": m["greedy_agreement"],
            "greedy_positions": m["greedy_positions"], "logits_snr_db": m["logits_snr_db"],
            "mean_kl_nats": m["mean_kl_nats"],
            # summed over layers, on the calibration inputs; None where RTN is already exact (e.g. G = 32 on a Q4_1 file)
            "layer_output_error_vs_rtn": (sum(e["error"] for e in errs.values()) / rtn_err) if (
                rtn_err := sum(e["rtn_error"] for e in errs.values())) > 0 else None,
            # norm tweaking (tune=STEPS): mean KL(FP || INT4) per position on the calibration windows, before / after
            "tuning_calibration_kl": prepared.int4.tuning or None,
            **bytes_summary(weights),
            "gate_passed": not fails, "gate_failures": fails,
            "calibrate_and_quantize_cpu_s": round(cal_s, 1), "gate_eval_cpu_s": round(eval_s, 1),
        })
        print(f"{variant}: ppl +{100 * m['perplexity_increase']:.2f}%, greedy {m['greedy_agreement']:.3f} "
              f"({cal_s:.0f} s + {eval_s:.0f} s)", flush=True)
        if variant == args.mixed:
            mixed = run_mixed(variant, loaded, prepared, ref, gate, opts, m, fails)

    out = {
        "model": loaded.config.name, "source": loaded.source.to_dict(), "measured_on": "cpu",
        "activations": "fp32", "reference": "the model as loaded (Q4_1 GGUF dequantized to FP32)",
        "gate": gate.to_dict(), "heldout_text": "edgekit/quant/data/heldout.txt",
        "cpu_threads": torch.get_num_threads(), "fp_reference_cpu_s": round(ref_s, 1),
        "total_cpu_s": round(time.perf_counter() - t0, 1), "results": rows, "allow_mixed": mixed,
    }
    print(f"\n{'variant':<24} {'groups':<7} {'ppl':>8} {'ppl +%':>7} {'greedy':>7} {'SNR dB':>7} {'err/RTN':>8} "
          f"{'MB/tok':>7} {'gate':>5} {'calib s':>8}")
    for r in rows:
        err = r["layer_output_error_vs_rtn"]
        print(f"{r['variant']:<24} {','.join(map(str, r['groups_used'])):<7} {r['perplexity']:>8.3f} "
              f"{100 * r['perplexity_increase']:>7.2f} {r['greedy_agreement']:>7.3f} {r['logits_snr_db']:>7.2f} "
              f"{'-' if err is None else f'{err:.3f}':>8} {r['linear_bytes_per_token'] / 1e6:>7.1f} "
              f"{'pass' if r['gate_passed'] else 'FAIL':>5} {r['calibrate_and_quantize_cpu_s']:>8.1f}")
    print(f"(FP perplexity {rows[0]['perplexity_fp']:.3f}; measured on the CPU, FP32 activations, "
          f"{rows[0]['greedy_positions']} greedy positions; MB/tok = linear weight bytes streamed per decoded token, "
          f"LM head included)" if rows else "")
    if mixed:
        print(f"--allow-mixed on {mixed['method']}:")
        for a in mixed["attempts"]:
            print(f"  {a['int8_layers']:>3} layer(s) INT8, {a['fp_layers']:>2} FP16: ppl +{100 * a['metrics']['perplexity_increase']:.2f}%, "
                  f"greedy {a['metrics']['greedy_agreement']:.3f}, INT4 {100 * a['int4_fraction_of_block_linear_bytes']:.1f}% of "
                  f"the blocks' linear bytes ({100 * a['int4_fraction_of_linear_bytes']:.1f}% with the LM head), "
                  f"{a['linear_bytes_per_token'] / 1e6:.1f} MB/token, gate {'FAIL' if a['failures'] else 'pass'}")
    print(json.dumps(out, indent=2))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

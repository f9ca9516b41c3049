#!/usr/bin/env python
"""CPU decode speed: `edgekit generate`'s path vs transformers' own generate, same prompt, same run.

Both run the default model in FP32 on this machine's CPU, greedy, with a fixed number of new
tokens (no early stop), alternating A/B/A/B so machine noise hits both. Prints a table and JSON
(--json PATH). Figures are measured on the CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", default="What is the capital of France?")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args()

    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from edgekit.generate import Generator
    from edgekit.model.loader import load_model
    from edgekit.shapes import StaticShapes

    m = load_model()
    ids = m.tokenizer.encode_chat(args.prompt)
    gen = Generator(m.decoder(), StaticShapes.for_context(512), m.tokenizer.pad_token_id)
    path = Path(m.source.location)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    inp = torch.tensor([ids])

    def run_edgekit() -> float:
        t = time.perf_counter()
        out, _ = gen.generate(ids, args.new_tokens)
        assert len(out) == args.new_tokens
        return args.new_tokens / (time.perf_counter() - t)

    def run_hf() -> float:
        t = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(inp, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                              attention_mask=torch.ones_like(inp))
        assert out.shape[1] - inp.shape[1] == args.new_tokens
        return args.new_tokens / (time.perf_counter() - t)

    run_edgekit(), run_hf()  # warm-up
    ek, hfs = [], []
    for _ in range(args.repeats):
        ek.append(run_edgekit())
        hfs.append(run_hf())
    result = {
        "measured_on": "cpu",
        "threads": torch.get_num_threads(),
        "prompt_tokens": len(ids),
        "new_tokens": args.new_tokens,
        "edgekit_tokens_per_s": statistics.median(ek),
        "transformers_tokens_per_s": statistics.median(hfs),
        "ratio_edgekit_over_transformers": statistics.median(ek) / statistics.median(hfs),
        "runs": {"edgekit": ek, "transformers": hfs},
    }
    print(f"{'path':<28}{'tok/s (median, CPU)':>22}")
    print(f"{'edgekit generate':<28}{result['edgekit_tokens_per_s']:>22.1f}")
    print(f"{'transformers generate':<28}{result['transformers_tokens_per_s']:>22.1f}")
    print(f"ratio edgekit / transformers: {result['ratio_edgekit_over_transformers']:.2f}x (end-to-end incl. prefill)")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

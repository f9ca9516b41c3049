"""Where a path's greedy tokens part from the reference path's at long context: a near-tie or a defect? (GPU)

Random-weight preset (default llama-3.2-1b, INT8 W8A16 blocks), a prompt of --depth tokens, --tokens greedy steps on
three paths from the same prompt: the torch reference operators (fp16, what `edgekit bench` checks against), the
per-operator Triton step and the fused step. At the first step where a path's token differs from the reference's,
the model is also run in FP64 (the same quantized weights, FP64 activations and accumulation, teacher-forced on the
reference's tokens) and the script reports: the reference's and FP64's top-two margins there, each path's and the
reference's max |logit - FP64 logit|, and which token FP64 picks. A verdict "near-tie" means FP64's margin is
smaller than the paths' own logit error (rounding order decides the token); "defect" means a path is off by more
than its peers at a step FP64 finds clear. Prints JSON (and a line per path); measured on the GPU it runs on.

    python tools/long_context_check.py --preset llama-3.2-1b --precision int8 --depth 4096 --tokens 16 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def _steps(decoder, prompt: torch.Tensor, n: int, fused: bool = False) -> tuple[list[int], list[torch.Tensor]]:
    """n greedy steps (prefill + n - 1 decode steps) of ``decoder``: tokens and the FP32 logits of each step."""
    from edgekit.runtime.fused_decode import FusedDecoder, with_fused_kernels

    T = prompt.shape[1]
    cache = decoder.new_cache(1, T + n)
    step = FusedDecoder(decoder, with_fused_kernels(decoder.ops)) if fused else decoder
    logits = decoder.prefill(prompt, torch.tensor([T], device=prompt.device), cache).float()
    tokens, out = [int(logits.argmax())], [logits[0].cpu()]
    for i in range(n - 1):
        logits = step.decode(torch.tensor([tokens[-1]], device=prompt.device), torch.tensor([T + i], device=prompt.device),
                             cache).float()
        tokens.append(int(logits.argmax()))
        out.append(logits[0].cpu())
    return tokens, out


def _fp64_logits(cfg, weights, prompt: torch.Tensor, history: list[int]) -> torch.Tensor:
    """Logits of the next token after prompt + history, the model in FP64 (weights as quantized), teacher-forced."""
    from edgekit.model.decoder import Decoder

    dec = Decoder(cfg, weights.to(dtype=torch.float64))
    seq = torch.cat([prompt, torch.tensor([history], device=prompt.device)], dim=1) if history else prompt
    T = seq.shape[1]
    return dec.prefill(seq, torch.tensor([T], device=seq.device), dec.new_cache(1, T))[0].cpu()


def _margin(logits: torch.Tensor) -> float:
    top = logits.double().topk(2).values
    return float(top[0] - top[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama-3.2-1b")
    ap.add_argument("--precision", default="int8", choices=["fp16", "int8", "int4"])
    ap.add_argument("--depth", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    from edgekit.bench.runner import _cast, quantized
    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.model.decoder import Decoder
    from edgekit.model.presets import preset_config
    from edgekit.model.weights import random_weights

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = preset_config(a.preset)
    w = quantized(_cast(random_weights(cfg, seed=a.seed, dtype=torch.float16), dev, torch.float16), a.precision)
    g = torch.Generator().manual_seed(a.seed * 100_003 + a.depth)  # the bench's prompt rule (bench.runner._prompt)
    prompt = torch.randint(0, cfg.vocab_size, (1, a.depth), generator=g).to(dev)
    paths = {"reference": _steps(Decoder(cfg, w, DispatchTable()), prompt, a.tokens)}
    if dev.type == "cuda":
        from edgekit.kernels.triton_backend import triton_dispatch_table

        triton = Decoder(cfg, w, triton_dispatch_table())
        paths["per-operator"] = _steps(triton, prompt, a.tokens)
        paths["fused"] = _steps(triton, prompt, a.tokens, fused=True)
    ref_tokens, ref_logits = paths["reference"]
    doc = {"preset": a.preset, "precision": a.precision, "depth": a.depth, "tokens": a.tokens,
           "measured_on": f"GPU ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else "CPU", "paths": {}}
    for name, (tokens, logits) in paths.items():
        row = {"tokens": tokens, "first_difference": next((i for i, (x, y) in enumerate(zip(tokens, ref_tokens)) if x != y),
                                                          None)}
        s = row["first_difference"]
        if s is not None:
            fp64 = _fp64_logits(cfg, w, prompt, ref_tokens[:s])
            row.update({
                "step": s, "token": tokens[s], "reference_token": ref_tokens[s], "fp64_token": int(fp64.argmax()),
                "reference_margin": _margin(ref_logits[s]), "fp64_margin": _margin(fp64),
                "max_abs_logit_error_vs_fp64": float((logits[s].double() - fp64).abs().max()),
                "reference_max_abs_logit_error_vs_fp64": float((ref_logits[s].double() - fp64).abs().max()),
                "fp64_gap_between_the_two_tokens": float(fp64[ref_tokens[s]] - fp64[tokens[s]]),
            })
            worst = max(row["max_abs_logit_error_vs_fp64"], row["reference_max_abs_logit_error_vs_fp64"])
            row["verdict"] = ("near-tie: FP64's two candidates are closer than the paths' own logit error"
                              if abs(row["fp64_gap_between_the_two_tokens"]) <= worst else
                              "defect: the path is off by more than rounding at a step FP64 finds clear")
        doc["paths"][name] = row
        print(f"{name:13s} first difference {s}" + (f": {row['verdict']} (FP64 gap "
              f"{row['fp64_gap_between_the_two_tokens']:.4g}, errors {row['max_abs_logit_error_vs_fp64']:.4g} / "
              f"{row['reference_max_abs_logit_error_vs_fp64']:.4g})" if s is not None else ""), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

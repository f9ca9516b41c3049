"""Serve's persistent decode call pattern under Triton's CPU interpreter; prints the checks (JSON).

Run by test_persistent_serve_pattern.py in a subprocess with TRITON_INTERPRET=1 (set before Triton is imported).
Not a test module itself. It mirrors ``GraphedRunner`` step for step, less the CUDA graphs (which need a GPU):

- the decoder's table is the Triton kernels' table wrapped by ``OpUsage.watch`` and the decode path is chosen by
  ``select_decode_path`` with the FULL cache (batch = the largest bucket, 8), preferring "persistent";
- one ``PersistentDecoder`` (one grid-barrier counter) serves every bucket 1, 2, 4, 8;
- per bucket b: tokens and positions are rows of one (3, aligned) int64 tensor (the positions row at an offset),
  a warm-up on a scratch cache (GraphedRunner runs two; one keeps the order and the CI time), then the step on ``rows_view`` of the live cache, its picks fed back;
- requests are prefilled into their own rows of the live cache through ``RowPrefillCache`` (serve's prefill).

Each step is compared with the per-operator decoder (the torch references) on its own cache of the decode batch:
logits finite, greedy tokens equal, logits within FP16 rounding. The persistent kernel runs its staged launches
here (``PersistentDecoder.staged`` off a GPU): what this rules out is everything but the one-launch mode's grid
barriers and the GPU-only pieces (graph capture, the AOT head plugin).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

sys.path.insert(0, str(Path(__file__).parents[2] / "kernels"))
import interpret_check  # noqa: E402,F401  (installs the interpreter shim for NumPy >= 2.4)
import torch  # noqa: E402

from edgekit.kernels.dispatch import DispatchTable  # noqa: E402
from edgekit.kernels.triton_backend import triton_dispatch_table  # noqa: E402
from edgekit.model.decoder import Decoder  # noqa: E402
from edgekit.model.presets import preset_config  # noqa: E402
from edgekit.model.weights import random_weights  # noqa: E402
from edgekit.runtime.fused_decode import select_decode_path  # noqa: E402
from edgekit.runtime.op_usage import OpUsage  # noqa: E402
from edgekit.runtime.step_runner import (RowPrefillCache, _aligned_len, _feed_back, _input_rows,  # noqa: E402
                                         _with_picks, rows_view)

BUCKETS = (1, 2, 4, 8)
MAX_SEQ = 512  # as a served context: 4 KV splits at batch 1 on the interpreter's 8 SMs, all but the first empty here
# step 0 decodes the prefilled requests' first tokens (host-built input rows), step 1 the picks fed back on the
# device (``_feed_back``) into the rows it wrote at step 0; a third step would repeat step 1's path
STEPS = 2


def main() -> None:
    # the tiny preset with an FFN of 96 (not 160): the gate/up stage, the slowest under the interpreter, runs 40%
    # fewer programs; the down stage's K (96) still ends inside its tile
    cfg = dataclasses.replace(preset_config("tiny"), intermediate_size=96)
    w = random_weights(cfg, seed=3, dtype=torch.float16)
    reference = Decoder(cfg, w, DispatchTable())
    usage = OpUsage()
    dec = Decoder(cfg, w, triton_dispatch_table()).with_ops(usage.watch(triton_dispatch_table()))
    cache = dec.new_cache(max(BUCKETS), MAX_SEQ)
    step_decoder, path = select_decode_path(dec, cache, prefer="persistent", allow_cpu=True, jit=False)
    if path.name != "persistent":
        raise SystemExit(f"expected the persistent path, got {path.name}: {path.reason}")
    inputs = {}
    scratch = dec.new_cache(cache.batch, cache.max_seq_len)
    for b in BUCKETS:  # GraphedRunner's construction: warm-ups on scratch, bucket after bucket (capture: no kernels)
        inputs[b] = torch.zeros(3, _aligned_len(b), dtype=torch.long)
        for _ in range(1):
            _, picks = _with_picks(step_decoder.decode(inputs[b][0, :b], inputs[b][1, :b], rows_view(scratch, b)))
            _feed_back(inputs[b], picks, b)
    results = []
    for b in (1, 2):  # one client (bucket 1 of a batch-8 cache), then two
        g = torch.Generator().manual_seed(b)
        lens = [5 + 3 * r for r in range(b)]
        ref_cache = reference.new_cache(b, MAX_SEQ)
        first = []
        for row, n in enumerate(lens):  # serve's prefill: batch 1 into the request's own row
            prompt = torch.randint(0, cfg.vocab_size, (1, n), generator=g)
            slot = torch.tensor([row])
            first.append(int(dec.prefill(prompt, torch.tensor([n]), RowPrefillCache(cache, slot)).argmax(-1)))
            reference.prefill(prompt, torch.tensor([n]), RowPrefillCache(ref_cache, slot))
        inputs[b].zero_()
        inputs[b][:, :b] = _input_rows(first, lens, None)
        ref_tokens, ref_pos = torch.tensor(first), torch.tensor(lens)
        for step in range(STEPS):
            want = reference.decode(ref_tokens, ref_pos, ref_cache).float()  # (b, V)
            logits, picks = _with_picks(step_decoder.decode(inputs[b][0, :b], inputs[b][1, :b], rows_view(cache, b)))
            got = logits.float()
            results.append({"batch": b, "cache_batch": cache.batch, "step": step,
                            "finite": bool(torch.isfinite(got).all()),
                            "tokens_equal": picks[:b].tolist() == want.argmax(-1).tolist(),
                            "max_abs_err": float((got - want).abs().max()), "max_abs_ref": float(want.abs().max())})
            _feed_back(inputs[b], picks, b)
            # the next step's inputs, as the runner leaves them on the device: each row's pick at its next position
            # (tiny random weights barely depend on position, so equal tokens alone would not show a stuck position)
            results[-1]["fed_back"] = (inputs[b][0, :b].tolist() == picks[:b].tolist()
                                       and inputs[b][1, :b].tolist() == (ref_pos + 1).tolist())
            ref_tokens, ref_pos = want.argmax(-1), ref_pos + 1
    print(json.dumps({"path": path.name, "steps": results}))


if __name__ == "__main__":
    main()

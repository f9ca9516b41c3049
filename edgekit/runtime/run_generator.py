"""The generator `edgekit run` decodes with: graphed prefill and the graphed fused decode path on a GPU.

One place, so the serving benchmark's baseline is exactly what `run` does (and
the CLI stays a thin layer over it).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.generate import Generator
from edgekit.runtime.bundle_runtime import OpenedBundle


@dataclass
class RunSetup:
    generator: Generator
    decode_path: dict  # DecodePath.to_dict(): path, reason, launches per token
    prefill_path: str


def run_generator(b: OpenedBundle, ids: list[int], max_new_tokens: int, *, cuda_graphs: bool = True,
                  truncate: bool = False, prefer: str | None = None) -> RunSetup:
    """A batch-1 Generator over the bundle's decoder; on a GPU (unless ``cuda_graphs`` is off) the decode step is
    the path ``select_decode_path`` picks (``prefer``: its preferred path, default the fused one), replayed as a
    CUDA graph, and the prompt's bucket is captured as a prefill graph before any clock starts."""
    dec = b.decoder()
    cache = dec.new_cache(1, b.shapes.max_seq_len)  # one sequence, whatever batch the bundle's plan serves
    step = prefill_step = None
    prefill_path = "eager"
    decode_path = {"path": "per-operator", "launches_per_token": None,
                   "reason": "eager decode: the fused path is a CUDA graph" + (" (no GPU)" if b.device.type != "cuda" else " (--no-cuda-graphs)")}
    if cuda_graphs and b.device.type == "cuda":
        from edgekit.runtime.cuda_graphs import GraphedDecodeStep
        from edgekit.runtime.fused_decode import DEFAULT_DECODE_PATH, select_decode_path
        from edgekit.runtime.graphed_prefill import GraphedPrefill

        # fused super-operators unless one is ruled out; says why when it falls back
        step_decoder, path = select_decode_path(dec, cache, prefer=prefer or DEFAULT_DECODE_PATH)
        step = GraphedDecodeStep(step_decoder, cache)
        decode_path = path.to_dict()
        prefill_step = GraphedPrefill(dec, cache)
        fitted, bucket = b.shapes.fit_prompt(ids, max_new_tokens, truncate, chunked=True)
        if len(fitted) <= bucket:
            prefill_step.capture(1, bucket)  # the Generator prefills one sequence; captured before the clock starts
            prefill_path = f"cuda-graph (bucket {bucket})"
        else:  # longer than the largest bucket: the Generator prefills it in chunks of that bucket, eagerly
            prefill_path = f"eager, chunks of {bucket} tokens (the prompt is longer than the largest bucket)"
    gen = Generator(dec, b.shapes, b.tokenizer.pad_token_id if b.tokenizer else 0, cache=cache, decode_step=step,
                    prefill_step=prefill_step)
    return RunSetup(gen, decode_path, prefill_path)

"""The accuracy gate's floating-point side, cached on disk by content.

``build``, ``quantize`` and ``eval`` all compare a quantized model with the same
FP reference: the FP model's greedy continuations of the prompts and its final
hidden states over the held-out windows. Computing it is most of the gate's
time on a CPU (the greedy decode especially), and it does not depend on how the
model is quantized, so it is kept in the build cache (``EDGEKIT_CACHE_DIR``,
``~/.cache/edgekit``) under a key made of everything it depends on: the model's
identity (file hash or preset and seed) and config, the exact token ids of the
windows and prompts, the number of greedy tokens, the FP dtype, and the source
of the code that computes it (quantization, model, operator references).
A w8a8 build after an int8 build, or `edgekit quantize` / `edgekit eval` on the
same model and text after a build, reads it back instead of recomputing it.

The cache holds only what this machine computed (edgekit/cache.py); entries are
safetensors and JSON, never pickles.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from edgekit.cache import BuildCache, cache_key, package_source_hash
from edgekit.model.decoder import Decoder
from edgekit.quant.gate import EvalText, Reference, build_reference
from edgekit.quant.progress import SILENT, Steps

STAGE = "gate_reference"
TENSORS_FILE = "reference.safetensors"
META_FILE = "reference.json"


def _ids_digest(text: EvalText) -> str:
    h = hashlib.sha256()
    for w in text.windows:
        h.update(b"w" + str(tuple(w.shape)).encode() + w.to(torch.int64).numpy().tobytes())
    for p in text.prompts:
        h.update(b"p" + json.dumps(list(map(int, p))).encode())
    return h.hexdigest()


def reference_key(model_identity: dict[str, Any], config: dict[str, Any], text: EvalText, new_tokens: int,
                  dtype: torch.dtype) -> str:
    return cache_key(stage=STAGE, model=model_identity, config=config, text=_ids_digest(text), new_tokens=new_tokens,
                     dtype=str(dtype), code=package_source_hash("edgekit.quant", "edgekit.model", "edgekit.kernels"))


def serialize_reference(ref: Reference) -> dict[str, bytes]:
    tensors = {f"hidden.{i}": h.contiguous() for i, h in enumerate(ref.hidden)}
    tensors.update({f"sequence.{i}": s.contiguous() for i, s in enumerate(ref.sequences)})
    meta = {"windows": len(ref.hidden), "sequences": len(ref.sequences), "prompt_lens": ref.prompt_lens}
    return {TENSORS_FILE: save_tensors(tensors), META_FILE: json.dumps(meta).encode()}


def deserialize_reference(files: dict[str, bytes], fp_decoder: Decoder, text: EvalText) -> Reference:
    meta = json.loads(files[META_FILE])
    t = load_tensors(files[TENSORS_FILE])
    if meta["windows"] != len(text.windows):
        raise ValueError("cached reference does not match the windows")  # a key collision; never expected
    hidden = [t[f"hidden.{i}"].to(fp_decoder.device) for i in range(meta["windows"])]
    sequences = [t[f"sequence.{i}"] for i in range(meta["sequences"])]
    return Reference(fp_decoder, text.windows, hidden, sequences, list(meta["prompt_lens"]))


def cached_reference(fp_decoder: Decoder, text: EvalText, new_tokens: int, *, model_identity: dict[str, Any],
                     cache: BuildCache | None = None, steps: Steps = SILENT) -> tuple[Reference, bool]:
    """The FP reference, from the cache when this machine computed it before. Returns (reference, cached)."""
    cache = cache if cache is not None else BuildCache(None)
    key = reference_key(model_identity, fp_decoder.config.to_dict(), text, new_tokens, fp_decoder.weights.tok_embeddings.dtype)
    hit = cache.get(STAGE, key)
    if hit is not None:
        try:
            return deserialize_reference(hit, fp_decoder, text), True
        except (KeyError, ValueError, json.JSONDecodeError, RuntimeError):
            pass  # an unreadable entry only costs the recomputation
    ref = build_reference(fp_decoder, text, new_tokens, steps)
    cache.put(STAGE, key, serialize_reference(ref))
    return ref, False

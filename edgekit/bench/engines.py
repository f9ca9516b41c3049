"""The contenders, behind two small interfaces.

*Stepped* engines (edgekit's runtime, edgekit's reference model under
torch.compile) expose ``prefill`` and ``decode``: the bench times each on its
own. Their decode loop keeps everything on the device: one step computes the
logits, picks the greedy token, writes it into the step's own input buffer,
advances the position and records the token, so the host only launches
(``GreedyFeedback``). Nothing is read back until the loop ends.

*Generate* engines (transformers) expose ``generate(prompt, n)``: their own
loop is what a user runs, so it is timed as a whole (time to first token =
``generate`` with one new token; decode = the difference to ``n + 1``).
"""

from __future__ import annotations

import abc

import torch

from edgekit.graph.node import PREFILL
from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import Decoder, ModelWeights
from edgekit.model.embedding import QuantizedEmbedding
from edgekit.model.kv_cache import StaticKVCache

ENGINE_LABELS = {
    "edgekit": "edgekit runtime: Triton kernels + CUDA-graph replay (GraphedDecodeStep)",
    "edgekit-fused": "edgekit runtime, fused decode super-operators + CUDA-graph replay (FusedDecoder)",
    "edgekit-fused-sms": "edgekit runtime, fused decode + CUDA-graph replay confined to part of the GPU's SMs "
                         "(a CUDA green context; edgekit bench --sms)",
    "compile": "edgekit reference ops + torch.compile(mode='reduce-overhead'), gpt-fast style",
    "hf-eager": "transformers generate, eager (dynamic cache, SDPA)",
    "hf-compile": "transformers generate, static cache + torch.compile(mode='reduce-overhead')",
    "llama.cpp": "llama.cpp llama-bench (CUDA, -ngl 99 -fa 1) on the same GGUF file, a subprocess",
}
BASELINES = ("compile", "hf-eager", "hf-compile")  # the default set (in-process engines)
KNOWN_BASELINES = BASELINES + ("llama.cpp",)  # llama.cpp needs --llama-bench PATH


class GreedyFeedback:
    """A decode step that feeds itself: logits -> greedy token -> next step's input, all on the device.

    Quacks like a Decoder for ``GraphedDecodeStep`` (``device`` and ``decode``), so the
    graph it captures holds the pick and the feedback too and one replay is one token.
    Tokens are recorded in ``out`` at index ``count`` (mod its length, so an overlong loop
    can never index out of bounds on the device).
    """

    def __init__(self, decoder: Decoder, max_tokens: int):
        self.decoder = decoder
        self.device = decoder.device
        self.out = torch.zeros(max_tokens, dtype=torch.long, device=self.device)  # (N,)
        self.count = torch.zeros(1, dtype=torch.long, device=self.device)  # (1,)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        logits = self.decoder.decode(tokens, positions, cache)  # (1, V)
        nxt = logits.argmax(-1)  # (1,)
        self.out.index_copy_(0, self.count % self.out.numel(), nxt)
        tokens.copy_(nxt)
        positions.add_(1)
        self.count.add_(1)
        return nxt

    def reset(self, tokens: torch.Tensor, positions: torch.Tensor, first: torch.Tensor, start_pos: int) -> None:
        tokens.copy_(first)
        positions.fill_(start_pos)
        self.count.zero_()


class SteppedEngine(abc.ABC):
    name = "stepped"
    prefill_note = ""

    def __init__(self, cfg: ModelConfig, decoder: Decoder, max_seq_len: int, max_tokens: int):
        self.cfg = cfg
        self.decoder = decoder
        self.device = decoder.device
        self.max_tokens = max_tokens
        self.cache = decoder.new_cache(1, max_seq_len)
        self.feedback = GreedyFeedback(decoder, max_tokens)
        self._seq_lens: dict[int, torch.Tensor] = {}

    def seq_lens(self, T: int) -> torch.Tensor:
        if T not in self._seq_lens:
            self._seq_lens[T] = torch.tensor([T], dtype=torch.long, device=self.device)
        return self._seq_lens[T]

    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """prompt (1, T) -> the first greedy token (1,), on the device."""
        return self.decoder.prefill(prompt, self.seq_lens(prompt.shape[1]), self.cache).argmax(-1)

    def _check_n(self, n: int) -> None:
        if n > self.max_tokens:
            raise ValueError(f"a decode loop of {n} tokens exceeds this engine's {self.max_tokens}")

    @abc.abstractmethod
    def decode(self, first: torch.Tensor, start_pos: int, n: int) -> torch.Tensor:
        """n greedy tokens after ``first`` at ``start_pos``, fed back on the device (no host sync)."""

    def close(self) -> None:
        pass


class RuntimeEngine(SteppedEngine):
    """edgekit's runtime: every operator on its Triton kernel, the decode step replayed as one CUDA graph."""

    name = "edgekit"
    prefill_note = "eager Triton operators (as the Generator runs it); prefill_graphed_* = the same prefill replayed as a CUDA graph"

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, max_seq_len: int, max_tokens: int, ops: DispatchTable | None = None):
        from edgekit.kernels.triton_backend import triton_dispatch_table
        from edgekit.runtime.cuda_graphs import GraphedDecodeStep

        super().__init__(cfg, Decoder(cfg, weights, ops or triton_dispatch_table()), max_seq_len, max_tokens)
        # GraphedDecodeStep warms up (Triton JIT, lazy loads) and captures decode + pick + feedback
        self.step = GraphedDecodeStep(self.feedback, self.cache)
        self._prefill_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}

    def decode(self, first: torch.Tensor, start_pos: int, n: int) -> torch.Tensor:
        self._check_n(n)
        self.feedback.reset(self.step.tokens, self.step.positions, first, start_pos)
        for _ in range(n):
            # GraphedDecodeStep.__call__ would copy tokens/positions into its buffers; the
            # captured step already wrote them there, so replaying is the whole step.
            self.step.graph.replay()
        return self.feedback.out[:n]

    def prefill_graphed(self, prompt: torch.Tensor) -> torch.Tensor:
        """The same prefill captured once per length and replayed (static shapes make this possible)."""
        T = prompt.shape[1]
        if T not in self._prefill_graphs:
            buf = prompt.clone()  # (1, T) static input
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.prefill(buf)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                first = self.prefill(buf)  # (1,) static output
            self._prefill_graphs[T] = (g, buf, first)
        g, buf, first = self._prefill_graphs[T]
        buf.copy_(prompt)
        g.replay()
        return first

    def close(self) -> None:
        self._prefill_graphs.clear()
        self.step = None


# gpt-fast's Inductor settings: coordinate-descent tuning lets Inductor turn the M=1 matmuls into
# fused GEMV reductions (so an INT8 weight is converted in registers, not materialized in FP32).
INDUCTOR_FLAGS = {"coordinate_descent_tuning": True, "triton.unique_kernel_names": True, "fx_graph_cache": True}


def apply_inductor_flags() -> dict:
    """Set INDUCTOR_FLAGS (process-wide: every compiled baseline of the run gets them). Returns what was set."""
    import torch._inductor.config as ic

    applied = {}
    for key, value in INDUCTOR_FLAGS.items():
        obj, attr = ic, key
        if "." in key:
            head, attr = key.split(".", 1)
            obj = getattr(ic, head, None)
        if obj is not None and hasattr(obj, attr):
            setattr(obj, attr, value)
            applied[key] = value
    return applied


class CompiledReferenceEngine(SteppedEngine):
    """edgekit's torch reference operators, the decode step compiled with mode='reduce-overhead'.

    This is the gpt-fast recipe: one function per token (decode + greedy pick) compiled with
    fullgraph=True; Inductor fuses the element-wise work and CUDA-graph trees replay it. Weights,
    the KV cache and the loop's buffers are marked as static addresses, so the graphs read them in
    place (no copy of inputs per replay) and may write the cache. Prefill stays eager, as gpt-fast
    runs it by default.
    """

    name = "compile"
    prefill_note = "eager torch reference operators (only the decode step is compiled, as in gpt-fast)"

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, max_seq_len: int, max_tokens: int, backend: str = "inductor",
                 mode: str | None = "reduce-overhead"):
        super().__init__(cfg, Decoder(cfg, weights, DispatchTable()), max_seq_len, max_tokens)
        dev = self.device
        self.tokens = torch.zeros(1, dtype=torch.long, device=dev)  # (1,)
        self.positions = torch.zeros(1, dtype=torch.long, device=dev)  # (1,)
        for t in _static_tensors(self.decoder, self.cache) + [self.tokens, self.positions, self.feedback.out, self.feedback.count]:
            torch._dynamo.mark_static_address(t)
        feedback, tokens, positions, cache = self.feedback, self.tokens, self.positions, self.cache

        def one_token() -> torch.Tensor:
            return feedback.decode(tokens, positions, cache)

        kw = {"fullgraph": True, "backend": backend}
        if mode is not None:
            kw["mode"] = mode
        self._step = torch.compile(one_token, **kw)
        self._mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None) if dev.type == "cuda" else None

    def decode(self, first: torch.Tensor, start_pos: int, n: int) -> torch.Tensor:
        self._check_n(n)
        self.feedback.reset(self.tokens, self.positions, first, start_pos)
        for _ in range(n):
            if self._mark is not None:
                self._mark()  # each call is a new step; its output is not kept
            self._step()
        return self.feedback.out[:n]

    def close(self) -> None:
        self._step = None
        torch._dynamo.reset()  # drop the compiled graphs and their CUDA-graph memory pools


def _static_tensors(decoder: Decoder, cache: StaticKVCache) -> list[torch.Tensor]:
    w = decoder.weights
    # a tied quantized head is the embedding table: its tensors are listed with the head
    emb = [] if isinstance(w.tok_embeddings, QuantizedEmbedding) else [w.tok_embeddings]
    tables = [t for name in decoder.graph(PREFILL).rope for t in decoder.rope_tables(name, cache.max_seq_len)]
    out = [*emb, w.norm, *tables, *cache.k, *cache.v]
    out += [t for t in (w.lm_head.weight, w.lm_head.bias, w.lm_head.scale, w.lm_head.smooth, w.lm_head.offset)
            if t is not None]
    for b in w.blocks:
        out += list(b.norms().values())
        for lw in b.linears().values():
            out += [t for t in (lw.weight, lw.bias, lw.scale, lw.smooth) if t is not None]
    seen, uniq = set(), []
    for t in out:  # a tied head is the embedding: mark it once
        if id(t) not in seen:
            seen.add(id(t))
            uniq.append(t)
    return uniq


class HFGenerateEngine:
    """transformers' own ``generate`` on the twin model: eager, or static cache + compiled forward."""

    def __init__(self, model, compiled: bool):
        self.model = model
        self.compiled = compiled
        self.name = "hf-compile" if compiled else "hf-eager"
        self.device = model.device
        gc = model.generation_config
        self.how = "eager"
        if compiled:
            if hasattr(gc, "compile_config"):
                # generate() itself compiles the decoding forward with mode="reduce-overhead" when the
                # cache is static (transformers' documented path); the prefill runs uncompiled.
                from transformers import CompileConfig

                gc.compile_config = CompileConfig(mode="reduce-overhead")
                self.how = "generate(cache_implementation='static') auto-compile, CompileConfig(mode='reduce-overhead')"
            else:  # older transformers: compile the forward by hand, as their docs said then
                model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
                self.how = "model.forward = torch.compile(mode='reduce-overhead', fullgraph=True) + static cache"

    def _kwargs(self, n: int) -> dict:
        kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        if self.compiled:
            kw["cache_implementation"] = "static"
        elif hasattr(self.model.generation_config, "disable_compile"):
            kw["disable_compile"] = True
        return kw

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, n: int) -> torch.Tensor:
        """prompt (1, T) -> the n new tokens (n,)."""
        out = self.model.generate(prompt, attention_mask=torch.ones_like(prompt), **self._kwargs(n))  # (1, T + n)
        return out[0, prompt.shape[1]:]

    def close(self) -> None:
        self.model = None

"""Write a random-weight GGUF file of a preset's shape, so that llama.cpp and edgekit read identical weights.

llama.cpp needs a GGUF with tokenizer metadata even for ``llama-bench`` (which
feeds token ids and never tokenizes), so the file carries a SentencePiece-style
``llama`` vocabulary: 3 control tokens, 256 byte tokens ``<0xNN>``, then plain
tokens up to the vocabulary size. Matrices are F16, norms F32 (llama.cpp's
convention); ``llama-quantize`` makes the Q8_0 / Q4_K_M copies. Values are
random (speed does not depend on them); edgekit loads the file back through its
GGUF loader like any other model file.

The llama, qwen3 and gemma3 architectures are written with llama.cpp's keys and
tensor names for them (gguf-py's tables): Qwen3's and Gemma 3's head_dim
(``key_length``), QK-norms, and Gemma 3's post-norms and sliding window. Gemma
3's norm weights are stored as llama.cpp runs them, 1 + w (here 1); its window
pattern, local RoPE base and query scale are llama.cpp's fixed ones, so a
preset with others is refused rather than benchmarked as a different model.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from edgekit.model.config import ModelConfig

GGUF_F16_FILE_TYPE = 1  # llama.cpp's LLAMA_FTYPE_MOSTLY_F16
ARCHITECTURES = ("llama", "qwen3", "gemma3")
# what llama.cpp runs every gemma3 file with (llama-model.cpp): one global layer in 6, local RoPE base 10000 (written
# out, not read from the architecture's traits: a check of them)
LLAMA_CPP_GEMMA3 = {"sliding_window_pattern": 6, "rope_local_theta": 10000.0}


def _vocab(n: int) -> tuple[list[bytes], list[float], list[int]]:
    from gguf import TokenType

    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    tokens += [f"t{i}".encode() for i in range(n - len(tokens))]
    types += [TokenType.NORMAL] * (n - len(types))
    return tokens[:n], [0.0] * n, [int(t) for t in types[:n]]


def _check_writable(cfg: ModelConfig) -> None:
    if cfg.architecture not in ARCHITECTURES:
        raise ValueError(f"write_random_gguf writes {', '.join(ARCHITECTURES)} files; got {cfg.architecture!r}")
    if cfg.architecture == "gemma3":
        fixed = {"sliding_window_pattern": cfg.sliding_window_pattern, "rope_local_theta": cfg.rope_local_theta}
        if fixed != LLAMA_CPP_GEMMA3 or not math.isclose(cfg.attention_scale, cfg.head_dim ** -0.5):
            raise ValueError(f"{cfg.name}: llama.cpp runs every gemma3 file with {LLAMA_CPP_GEMMA3} and a query scale "
                             f"of 1/sqrt(head_dim); this preset has {fixed}, query scale {cfg.attention_scale}")


def _block_tensors(cfg: ModelConfig) -> dict:
    """llama.cpp's block tensor -> its shape (rows, cols), or (n,) for a norm."""
    import gguf

    T = gguf.MODEL_TENSOR
    C, F, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    shapes = {T.ATTN_NORM: (C,), T.ATTN_Q: (cfg.q_size, C), T.ATTN_K: (cfg.kv_size, C), T.ATTN_V: (cfg.kv_size, C),
              T.ATTN_OUT: (C, cfg.q_size), T.FFN_NORM: (C,), T.FFN_GATE: (F, C), T.FFN_UP: (F, C), T.FFN_DOWN: (C, F)}
    if cfg.qk_norm:
        shapes.update({T.ATTN_Q_NORM: (D,), T.ATTN_K_NORM: (D,)})
    if cfg.post_norms:
        shapes.update({T.ATTN_POST_NORM: (C,), T.FFN_POST_NORM: (C,)})
    return shapes


def write_random_gguf(cfg: ModelConfig, path: Path, seed: int = 0) -> Path:
    """An F16 GGUF of ``cfg``'s shape and architecture with random weights (std 0.02; norms 1)."""
    import gguf

    _check_writable(cfg)
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float16)

    path = Path(path)
    w = gguf.GGUFWriter(str(path), cfg.architecture)
    w.add_name(cfg.name.replace("preset:", "") + "-random")
    w.add_context_length(cfg.max_position_len)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_dimension_count(cfg.head_dim)
    if cfg.architecture != "llama":  # head_dim apart from hidden / heads (Qwen3 0.6B: 128 vs 64)
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if cfg.sliding_window:
        w.add_sliding_window(cfg.sliding_window)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(GGUF_F16_FILE_TYPE)
    tokens, scores, types = _vocab(cfg.vocab_size)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    names, C = gguf.TENSOR_NAMES, cfg.hidden_size
    w.add_tensor("token_embd.weight", mat(cfg.vocab_size, C, 1.0))
    blocks = _block_tensors(cfg)
    for i in range(cfg.n_layers):
        for tensor, shape in blocks.items():
            name = names[tensor].format(bid=i) + ".weight"
            w.add_tensor(name, np.ones(shape, dtype=np.float32) if len(shape) == 1 else mat(*shape))
    w.add_tensor("output_norm.weight", np.ones(C, dtype=np.float32))
    if not cfg.tie_embeddings:
        w.add_tensor("output.weight", mat(cfg.vocab_size, C))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

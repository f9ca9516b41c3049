"""Write a random-weight GGUF file of a preset's shape, so that llama.cpp and edgekit read identical weights.

llama.cpp needs a GGUF with tokenizer metadata even for ``llama-bench`` (which
feeds token ids and never tokenizes), so the file carries a SentencePiece-style
``llama`` vocabulary: 3 control tokens, 256 byte tokens ``<0xNN>``, then plain
tokens up to the vocabulary size. Matrices are F16, norms F32 (llama.cpp's
convention); ``llama-quantize`` makes the Q8_0 / Q4_K_M copies. Values are
random (speed does not depend on them); edgekit loads the file back through its
GGUF loader like any other model file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgekit.model.config import ModelConfig

GGUF_F16_FILE_TYPE = 1  # llama.cpp's LLAMA_FTYPE_MOSTLY_F16


def _vocab(n: int) -> tuple[list[bytes], list[float], list[int]]:
    from gguf import TokenType

    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    tokens += [f"t{i}".encode() for i in range(n - len(tokens))]
    types += [TokenType.NORMAL] * (n - len(types))
    return tokens[:n], [0.0] * n, [int(t) for t in types[:n]]


def write_random_gguf(cfg: ModelConfig, path: Path, seed: int = 0) -> Path:
    """A llama-architecture F16 GGUF of ``cfg``'s shape with random weights (std 0.02; norms 1)."""
    import gguf

    if cfg.architecture != "llama":
        raise ValueError(f"write_random_gguf writes llama-architecture files; got {cfg.architecture!r}")
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float16)

    path = Path(path)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(cfg.name.replace("preset:", "") + "-random")
    w.add_context_length(cfg.max_position_len)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(GGUF_F16_FILE_TYPE)
    tokens, scores, types = _vocab(cfg.vocab_size)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    C, F, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    w.add_tensor("token_embd.weight", mat(cfg.vocab_size, C, 1.0))
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(C, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", mat(cfg.n_heads * D, C))
        w.add_tensor(p + "attn_k.weight", mat(cfg.n_kv_heads * D, C))
        w.add_tensor(p + "attn_v.weight", mat(cfg.n_kv_heads * D, C))
        w.add_tensor(p + "attn_output.weight", mat(C, cfg.n_heads * D))
        w.add_tensor(p + "ffn_norm.weight", np.ones(C, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", mat(F, C))
        w.add_tensor(p + "ffn_up.weight", mat(F, C))
        w.add_tensor(p + "ffn_down.weight", mat(C, F))
    w.add_tensor("output_norm.weight", np.ones(C, dtype=np.float32))
    if not cfg.tie_embeddings:
        w.add_tensor("output.weight", mat(cfg.vocab_size, C))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

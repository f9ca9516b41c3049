"""Small model files made on the fly: a Hugging Face directory and a GGUF file with random weights.

They are written the way the real tools write them (transformers' save_pretrained; a GGUF with
llama.cpp's Q/K row permutation and a byte-level BPE vocabulary), so the loaders are tested on
real formats without shipping any weights.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_level_vocab() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return SPECIALS + [bytes_to_unicode()[b] for b in range(256)]


def fast_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer with no merges: every byte is a token (ids after the specials)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = byte_level_vocab()
    assert len(tokens) <= vocab_size
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE
    )


def hf_model(model_type: str, seed: int = 0):
    import transformers

    common = dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
        eos_token_id=2, bos_token_id=1, pad_token_id=0,
    )
    cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(tie_word_embeddings=False)),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, dict(tie_word_embeddings=False, sliding_window=None)),
    }[model_type]
    torch.manual_seed(seed)
    cfg = cls[0](**common, **cls[2])
    model = cls[1](cfg).eval()
    with torch.no_grad():  # transformers initialises norms to 1 and biases to 0: randomise them so they are tested
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(scope="session", params=["llama", "qwen2", "mistral"])
def hf_dir(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"hf-{request.param}")
    model = hf_model(request.param)
    model.save_pretrained(str(d), safe_serialization=True)
    fast_tokenizer(model.config.vocab_size).save_pretrained(str(d))
    return d, model


def _permute_for_gguf(w: np.ndarray, n_heads: int) -> np.ndarray:
    # llama.cpp's convert_hf_to_gguf.py LlamaModel.permute
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _add_header(writer, cfg, rope_theta: float) -> None:
    """A transformers config's shape, and a byte-level BPE vocabulary of its size, as GGUF metadata."""
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    tokens = byte_level_vocab()
    tokens += [f"<unused{i}>" for i in range(cfg.vocab_size - len(tokens))]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges([])
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_llama_gguf(path, model, *, architecture: str = "llama", truncate_to: int | None = None,
                     projection_types: dict[str, str] | None = None, table_type: str | None = None,
                     tied: bool = False) -> None:
    """``projection_types``: GGUF tensor name suffix (e.g. "attn_q.weight") -> GGML type ("Q4_1") to store that
    projection in, quantized by gguf-py as llama.cpp's converter would; the rest is F32. "TYPE:zeros" writes
    all-zero blocks of a type gguf-py cannot quantize (for intake errors). ``table_type``: the GGML type of the
    embedding (and output) table, quantized by gguf-py (e.g. "Q8_0"); ``tied``: no output.weight (tied embeddings)."""
    import gguf

    def tensor(name: str, w: np.ndarray) -> None:
        qtype = next((t for suffix, t in (projection_types or {}).items() if name.endswith(suffix)), None)
        if qtype is None:
            writer.add_tensor(name, w)
        elif qtype.endswith(":zeros"):
            q = gguf.GGMLQuantizationType[qtype.split(":")[0]]
            writer.add_tensor(name, np.zeros(gguf.quants.quant_shape_to_byte_shape(w.shape, q), np.uint8), raw_dtype=q)
        else:
            q = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(name, gguf.quants.quantize(w, q), raw_dtype=q)

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-test-llama")
    _add_header(writer, cfg, cfg.rope_theta if hasattr(cfg, "rope_theta") else 10000.0)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {
        "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    }
    def table(name: str, w: np.ndarray) -> None:
        if table_type is None:
            writer.add_tensor(name, w)
        else:
            q = gguf.GGMLQuantizationType[table_type]
            writer.add_tensor(name, gguf.quants.quantize(w, q), raw_dtype=q)

    table("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            w = sd[f"model.layers.{i}.{hf}"]
            if hf.startswith("self_attn.q_proj"):
                w = _permute_for_gguf(w, cfg.num_attention_heads)
            elif hf.startswith("self_attn.k_proj"):
                w = _permute_for_gguf(w, cfg.num_key_value_heads)
            tensor(f"blk.{i}.{gg}", np.ascontiguousarray(w))
    writer.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings and not tied:
        table("output.weight", sd["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if truncate_to is not None:
        data = path.read_bytes()
        path.write_bytes(data[:truncate_to])


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    model = hf_model("llama", seed=1)
    path = d / "tiny-llama.gguf"
    write_llama_gguf(path, model)
    return path, model


def write_json(path, obj) -> None:
    path.write_text(json.dumps(obj))


@pytest.fixture(scope="session")
def tiny():
    """The tiny preset (random weights), loaded once per session."""
    from edgekit.model.loader import load_model

    return load_model("preset:tiny")


def write_family_gguf(path, model, projections: str | None = None) -> None:
    """A Qwen3 or Gemma 3 transformers model as llama.cpp's convert_hf_to_gguf.py writes it (F32): the family's
    architecture keys and tensor names (gguf-py's own tables), Q/K rows as stored (only llama is permuted), and for
    Gemma every norm weight written as 1 + w (Gemma3Model.norm_shift) with no local RoPE base, window pattern or
    query scale key (llama.cpp fixes them: 10000, one global layer in 6, 1/sqrt(head_dim)). ``projections``: a GGML
    type (e.g. "Q4_0") the block projections are quantized to by gguf-py, as llama-quantize would store them."""
    import gguf

    cfg = model.config
    arch = {"qwen3": "qwen3", "gemma3_text": "gemma3"}[cfg.model_type]
    T, names = gguf.MODEL_TENSOR, gguf.TENSOR_NAMES
    block = {
        "input_layernorm": T.ATTN_NORM, "self_attn.q_proj": T.ATTN_Q, "self_attn.k_proj": T.ATTN_K,
        "self_attn.v_proj": T.ATTN_V, "self_attn.o_proj": T.ATTN_OUT, "self_attn.q_norm": T.ATTN_Q_NORM,
        "self_attn.k_norm": T.ATTN_K_NORM, "mlp.gate_proj": T.FFN_GATE, "mlp.up_proj": T.FFN_UP,
        "mlp.down_proj": T.FFN_DOWN,
    }
    if arch == "gemma3":
        block.update({"post_attention_layernorm": T.ATTN_POST_NORM, "pre_feedforward_layernorm": T.FFN_PRE_NORM,
                      "post_feedforward_layernorm": T.FFN_POST_NORM})
    else:
        block["post_attention_layernorm"] = T.FFN_NORM
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-test-{arch}")
    rope = cfg.rope_parameters
    _add_header(writer, cfg, (rope.get("full_attention") or rope)["rope_theta"])
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    theta, D = (rope.get("full_attention") or rope)["rope_theta"], cfg.head_dim
    plain = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    rotary = model.model.rotary_emb  # Gemma 3 keeps one set per layer type
    scaled = getattr(rotary, "inv_freq", None)
    scaled = getattr(rotary, "full_attention_inv_freq", None) if scaled is None else scaled
    if scaled is not None and not torch.allclose(scaled.double(), plain, rtol=1e-6):  # llama3: llama.cpp's divisors
        scaled = scaled.double()
        writer.add_tensor("rope_freqs.weight", (plain / scaled).float().numpy())
    if arch == "gemma3":
        writer.add_sliding_window(cfg.sliding_window)
    shift = 1.0 if arch == "gemma3" else 0.0
    for name, t in model.state_dict().items():
        w = t.detach().float().numpy()
        if name.endswith("norm.weight"):
            w = w + shift
        if name == "model.embed_tokens.weight":
            writer.add_tensor(names[T.TOKEN_EMBD] + ".weight", w)
        elif name == "model.norm.weight":
            writer.add_tensor(names[T.OUTPUT_NORM] + ".weight", w)
        elif name == "lm_head.weight":
            if not cfg.tie_word_embeddings:
                writer.add_tensor(names[T.OUTPUT] + ".weight", w)
        else:
            _, _, i, rest = name.split(".", 3)  # model.layers.{i}.<module>.weight
            gguf_name = names[block[rest.removesuffix(".weight")]].format(bid=i) + ".weight"
            if projections and not name.endswith("norm.weight"):
                q = gguf.GGMLQuantizationType[projections]
                writer.add_tensor(gguf_name, gguf.quants.quantize(np.ascontiguousarray(w), q), raw_dtype=q)
            else:
                writer.add_tensor(gguf_name, np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# -- Qwen3 and Gemma 3: random-initialised transformers models (no hub download)

FAMILY_SMALL = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1,
                    eos_token_id=2, pad_token_id=0)


def hf_family_model(model_type: str, seed: int = 0, norm_noise: float = 0.3, **kw):
    import transformers

    classes = {"qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
               "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM)}
    conf_cls, model_cls = classes[model_type]
    torch.manual_seed(seed)
    model = model_cls(conf_cls(**kw)).eval()
    with torch.no_grad():  # norms start at 1 (Qwen3) or 0 (Gemma's 1 + w): make every one of them matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * norm_noise)
    return model


# Weights drawn wider than transformers' 0.02 where a small random model would otherwise repeat one token forever
# (Qwen3 0.2, Gemma 3 0.03: its embedding is scaled by sqrt(hidden) already)
def small_qwen3():
    return hf_family_model("qwen3", num_hidden_layers=3, rope_theta=1e6, tie_word_embeddings=True,
                           initializer_range=0.2, **FAMILY_SMALL)


def small_gemma3():
    """Pattern 2, a local RoPE base of its own and a query scalar apart from head_dim (HF folders carry all three)."""
    return hf_family_model("gemma3", num_hidden_layers=4, rope_theta=1e6, rope_local_base_freq=1000.0,
                           sliding_window=6, layer_types=["sliding_attention", "full_attention"] * 2,
                           query_pre_attn_scalar=24, initializer_range=0.03, **FAMILY_SMALL)


def small_gemma3_llamacpp():
    """What a gemma3 GGUF can say: llama.cpp fixes one global layer in 6, local base 10000, 1/sqrt(head_dim)."""
    return hf_family_model("gemma3", num_hidden_layers=7, rope_theta=1e6, rope_local_base_freq=10000.0,
                           sliding_window=6, query_pre_attn_scalar=FAMILY_SMALL["head_dim"], initializer_range=0.03,
                           **FAMILY_SMALL)

"""Tokenizers from a GGUF file's metadata or a Hugging Face directory, with the model's chat template."""

from __future__ import annotations

from pathlib import Path

from edgekit.errors import ModelLoadError


class Tokenizer:
    """A thin wrapper so the rest of edgekit does not depend on transformers' tokenizer API."""

    def __init__(self, hf_tokenizer):
        self._tok = hf_tokenizer

    @property
    def chat_template(self) -> str | None:
        return self._tok.chat_template

    @property
    def eos_token_id(self) -> int | None:
        return self._tok.eos_token_id

    @property
    def pad_token_id(self) -> int:
        pid = self._tok.pad_token_id
        return pid if pid is not None else (self._tok.eos_token_id or 0)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=True))

    def encode_chat(self, user_message: str, system: str | None = None) -> list[int]:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user_message}]
        return self.encode_messages(messages)

    def encode_messages(self, messages: list[dict]) -> list[int]:
        """A conversation ({"role", "content"} dicts, in order) through the chat template, ready for the answer.
        A template that refuses it (roles it does not know or order) raises jinja2's TemplateError."""
        out = self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
        return list(ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def save(self, directory: Path) -> list[Path]:
        """Write tokenizer.json and tokenizer_config.json (chat template included)."""
        directory.mkdir(parents=True, exist_ok=True)
        return [Path(p) for p in self._tok.save_pretrained(str(directory))]


def tokenizer_from_gguf(path: Path) -> Tokenizer:
    try:
        from transformers import PreTrainedTokenizerFast
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer
    except ImportError:  # older transformers: the slower public path does the same conversion
        from transformers import AutoTokenizer

        return Tokenizer(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))
    try:
        architecture, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(str(path))
        backend, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    except Exception as e:  # foreign library, arbitrary failure modes: wrap at the boundary
        raise ModelLoadError(f"{path}: cannot build a tokenizer from this GGUF file's metadata ({e})") from e
    return Tokenizer(PreTrainedTokenizerFast(tokenizer_object=backend, **tokenizer_config))


def tokenizer_from_directory(directory: Path) -> Tokenizer:
    if not (directory / "tokenizer.json").exists():
        raise ModelLoadError(
            f"{directory}: no tokenizer.json",
            hint="a Hugging Face model directory needs tokenizer.json (and tokenizer_config.json for the chat template)",
        )
    from transformers import PreTrainedTokenizerFast

    try:
        return Tokenizer(PreTrainedTokenizerFast.from_pretrained(str(directory)))
    except Exception as e:
        raise ModelLoadError(f"{directory}: cannot load the tokenizer ({e})") from e

"""The OpenAI-compatible request bodies the server accepts, and 400s that name the field as the client sent it.

Every number must be finite and in range, every string valid UTF-8 (JSON can
carry a lone surrogate, ``"\\ud800"``, which no tokenizer can encode). A field
of the OpenAI API this server does not implement is refused by name rather than
silently ignored. ``n`` (choices per request) is bounded by ``MAX_CHOICES``: the
choices decode as parallel rows of one batch, and the batch is small.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edgekit.seed_range import MAX_SEED

MAX_CHOICES = 4  # n: each choice is one decode row; the engine refuses more than its rows (the bundle's --batch)
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256
MAX_PROMPT_IDS = 65_536  # a cap on the items parsed before the KV cache's own bound is checked

# Fields of the OpenAI API this server does not implement: a request that sets them gets a 400 naming them.
UNSUPPORTED = ("logprobs", "top_logprobs", "echo", "best_of", "suffix", "logit_bias", "presence_penalty",
               "frequency_penalty", "tools", "tool_choice", "functions", "function_call", "response_format",
               "parallel_tool_calls")
# Fields a stock client may send that change nothing here.
ACCEPTED_AND_IGNORED = ("model", "user", "metadata", "store", "service_tier")


def _valid_utf8(value: str, field: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{field} is not valid UTF-8: character {e.start} is a lone surrogate "
                         f"(\\u{ord(value[e.start]):04x}); send well-formed Unicode text") from None
    return value


# strict: a value of the wrong JSON type is a 400 naming the field, as OpenAI's API answers it, never coerced: lax
# parsing took "max_tokens": true as 1, "stream": "no" as true and a prompt of [true, false] as token ids 1 and 0
_STRICT = ConfigDict(extra="forbid", strict=True)


class _Common(BaseModel):
    model_config = _STRICT

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=0)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    n: int = 1
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False  # an extension (vLLM's name): generate max_tokens even past end-of-sequence; benchmarks
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in UNSUPPORTED:
                if data.get(name) not in (None, False, 0, [], {}):
                    raise ValueError(f"unsupported field {name!r}: this server does not implement it; leave it out")
        return data

    @field_validator("n")
    @classmethod
    def _choices(cls, v: int) -> int:
        if not 1 <= v <= MAX_CHOICES:
            raise ValueError(f"n={v} is out of range: this server returns 1 to {MAX_CHOICES} choices per request "
                             f"(each is a decode row of a small batch); send n<={MAX_CHOICES} or several requests")
        return v

    def seeds(self) -> list[int]:
        """One seed per choice: seed, seed+1, ... (so sampled choices differ; greedy ones are alike)."""
        return [(self.seed + i) % (MAX_SEED + 1) for i in range(self.n)]

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        for s in stops:
            if not s or len(s) > MAX_STOP_CHARS:
                raise ValueError(f"each stop string must have 1..{MAX_STOP_CHARS} characters, got {len(s)}")
            _valid_utf8(s, "stop")
        return v

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def new_tokens(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def new_tokens_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"

    def include_usage_in_stream(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class CompletionRequest(_Common):
    # text, or token ids as the OpenAI API allows; an id list over MAX_PROMPT_IDS is refused by its length before its
    # items are checked (a 1 MB body holds ~500k ids); the KV cache bounds the rest
    prompt: str | Annotated[list[int], Field(max_length=MAX_PROMPT_IDS)]

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, str):
            return _valid_utf8(v, "prompt")
        return v


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "user", "assistant", "developer"]
    content: str
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, v: str) -> str:
        return _valid_utf8(v, "content")


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)


def field_name(loc: tuple) -> str:
    """('body', 'messages', 0, 'content') -> 'messages[0].content': the field as the client wrote it."""
    parts = [p for p in loc if p != "body"]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p in ("str", "int", "float", "list[int]", "list[str]"):  # pydantic's union-branch labels: not fields
            continue
        else:
            out += ("." if out else "") + str(p)
    return out or "body"


def _describe(err: dict) -> str:
    """One error, without echoing the received value (it may be huge, or not representable in JSON)."""
    msg = err.get("msg", "invalid")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    value = err.get("input")
    if isinstance(value, float) and not math.isfinite(value):
        msg += f" (received {value}; numbers must be finite)"
    elif str(err.get("type", "")).endswith("_type"):  # a wrong JSON type: say which one came
        msg += f" (received {_json_type(value)})"
    return msg


def _json_type(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words (never the value itself)."""
    if isinstance(value, bool):  # before int: bool is an int in Python
        return "true" if value else "false"
    names = {int: "an integer", float: "a decimal number", str: "a string", list: "an array", dict: "an object"}
    return next((name for t, name in names.items() if isinstance(value, t)), "null")


def validation_message(errors: list[dict]) -> tuple[str, str]:
    """(field, message) for the first error; the message names every failing field."""
    parts, first = [], None
    for err in errors[:5]:
        name = field_name(tuple(err.get("loc", ())))
        if err.get("type") == "extra_forbidden":
            message = f"unknown field {name!r}: not part of this API (see /v1/models and the docs); leave it out"
        elif err.get("type") == "json_invalid":
            name, message = "body", f"the body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')})"
        else:
            message = f"{name}: {_describe(err)}"
        first = first or name
        parts.append(message)
    return first or "body", "; ".join(parts)

"""Streaming text deltas: stop strings across token boundaries, incomplete UTF-8 held back."""

from __future__ import annotations

from edgekit.runtime.text_stream import TextStream

# a toy byte-level tokenizer: token i is one byte
def _decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def _feed(stream: TextStream, data: bytes) -> list[str]:
    out = []
    for b in data:
        out.append(stream.push(b))
        if stream.stopped:
            break
    out.append(stream.finish())
    return out


def test_deltas_concatenate_to_the_text():
    s = TextStream(_decode, [])
    assert "".join(_feed(s, b"hello world")) == "hello world" and not s.stopped


def test_stop_string_split_over_tokens_is_cut_and_never_streamed():
    s = TextStream(_decode, ["END"])
    out = _feed(s, b"abcENDxyz")
    assert "".join(out) == "abc" and s.stopped
    assert all("E" not in d for d in out)  # the start of the stop string was held back, not sent


def test_incomplete_utf8_is_held_until_its_last_byte():
    s = TextStream(_decode, [])
    euro = "€".encode()  # 3 bytes
    assert s.push(euro[0]) == "" and s.push(euro[1]) == ""
    assert s.push(euro[2]) == "€"


def test_incremental_text_equals_a_full_decode_with_a_real_tokenizer(default_model):
    tok = default_model.tokenizer
    ids = tok.encode("Héllo, wörld! Ünïcode — and spaces   here. 東京は日本の首都です。")
    s = TextStream(tok.decode, [])
    out = "".join(s.push(i) for i in ids) + s.finish()
    assert out == tok.decode(ids)


def test_stop_string_with_a_real_tokenizer(default_model):
    tok = default_model.tokenizer
    ids = tok.encode("The answer is 42. The end.")
    s = TextStream(tok.decode, [". The"])
    out = "".join(s.push(i) for i in ids if not s.stopped) + s.finish()
    assert out == "The answer is 42" and s.stopped


def test_stop_list_order_does_not_matter_the_earliest_match_wins():
    """#32 row 13: stop [" ", "w"] and ["w", " "] cut at different places when one token brought both (the list's
    first match won, so the returned text could contain a stop string). Now the earliest match wins."""
    vocab = {0: "hello", 1: " wor", 2: "ld"}

    def decode(ids):
        return "".join(vocab[i] for i in ids)

    for stops in ([" ", "w"], ["w", " "]):
        s = TextStream(decode, stops)
        out = "".join(s.push(t) for t in (0, 1, 2) if not s.stopped) + s.finish()
        assert out == "hello" and s.stopped, (stops, out)
        assert s.tokens == [0, 1]  # what was returned (and what usage counts): up to the token that completed it

"""A stock OpenAI client against `serve`: streaming chat, completions, /v1/models, stop, usage; raw SSE framing."""

from __future__ import annotations

import json

import httpx
import pytest

from runtime_helpers import live_server

from edgekit.runtime.server import create_app

openai = pytest.importorskip("openai")  # in the dev extra


@pytest.fixture(scope="module")
def url(smol_engine):
    with live_server(create_app(smol_engine)) as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_stock_client_streams_a_chat_completion(client):
    stream = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals in (["stop"], ["length"])
    usage = chunks[-1].usage
    assert usage is not None and 1 <= usage.completion_tokens <= 12 and usage.total_tokens > usage.completion_tokens
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2  # more than one delta: it streamed


def test_stock_client_non_streaming_chat_and_completion(client):
    r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "What is the capital of France?"}],
                                       max_tokens=12)
    assert "Paris" in r.choices[0].message.content and r.usage.completion_tokens <= 12
    c = client.completions.create(model="x", prompt="The capital of France is", max_tokens=4)
    assert c.choices[0].text and c.usage.prompt_tokens > 0


def test_stock_client_lists_the_model(client):
    assert [m.id for m in client.models.list()] == ["smollm2-135m"]


def test_stock_client_gets_n_choices_decoded_together(client, smol_engine):
    steps_before = dict(smol_engine.step_batches)
    r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Name a colour."}], n=3,
                                       max_tokens=6, temperature=1.0, seed=11)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content and c.finish_reason in ("stop", "length") for c in r.choices)
    assert len({c.message.content for c in r.choices}) > 1  # seeds 11, 12, 13: different samples
    assert 3 <= r.usage.completion_tokens <= 18
    # the three sequences were rows of one batch (bucket 4), not three requests one after another
    assert smol_engine.step_batches[4] > steps_before[4]


def test_stock_client_streams_n_choices(client):
    stream = client.completions.create(model="x", prompt="The capital of France is", n=2, max_tokens=5, stream=True,
                                       stream_options={"include_usage": True})
    texts, finals, usage = {0: "", 1: ""}, {}, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                finals[c.index] = c.finish_reason
    assert texts[0] and texts[0] == texts[1]  # greedy: both choices alike
    assert set(finals) == {0, 1}
    assert usage is not None and 2 <= usage.completion_tokens <= 10


def test_stock_client_sees_a_400_for_n_above_the_bound(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], n=5, max_tokens=2)
    assert "n=5" in str(e.value)


def test_stop_string_ends_the_answer_before_it(client):
    free = client.completions.create(model="x", prompt="1, 2, 3, 4,", max_tokens=12).choices[0].text
    assert free.strip(), free
    stop = free.strip()[:1]  # the first character the model writes
    r = client.completions.create(model="x", prompt="1, 2, 3, 4,", max_tokens=12, stop=[stop])
    assert stop not in r.choices[0].text and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 12


def test_raw_sse_framing_ends_with_done(url):
    lines = []
    with httpx.stream("POST", url + "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 5, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            lines.append(line)
    events = [x[len("data: "):] for x in lines if x.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(x == "" for x in lines if not x.startswith("data: "))  # events separated by blank lines only


def test_top_p_is_applied(url):
    """A nucleus this small holds only the most likely token: sampling at temperature 1 becomes greedy."""
    base = {"prompt": "Once upon a time", "max_tokens": 8}
    greedy = httpx.post(url + "/v1/completions", json=base, timeout=60).json()["choices"][0]["text"]
    for seed in (1, 2, 3):
        body = {**base, "temperature": 1.0, "top_p": 1e-9, "seed": seed}
        assert httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"] == greedy
    wide = [httpx.post(url + "/v1/completions", json={**base, "temperature": 2.0, "seed": s}, timeout=60).json()
            ["choices"][0]["text"] for s in (1, 2, 3)]
    assert any(w != greedy for w in wide)  # without the nucleus the same seeds do wander


def test_the_model_id_is_an_identifier_not_a_gguf_display_name():
    """#33 (low): /v1/models said "Smollm2 135M 8k Lc100K Mix1 Ep2" (the GGUF's general.name)."""
    from edgekit.runtime.serving import model_id

    assert model_id("Smollm2 135M 8k Lc100K Mix1 Ep2") == "smollm2-135m-8k-lc100k-mix1-ep2"
    assert model_id("preset:tiny") == "preset-tiny" and model_id("  ") == "edgekit"


def test_a_served_bundle_names_its_model_by_id(tiny_server):
    import httpx

    url, stack, _ = tiny_server
    models = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    assert [m["id"] for m in models] == ["preset-tiny"]

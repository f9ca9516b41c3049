"""The on-device HTTP server: OpenAI-compatible completions (streamed or not), models, health, metrics, plugin admin.

Binds to 127.0.0.1 unless told otherwise. What holds it up under hostile or careless clients:
- admin routes check the bearer token from the headers before a byte of body is
  read; every body has a size limit enforced while it streams in, and a deadline
  (``http_guard``); connections that dribble their headers are closed;
- the event loop never tokenizes, decodes or waits for the device or the store:
  tokenization runs on its own small pool, admin operations on their own thread,
  inference on the engine's device thread behind a bounded admission queue that
  answers 429 + Retry-After at once when full;
- requests are validated (finite numbers, ranges, UTF-8, unknown fields) with a
  400 that names the field as the client sent it;
- one Prometheus registry: the engine's latency tracker (which the watchdog
  reads) plus the server's counters, each family defined once.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Protocol

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import ValidationError
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from starlette.exceptions import HTTPException as StarletteHTTPException

from edgekit.bundle.plugin import MAX_PACKAGE_BYTES
from edgekit.bundle.plugin_identity import SwapRefused
from edgekit.errors import BundleError, EdgekitError, ShapeError
from edgekit.generate import SamplingConfig
from edgekit.power.jsonl import JsonlLogger
from edgekit.runtime.choices import Choices
from edgekit.runtime.engine import (ChatTemplateError, Engine, EngineClosedError, OverloadedError,
                                    RequestTooLargeError)
from edgekit.runtime.http_guard import AdminAuth, RequestGuard, error_body, read_admin_token
from edgekit.runtime.openai_schema import MAX_PROMPT_IDS, ChatRequest, CompletionRequest, validation_message
from edgekit.runtime.plugin_store import StoreBusyError, UnknownOperatorError
from edgekit.runtime.sse_chunks import ChunkEncoder
from edgekit.runtime.text_stream import TextStream
from edgekit.runtime.token_feed import TokenFeed

MAX_PLUGIN_UPLOAD_BYTES = MAX_PACKAGE_BYTES  # an upload is one signed plugin package: the format's cap
MAX_REQUEST_BODY_BYTES = 1024 * 1024
# A token is rarely longer than this many characters: text longer than (KV cache length x this) cannot fit and is
# refused before it is tokenized.
MAX_CHARS_PER_TOKEN = 32
DEFAULT_MAX_TOKENS = 64
INLINE_PARSE_BYTES = 16 * 1024  # bodies up to this are parsed on the event loop (a thread hop costs more)
RETRY_AFTER_S = 1
# A capacity refusal (429) is answered after this long, not at once: a client that ignores Retry-After and retries
# at once then retries ~2 times a second instead of hundreds. 32 such clients sent 570 requests/s at the default
# model on a 2-core CPU and took the cores from the requests being served (0.5 served/s, their time to first byte
# 6x one client's). The wait costs the server a sleeping coroutine; the answer still comes within 1 s.
REFUSAL_DELAY_S = 0.5
ADMIN_PREFIX = "/v1/plugins"
INFERENCE_PATHS = ("/v1/completions", "/v1/chat/completions")
SWAP_PAUSE_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 1.0)


class PluginAdmin(Protocol):
    """What the admin routes need from the plugin swap machinery."""

    def list(self) -> list[dict]: ...

    def install(self, package: bytes, *, allow_downgrade: bool = False) -> dict: ...

    def rollback(self, op: str) -> dict: ...


class _Metrics:
    """The server's own families; latency histograms come from the engine's tracker, on the same registry."""

    def __init__(self, engine: Engine) -> None:
        reg = self.registry = engine.tracker.registry
        self.requests = Counter("edgekit_requests", "HTTP requests by route and status", ["route", "status"], registry=reg)
        self.tokens = Counter("edgekit_generated_tokens", "Tokens generated (measured)", registry=reg)
        self.swaps = Counter("edgekit_plugin_swaps", "Operator plugin installs and rollbacks", ["op", "kind"], registry=reg)
        self.swap_pause = Histogram("edgekit_swap_pause_seconds", "Serving pause when the device thread switches to a "
                                    "new operator table (measured)", buckets=SWAP_PAUSE_BUCKETS_S, registry=reg)
        waiting = Gauge("edgekit_requests_waiting", "Requests in the admission queue", registry=reg)
        waiting.set_function(engine.queue_depth)
        rows = Gauge("edgekit_sequences_decoding", "Sequences in the decode batch", registry=reg)
        rows.set_function(engine.active_rows)
        reg.register(_DecodePathCollector(engine))
        self.logs: list[JsonlLogger] = []  # every app's log on this engine (tests make several apps)
        dropped = Gauge("edgekit_log_records_dropped", "Log records lost to failed writes (disk full, ...): counted "
                        "instead of failing the request", registry=reg)
        dropped.set_function(lambda: sum(log.dropped for log in self.logs))
        self._pauses_seen = 0
        self._engine = engine

    def collect_swap_pauses(self) -> None:
        pauses = self._engine.swap_pauses_s
        for p in pauses[self._pauses_seen:]:
            self.swap_pause.observe(p)
        self._pauses_seen = len(pauses)


class _DecodePathCollector:
    """``edgekit_decode_path{path="fused",graphed="true"} 1``: the path the device thread runs now (a swap of an
    operator the fused kernels subsume moves it to per-operator until fused kernels with it arrive)."""

    NAME = "edgekit_decode_path"

    def __init__(self, engine: Engine):
        self._engine = engine

    def _family(self, path: str, graphed: bool) -> GaugeMetricFamily:
        g = GaugeMetricFamily(self.NAME, "Active decode path (1 for the one running now)", labels=["path", "graphed"])
        g.add_metric([path, "true" if graphed else "false"], 1)
        return g

    def describe(self):
        yield GaugeMetricFamily(self.NAME, "Active decode path", labels=["path", "graphed"])

    def collect(self):
        yield self._family(self._engine.decode_path.name, self._engine.graphed)


class _Refused(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}


def _first_token_ms(stats) -> dict:
    """A served request's log fields: time to its first token (from its arrival) and the part of it spent waiting
    for a decode row; absent for a request that never got one (its first token never came)."""
    if stats.first_token_at_s is None:
        return {}
    return {"ttft_ms": round(stats.prefill_s * 1000, 3), "queue_ms": round(stats.queue_s * 1000, 3)}


def _is_bad_name(e: Exception) -> bool:
    """An operator name that is not an identifier at all (plugin_identity.check_name's refusal)."""
    return isinstance(e, SwapRefused) and e.reason == "schema"


def _error(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=json.loads(error_body(status, message, param)), headers=headers)


def create_app(engine: Engine, *, admin_token_file: str | None = None, admin_token: str | None = None,
               plugins: PluginAdmin | None = None, extra_registries: list[Any] | None = None,
               log: JsonlLogger | None = None, max_body_bytes: int = MAX_REQUEST_BODY_BYTES,
               body_timeout_s: float = 10.0, refusal_delay_s: float = REFUSAL_DELAY_S) -> FastAPI:
    app = FastAPI(title="edgekit", docs_url=None, redoc_url=None, openapi_url=None)
    token = admin_token if admin_token is not None else read_admin_token(admin_token_file)
    auth = AdminAuth(token)
    metrics = getattr(engine, "server_metrics", None) or _Metrics(engine)  # families register once per registry
    engine.server_metrics = metrics
    if log is not None:
        metrics.logs.append(log)
    tokenize_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="edgekit-tokenize")
    parse_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgekit-parse")  # one: the loop vies with one
    admin_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgekit-admin-http")
    app.state.engine, app.state.metrics, app.state.token_feed = engine, metrics, None
    vocab = engine.decoder.config.vocab_size
    # a prompt past the largest bucket is prefilled in chunks: only the KV cache bounds it (what can never fit it is
    # refused before tokenization)
    max_prompt_chars = engine.shapes.max_seq_len * MAX_CHARS_PER_TOKEN

    def upload_limit() -> int:  # read at request time: tests lower it
        return MAX_PLUGIN_UPLOAD_BYTES

    def route_of(path: str) -> str:
        """A fixed set of labels: a client must not be able to mint metric series with made-up paths."""
        if path.startswith(ADMIN_PREFIX):
            return "plugins"
        return {"/v1/completions": "completions", "/v1/chat/completions": "chat", "/v1/models": "models",
                "/healthz": "healthz", "/metrics": "metrics"}.get(path, "other")

    app.add_middleware(RequestGuard, auth=auth, is_admin=lambda p: p.startswith(ADMIN_PREFIX),
                       body_limit=lambda p: upload_limit() if p.startswith(ADMIN_PREFIX) else max_body_bytes,
                       body_timeout_s=body_timeout_s,
                       on_refusal=lambda path, status, msg: record(route_of(path), status, time.perf_counter(), error=msg),
                       overloaded=lambda p: p in INFERENCE_PATHS and engine.full(), retry_after_s=RETRY_AFTER_S,
                       refusal_delay_s=refusal_delay_s)

    def record(route: str, status: int, t0: float | None, **fields) -> None:
        """One request's log line; ``t0`` None where the handler's start is not known (an exception handler): no
        "ms" then, rather than a made-up ~0."""
        metrics.requests.labels(route, str(status)).inc()
        if log is not None:
            took = {} if t0 is None else {"ms": round((time.perf_counter() - t0) * 1000, 3)}
            log.write({"type": "request", "t_s": time.time(), "route": route, "status": status, **took, **fields})

    def require_admin(request: Request) -> None:  # the middleware already refused; kept so no route depends on it
        refused = auth.refusal(request.headers.get("authorization", ""))
        if refused is not None:
            raise HTTPException(refused[0], refused[1], headers=refused[2])

    def require_plugins() -> PluginAdmin:
        if plugins is None:
            raise HTTPException(409, "this server runs without a plugin store (serve a bundle to enable swaps)")
        return plugins

    # -- inference ---------------------------------------------------------------
    async def prompt_ids(req) -> list[int]:
        loop = asyncio.get_running_loop()
        if isinstance(req, ChatRequest):
            chars = sum(len(m.content) for m in req.messages)
            if chars > max_prompt_chars:
                raise _Refused(413, f"messages hold {chars} characters; at most {max_prompt_chars} can fit the KV "
                                    f"cache ({engine.shapes.max_seq_len} tokens)", "messages")
            refuse_text_without_tokenizer("messages")
            msgs = [m.model_dump() for m in req.messages]
            try:
                return await loop.run_in_executor(tokenize_pool, lambda: engine.encode(messages=msgs))
            except ChatTemplateError as e:
                raise _Refused(400, str(e), "messages") from e
        if isinstance(req.prompt, list):
            if engine.tokenizer is None and req.stop_strings():
                raise _Refused(400, f"{NO_TOKENIZER}, so stop strings cannot be matched; send none, and stop on "
                                    "token ids yourself", "stop")
            bad = next((t for t in req.prompt if not 0 <= t < vocab), None)
            if bad is not None:
                raise _Refused(400, f"prompt: token id {bad} is out of range; token ids must be in [0, {vocab})", "prompt")
            return list(req.prompt)
        if len(req.prompt) > max_prompt_chars:
            raise _Refused(413, f"prompt of {len(req.prompt)} characters cannot fit the KV cache "
                                f"({engine.shapes.max_seq_len} tokens); send at most {max_prompt_chars} characters",
                           "prompt")
        refuse_text_without_tokenizer("prompt")
        text = req.prompt
        return await loop.run_in_executor(tokenize_pool, lambda: engine.encode(prompt=text))

    def refuse_text_without_tokenizer(param: str) -> None:
        if engine.tokenizer is None:  # a preset's bundle, or a model folder without tokenizer.json
            raise _Refused(400, f"{NO_TOKENIZER}: send the prompt to /v1/completions as a list of token ids, "
                                'e.g. "prompt": [1, 2, 3]', param)

    def start(req, ids: list[int], choices: Choices) -> None:
        if not ids:  # "prompt": [] or text that tokenizes to nothing: malformed, not too large (413)
            raise _Refused(400, "prompt: empty (no tokens to continue from); send a non-empty prompt", "prompt")
        # unasked, the answer takes what room the prompt leaves, up to the default (as OpenAI's chat route fills
        # the context): a long prompt is not refused for a max_tokens the client never sent
        max_tokens = req.new_tokens(min(DEFAULT_MAX_TOKENS, max(1, engine.shapes.max_seq_len - len(ids))))
        if max_tokens >= engine.shapes.max_seq_len:
            # the prompt shares the cache (the server does not truncate it): what fits beside this one
            kept = min(len(ids), engine.shapes.max_seq_len - 1)
            raise _Refused(400, f"{req.new_tokens_field()}: {max_tokens} new tokens do not fit the KV cache of "
                                f"{engine.shapes.max_seq_len} tokens; ask for at most "
                                f"{engine.shapes.max_seq_len - kept} (the prompt takes {kept})",
                           req.new_tokens_field())
        room = engine.shapes.max_seq_len - max_tokens
        if room < len(ids) < engine.shapes.max_seq_len:
            # the prompt alone fits: the answer asked for is what overflows (a 413 naming the prompt told the client
            # to shorten what it may need whole); a prompt that cannot fit at all stays the engine's 413 below
            raise _Refused(400, f"{req.new_tokens_field()}: {max_tokens} new tokens and the prompt's {len(ids)} do not "
                                f"fit the KV cache of {engine.shapes.max_seq_len} tokens together; ask for at most "
                                f"{engine.shapes.max_seq_len - len(ids)}, or shorten the "
                                f"{'messages' if isinstance(req, ChatRequest) else 'prompt'} to {room} tokens",
                           req.new_tokens_field())
        samplings = [SamplingConfig(req.temperature, min(req.top_k, vocab), seed, req.top_p) for seed in req.seeds()]
        try:
            choices.started(engine.submit_group(ids, max_tokens, samplings, stop_ids=() if req.ignore_eos else None,
                                                on_token=choices.on_token, on_done=choices.on_done))
        except OverloadedError as e:
            raise _Refused(429, str(e), headers={"Retry-After": str(RETRY_AFTER_S)}) from e
        except RequestTooLargeError as e:
            raise _Refused(400, str(e), "n" if req.n > 1 else req.new_tokens_field()) from e
        except ShapeError as e:  # its hint names CLI flags; an HTTP client sends fields (a chat request has no prompt)
            field = "messages" if isinstance(req, ChatRequest) else "prompt"
            raise _Refused(413, f"{e.message}; shorten the {field} or ask for fewer {req.new_tokens_field()}",
                           field) from e
        except EngineClosedError as e:
            raise _Refused(503, str(e)) from e

    def usage(n_prompt: int, n_out: int) -> dict:
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}

    def feed() -> TokenFeed:
        """The loop's token feed, made on first use (the app is created before uvicorn starts its loop)."""
        loop = asyncio.get_running_loop()
        f = app.state.token_feed
        if f is None or f._loop is not loop:
            f = app.state.token_feed = TokenFeed(loop)
        return f

    async def handle(req, route: str, chat: bool, request: Request):
        t0 = time.perf_counter()
        choices = Choices(feed().channel(), lambda: TextStream(engine.decode_text, req.stop_strings()))
        try:
            ids = await prompt_ids(req)
            start(req, ids, choices)
        except _Refused as e:
            if e.status == 429:  # at capacity: held as the middleware holds a flood's refusals
                await asyncio.sleep(refusal_delay_s)
            record(route, e.status, t0, param=e.param, error=e.message)  # the log says why, as for every refusal
            return _error(e.status, e.message, e.param, e.headers)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())

        # A hang-up is noticed from here on, not only once the first token is out: a client that gives up while its
        # request waits for a row or its long prompt is prefilled (seconds on a CPU) ends it at the next chunk.
        watcher = asyncio.ensure_future(_cancel_on_disconnect(request, choices))
        # The first news decides the status: a request that expires in the queue (429) or fails at prefill
        # gets a real status code, also when it asked to stream (headers are sent after the first token).
        err = await choices.refusal()
        if err is not None:
            watcher.cancel()
            choices.cancel()
            if isinstance(err, OverloadedError):
                record(route, 429, t0, error=str(err))
                return _error(429, str(err), headers={"Retry-After": str(RETRY_AFTER_S)})
            # the server shut down under it (SIGTERM while it waited or its prompt was read): not a fault, as a
            # request refused while draining is not (503 in start)
            status = 503 if isinstance(err, EngineClosedError) else 500
            record(route, status, t0, error=str(err))
            return _error(status, str(err))
        n = len(choices.jobs)

        if req.stream:
            enc = ChunkEncoder(rid, created, engine.model_name, chat)

            async def sse() -> AsyncIterator[bytes]:
                status, reasons = 200, None
                # (the watcher notices a hang-up when it happens, not at the next write: text held back writes nothing)
                try:
                    if chat:
                        for i in range(n):
                            yield enc.role(i)
                    sent = [0] * n  # token ids streamed so far, a choice (a model without a tokenizer)

                    def new_ids(i: int) -> list[bytes]:
                        out_ids = choices.texts[i].tokens
                        if len(out_ids) <= sent[i]:
                            return []
                        chunk, sent[i] = enc.token_ids(list(out_ids[sent[i]:]), i), len(out_ids)
                        return [chunk]

                    async for i, delta in choices.deltas():
                        if engine.tokenizer is None:
                            for chunk in new_ids(i):
                                yield chunk
                            continue
                        yield enc.delta(delta, i)
                    if choices.hung_up():
                        status, reasons = 499, ["cancelled"] * n
                        return
                    if engine.tokenizer is None:  # an end-of-sequence token alone yields no delta: it is sent here,
                        for i in range(n):  # so the stream's token ids are the answer's (and usage's count)
                            for chunk in new_ids(i):
                                yield chunk
                    reasons = [choices.finish_reason(i) for i in range(n)]
                    for i in range(n):
                        yield enc.finish(reasons[i], i)
                    reasons = [choices.logged_reason(i) for i in range(n)]  # the log tells what cut an answer short
                    if req.include_usage_in_stream():
                        yield enc.usage(usage(len(ids), choices.completion_tokens()))
                    yield enc.done()
                except EdgekitError as e:  # headers are sent: report in-band, as OpenAI's servers do
                    status = 429 if isinstance(e, OverloadedError) else 500
                    yield b"data: " + error_body(status, str(e)) + b"\n\n"
                except (asyncio.CancelledError, GeneratorExit):  # the client hung up mid-stream: its rows are freed
                    status, reasons = 499, ["cancelled"] * n
                    choices.cancel()
                    raise
                finally:
                    watcher.cancel()
                    reasons = reasons or [j.finish_reason for j in choices.jobs]
                    metrics.tokens.inc(choices.completion_tokens())
                    record(route, status, t0, stream=True, prompt_tokens=len(ids), completion_tokens=choices.completion_tokens(),
                           finish_reason=reasons if n > 1 else reasons[0], **_first_token_ms(choices.jobs[0].stats))

            return StreamingResponse(sse(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        # not streamed: nothing tells the client's hang-up to this coroutine unless it listens for it (the watcher)
        try:
            async for _ in choices.deltas():
                pass
        except EdgekitError as e:
            status = 429 if isinstance(e, OverloadedError) else 500
            record(route, status, t0, error=str(e))
            return _error(status, str(e), headers={"Retry-After": str(RETRY_AFTER_S)} if status == 429 else None)
        finally:
            watcher.cancel()
        n_out = choices.completion_tokens()
        metrics.tokens.inc(n_out)
        if choices.hung_up():  # the client went away: its rows were freed
            record(route, 499, t0, prompt_tokens=len(ids), completion_tokens=n_out, finish_reason="cancelled")
            return _error(499, "the client closed the connection before the answer was ready")
        reasons = [choices.finish_reason(i) for i in range(n)]
        logged = [choices.logged_reason(i) for i in range(n)]  # "time_limit" / "shutdown" where the client reads "length"
        record(route, 200, t0, prompt_tokens=len(ids), completion_tokens=n_out,
               finish_reason=logged if n > 1 else logged[0], **_first_token_ms(choices.jobs[0].stats))
        out = [({"index": i, "message": {"role": "assistant", "content": t.text}, "logprobs": None, "finish_reason": r}
                if chat else {"index": i, "text": t.text, "logprobs": None, "finish_reason": r})
               for i, (t, r) in enumerate(zip(choices.texts, reasons))]
        if engine.tokenizer is None:  # no text to give: the answer is its token ids (an edgekit field)
            for choice, t in zip(out, choices.texts):
                choice["token_ids"] = list(t.tokens)
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": engine.model_name, "choices": out, "usage": usage(len(ids), n_out)}

    async def parsed(request: Request, model):
        """The body as ``model``: small bodies here, bigger ones on the parse thread (JSON and validation of a body
        near the 1 MB limit take tens of ms that the loop would otherwise stall for: 32 at once held it 2-4.7 s)."""
        body = await request.body()
        if len(body) <= INLINE_PARSE_BYTES:
            return _validate(model, body)
        return await asyncio.get_running_loop().run_in_executor(parse_pool, _validate, model, body)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(await parsed(request, CompletionRequest), "completions", False, request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await handle(await parsed(request, ChatRequest), "chat", True, request)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": engine.model_name, "object": "model", "created": 0,
                                            "owned_by": "edgekit", "decode_path": engine.decode_path.to_dict(),
                                            "graphed": engine.graphed}]}

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok", "model": engine.model_name, "operators": engine.table.sources(),
                "graphed": engine.graphed, "decode_path": engine.decode_path.to_dict(), "batch_buckets": list(engine.batch_buckets),
                "buckets": list(engine.shapes.buckets), "max_seq_len": engine.shapes.max_seq_len,
                "waiting": engine.queue_depth(), "decoding": engine.active_rows()}

    @app.get("/metrics")
    async def prom(request: Request):
        metrics.collect_swap_pauses()
        registries = list({id(r): r for r in [metrics.registry, *(extra_registries or [])]}.values())
        if "application/openmetrics-text" in request.headers.get("accept", ""):  # what strict scrapers ask for
            from prometheus_client.openmetrics import exposition as om

            body = b"".join(om.generate_latest(r)[: -len(b"# EOF\n")] for r in registries) + b"# EOF\n"
            return PlainTextResponse(body, media_type=om.CONTENT_TYPE_LATEST)
        # the watchdog shares the engine's registry: each family is exposed once
        return PlainTextResponse(b"".join(generate_latest(r) for r in registries), media_type=CONTENT_TYPE_LATEST)

    # -- admin (never behind inference: its own thread, no device lock) -----------
    store_root = str(getattr(getattr(plugins, "store", None), "root", "")) or None

    def public(e: Exception) -> str:
        """An admin error as the client sees it: what went wrong, not where the store lives on disk."""
        text = str(e)
        return text.replace(store_root, "<store>") if store_root else text

    async def admin_call(fn, *args, **kw):
        try:
            return await asyncio.get_running_loop().run_in_executor(admin_pool, lambda: fn(*args, **kw))
        except StoreBusyError as e:
            raise _Refused(503, "the plugin store is busy: another edgekit process (server or agent) holds its lock; "
                                "retry later", headers={"Retry-After": str(RETRY_AFTER_S * 5)}) from e

    @app.get(ADMIN_PREFIX)
    async def list_plugins(request: Request):
        require_admin(request)
        try:
            return {"operators": engine.table.sources(), "plugins": await admin_call(require_plugins().list)}
        except _Refused as e:
            return _error(e.status, e.message, headers=e.headers)

    @app.post(ADMIN_PREFIX)
    async def upload_plugin(request: Request, allow_downgrade: bool = False):
        require_admin(request)
        store = require_plugins()
        package = await _package_from(request)
        t0 = time.perf_counter()
        try:
            result = await admin_call(store.install, package, allow_downgrade=allow_downgrade)
        except _Refused as e:
            record("plugins", e.status, t0, action="install", error=e.message)
            return _error(e.status, e.message, headers=e.headers)
        except BundleError as e:
            record("plugins", 422, t0, action="install", error=public(e))
            return _error(422, public(e), "file")
        metrics.swaps.labels(result.get("op", "?"), "install").inc()
        record("plugins", 200, t0, action="install", op=result.get("op"), version=result.get("version"))
        return result

    @app.post(ADMIN_PREFIX + "/{op}/rollback")
    async def rollback(request: Request, op: str):
        require_admin(request)
        t0 = time.perf_counter()
        try:
            result = await admin_call(require_plugins().rollback, op)
        except _Refused as e:
            record("plugins", e.status, t0, action="rollback", op=op, error=e.message)
            return _error(e.status, e.message, headers=e.headers)
        except EdgekitError as e:
            # a name no operator has is a missing resource, a malformed one a bad request; a known operator that
            # cannot step down (it already runs on the reference) conflicts with the store's state
            status = 404 if isinstance(e, UnknownOperatorError) else 400 if _is_bad_name(e) else 409
            record("plugins", status, t0, action="rollback", op=op, error=public(e))
            return _error(status, public(e), "op" if status != 409 else None)
        metrics.swaps.labels(op, "rollback").inc()
        record("plugins", 200, t0, action="rollback", op=op)
        return result

    # -- errors --------------------------------------------------------------------
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        errors = list(e.errors())
        param, message = validation_message(errors)
        status = 400
        if any(err.get("type") == "too_long" and err.get("loc", ())[:1] == ("prompt",) for err in errors):
            # a token-id prompt over the schema's cap: too large, as a long text prompt is
            status, param = 413, "prompt"
            message = (f"prompt holds more than {MAX_PROMPT_IDS} token ids (this server's cap); the KV cache holds "
                       f"{engine.shapes.max_seq_len} tokens: shorten the prompt")
        record(route_of(request.url.path), status, time.perf_counter(), param=param, error=message)
        return _error(status, message, param)

    def no_such_route(request: Request, e: StarletteHTTPException) -> str:
        """A 404/405 that says what came and what to send instead (Starlette says "Not Found"): a stock client whose
        base_url lacks /v1 posts to /chat/completions."""
        came = f"{request.method} {request.url.path[:200]}"
        if e.status_code == 405:
            return f"{came}: method not allowed; this route takes {(e.headers or {}).get('Allow', 'another method')}"
        served = ", ".join(f"{m} {r.path}" for r in app.routes for m in sorted(getattr(r, "methods", None) or ())
                           if m != "HEAD")
        return f"{came}: no such route; this server serves {served} (an OpenAI client's base_url ends in /v1)"

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        message = str(e.detail)
        if (e.status_code, message) in ((404, "Not Found"), (405, "Method Not Allowed")):  # the router's, not ours
            message = no_such_route(request, e)
        record(route_of(request.url.path), e.status_code, time.perf_counter(), error=message)
        return _error(e.status_code, message, headers=e.headers)

    @app.exception_handler(EdgekitError)
    async def edgekit_error(request: Request, e: EdgekitError):
        # an internal failure: the log (local) says what failed; the client is never told where the store lives
        record(route_of(request.url.path), 500, None, error=f"{type(e).__name__}: {e}")
        return _error(500, f"{type(e).__name__}: the server could not complete the request")

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, e: Exception):
        # a bug (any other exception): logged as every answer is, and uvicorn prints its traceback after this
        record(route_of(request.url.path), 500, None, error=f"{type(e).__name__}: {e}")
        return _error(500, f"{type(e).__name__}: the server could not complete the request")

    return app


NO_TOKENIZER = "this model has no tokenizer (its bundle ships none: a preset's, or a model folder without tokenizer.json)"


def _validate(model, body: bytes):
    """A request body as ``model``, or RequestValidationError as FastAPI raises it. Python's JSON parser, as FastAPI
    uses: it reads NaN and lone surrogates, which the validators then refuse by field name."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", getattr(e, "pos", 0)),
                                       "msg": "JSON decode error", "input": {},
                                       "ctx": {"error": getattr(e, "msg", str(e))}}]) from e
    except RecursionError as e:  # arrays or objects nested thousands deep: the parser's stack, not a server fault
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", 0), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": "nested too deeply"}}]) from e
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from e


async def _cancel_on_disconnect(request: Request, choices: Choices) -> None:
    """Cancel the request's sequences when the client hangs up (their decode rows are freed at the next step).
    The body was read already, so the next ASGI message is the disconnect."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            choices.cancel()
            return


async def _package_from(request: Request) -> bytes:
    """The plugin package: a raw body (application/octet-stream) or one multipart file part.

    The body is already in memory and within the upload limit (RequestGuard); the multipart parser
    accepts one file and no other fields, so a body of 900 parts is refused before it is parsed through."""
    ctype = request.headers.get("content-type", "")
    if not ctype.startswith("multipart/form-data"):
        return await request.body()
    try:
        form = await request.form(max_files=1, max_fields=1)
    except StarletteHTTPException as e:  # starlette's parser raises 400 for too many parts
        raise HTTPException(400, f"plugin upload: {e.detail}; send exactly one file part named 'file'") from e
    try:
        part = form.get("file")
        if part is None or isinstance(part, str):
            raise HTTPException(400, "plugin upload: expected one file part named 'file'")
        return await part.read()
    finally:
        await form.close()

"""The on-device HTTP server: OpenAI-style completions, health, Prometheus metrics, plugin admin.

Binds to 127.0.0.1 unless told otherwise. Admin routes need a bearer token
read from a file (compared in constant time). A request that cannot fit the
static shapes gets 413 with the limit; one that finds every slot taken gets
429; neither crashes the server.
"""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from typing import Any, Protocol

from fastapi import FastAPI, HTTPException, Request, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from edgekit.bundle.plugin import MAX_PACKAGE_BYTES
from edgekit.errors import BundleError, EdgekitError, ShapeError
from edgekit.generate import SamplingConfig
from edgekit.runtime.engine import Engine, OverloadedError

MAX_PLUGIN_UPLOAD_BYTES = MAX_PACKAGE_BYTES  # an upload is one signed plugin package: the format's cap
# Millisecond-resolving buckets: a 5 ms jitter budget must be visible in the histogram.
LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)


class PluginAdmin(Protocol):
    """What the admin routes need from the plugin swap machinery."""

    def list(self) -> list[dict]: ...

    def install(self, package: bytes, *, allow_downgrade: bool = False) -> dict: ...

    def rollback(self, op: str) -> dict: ...


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    prompt: str | list[int]  # text, or token ids as the OpenAI API allows
    max_tokens: int = Field(default=64, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    top_k: int = Field(default=0, ge=0)
    seed: int = 0


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int = Field(default=64, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    top_k: int = Field(default=0, ge=0)
    seed: int = 0


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("edgekit_requests_total", "HTTP requests by route and status", ["route", "status"], registry=self.registry)
        self.latency = Histogram("edgekit_request_seconds", "Request latency (measured)", buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.ttft = Histogram("edgekit_time_to_first_token_seconds", "Time to first token (measured)", buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.token = Histogram("edgekit_token_seconds", "Per-token decode latency (measured)", buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.swaps = Counter("edgekit_plugin_swaps_total", "Operator plugin swaps and rollbacks", ["op", "kind"], registry=self.registry)


def _read_token(path: str | None) -> str | None:
    if path is None:
        return None
    from pathlib import Path

    token = Path(path).read_text().strip()
    if len(token) < 16:
        raise EdgekitError(f"{path}: the admin token is {len(token)} characters; expected at least 16",
                           hint="write a long random token, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE`")
    return token


def create_app(engine: Engine, *, admin_token_file: str | None = None, plugins: PluginAdmin | None = None,
               extra_registries: list[Any] | None = None) -> FastAPI:
    app = FastAPI(title="edgekit", docs_url=None, redoc_url=None)
    token = _read_token(admin_token_file)
    metrics = _Metrics()
    app.state.engine, app.state.metrics = engine, metrics

    def observe(stats) -> None:
        metrics.ttft.observe(stats.prefill_s)
        for dt in stats.token_times_s:
            metrics.token.observe(dt)

    engine.observers.append(observe)

    def require_admin(request: Request) -> None:
        if token is None:
            raise HTTPException(403, "admin routes are disabled: start the server with --admin-token-file")
        got = request.headers.get("authorization", "")
        if not got.startswith("Bearer ") or not hmac.compare_digest(got[7:].encode(), token.encode()):
            raise HTTPException(401, "missing or wrong admin bearer token", headers={"WWW-Authenticate": "Bearer"})

    def require_plugins() -> PluginAdmin:
        if plugins is None:
            raise HTTPException(409, "this server runs without a plugin store (serve a bundle to enable swaps)")
        return plugins

    async def run_completion(ids: list[int], max_tokens: int, sampling: SamplingConfig, route: str):
        t = time.perf_counter()
        try:
            result = await asyncio.to_thread(engine.complete, ids, max_tokens, sampling)
        except OverloadedError as e:
            metrics.requests.labels(route, "429").inc()
            raise HTTPException(429, str(e), headers={"Retry-After": "1"}) from e
        except ShapeError as e:
            metrics.requests.labels(route, "413").inc()
            raise HTTPException(413, str(e)) from e
        metrics.latency.observe(time.perf_counter() - t)
        metrics.requests.labels(route, "200").inc()
        return result

    def usage(n_prompt: int, result) -> dict:
        return {"prompt_tokens": n_prompt, "completion_tokens": len(result.token_ids),
                "total_tokens": n_prompt + len(result.token_ids)}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        ids = list(req.prompt) if isinstance(req.prompt, list) else engine.encode(prompt=req.prompt)
        if any(not 0 <= t < engine.decoder.config.vocab_size for t in ids):
            raise HTTPException(400, f"token ids must be in [0, {engine.decoder.config.vocab_size})")
        r = await run_completion(ids, req.max_tokens, SamplingConfig(req.temperature, req.top_k, req.seed), "completions")
        return {"id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion", "created": int(time.time()),
                "model": engine.model_name,
                "choices": [{"index": 0, "text": r.text, "finish_reason": r.finish_reason}],
                "usage": usage(len(ids), r)}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        ids = engine.encode(messages=[m.model_dump() for m in req.messages])
        r = await run_completion(ids, req.max_tokens, SamplingConfig(req.temperature, req.top_k, req.seed), "chat")
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
                "model": engine.model_name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": r.text}, "finish_reason": r.finish_reason}],
                "usage": usage(len(ids), r)}

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok", "model": engine.model_name, "operators": engine.table.sources(),
                "buckets": list(engine.shapes.buckets), "max_seq_len": engine.shapes.max_seq_len}

    @app.get("/metrics")
    async def prom():
        # the server's own metrics, then the watchdog's (latency histograms, power and jitter gauges)
        body = b"".join(generate_latest(r) for r in [metrics.registry, *(extra_registries or [])])
        return PlainTextResponse(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/plugins")
    async def list_plugins(request: Request):
        require_admin(request)
        return {"operators": engine.table.sources(), "plugins": require_plugins().list()}

    @app.post("/v1/plugins")
    async def upload_plugin(request: Request, file: UploadFile, allow_downgrade: bool = False):
        require_admin(request)
        store = require_plugins()
        data = bytearray()
        while chunk := await file.read(1 << 20):
            data += chunk
            if len(data) > MAX_PLUGIN_UPLOAD_BYTES:
                raise HTTPException(413, f"plugin package larger than {MAX_PLUGIN_UPLOAD_BYTES} bytes")
        try:
            result = await asyncio.to_thread(store.install, bytes(data), allow_downgrade=allow_downgrade)
        except BundleError as e:
            raise HTTPException(422, str(e)) from e
        metrics.swaps.labels(result.get("op", "?"), "install").inc()
        return result

    @app.post("/v1/plugins/{op}/rollback")
    async def rollback(request: Request, op: str):
        require_admin(request)
        try:
            result = await asyncio.to_thread(require_plugins().rollback, op)
        except EdgekitError as e:
            raise HTTPException(409, str(e)) from e
        metrics.swaps.labels(op, "rollback").inc()
        return result

    @app.exception_handler(EdgekitError)
    async def edgekit_error(_: Request, e: EdgekitError):
        return JSONResponse(status_code=400, content={"detail": str(e)})

    return app

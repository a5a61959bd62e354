"""HTTP API over one open index (FastAPI): search and prompt-ready context (POST with a JSON
body, or GET with query parameters), embed, OpenAI's embeddings API (:mod:`.openai_api`), health,
info, and a search page at ``/``; or over a model without an index (``ragidx serve --model``):
the embedding routes alone.

The model is loaded once, before the first request. Every use of the index or model runs on one
thread, in turn (:class:`~ragidx.app.model_thread.ModelThread`): strategies such as kv-embedding
and htp re-route the model's attention for the length of a forward pass, so two interleaved
forwards would corrupt each other, and torch's thread pools slow each other down once a second
thread has used the model. Searches waiting for it are answered together, their queries embedded
in one forward (:mod:`ragidx.app.batching`).
Request data is only ever query text, numbers and filter values; nothing in a request names a
file to open. Bodies are bounded (:class:`BodyLimit`) and errors never echo the input back.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import queue
import socket
import threading
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.middleware.trustedhost import TrustedHostMiddleware

from ragidx import __version__
from ragidx.app.batching import SearchBatcher
from ragidx.app.embedder import Embedder
from ragidx.app.http_limits import limited_protocol
from ragidx.app.model_thread import ModelThread
from ragidx.app.openai_api import add_openai_routes, served_name
from ragidx.app.retriever import Index, SearchOptions
from ragidx.app.schemas import (
    DEFAULT_CONTEXT_TOKENS,
    AskBody,
    ContextBody,
    EmbedBody,
    SearchBody,
    query_parameters,
    search_options,
    validation_detail,
)
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies.base import Role

MAX_BODY_BYTES = 1_000_000  # default bound on a request body (`ragidx serve --max-body-bytes`)
NEEDS_TOKEN = "a bearer token is needed: Authorization: Bearer TOKEN"
# ragidx's shape and OpenAI's in one body, so that both kinds of client show why.
UNAUTHORISED = json.dumps(
    {
        "detail": NEEDS_TOKEN,
        "error": {"message": NEEDS_TOKEN, "type": "authentication_error", "code": "invalid_api_key"},
    }
).encode()
OPEN_PATHS = ("/",)  # the search page: static, holds no index data; it sends the token itself
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413 before the application reads
    any of it (by its Content-Length, or once the bytes received pass the bound)."""

    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int = MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(send)
                return
            if not message.get("more_body"):
                break
        body: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            return body.pop() if body else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        detail = json.dumps({"detail": f"request body larger than {self.max_bytes} bytes"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(detail)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": detail})


class TokenCheck:
    """ASGI middleware: every request but the search page needs ``Authorization: Bearer TOKEN``
    (the scheme in any case, as HTTP has it; the token compared in constant time); others get 401."""

    def __init__(self, app: Callable[..., Awaitable[None]], token: str):
        self.app = app
        self.expected = token.encode()

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").strip().partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.expected):
                detail = UNAUTHORISED
                headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": detail})
                return
        await self.app(scope, receive, send)


def loopback_hosts() -> list[str]:
    """The names a browser on this machine reaches a loopback server by."""
    return ["127.0.0.1", "localhost", "::1", "[::1]"]


class ServedModel:
    """What the embedding routes need of an index (its own model, followed across rebuilds) or
    of a model served without one (``ragidx serve --model``)."""

    def __init__(self, served: Index | Embedder):
        self.served = served

    def embed(self, texts: Sequence[str], role: Role) -> Any:
        if isinstance(self.served, Index):
            self.served.refresh()
        return self.served.embed(texts, role)

    def name(self) -> str:
        served = self.served
        return served_name(served.settings.model if isinstance(served, Index) else served.model)

    def dimension(self) -> int:
        if isinstance(self.served, Index):
            return int(self.served.meta["dimension"])
        return self.served.strategy.dimension

    def count_tokens(self, texts: Sequence[str]) -> int:
        """The texts' tokens with the model's tokenizer, as given (no template, no special tokens)."""
        tokenizer = self.served.strategy.runtime.tokenizer
        return sum(len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"])

    def health(self) -> dict[str, Any]:
        if isinstance(self.served, Index):
            self.served.refresh()
            return {"status": "ok", "generation": self.served.meta["generation"]}
        return {"status": "ok", "model": self.name()}

    def info(self) -> dict[str, Any]:
        if isinstance(self.served, Index):
            self.served.refresh()
            return self.served.info()
        strategy = self.served.strategy
        return {"model": self.served.model, "strategy": strategy.name, "dimension": strategy.dimension}


def create_app(
    served: Index | Embedder,
    max_body_bytes: int = MAX_BODY_BYTES,
    *,
    token: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
    llm: str | None = None,
    llm_url: str | None = None,
    model_thread: ModelThread | None = None,
) -> Callable[..., Awaitable[None]]:
    """The application serving an index, or a model without one (embeddings only), its model
    used on ``model_thread`` alone (load it there first, to have it loaded up front: see
    :mod:`ragidx.app.model_thread`). ``llm`` and ``llm_url``: the model that answers ``POST
    /ask`` (see :meth:`Index.ask`; a request cannot name another).

    ``allowed_hosts``: the ``Host`` headers answered (default: this machine's loopback names), so a
    web page cannot reach the server by a name it controls (DNS rebinding); ``["*"]`` answers
    any. ``token``: a bearer token every request but the search page must carry.
    """
    app = FastAPI(title="ragidx", version=__version__, docs_url=None, redoc_url=None)
    on_model = model_thread or ModelThread()
    model = ServedModel(served)

    @app.exception_handler(RequestValidationError)
    def invalid_request(_: Request, error: RequestValidationError) -> JSONResponse:
        """One line per problem, naming where and what, never the input (it may be huge, or not
        encodable: NaN, lone surrogates)."""
        detail, errors = validation_detail(error.errors())
        return JSONResponse(status_code=422, content={"detail": detail, "errors": errors})

    @app.exception_handler(RagidxError)
    def refused(_: Request, error: RagidxError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": str(error)})

    @app.get("/health")
    def health() -> dict[str, Any]:
        return on_model.run(model.health)

    @app.get("/info")
    def info() -> dict[str, Any]:
        return on_model.run(model.info)

    @app.post("/embed")
    def embed(body: EmbedBody) -> dict[str, Any]:
        vectors = on_model.run(model.embed, body.texts, body.role)
        return {"role": body.role, "dimension": int(vectors.shape[1]), "vectors": vectors.tolist()}

    add_openai_routes(app, model.embed, model.name, model.dimension, model.count_tokens, on_model)
    if isinstance(served, Index):
        add_search_routes(app, served, on_model)
        add_ask_route(app, served, on_model, llm, llm_url)

    guarded: Callable[..., Awaitable[None]] = BodyLimit(app, max_body_bytes)
    if token:
        guarded = TokenCheck(guarded, token)
    return TrustedHostMiddleware(guarded, allowed_hosts=list(allowed_hosts or loopback_hosts()))


def add_search_routes(app: FastAPI, index: Index, on_model: ModelThread) -> None:
    """Search and context, by POST with a JSON body or by GET with query parameters (``GET
    /search?q=tides&k=3&path=notes/*``), and the search page."""
    batcher = SearchBatcher(index, on_model)
    page = resources.files("ragidx.app").joinpath("static/search.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def search_page() -> str:
        return page

    async def searched(query: str, given: dict[str, Any]) -> dict[str, Any]:
        options = SearchOptions.of(**given)
        hits = await asyncio.wrap_future(batcher.submit(query, options))
        return {"query": query, "mode": options.mode, "k": options.k, "hits": [hit.to_dict() for hit in hits]}

    def context(query: str, given: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        return on_model.run(index.context, query, max_tokens=max_tokens, **given).to_dict()

    @app.post("/search")
    async def search(body: SearchBody) -> dict[str, Any]:
        return await searched(*search_options(body))

    @app.get("/search")
    async def search_by_url(request: Request) -> dict[str, Any]:
        query, given, _ = query_parameters(request.query_params)
        return await searched(query, given)

    @app.post("/context")
    def context_of(body: ContextBody) -> dict[str, Any]:
        query, given = search_options(body)
        return context(query, given, given.pop("max_tokens", DEFAULT_CONTEXT_TOKENS))

    @app.get("/context")
    def context_by_url(request: Request) -> dict[str, Any]:
        return context(*query_parameters(request.query_params, context=True))


def add_ask_route(
    app: FastAPI, index: Index, on_model: ModelThread, llm: str | None, llm_url: str | None
) -> None:
    """``POST /ask``: the search body plus ``max_tokens``, ``max_new_tokens`` and ``closed_book``;
    streamed as JSON lines, ``{"text": ...}`` as the answer is written, then ``{"answer": ...}``
    (``ragidx ask --json``'s object) or ``{"error": ...}``; ``"stream": false`` answers that object
    alone."""

    def answer(query: str, given: dict[str, Any], on_text: Callable[[str], None]) -> dict[str, Any]:
        found = on_model.run(index.ask, query, llm=llm, llm_url=llm_url, on_text=on_text, **given)
        return found.to_dict()

    @app.post("/ask", response_model=None)
    def ask(body: AskBody) -> dict[str, Any] | StreamingResponse:
        query, given = search_options(body)
        if not given.pop("stream", True):
            return answer(query, given, lambda text: None)
        events: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()

        def run() -> None:
            try:
                events.put({"answer": answer(query, given, lambda text: events.put({"text": text}))})
            except RagidxError as error:
                events.put({"error": str(error)})
            finally:
                events.put(None)

        threading.Thread(target=run, name="ragidx-ask", daemon=True).start()
        lines = (json.dumps(event, ensure_ascii=False) + "\n" for event in iter(events.get, None))
        return StreamingResponse(lines, media_type="application/x-ndjson")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound and listening on ``host:port``, made before the model loads, so a busy port
    is one line at once rather than a failure after a minute of loading."""
    try:
        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError as error:
        raise RagidxError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sock


def run(app: Callable[..., Awaitable[None]], sock: socket.socket) -> None:
    """Serve ``app`` on ``sock`` until interrupted, each request bounded by :mod:`.http_limits`."""
    import uvicorn

    config = uvicorn.Config(app, http=limited_protocol(), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])

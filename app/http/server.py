"""HTTP API over one open index (FastAPI): search and prompt-ready context (POST with a JSON
body, or GET with query parameters), embed, OpenAI's embeddings API (:mod:`.openai_routes`), health,
info, and a search page at ``/``; or over a model without an index (``ragidx serve --model``):
the embedding routes alone.

The model is loaded once, before the first request. Every use of the model goes through one
:class:`~ragidx.app.service.scheduler.Scheduler` (which says why, and how clients take turns), each
request in a job of its client's that a disconnect cancels; what needs no model (health, info,
the model list, a keyword search) never waits for it. Searches waiting for the model are
answered together, their queries embedded in one forward. Past the scheduler's bound a request
gets 503 with ``Retry-After``.
Request data is only ever query text, numbers and filter values; nothing in a request names a
file to open. Bodies are bounded (:class:`BodyLimit`) and errors never echo the input back.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.middleware.trustedhost import TrustedHostMiddleware

from ragidx import __version__
from ragidx.app.embedder import Embedder
from ragidx.app.generation import EndpointError
from ragidx.app.http.jobs import until_done
from ragidx.app.http.limits import limited_protocol
from ragidx.app.http.openai_routes import add_openai_routes, served_name
from ragidx.app.retriever import Index, SearchOptions
from ragidx.app.service.operations import dispatch
from ragidx.app.service.scheduler import Busy, Job, Scheduler
from ragidx.app.service.schemas import (
    DEFAULT_CONTEXT_TOKENS,
    AskBody,
    ContextBody,
    EmbedBody,
    SearchBody,
    query_parameters,
    search_options,
    validation_detail,
)
from ragidx.app.service.served_index import ServedIndex, embed_in_slices
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.runtime import model_tokenizer
from ragidx.indexer.roles import Role
from ragidx.indexer.strategies.base import TEXT_SLOT, render
from ragidx.indexer.strategies.traced_readout import settle
from ragidx.indexer.wording import excerpt

MAX_BODY_BYTES = 1_000_000  # default bound on a request body (`ragidx serve --max-body-bytes`)
ASK_FIELDS = ("max_tokens", "max_new_tokens", "closed_book")  # what an /ask body says besides the search

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


def body_only(request: Request) -> None:
    """A POST takes its options in its JSON body; one in its URL (``POST /search?index=...``)
    would be ignored, so it is refused, as GET refuses a parameter it does not know."""
    for name in request.query_params:
        raise RagidxError(f"unknown parameter {excerpt(name)}: a POST takes its options in its JSON body")


BODY_ONLY = [Depends(body_only)]


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


class ServedModel(ABC):
    """What the embedding routes need of the model served: an index's own (:class:`IndexModel`) or
    one served without an index (:class:`BareModel`, ``ragidx serve --model``). The model runs on
    the scheduler's thread alone, and what needs no model (name, dimension, health) never waits
    for it."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.counting = threading.Lock()

    @abstractmethod
    def embed(self, texts: Sequence[str], role: Role, job: Job) -> Any: ...

    @abstractmethod
    def model(self) -> str:
        """The model's id (as ``--model`` names it)."""
        ...

    @abstractmethod
    def dimension(self) -> int: ...

    @abstractmethod
    def strategy_params(self) -> dict[str, Any]: ...

    @abstractmethod
    def health(self) -> dict[str, Any]: ...

    @abstractmethod
    def info(self) -> dict[str, Any]: ...

    def name(self) -> str:
        return served_name(self.model())

    def count_tokens(self, texts: Sequence[str]) -> int:
        """The texts' tokens with the model's tokenizer, as given (no template, no special tokens):
        a tokenizer of its own, not the model's (which the model's thread may be using)."""
        with self.counting:
            ids = model_tokenizer(self.model())(list(texts), add_special_tokens=False)["input_ids"]
        return sum(len(row) for row in ids)

    def too_long(self, texts: Sequence[str], role: Role) -> tuple[int, list[tuple[int, int]]]:
        """The model's input length in tokens, and each text (position, tokens) that would pass it
        once put in the role's template with the model's special tokens: the model would read
        only its beginning."""
        params = self.strategy_params()
        template = params.get(f"{role}_template") or TEXT_SLOT
        limit = int(params.get("max_length") or 512)
        with self.counting:
            rendered = [render(template, text) for text in texts]
            ids = model_tokenizer(self.model())(rendered, verbose=False)["input_ids"]
        return limit, [(n, len(row)) for n, row in enumerate(ids) if len(row) > limit]


class IndexModel(ServedModel):
    """An index's own model, followed across rebuilds (read from the index's settings as committed)."""

    def __init__(self, index: ServedIndex, scheduler: Scheduler):
        super().__init__(scheduler)
        self.index = index

    def embed(self, texts: Sequence[str], role: Role, job: Job) -> Any:
        return self.index.embed(texts, role, job)

    def model(self) -> str:
        return str(self.index.meta()["model"])

    def dimension(self) -> int:
        return int(self.index.meta()["dimension"])

    def strategy_params(self) -> dict[str, Any]:
        return dict(self.index.meta()["strategy_params"])

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "generation": self.index.meta()["generation"]}

    def info(self) -> dict[str, Any]:
        return self.index.info()


class BareModel(ServedModel):
    """A model served without an index: embeddings only."""

    def __init__(self, embedder: Embedder, scheduler: Scheduler):
        super().__init__(scheduler)
        self.embedder = embedder

    def embed(self, texts: Sequence[str], role: Role, job: Job) -> Any:
        return embed_in_slices(self.scheduler, job, self.embedder.embed, texts, role)

    def model(self) -> str:
        return self.embedder.model

    def dimension(self) -> int:
        return self.embedder.strategy.dimension

    def strategy_params(self) -> dict[str, Any]:
        return dict(self.embedder.strategy.params)

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.name()}

    def info(self) -> dict[str, Any]:
        strategy = self.embedder.strategy
        return {"model": self.embedder.model, "strategy": strategy.name, "dimension": strategy.dimension}


def load_and_settle(served: Index | Embedder) -> None:
    """Load ``served``'s model and settle its traced query readout (on the scheduler's thread),
    before the server takes requests: none of them then pays the trace's recording (~2 s)."""
    settle(served.strategy)


def create_app(
    served: Index | Embedder,
    max_body_bytes: int = MAX_BODY_BYTES,
    *,
    token: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
    llm: str | None = None,
    llm_url: str | None = None,
    scheduler: Scheduler | None = None,
) -> Callable[..., Awaitable[None]]:
    """The application serving an index, or a model without one (embeddings only), its model
    used through ``scheduler`` alone (see :mod:`ragidx.app.service.scheduler`: load it there first, to
    have it loaded up front). ``llm`` and ``llm_url``: the model that answers ``POST /ask`` (see
    :meth:`Index.ask`; a request cannot name another).

    ``allowed_hosts``: the ``Host`` headers answered (default: this machine's loopback names), so a
    web page cannot reach the server by a name it controls (DNS rebinding); ``["*"]`` answers
    any. ``token``: a bearer token every request but the search page must carry.
    """
    app = FastAPI(title="ragidx", version=__version__, docs_url=None, redoc_url=None)
    scheduler = scheduler or Scheduler()
    index: ServedIndex | None = None
    model: ServedModel
    if isinstance(served, Index):
        index = ServedIndex(served, scheduler)
        model = IndexModel(index, scheduler)
    else:
        model = BareModel(served, scheduler)

    @app.exception_handler(RequestValidationError)
    def invalid_request(_: Request, error: RequestValidationError) -> JSONResponse:
        """One line per problem, naming where and what, never the input (it may be huge, or not
        encodable: NaN, lone surrogates)."""
        detail, errors = validation_detail(error.errors())
        return JSONResponse(status_code=422, content={"detail": detail, "errors": errors})

    @app.exception_handler(Busy)
    def busy(_: Request, error: Busy) -> JSONResponse:
        headers = {"Retry-After": str(error.retry_after)}
        return JSONResponse(status_code=503, content={"detail": str(error)}, headers=headers)

    @app.exception_handler(RagidxError)
    def refused(_: Request, error: RagidxError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": str(error)})

    @app.exception_handler(EndpointError)
    def upstream(_: Request, error: EndpointError) -> JSONResponse:
        """The chat endpoint failed: a bad gateway, not a bad request."""
        return JSONResponse(status_code=502, content={"detail": str(error)})

    @app.get("/health")
    def health() -> dict[str, Any]:
        return model.health()

    @app.get("/info")
    def info() -> dict[str, Any]:
        return model.info()

    @app.post("/embed", dependencies=BODY_ONLY)
    async def embed(body: EmbedBody, request: Request) -> dict[str, Any]:
        vectors = await until_done(
            request, scheduler, "embed", lambda job: model.embed(body.texts, body.role, job)
        )
        return {"role": body.role, "dimension": int(vectors.shape[1]), "vectors": vectors.tolist()}

    add_openai_routes(app, model, scheduler)
    if index is not None:
        add_search_routes(app, index)
        add_ask_route(app, index, llm, llm_url)

    guarded: Callable[..., Awaitable[None]] = BodyLimit(app, max_body_bytes)
    if token:
        guarded = TokenCheck(guarded, token)
    return TrustedHostMiddleware(guarded, allowed_hosts=list(allowed_hosts or loopback_hosts()))


def add_search_routes(app: FastAPI, index: ServedIndex) -> None:
    """Search and context, by POST with a JSON body or by GET with query parameters (``GET
    /search?q=tides&k=3&path=notes/*``), and the search page. A search that needs the model is
    answered with every other waiting for it, in one forward (:mod:`ragidx.app.service.scheduler`); one
    that does not (keywords, or a hybrid one weighing the vectors 0) never waits for it."""
    page = resources.files("ragidx.app.http").joinpath("static/search.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def search_page() -> str:
        return page

    async def searched(request: Request, query: str, given: dict[str, Any]) -> dict[str, Any]:
        options = SearchOptions.of(**given)
        found = await until_done(
            request,
            index.scheduler,
            "search",
            lambda job: dispatch(index, _request("search", query, given), job),
        )
        return {"query": query, "mode": options.mode, "k": options.k, "hits": found["hits"]}

    async def context(request: Request, query: str, given: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        asked = {**_request("context", query, given), "context": {"max_tokens": max_tokens}}
        found = await until_done(request, index.scheduler, "context", lambda job: dispatch(index, asked, job))
        return dict(found["context"])

    @app.post("/search", dependencies=BODY_ONLY)
    async def search(body: SearchBody, request: Request) -> dict[str, Any]:
        return await searched(request, *search_options(body))

    @app.get("/search")
    async def search_by_url(request: Request) -> dict[str, Any]:
        query, given, _ = query_parameters(request.query_params)
        return await searched(request, query, given)

    @app.post("/context", dependencies=BODY_ONLY)
    async def context_of(body: ContextBody, request: Request) -> dict[str, Any]:
        query, given = search_options(body)
        return await context(request, query, given, given.pop("max_tokens", DEFAULT_CONTEXT_TOKENS))

    @app.get("/context")
    async def context_by_url(request: Request) -> dict[str, Any]:
        return await context(request, *query_parameters(request.query_params, context=True))


def _request(operation: str, query: str, options: dict[str, Any]) -> dict[str, Any]:
    return {"op": operation, "query": query, "options": options}


def add_ask_route(app: FastAPI, index: ServedIndex, llm: str | None, llm_url: str | None) -> None:
    """``POST /ask``: the search body plus ``max_tokens``, ``max_new_tokens`` and ``closed_book``;
    streamed as JSON lines, ``{"text": ...}`` as the answer is written, then ``{"answer": ...}``
    (``ragidx ask --json``'s object) or ``{"error": ...}``; ``"stream": false`` answers that object
    alone. A client that leaves stops its answer (a chat endpoint's request is closed)."""

    def asked(query: str, given: dict[str, Any]) -> dict[str, Any]:
        settings = {name: given.pop(name) for name in ASK_FIELDS if name in given}
        return {**_request("ask", query, given), "ask": {**settings, "llm": llm, "llm_url": llm_url}}

    @app.post("/ask", response_model=None, dependencies=BODY_ONLY)
    async def ask(body: AskBody, request: Request) -> dict[str, Any] | StreamingResponse:
        query, given = search_options(body)
        stream = given.pop("stream", True)
        wanted = asked(query, given)
        if not stream:
            found = await until_done(
                request, index.scheduler, "ask", lambda job: dispatch(index, wanted, job)
            )
            return dict(found["answer"])
        events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def put(event: dict[str, Any] | None) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        def work(job: Job) -> None:
            try:
                put(dispatch(index, wanted, job, put))
            except Busy as error:
                put({"error": str(error), "retry_after": error.retry_after})
            except RagidxError as error:
                put({"error": str(error)})
            except Exception as error:  # the stream ends with it, never cut without a word
                put({"error": f"{type(error).__name__}: {error}"})
            finally:
                put(None)

        async def lines() -> AsyncIterator[str]:
            running = asyncio.ensure_future(until_done(request, index.scheduler, "ask", work))
            try:
                while (event := await events.get()) is not None:
                    yield json.dumps(event, ensure_ascii=False) + "\n"
            finally:
                running.cancel()  # the client left: its job is cancelled (until_done's finally)

        return StreamingResponse(lines(), media_type="application/x-ndjson")


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
    """Serve ``app`` on ``sock`` until interrupted, each request bounded by :mod:`.limits`."""
    import uvicorn

    config = uvicorn.Config(app, http=limited_protocol(), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])

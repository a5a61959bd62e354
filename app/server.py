"""HTTP API over one open index (FastAPI): search, embed, health, info, and a search page at ``/``.

The model is loaded once, before the first request. Every use of the index passes through one
lock: strategies such as kv-embedding and htp re-route the model's attention for the length of a
forward pass, so two interleaved forwards would corrupt each other. Searches waiting for the lock
are answered together, their queries embedded in one forward (:mod:`ragidx.app.batching`).
Request data is only ever query text, numbers and filter values; nothing in a request names a
file to open. Bodies are bounded (:class:`BodyLimit`) and errors never echo the input back.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse

from ragidx import __version__
from ragidx.app.batching import SearchBatcher
from ragidx.app.retriever import Index, SearchOptions
from ragidx.app.schemas import EmbedBody, SearchBody, search_options
from ragidx.indexer.errors import RagidxError

MAX_BODY_BYTES = 1_000_000  # default bound on a request body (`ragidx serve --max-body-bytes`)
SHOWN_CHARS = 40  # of a field name in an error
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _shown(part: str | int) -> str | int:
    """A field name or list index from an error's location, short and encodable."""
    if isinstance(part, int):
        return part
    text = str(part).encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


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


def create_app(index: Index, max_body_bytes: int = MAX_BODY_BYTES) -> BodyLimit:
    """The application serving ``index``; call ``index.strategy`` first to load the model up front."""
    app = FastAPI(title="ragidx", version=__version__, docs_url="/docs", redoc_url=None)
    lock = threading.Lock()
    batcher = SearchBatcher(index, lock)
    page = resources.files("ragidx.app").joinpath("static/search.html").read_text(encoding="utf-8")

    @app.exception_handler(RequestValidationError)
    def invalid_request(_: Request, error: RequestValidationError) -> JSONResponse:
        """One line per problem, naming where and what, never the input (it may be huge, or not
        encodable: NaN, lone surrogates)."""
        errors = [
            {"loc": [_shown(part) for part in e["loc"]], "type": e["type"], "msg": e["msg"]}
            for e in error.errors()
        ]
        first = errors[0]
        where = ".".join(str(part) for part in first["loc"] if part != "body")
        detail = f"{where}: {first['msg']}" if where else first["msg"]
        return JSONResponse(status_code=422, content={"detail": detail, "errors": errors})

    @app.exception_handler(RagidxError)
    def refused(_: Request, error: RagidxError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": str(error)})

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def search_page() -> str:
        return page

    @app.get("/health")
    def health() -> dict[str, Any]:
        with lock:
            index.refresh()
            return {"status": "ok", "generation": index.meta["generation"]}

    @app.get("/info")
    def info() -> dict[str, Any]:
        with lock:
            index.refresh()
            return index.info()

    @app.post("/search")
    async def search(body: SearchBody) -> dict[str, Any]:
        query, given = search_options(body)
        options = SearchOptions.of(**given)
        hits = await asyncio.wrap_future(batcher.submit(query, options))
        return {"query": query, "mode": options.mode, "k": options.k, "hits": [hit.to_dict() for hit in hits]}

    @app.post("/embed")
    def embed(body: EmbedBody) -> dict[str, Any]:
        with lock:
            vectors = index.embed(body.texts, body.role)
        return {"role": body.role, "dimension": int(vectors.shape[1]), "vectors": vectors.tolist()}

    return BodyLimit(app, max_body_bytes)

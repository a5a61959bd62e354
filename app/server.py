"""HTTP API over one open index (FastAPI): search, embed, health, info, and a search page at ``/``.

The model is loaded once, before the first request. Requests run in FastAPI's thread pool but
pass through one lock: strategies such as kv-embedding and htp re-route the model's attention for
the length of a forward pass, so two interleaved forwards would corrupt each other. Request data
is only ever query text, numbers and filter values; nothing in a request names a file to open.
"""

from __future__ import annotations

import threading
from importlib import resources
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from ragidx import __version__
from ragidx.app.retriever import Index
from ragidx.indexer.errors import RagidxError

MAX_K = 1000
MAX_TEXT_CHARS = 20_000
MAX_EMBED_TEXTS = 256
MAX_WEIGHT = 1e6  # only the ratio of the weights matters
MAX_SEARCH_BREADTH = 65_536  # efSearch / nprobe: beyond this a request is a denial of service, not tuning

MetaValue = str | int | float | bool | list[str | int | float | bool]


class FilterBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str | list[str] | None = None
    ext: str | list[str] | None = None
    meta: dict[str, MetaValue] | None = None


class WeightsBody(BaseModel):
    """Hybrid fusion weights; a list left out weighs 0."""

    model_config = ConfigDict(extra="forbid")

    dense: float = Field(default=0.0, ge=0, le=MAX_WEIGHT, allow_inf_nan=False)
    lexical: float = Field(default=0.0, ge=0, le=MAX_WEIGHT, allow_inf_nan=False)


class SearchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    k: int = Field(default=10, ge=1, le=MAX_K)
    mode: Literal["hybrid", "dense", "lexical"] = "hybrid"
    filters: FilterBody | None = None
    min_score: float | None = None
    weights: WeightsBody | None = None
    fusion: Literal["rrf", "minmax"] | None = None
    ef_search: int | None = Field(default=None, ge=1, le=MAX_SEARCH_BREADTH)
    nprobe: int | None = Field(default=None, ge=1, le=MAX_SEARCH_BREADTH)


class EmbedBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    texts: list[str] = Field(min_length=1, max_length=MAX_EMBED_TEXTS)
    role: Literal["query", "document"] = "query"


def create_app(index: Index) -> FastAPI:
    """The application serving ``index``; call ``index.strategy`` first to load the model up front."""
    app = FastAPI(title="ragidx", version=__version__, docs_url="/docs", redoc_url=None)
    lock = threading.Lock()
    page = resources.files("ragidx.app").joinpath("static/search.html").read_text(encoding="utf-8")

    @app.exception_handler(RequestValidationError)
    def invalid_request(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"] if part != "body")
        return JSONResponse(
            status_code=422,
            content={
                "detail": f"{where}: {first['msg']}" if where else first["msg"],
                "errors": jsonable_encoder(error.errors()),
            },
        )

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
    def search(body: SearchBody) -> dict[str, Any]:
        filters = body.filters.model_dump(exclude_none=True) if body.filters else None
        weights = body.weights.model_dump() if body.weights else None
        with lock:
            tuning = {"ef_search": body.ef_search, "nprobe": body.nprobe}
            hits = index.search(
                body.query,
                body.k,
                body.mode,
                filters,
                body.min_score,
                weights=weights,
                fusion=body.fusion,
                **tuning,
            )
        return {"query": body.query, "mode": body.mode, "k": body.k, "hits": [hit.to_dict() for hit in hits]}

    @app.post("/embed")
    def embed(body: EmbedBody) -> dict[str, Any]:
        with lock:
            vectors = index.embed(body.texts, body.role)
        return {"role": body.role, "dimension": int(vectors.shape[1]), "vectors": vectors.tolist()}

    return app

"""OpenAI's embeddings API on ``ragidx serve``: ``POST /v1/embeddings`` (and ``/embeddings``),
``GET /v1/models``.

Applications talk to embedding servers through this API (Ollama, llama.cpp's server, TEI, vLLM
serve it), so the official ``openai`` client, LangChain's ``OpenAIEmbeddings``, LlamaIndex's
``OpenAILikeEmbedding`` and the like get ragidx's vectors with nothing but a base URL. A strategy
embeds a query and a document differently and these clients cannot say which they send, so each
role has a model id of its own: ``NAME-query`` and ``NAME-document``; the bare ``NAME`` embeds
as a query, as ``ragidx embed`` and ``POST /embed`` do. Errors have OpenAI's shape (``{"error":
{"message", "type", "param", "code"}}``) so that clients show them.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
from anyio import to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ragidx.app.http.jobs import until_done
from ragidx.app.service.scheduler import Busy, Job, Scheduler
from ragidx.app.service.schemas import MAX_EMBED_TEXTS, validation_detail
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.roles import Role
from ragidx.indexer.wording import encodable

MAX_INPUT_CHARS = 100_000  # per input (the strategy truncates to its --max-length in tokens)
JSON_KINDS = {
    int: "a number",
    float: "a number",
    bool: "true or false",
    type(None): "null",
    dict: "an object",
    list: "a list",
}
ROLE_SUFFIXES: dict[str, Role] = {"-query": "query", "-document": "document"}
TOKEN_IDS = (
    "ragidx embeds text, not token ids: send strings (LangChain's OpenAIEmbeddings sends token ids "
    "unless it is given check_embedding_ctx_length=False)"
)


class EmbeddingModel(Protocol):
    """The model these routes serve (``ragidx.app.http.server.ServedModel``)."""

    def embed(self, texts: Sequence[str], role: Role, job: Job) -> np.ndarray: ...
    def name(self) -> str: ...
    def dimension(self) -> int: ...
    def count_tokens(self, texts: Sequence[str]) -> int: ...
    def too_long(self, texts: Sequence[str], role: Role) -> tuple[int, list[tuple[int, int]]]: ...


class OpenAIError(Exception):
    """A refusal in OpenAI's error shape."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        kind = {401: "authentication_error", 404: "invalid_request_error"}.get(self.status)
        error = {
            "message": self.message,
            "type": kind or ("invalid_request_error" if self.status < 500 else "server_error"),
            "param": self.param,
            "code": self.code,
        }
        return JSONResponse(status_code=self.status, content={"error": error}, headers=headers)


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request (``user`` taken and ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=200)
    input: str | list[Any]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, strict=True)
    user: str | None = None
    truncate: bool = Field(default=False, strict=True)  # TEI's: embed an over-long input's beginning


def served_name(model: str) -> str:
    """The model's id on this API: its short name, or a file or folder's name without suffix."""
    name = Path(model).name if "/" in model or model.endswith(".gguf") else model
    name = re.sub(r"\.gguf$", "", name)
    return re.sub(r"[^A-Za-z0-9._:-]+", "-", name) or "ragidx"


def model_ids(name: str) -> dict[str, Role]:
    """Each id this server answers to, with the role it embeds in."""
    return {name: "query", **{name + suffix: role for suffix, role in ROLE_SUFFIXES.items()}}


def add_openai_routes(app: FastAPI, model: EmbeddingModel, scheduler: Scheduler) -> None:
    """The routes, on ``app``, for ``model``: the one served now (an index rebuilt with another
    model changes its name and dimension), its embeddings computed through ``scheduler``."""
    created = int(time.time())

    @app.get("/v1/models", response_model=None)
    @app.get("/models", include_in_schema=False, response_model=None)
    def models() -> dict[str, Any] | JSONResponse:
        try:
            ids = model_ids(model.name())
        except RagidxError as error:  # the index is gone: nothing is served
            return OpenAIError(503, str(error), "index_unavailable").response()
        return {
            "object": "list",
            "data": [{"id": id, "object": "model", "created": created, "owned_by": "ragidx"} for id in ids],
        }

    async def embeddings(request: Request) -> JSONResponse:
        try:
            body = await _parsed(request)
            texts = _texts(body.input)
            role = await to_thread.run_sync(_role, body)
            if not body.truncate:
                await to_thread.run_sync(_fits, texts, role)
            vectors = await until_done(
                request, scheduler, "embeddings", lambda job: _vectors(texts, role, job)
            )
            tokens = await to_thread.run_sync(model.count_tokens, texts)
        except Busy as error:
            return OpenAIError(503, str(error), "overloaded").response(
                {"Retry-After": str(error.retry_after)}
            )
        except OpenAIError as error:
            return error.response()
        except RagidxError as error:  # not the input's fault: the index is gone or unreadable
            return OpenAIError(503, str(error), "index_unavailable").response()
        return JSONResponse(content=_answer(body, vectors, tokens))

    def _role(body: EmbeddingsRequest) -> Role:
        """The role the requested model id embeds in, if it is the model served (and its size)."""
        ids = model_ids(model.name())
        if body.model not in ids:
            raise OpenAIError(
                404,
                f"the model '{body.model[:100]}' is not served here: use one of {', '.join(ids)} "
                f"(GET /v1/models); the bare '{model.name()}' embeds as a query",
                "model_not_found",
                "model",
            )
        served = model.dimension()
        if body.dimensions is not None and body.dimensions != served:
            raise OpenAIError(
                400,
                f"this model's vectors have {served} dimensions; ragidx does not shorten them, so "
                f"dimensions={body.dimensions} cannot be served (leave it out, or give {served})",
                "invalid_dimensions",
                "dimensions",
            )
        return ids[body.model]

    def _fits(texts: list[str], role: Role) -> None:
        """Refuse inputs the model would read only the beginning of, as OpenAI does (TEI too,
        unless asked to truncate): a vector of a text's first part passes for the whole's."""
        limit, over = model.too_long(texts, role)
        if over:
            position, tokens = over[0]
            raise OpenAIError(
                400,
                f"input {position} is {tokens} tokens long, and this model reads at most {limit} "
                f"(its template included){f' ({len(over)} inputs are)' if len(over) > 1 else ''}: "
                'shorten it, or send "truncate": true to embed its first tokens',
                "context_length_exceeded",
                "input",
            )

    def _vectors(texts: list[str], role: Role, job: Job) -> np.ndarray:
        try:
            return model.embed(texts, role, job)
        except Busy:
            raise
        except RagidxError as error:
            raise OpenAIError(500, str(error), "embedding_failed") from None

    for path in ("/v1/embeddings", "/embeddings"):
        app.add_api_route(path, embeddings, methods=["POST"], include_in_schema=path.startswith("/v1"))


def _answer(body: EmbeddingsRequest, vectors: np.ndarray, tokens: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encoded(vector, body.encoding_format)}
            for i, vector in enumerate(vectors)
        ],
        "model": body.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


async def _parsed(request: Request) -> EmbeddingsRequest:
    """The request's JSON body; another content type is refused (415), so a web page's form
    (which a browser may post anywhere without asking) never reaches the model."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise OpenAIError(
            415,
            f"send the body as application/json, not {kind[:80] or 'no content type'}",
            "unsupported_media_type",
        )
    try:
        return EmbeddingsRequest.model_validate_json(await request.body())
    except ValidationError as error:
        detail, errors = validation_detail(error.errors())
        param = str(errors[0]["loc"][0]) if errors and errors[0]["loc"] else None
        raise OpenAIError(400, detail, "invalid_request", param) from None


def _texts(given: str | list[Any]) -> list[str]:
    """The inputs as a list of texts; token ids and empty or oversized texts refused."""
    texts = [given] if isinstance(given, str) else given
    if not texts:
        raise OpenAIError(400, "input is empty: give a string or a list of strings", "invalid_input", "input")
    if len(texts) > MAX_EMBED_TEXTS:
        too_many = f"input has {len(texts)} items; at most {MAX_EMBED_TEXTS} per request"
        raise OpenAIError(400, too_many, "too_many_inputs", "input")
    if all(isinstance(item, int) for item in texts) or all(isinstance(item, list) for item in texts):
        raise OpenAIError(400, TOKEN_IDS, "token_ids_not_supported", "input")
    for number, item in enumerate(texts):
        if not isinstance(item, str):
            kind = JSON_KINDS.get(type(item), "something else")
            wrong = f"input[{number}] is {kind}, not a string: give a string or a list of strings"
            raise OpenAIError(400, wrong, "invalid_input", "input")
        if not item.strip():
            raise OpenAIError(400, "input holds an empty string", "invalid_input", "input")
        if not encodable(item):
            raise OpenAIError(400, "input holds text that is not valid Unicode", "invalid_input", "input")
        if len(item) > MAX_INPUT_CHARS:
            raise OpenAIError(
                400, f"an input is longer than {MAX_INPUT_CHARS} characters", "input_too_long", "input"
            )
    return texts


def _encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    """A vector as floats, or as base64 of its little-endian float32 bytes (the openai client's
    default, decoded with ``numpy.frombuffer(..., dtype="<f4")``)."""
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]

"""MCP server over one open index (the official ``mcp`` SDK, stdio): the tools ``search``,
``context`` (prompt-ready passages to cite), ``get_document`` and ``status``, and every indexed
document as a ``file://`` resource.

Agents and editors speak the Model Context Protocol; this gives them ragidx's search with the
index's own model and strategy. As in the HTTP API, every use of the model goes through one
scheduler (:mod:`ragidx.app.service.scheduler` says why), a keyword search and the documents' listing never
wait for it, and nothing a caller sends can open a file that is not an indexed document.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import unquote, urlparse

from anyio import to_thread
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp_types import Resource, ToolAnnotations
from pydantic import Field, ValidationError

from ragidx import __version__
from ragidx.app.retriever import Index
from ragidx.app.service.operations import dispatch
from ragidx.app.service.scheduler import Scheduler
from ragidx.app.service.schemas import (
    DEFAULT_CONTEXT_TOKENS,
    MaxTokens,
    search_options,
    search_parameters,
    validation_detail,
)
from ragidx.app.service.served_index import ServedIndex
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.access import FileAccess
from ragidx.indexer.ingest.sources import SkippedFile, SourceDocument, normal_path, read_document
from ragidx.indexer.ingest.spans import span_pages

DOCUMENT_CHARS = 20_000  # get_document's default slice: an agent asks for the next one by `start`
INSTRUCTIONS = (
    "Search a local document index built by ragidx. `search` returns the best chunks with their "
    "file path, character span, page (PDFs) and text; `get_document` returns a document's text or "
    "a span of it (pass a hit's span to read around it); `status` describes the index."
)
CLIENT = "mcp"  # the agent's jobs, as the scheduler shows them
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)


class IndexServer(MCPServer):
    """An MCP server whose resources are the index's documents, listed fresh on every request so
    a build that commits while it runs is seen."""

    def __init__(self, index: Index):
        super().__init__("ragidx", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING")
        self.index = index
        self.scheduler = Scheduler()
        self.served = ServedIndex(index, self.scheduler)

    def load_model(self) -> None:
        """Start loading the index's model, and settling its traced query readout, ahead of the
        first search that needs it (that search waits for it, a keyword search does not); a
        failure is reported by that search."""

        def load() -> None:
            with contextlib.suppress(RagidxError), self.scheduler.job(CLIENT, "load") as job:
                if self.served.embeds_queries():
                    self.served.settle(job)

        threading.Thread(target=load, name="ragidx-mcp-load", daemon=True).start()

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """One operation (:mod:`ragidx.app.service.operations`) for the agent; errors as the tool's own."""
        try:
            with self.scheduler.job(CLIENT, str(request["op"])) as job:
                return dispatch(self.served, request, job)
        except RagidxError as error:
            raise ToolError(str(error)) from None

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        """The SDK's call, with bad arguments told in one short line as the HTTP API tells them
        (its own message is pydantic's whole dump, input values included)."""
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as error:
            if isinstance(error.__cause__, ValidationError):
                detail, _ = validation_detail(error.__cause__.errors())
                raise ToolError(f"invalid arguments: {detail}") from None
            raise

    def access(self) -> FileAccess:
        """What reading an indexed document again may open (see :mod:`ragidx.indexer.ingest.access`)."""
        settings = self.index.settings
        return settings.access([] if settings.roots else [row["path"] for row in self.documents()])

    def documents(self, path: str | None = None) -> list[dict[str, Any]]:
        with self.served.reading:
            self.index.refresh()
            return self.index.reader.document_rows(path)

    def info(self) -> dict[str, Any]:
        return self.served.info()

    async def list_resources(self) -> list[Resource]:
        # In a worker thread, as tools run: a build's commit may hold the index a moment.
        rows = await to_thread.run_sync(self.documents)
        return [
            Resource(
                uri=Path(row["path"]).as_uri(),
                name=row["path"],
                title=row["title"],
                description=f"{row['kind']} document, {row['chunk_count']} chunks",
                mime_type="text/plain",
            )
            for row in rows
        ]

    async def read_resource(self, uri: Any, context: Any = None) -> Iterable[ReadResourceContents]:
        parsed = urlparse(str(uri))
        path = unquote(parsed.path) if parsed.scheme == "file" else None
        rows = await to_thread.run_sync(self.documents, path) if path else []
        if not rows:
            raise ResourceNotFoundError(f"not an indexed document: {uri}")
        try:
            text, _ = await to_thread.run_sync(current_text, rows[0], self.access())
        except RagidxError as error:
            raise ResourceError(str(error)) from None
        return [ReadResourceContents(content=text, mime_type="text/plain")]


def current_text(row: dict[str, Any], access: FileAccess) -> tuple[str, bool]:
    """The document's text as ragidx extracts it now, and whether the file changed since indexing
    (then the spans of its hits may no longer match). Only what ``access`` allows is opened: a
    document swapped for a link to a file outside the index's folders, or for a FIFO, is refused."""
    try:
        stat = os.stat(row["path"])
        document = _read(row["path"], stat.st_ino, stat.st_size, stat.st_mtime_ns, access)
    except OSError as error:
        raise RagidxError(f"{row['path']} cannot be read now: {error.strerror or error}") from None
    if isinstance(document, SkippedFile):
        raise RagidxError(f"{row['path']} cannot be read now: {document.reason}")
    return document.text, document.content_hash != row["content_hash"]


@functools.lru_cache(maxsize=8)
def _read(
    path: str, inode: int, size: int, mtime_ns: int, access: FileAccess
) -> SourceDocument | SkippedFile:
    """One extraction per file version: an agent reading a long PDF slice by slice calls again
    and again (a 100-page PDF takes ~0.4 s)."""
    return read_document(Path(path), access=access)


def create_server(index: Index) -> IndexServer:
    """The MCP server for ``index``; ``server.run("stdio")`` serves it."""
    server = IndexServer(index)

    def search(**arguments: Any) -> dict[str, Any]:
        """Search the index: the best chunks for the query, each with its document's path, the
        chunk's character span in that document, its page(s) for PDFs, a snippet and its text."""
        query, given = search_options(arguments)
        found = server.answer({"op": "search", "query": query, "options": given})
        mode = given.get("mode", "hybrid")
        return {"query": query, "mode": mode, "hits": [tool_hit(hit) for hit in found["hits"]]}

    # The arguments are the search options' own declaration, as the HTTP request's are.
    search.__signature__ = inspect.Signature(search_parameters(), return_annotation=dict[str, Any])  # type: ignore[attr-defined]
    server.tool(annotations=READ_ONLY)(search)

    def context(**arguments: Any) -> dict[str, Any]:
        """The search's hits as context to answer from: passages merged per document, numbered
        [1]... best first with path, span and title, cut to whole sentences within max_tokens
        (the index's model's tokenizer). Cite a passage by its number."""
        max_tokens = arguments.pop("max_tokens", DEFAULT_CONTEXT_TOKENS)
        query, given = search_options(arguments)
        request = {"op": "context", "query": query, "options": given, "context": {"max_tokens": max_tokens}}
        return dict(server.answer(request)["context"])

    budget = inspect.Parameter(
        "max_tokens", inspect.Parameter.KEYWORD_ONLY, default=DEFAULT_CONTEXT_TOKENS, annotation=MaxTokens
    )
    context.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*search_parameters(), budget], return_annotation=dict[str, Any]
    )
    server.tool(annotations=READ_ONLY)(context)

    @server.tool(annotations=READ_ONLY)
    def get_document(
        path: Annotated[
            str, Field(min_length=1, description="An indexed document's path, as search returns it.")
        ],
        start: Annotated[int, Field(ge=0, description="First character (a hit's span[0]).")] = 0,
        end: Annotated[int | None, Field(ge=0, description="End character (a hit's span[1]).")] = None,
    ) -> dict[str, Any]:
        """A document's text, or the span [start, end) of it (at most 20,000 characters per call:
        ``next_start`` says where to go on), with its title, metadata and pages."""
        rows = server.documents(path) or server.documents(normal_path(path))
        if not rows:
            raise ToolError(f"not an indexed document: {path} (search returns the paths the index holds)")
        row = rows[0]
        try:
            text, changed = current_text(row, server.access())
        except RagidxError as error:
            raise ToolError(str(error)) from None
        limit = len(text) if end is None else min(end, len(text))
        if start > limit:
            raise ToolError(f"start {start} is past the end ({limit} characters)")
        stop = min(limit, start + DOCUMENT_CHARS)
        return {
            "path": row["path"],
            "title": row["title"],
            "kind": row["kind"],
            "metadata": row["metadata"],
            "length": len(text),
            "span": [start, stop],
            "pages": span_pages(row["page_starts"], start, stop),
            "text": text[start:stop],
            "next_start": stop if stop < limit else None,
            "changed_since_indexed": changed,
        }

    @server.tool(annotations=READ_ONLY)
    def status() -> dict[str, Any]:
        """The index: model, strategy and its settings, document and chunk counts, size on disk."""
        return server.info()

    return server


def tool_hit(hit: dict[str, Any]) -> dict[str, Any]:
    """A hit as an agent needs it: where it is, how good, and what it says (and, when asked, why)."""
    keys = ("rank", "score", "path", "title", "span", "page", "pages", "metadata", "text", "explain")
    return {**{key: hit[key] for key in keys if key in hit}, "snippet": hit["snippet"]["text"]}

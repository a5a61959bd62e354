"""The operations a client may ask of an index (search, context, ask, embed), as one table that the
CLI, the daemon and the HTTP server all dispatch through.

A request is a JSON object: ``{"op": "search", "query": ..., "options": {...}}``, with ``context``
(``max_tokens``, ``tokenizer``, ``relative_to``) for ``context``, ``ask`` (:class:`Asked`'s fields)
for ``ask``, and ``texts`` and ``role`` for ``embed``. Each is answered by a :class:`ServedIndex`
for one client's :class:`~ragidx.app.service.scheduler.Job`; ``event`` gets what a streamed operation
(``ask``) sends on the way: ``{"text": piece}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ragidx.app.service.scheduler import Job
from ragidx.app.service.served_index import Asked, ServedIndex
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.search.hits import Found
from ragidx.indexer.search.options import SearchOptions

Event = Callable[[dict[str, Any]], None]
Operation = Callable[[ServedIndex, dict[str, Any], Job, Event], dict[str, Any]]


def _options(request: dict[str, Any]) -> SearchOptions:
    return SearchOptions.of(**request.get("options", {}))


def search(served: ServedIndex, query: str, options: SearchOptions, job: Job) -> Found:
    """The search's hits, and what an interrupted build left pending (as objects: the in-process
    door's answer; the others send :meth:`Found.to_dict`)."""
    hits = served.search(query, options, job)
    return Found(hits, served.index.pending_build(served.index.reader.directory))


def _search(served: ServedIndex, request: dict[str, Any], job: Job, event: Event) -> dict[str, Any]:
    return search(served, request["query"], _options(request), job).to_dict()


def _context(served: ServedIndex, request: dict[str, Any], job: Job, event: Event) -> dict[str, Any]:
    context = served.context(request["query"], _options(request), job, **request.get("context", {}))
    return {"context": context.to_dict()}


def _ask(served: ServedIndex, request: dict[str, Any], job: Job, event: Event) -> dict[str, Any]:
    asked = Asked(**request.get("ask", {}))
    found = served.ask(request["query"], _options(request), asked, job, lambda text: event({"text": text}))
    return {"answer": found.to_dict()}


def _embed(served: ServedIndex, request: dict[str, Any], job: Job, event: Event) -> dict[str, Any]:
    return {"vectors": served.embed(request["texts"], request.get("role", "query"), job).tolist()}


OPERATIONS: dict[str, Operation] = {"search": _search, "context": _context, "ask": _ask, "embed": _embed}


def dispatch(
    served: ServedIndex, request: dict[str, Any], job: Job, event: Event = lambda found: None
) -> dict[str, Any]:
    """The answer to ``request`` (whose ``op`` is one of :data:`OPERATIONS`); a request naming
    another model or strategy than the index's is refused."""
    operation = OPERATIONS.get(request.get("op", ""))
    if operation is None:
        raise RagidxError(f"unknown request {request.get('op')!r}: one of {', '.join(OPERATIONS)}")
    prepare(served, request)
    return operation(served, request, job, event)


def prepare(served: ServedIndex, request: dict[str, Any]) -> None:
    """Read what a build committed since, and refuse a request naming another model or strategy
    than the index's: before every operation."""
    served.refresh()
    served.index.check_compatible(request.get("model"), request.get("strategy"))

"""What both frameworks' adapters share: an open index or a model to embed with, its model used
through a scheduler of its own (a framework may call from several threads: its async calls run in
a pool; see :mod:`ragidx.app.service.scheduler`), and a hit's fields as a framework's metadata."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragidx.app.embedder import Embedder
from ragidx.app.retriever import Hit, Index, SearchOptions
from ragidx.app.service.scheduler import Scheduler
from ragidx.app.service.served_index import ServedIndex, embed_in_slices
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.roles import Role
from ragidx.indexer.search.options import SEARCH_OPTION_SPECS

CLIENT = "python"  # the adapters' jobs, as the scheduler shows them
SEARCH_OPTION_NAMES = frozenset(spec.name for spec in SEARCH_OPTION_SPECS)  # taken by the retrievers


def opened(index: Index | str | Path) -> Index:
    """``index`` itself, or the index at that folder opened."""
    return index if isinstance(index, Index) else Index.open(index)


class Guarded:
    """An index or an embedder whose model work runs through its own scheduler, whichever thread
    asks; a keyword search runs where it is asked."""

    def __init__(self, source: Index | Embedder, scheduler: Scheduler):
        self.source = source
        self.scheduler = scheduler
        self.served = ServedIndex(source, scheduler) if isinstance(source, Index) else None

    @classmethod
    def of(cls, index: Index | str | Path | None, model: str | None, **options: Any) -> Guarded:
        """An index (``index``; its model loads on first use), or a model without one (``model``,
        ``strategy=`` and its options; loaded now), with a scheduler of their own."""
        if (index is None) == (model is None):
            raise RagidxError("give an index to embed as it does, or a model (with its strategy), not both")
        scheduler = Scheduler()
        if index is not None:
            return cls(opened(index), scheduler)
        with scheduler.job(CLIENT, "load") as job:
            return cls(scheduler.run(job, Embedder, model, **options), scheduler)

    def search(self, query: str, options: SearchOptions) -> list[Hit]:
        with self.scheduler.job(CLIENT, "search") as job:
            return self.index().search(query, options, job)

    def embed(self, texts: Sequence[str], role: Role) -> np.ndarray:
        with self.scheduler.job(CLIENT, "embed") as job:
            if self.served is not None:
                return self.served.embed(texts, role, job)
            return embed_in_slices(self.scheduler, job, self.source.embed, texts, role)

    async def asearch(self, query: str, options: SearchOptions) -> list[Hit]:
        """:meth:`search` for a framework's async calls: the event loop runs on meanwhile."""
        return await asyncio.to_thread(self.search, query, options)

    async def aembed(self, texts: Sequence[str], role: Role) -> np.ndarray:
        """:meth:`embed` for a framework's async calls: the event loop runs on meanwhile."""
        return await asyncio.to_thread(self.embed, texts, role)

    def index(self) -> ServedIndex:
        """The index searched; a model given without one cannot search."""
        if self.served is None:
            raise TypeError("searching needs an index")
        return self.served


def hit_metadata(hit: Hit) -> dict[str, Any]:
    """The document's own metadata with ragidx's fields over it: where the passage is (path,
    span, page), what it is (title, chunk id) and how it ranked (score, rank)."""
    return {
        **hit.metadata,
        "path": hit.path,
        "span": list(hit.span),
        "page": hit.page,
        "title": hit.title,
        "chunk_id": hit.chunk_id,
        "score": hit.score,
        "rank": hit.rank,
    }

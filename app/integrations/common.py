"""What both frameworks' adapters share: an open index or a model to embed with, used on one
thread of its own (a framework may call from several: its async calls run in a pool of threads;
see :mod:`ragidx.app.model_thread`), and a hit's fields as a framework's metadata."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragidx.app.embedder import Embedder
from ragidx.app.model_thread import ModelThread
from ragidx.app.retriever import Hit, Index, SearchOptions
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies.base import Role


def opened(index: Index | str | Path) -> Index:
    """``index`` itself, or the index at that folder opened."""
    return index if isinstance(index, Index) else Index.open(index)


class Guarded:
    """An index or an embedder whose searches and embeddings run one at a time, on its model's
    thread, whichever thread asks."""

    def __init__(self, source: Index | Embedder, on_model: ModelThread):
        self.source = source
        self.on_model = on_model

    @classmethod
    def of(cls, index: Index | str | Path | None, model: str | None, **options: Any) -> Guarded:
        """An index (``index``; its model loads on first use), or a model without one (``model``,
        ``strategy=`` and its options; loaded now), on a model thread of their own."""
        if (index is None) == (model is None):
            raise RagidxError("give an index to embed as it does, or a model (with its strategy), not both")
        on_model = ModelThread()
        source = opened(index) if index is not None else on_model.run(Embedder, model, **options)
        return cls(source, on_model)

    def search(self, query: str, options: SearchOptions) -> list[Hit]:
        return self.on_model.run(self.index().search, query, options)

    def embed(self, texts: Sequence[str], role: Role) -> np.ndarray:
        return self.on_model.run(self.source.embed, list(texts), role)

    async def asearch(self, query: str, options: SearchOptions) -> list[Hit]:
        """:meth:`search` for a framework's async calls: the event loop runs on meanwhile."""
        return await self.on_model.arun(self.index().search, query, options)

    async def aembed(self, texts: Sequence[str], role: Role) -> np.ndarray:
        """:meth:`embed` for a framework's async calls: the event loop runs on meanwhile."""
        return await self.on_model.arun(self.source.embed, list(texts), role)

    def index(self) -> Index:
        """The index searched; a model given without one cannot search."""
        if not isinstance(self.source, Index):
            raise TypeError("searching needs an index")
        return self.source


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

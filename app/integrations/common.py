"""What both frameworks' adapters share: an open index or a model to embed with, used by one
thread at a time (a framework may call from several; a strategy re-routes the model's attention
for the length of a forward pass), and a hit's fields as a framework's metadata."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragidx.app.embedder import Embedder
from ragidx.app.retriever import Hit, Index, SearchOptions
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies.base import Role


def opened(index: Index | str | Path) -> Index:
    """``index`` itself, or the index at that folder opened."""
    return index if isinstance(index, Index) else Index.open(index)


class Guarded:
    """An index or an embedder behind a lock: searches and embeddings one at a time."""

    def __init__(self, source: Index | Embedder):
        self.source = source
        self.lock = threading.Lock()

    @classmethod
    def of(cls, index: Index | str | Path | None, model: str | None, **options: Any) -> Guarded:
        """An index (``index``), or a model without one (``model``, ``strategy=`` and its options)."""
        if (index is None) == (model is None):
            raise RagidxError("give an index to embed as it does, or a model (with its strategy), not both")
        return cls(opened(index) if index is not None else Embedder(model, **options))

    def search(self, query: str, options: SearchOptions) -> list[Hit]:
        if not isinstance(self.source, Index):
            raise TypeError("searching needs an index")
        with self.lock:
            return self.source.search(query, options)

    def embed(self, texts: Sequence[str], role: Role) -> np.ndarray:
        with self.lock:
            return self.source.embed(list(texts), role)


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

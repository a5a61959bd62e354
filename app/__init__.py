"""Retrieval over a built index: the public Python API.

``Index``, ``Embedder``, ``Hit``, ``SearchOptions`` and ``Role`` are imported on first use, so
``import ragidx.app`` (and the CLI, which answers many commands through a daemon without any
model) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ragidx.indexer.errors import RagidxError

if TYPE_CHECKING:
    from ragidx.app.embedder import Embedder
    from ragidx.app.retriever import Index, SearchOptions
    from ragidx.indexer.search.hits import Hit, hit_from_dict
    from ragidx.indexer.storage.location import default_index_dir
    from ragidx.indexer.strategies.base import Role

__all__ = [
    "Embedder",
    "Hit",
    "Index",
    "RagidxError",
    "Role",
    "SearchOptions",
    "default_index_dir",
    "hit_from_dict",
]
_HOMES = {
    "Embedder": "ragidx.app.embedder",
    "Hit": "ragidx.indexer.search.hits",
    "Index": "ragidx.app.retriever",
    "SearchOptions": "ragidx.indexer.search.options",
    "Role": "ragidx.indexer.strategies.base",
    "default_index_dir": "ragidx.indexer.storage.location",
    "hit_from_dict": "ragidx.indexer.search.hits",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'ragidx.app' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)

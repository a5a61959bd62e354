"""Retrieval over a built index: the public Python API."""

from ragidx.app.embedder import Embedder
from ragidx.app.retriever import Hit, Index, SearchOptions
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.strategies.base import Role

__all__ = ["Embedder", "Hit", "Index", "RagidxError", "Role", "SearchOptions"]

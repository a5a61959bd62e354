"""Retrieval over a built index: the public Python API."""

from ragidx.app.embedder import Embedder
from ragidx.app.retriever import Hit, Index
from ragidx.indexer.errors import RagidxError

__all__ = ["Embedder", "Hit", "Index", "RagidxError"]

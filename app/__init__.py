"""Retrieval over a built index: the public Python API."""

from ragidx.app.embedder import Embedder
from ragidx.app.retriever import Hit, Index

__all__ = ["Embedder", "Hit", "Index"]

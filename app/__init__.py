"""Retrieval over a built index: the public Python API."""

from ragidx.app.retriever import Hit, Index

__all__ = ["Hit", "Index"]

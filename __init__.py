"""ragidx: a local retrieval indexer whose embeddings come from decoder-only LLMs."""

__version__ = "0.1.0"

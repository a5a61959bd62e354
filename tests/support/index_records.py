"""Document records and vectors written straight to the storage layer, without a model."""

from __future__ import annotations

import numpy as np

from ragidx.indexer.ingest.chunking import Chunk
from ragidx.indexer.ingest.sources import SourceDocument
from ragidx.indexer.storage.database import DocumentRecord


def record(name: str, texts: list[str]) -> DocumentRecord:
    source = SourceDocument(f"/docs/{name}", " ".join(texts), f"hash-{name}", 10, 0.0, name, "text")
    chunks, cursor = [], 0
    for i, text in enumerate(texts):
        chunks.append(Chunk(i, text, cursor, cursor + len(text), 3, [(cursor, cursor + len(text))]))
        cursor += len(text) + 1
    return DocumentRecord(source, chunks, {"team": name})


def vectors(n: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, 8)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)

"""Vectors for document records' chunks, and the account of an embedding pass: what the local
build and the Ray workers (:mod:`ragidx.indexer.build.distributed`) both compute."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ragidx.indexer.ingest.access import FileAccess
from ragidx.indexer.ingest.chunking import Chunker
from ragidx.indexer.ingest.sources import SkippedFile, read_document
from ragidx.indexer.storage.database import DocumentRecord
from ragidx.indexer.strategies import Strategy
from ragidx.indexer.strategies.base import ProgressCallback


@dataclass
class Embedded:
    """What the embedding pass did."""

    documents: int = 0
    chunks: int = 0
    tokens: int = 0
    truncated: int = 0
    seconds: float = 0.0
    skipped: list[SkippedFile] = field(default_factory=list)
    restored: int = 0  # chunks already indexed whose lost vectors were re-embedded
    vectorised: int = 0  # chunks of a lexical index embedded as it got vectors (--dense)
    embedded_tokens: int = 0  # of the chunks' tokens, those this build put through the model

    def count(self, record: DocumentRecord) -> None:
        self.documents += 1
        self.chunks += len(record.chunks)
        self.tokens += sum(chunk.token_count for chunk in record.chunks)


def read_record(path: str, chunker: Chunker, access: FileAccess) -> DocumentRecord | SkippedFile:
    """A document read again and chunked for embedding (the scan keeps no text), or why it can no
    longer be read (``access``: the build's, so a file swapped for a link meanwhile is refused)."""
    fresh = read_document(Path(path), access=access)
    if isinstance(fresh, SkippedFile):
        return fresh
    return DocumentRecord(fresh, chunker.chunk(fresh.text), fresh.metadata)


def embed_records(
    strategy: Strategy, records: Sequence[DocumentRecord], progress: ProgressCallback | None = None
) -> np.ndarray:
    """One vector per chunk of ``records``, in order; sentence spans are made chunk-relative."""
    chunks = [chunk for record in records for chunk in record.chunks]
    if not chunks:
        return np.zeros((0, strategy.dimension), dtype=np.float32)
    sentences = [chunk.relative_sentences for chunk in chunks]
    return strategy.encode([chunk.text for chunk in chunks], "document", progress, sentences)

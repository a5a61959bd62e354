"""Vectors for document records' chunks, and the account of an embedding pass: what the local
build and the Ray workers (:mod:`ragidx.indexer.build.distributed`) both compute."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ragidx.indexer.ingest.access import FileAccess
from ragidx.indexer.ingest.chunking import Chunk, Chunker
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


@dataclass(frozen=True)
class Part:
    """Chunks ``start`` to ``stop`` of a record: a long document is embedded and journalled a part
    at a time, so an interrupted build loses at most one part of it, not all of it."""

    record: DocumentRecord
    start: int
    stop: int

    @classmethod
    def whole(cls, record: DocumentRecord) -> Part:
        return cls(record, 0, len(record.chunks))

    @property
    def chunks(self) -> list[Chunk]:
        return self.record.chunks[self.start : self.stop]

    @property
    def last(self) -> bool:
        """Whether this part ends its record."""
        return self.stop == len(self.record.chunks)

    @property
    def size(self) -> float:
        """The bytes of the record's file this part stands for (its share of the chunks)."""
        return self.record.source.size * (self.stop - self.start) / max(len(self.record.chunks), 1)


def embed_records(
    strategy: Strategy, records: Sequence[DocumentRecord], progress: ProgressCallback | None = None
) -> np.ndarray:
    """One vector per chunk of ``records``, in order."""
    return embed_chunks(strategy, [chunk for record in records for chunk in record.chunks], progress)


def embed_chunks(
    strategy: Strategy, chunks: Sequence[Chunk], progress: ProgressCallback | None = None
) -> np.ndarray:
    """One vector per chunk, in order; sentence spans are made chunk-relative."""
    if not chunks:
        return np.zeros((0, strategy.dimension), dtype=np.float32)
    sentences = [chunk.relative_sentences for chunk in chunks]
    return strategy.encode([chunk.text for chunk in chunks], "document", progress, sentences)

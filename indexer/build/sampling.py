"""Decide early whether a new index's vectors are worth their cost: embed a sample, tune on it.

A build spends nearly all its time embedding, and on many corpora tuning then finds that hybrid
search does best with the vectors weighted 0 (keyword search alone): a newcomer's 35-minute build
of package READMEs went entirely into vectors no search read. So a new index (or a ``--rebuild``)
whose options do not ask for vectors embeds a sample first: whole documents drawn in a seeded
random order until :data:`SAMPLE_CHUNKS` chunks, spread over the corpus. The sample becomes a
temporary index, tuned on up to 100 pseudo-queries (:mod:`.tuning`). Unless the
vectors earn their cost there (:func:`vectors_help`: fused at equal weights above keyword search
alone, the dense list near it), the build keeps a lexical index and says what it saved; otherwise it
says what the rest will cost and embeds it, the sample's vectors included as they are.

A corpus whose sample would be most of it (:data:`MAX_SAMPLE_SHARE` of its bytes) is embedded
whole: deciding then would save little, and tuning the whole index decides as well.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragidx.indexer.build.embedding import Part, embed_records, read_record
from ragidx.indexer.build.tuning import SAMPLE_PSEUDO_QUERIES, TuningReport, tune_and_store
from ragidx.indexer.ingest.access import FileAccess
from ragidx.indexer.ingest.chunking import Chunker
from ragidx.indexer.ingest.sources import SkippedFile, SourceDocument
from ragidx.indexer.model.sources import reads_only, unread_languages
from ragidx.indexer.progress import progress as progress_bar
from ragidx.indexer.storage.database import DocumentRecord
from ragidx.indexer.storage.lexical import document_language
from ragidx.indexer.storage.writer import IndexWriter
from ragidx.indexer.strategies import Strategy
from ragidx.indexer.wording import counted

SAMPLE_CHUNKS = 256  # a few hundred chunks: enough pseudo-queries and answers to tune on
MAX_SAMPLE_SHARE = 0.5  # of the corpus's bytes: a larger sample decides too late to save much
SEED = 0
# The sample is journalled a group of documents at a time, each ending at this many chunks: an
# eighth of it, and a CPU's forward pass or two (a decoder's sample is two minutes of embedding).
SAMPLE_GROUP_CHUNKS = SAMPLE_CHUNKS // 8
MIN_DENSE_SHARE = 0.85  # of keyword search's nDCG@10 the dense list must reach (see vectors_help)


@dataclass
class Sample:
    """Documents drawn for the sample, read and chunked; the rest are left as found."""

    records: list[DocumentRecord]
    rest: list[SourceDocument]
    skipped: list[SkippedFile] = field(default_factory=list)
    sampled_bytes: int = 0
    total_bytes: int = 0

    @property
    def decides(self) -> bool:
        """Whether the sample is small enough beside the corpus for an early decision to pay."""
        return bool(self.records) and self.sampled_bytes < MAX_SAMPLE_SHARE * self.total_bytes

    @property
    def chunks(self) -> int:
        return sum(len(record.chunks) for record in self.records)

    @property
    def tokens(self) -> int:
        return sum(chunk.token_count for record in self.records for chunk in record.chunks)

    @property
    def rest_tokens(self) -> int:
        """The rest's tokens, estimated from its bytes at the sample's tokens per byte."""
        rest_bytes = self.total_bytes - self.sampled_bytes
        return round(self.tokens * rest_bytes / max(self.sampled_bytes, 1))


def draw_sample(documents: Sequence[SourceDocument], chunker: Chunker, access: FileAccess) -> Sample:
    """Whole documents in a seeded random order until :data:`SAMPLE_CHUNKS` chunks are drawn (the
    same corpus draws the same sample, so a resumed build decides as the interrupted one did)."""
    sample = Sample([], [], total_bytes=sum(document.size for document in documents))
    drawn: set[int] = set()
    for position in np.random.default_rng(SEED).permutation(len(documents)):
        if sample.chunks >= SAMPLE_CHUNKS:
            break
        document = documents[int(position)]
        drawn.add(int(position))
        sample.sampled_bytes += document.size
        record = read_record(document.path, chunker, access)
        if isinstance(record, SkippedFile):
            sample.skipped.append(record)
        else:
            sample.records.append(record)
    sample.rest = [document for position, document in enumerate(documents) if position not in drawn]
    return sample


@dataclass
class SampleReport:
    """What the sample showed, and what the build did about it."""

    documents: int
    chunks: int
    tokens: int
    embed_seconds: float  # embedding the sample's chunks not already in the journal
    embedded_tokens: int  # the tokens those were
    tuning: TuningReport
    keep_vectors: bool
    rest_documents: int
    rest_tokens: int  # estimated from the rest's bytes at the sample's tokens per byte
    unread: str = ""  # why no vector was embedded: the model reads none of the sample's languages

    @property
    def tokens_per_second(self) -> float:
        return self.embedded_tokens / self.embed_seconds if self.embed_seconds > 0 else 0.0

    @property
    def rest_seconds(self) -> float | None:
        """What embedding the rest takes (or would have taken) at the sample's rate."""
        rate = self.tokens_per_second
        return self.rest_tokens / rate if rate else None

    def describe_sample(self) -> str:
        """The sample and its tuning, in one line."""
        return (
            f"sample: {counted(self.documents, 'document')}, {counted(self.chunks, 'chunk')} "
            f"({counted(self.tokens, 'token')}) embedded at {self.tokens_per_second:.0f} tokens/s; "
            f"{self.tuning.describe()}"
        )

    def describe_decision(self) -> str:
        """What the build does with the rest, and what that costs or saves."""
        cost = f"~{self.rest_tokens:,} tokens" + (
            f", ~{_duration(self.rest_seconds)}" if self.rest_seconds is not None else ""
        )
        rest = counted(self.rest_documents, "other document")
        if self.unread:
            return (
                f"{self.unread}, so this index keeps no vectors (a lexical index: hybrid search is keyword "
                "search); that saves embedding all "
                f"{counted(self.documents + self.rest_documents, 'document')} "
                "(`ragidx build PATH... --dense` adds them anyway; docs/choosing.md#languages)"
            )
        if self.keep_vectors:
            return f"the vectors help on the sample: embedding the {rest} ({cost})"
        return (
            f"the vectors added nothing on the sample, so this index keeps none (a lexical index: "
            f"hybrid search is keyword search); that saves embedding the {rest} ({cost}). "
            "`ragidx build PATH... --dense` adds them later"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "chunks": self.chunks,
            "tokens": self.tokens,
            "embed_seconds": round(self.embed_seconds, 3),
            "tokens_per_second": round(self.tokens_per_second, 1),
            "tuning": self.tuning.to_meta(),
            "keep_vectors": self.keep_vectors,
            "rest_documents": self.rest_documents,
            "rest_tokens_estimate": self.rest_tokens,
            "rest_seconds_estimate": None if self.rest_seconds is None else round(self.rest_seconds, 1),
            "unread": self.unread,
        }


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def vectors_help(tuning: TuningReport) -> bool:
    """Whether the vectors earn their cost on the sample: fused with keyword search at equal
    weights (by reciprocal rank or min-max scores, whichever scores higher) they score above
    keyword search alone, and the dense list alone reaches :data:`MIN_DENSE_SHARE` of keyword
    search's nDCG@10. A tie goes to keyword search, which costs nothing. (The weights tuning
    stores are not the test: it prefers a single list unless a blend is clearly better, and on
    one sample of MiniLM's chose the dense list alone, below keyword search, while equal weights
    were above both.) A sample too small to tune on proves nothing: the vectors are kept.

    Why the floor: on the development data, fusion helped real queries only where the dense list
    was about as good as BM25 (MiniLM: SciFact 1.02 of BM25's nDCG@10, +0.05 hybrid; twelve QMSum
    meetings 0.91, +0.025); where it was 0.67-0.80 of it (the decoders), tuned hybrid was BM25's
    figure, or within 0.006 of it. On 127 package READMEs, SmolLM2's sample (dense 0.55 of BM25's)
    scored 0.02 above keyword search at equal weights, the build then took 19 minutes, and its
    hybrid search found 5 of 8 questions' packages first, against 7 of 8 for keyword search."""
    if tuning.reason:
        return True
    ndcg = tuning.ndcg
    lexical = ndcg.get("lexical", 0.0)
    fused = max(ndcg.get("equal", 0.0), ndcg.get("minmax", 0.0))
    return fused > lexical and ndcg.get("dense", 0.0) >= MIN_DENSE_SHARE * lexical


def unread_sample(model: str, records: Sequence[DocumentRecord]) -> str:
    """Why vectors are not worth embedding, where ``model`` (a packaged one that says what it reads)
    reads none of the sample's languages: its vectors of such text are noise, and hybrid search
    answers such queries by keywords alone anyway (see the search engine); "" otherwise."""
    languages = {document_language(chunk.text for chunk in record.chunks[:4]) for record in records}
    unread = unread_languages(model, sorted(languages))
    if not languages or len(unread) < len(languages):
        return ""
    return f"{reads_only(model)}; the sample is {', '.join(unread)}"


def tune_sample(
    records: Sequence[DocumentRecord],
    vectors: np.ndarray,
    meta: dict[str, Any],
    strategy: Strategy,
    device: str,
    progress: bool,
) -> TuningReport:
    """Tune hybrid weights on the sample as a whole index is tuned: the sample is committed to a
    temporary index (``meta``: the build's settings) that is gone afterwards."""
    chunks = sum(len(record.chunks) for record in records)
    with (
        tempfile.TemporaryDirectory(prefix="ragidx-sample-") as folder,
        IndexWriter(Path(folder) / "index") as writer,
    ):
        writer.commit(records, vectors, meta)
        return tune_and_store(writer, strategy, min(SAMPLE_PSEUDO_QUERIES, chunks), device, progress)


def _groups(records: Sequence[DocumentRecord]) -> list[list[DocumentRecord]]:
    """``records`` in order, in groups of whole documents that end once they reach
    :data:`SAMPLE_GROUP_CHUNKS` chunks."""
    groups: list[list[DocumentRecord]] = [[]]
    for record in records:
        if sum(len(each.chunks) for each in groups[-1]) >= SAMPLE_GROUP_CHUNKS:
            groups.append([])
        groups[-1].append(record)
    return groups


def embed_sample(
    sample: Sample,
    strategy: Strategy,
    take: Callable[[DocumentRecord], np.ndarray | None],
    keep: Callable[[Sequence[Part], np.ndarray], None],
    progress: bool,
) -> tuple[np.ndarray, float, int]:
    """The sample's vectors (those ``take`` finds in the journal, the rest embedded and handed to
    ``keep`` a group of :data:`SAMPLE_GROUP_CHUNKS` at a time, so a build stopped during the sample
    keeps most of it), the seconds embedding took and the tokens it embedded."""
    parts: list[np.ndarray | None] = [take(record) for record in sample.records]
    missing = [record for record, part in zip(sample.records, parts, strict=True) if part is None]
    started = time.perf_counter()
    tokens = sum(chunk.token_count for record in missing for chunk in record.chunks)
    if missing:
        fresh: list[np.ndarray] = []
        with progress_bar(sum(len(r.chunks) for r in missing), "sample", "chunks", progress) as bar:
            for group in _groups(missing):
                vectors = embed_records(strategy, group, lambda rows, _tokens: bar.update(rows))
                keep([Part.whole(record) for record in group], vectors)
                fresh += np.split(vectors, np.cumsum([len(record.chunks) for record in group])[:-1])
        found = iter(fresh)
        parts = [part if part is not None else next(found) for part in parts]
    seconds = time.perf_counter() - started
    dimension = strategy.dimension
    vectors = np.concatenate([p for p in parts if p is not None]) if parts else np.zeros((0, dimension))
    return vectors.astype(np.float32, copy=False), seconds, tokens

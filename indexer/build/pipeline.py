"""Build an index: scan sources, chunk, embed in batches with progress, and commit atomically."""

from __future__ import annotations

import collections
import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragidx import __version__
from ragidx.indexer.build.distributed import WorkerSpec, connect, embed_documents_on_ray
from ragidx.indexer.build.embedding import Embedded, Part, embed_chunks, read_record
from ragidx.indexer.build.journal import EmbeddingJournal, Resumed, Reused
from ragidx.indexer.build.maintenance import reembed
from ragidx.indexer.build.sampling import (
    Sample,
    SampleReport,
    draw_sample,
    embed_sample,
    tune_sample,
    unread_sample,
    vectors_help,
)
from ragidx.indexer.build.settings import BuildOptions, Resolution, resolve
from ragidx.indexer.build.tuning import (
    TuningReport,
    build_queries,
    lexical_fusion,
    needs_tuning,
    tune_and_store,
)
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.access import FileAccess
from ragidx.indexer.ingest.changes import ChangePlan, plan_changes
from ragidx.indexer.ingest.chunking import Chunker
from ragidx.indexer.ingest.sources import ScanResult, SkippedFile, SourceDocument, scan
from ragidx.indexer.model.runtime import ModelRuntime, load_runtime
from ragidx.indexer.model.sources import ModelSource, check_same_file, keyword_only_note, resolve_model
from ragidx.indexer.progress import notice
from ragidx.indexer.progress import progress as progress_bar
from ragidx.indexer.search.fusion import Fusion
from ragidx.indexer.storage.index_settings import VectorIndexSettings
from ragidx.indexer.storage.settings import IndexSettings
from ragidx.indexer.storage.vector_store import StoreSpec
from ragidx.indexer.storage.writer import Committed, IndexWriter, NextGeneration
from ragidx.indexer.strategies import Strategy
from ragidx.indexer.wording import counted

EMBED_SLICE = 256  # chunks tokenised and embedded per step at most; bounds memory, not results
# A step also ends at this share of the bytes to embed, so that even a small build is journalled
# in parts (an interrupted build resumes from the last part: .journal).
JOURNAL_PARTS = 16


@dataclass
class BuildReport:
    index_dir: str
    generation: int
    model: str
    dtype: str
    dtype_reason: str
    strategy: str
    strategy_reason: str
    strategy_notes: dict[str, Any]
    documents: int
    chunks: int
    tokens: int
    truncated_chunks: int
    skipped: list[SkippedFile]
    seconds: float
    embed_seconds: float
    changes: ChangePlan
    total_documents: int
    total_chunks: int
    vector_index: VectorIndexSettings
    vector_index_rebuilt: str
    store: StoreSpec  # where the vectors live
    segments: int  # parts of the vector store after this build (segment files; 0 in Milvus)
    segments_merged: str = ""  # what this build merged (for size or deletions), "" if nothing
    tuning: TuningReport | None = None  # when this build tuned the hybrid weights
    restored: int = 0  # chunks whose lost vectors this build re-embedded from their stored text
    fusion: dict[str, Any] | None = None  # the index's hybrid weights and the figures behind them
    dense: bool = True  # whether the index keeps vectors (False: a lexical index)
    dense_reason: str = ""
    vectorised: int = 0  # chunks of a lexical index embedded as it got vectors (--dense)
    embedded_tokens: int = 0  # of ``tokens``, those put through the model (not resumed, not lexical)
    sample: SampleReport | None = None  # the sample that decided whether to keep vectors
    resumed: Resumed | None = None  # what an interrupted build had embedded, taken from its journal
    copied: Reused | None = (
        None  # documents with the content of an earlier one of this build: not embedded twice
    )
    languages: dict[str, int] = field(default_factory=dict)  # the index's chunks in each language
    languages_note: str = ""  # the languages the model cannot read ("" where it reads them all)

    @property
    def vectors_description(self) -> str:
        """Where the vectors are and how they are indexed, in one line."""
        if not self.dense:
            return f"none (a lexical index: {self.dense_reason or 'built without them'})"
        return self.store.describe(self.vector_index, self.segments)

    @property
    def embedded_chunks(self) -> int:
        """Of ``chunks``, those put through the model (not taken from an interrupted build's
        journal, nor copied from a file of the same content)."""
        return self.chunks - sum(reused.chunks for reused in (self.resumed, self.copied) if reused)

    @property
    def vectors_per_second(self) -> float:
        return self.embedded_chunks / self.embed_seconds if self.embed_seconds > 0 else 0.0

    def summary(self) -> str:
        """What was indexed, embedded and taken from a journal, in one line whose counts add up."""
        counts = (
            f"{counted(self.documents, 'document')} as {counted(self.chunks, 'chunk')} "
            f"({counted(self.tokens, 'token')})"
        )
        if not self.dense:
            return f"indexed {counts} without vectors (a lexical index); {self.seconds:.1f} s in all"
        rate = f"{self.tokens_per_second:.0f} tokens/s, {self.vectors_per_second:.1f} chunks/s"
        taken = [f"{counted(self.resumed.chunks, 'chunk')} taken from the journal"] if self.resumed else []
        if self.copied:
            chunks, copies = counted(self.copied.chunks, "chunk"), counted(self.copied.documents, "document")
            taken.append(f"{chunks} of {copies} the same as another file's, not embedded twice")
        if not taken:
            return f"embedded {counts} in {self.embed_seconds:.1f} s ({rate}); {self.seconds:.1f} s in all"
        if not self.embedded_chunks:
            return f"indexed {counts}: {', '.join(taken)}, none embedded; {self.seconds:.1f} s in all"
        embedded = f"{self.embedded_chunks} embedded ({counted(self.embedded_tokens, 'token')})"
        timing = f"in {self.embed_seconds:.1f} s ({rate}); {self.seconds:.1f} s in all"
        return f"indexed {counts}: {', '.join(taken)}, {embedded} {timing}"

    @property
    def tokens_per_second(self) -> float:
        return self.embedded_tokens / self.embed_seconds if self.embed_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index_dir,
            "generation": self.generation,
            "model": self.model,
            "dtype": self.dtype,
            "dtype_reason": self.dtype_reason,
            "strategy": self.strategy,
            "strategy_reason": self.strategy_reason,
            "strategy_notes": self.strategy_notes,
            "documents": self.documents,
            "chunks": self.chunks,
            "new": len(self.changes.new),
            "updated": len(self.changes.updated),
            "unchanged": self.changes.unchanged,
            "removed": self.changes.removed,
            "total_documents": self.total_documents,
            "total_chunks": self.total_chunks,
            "vector_index": self.vector_index.to_meta(),
            "vector_index_rebuilt": self.vector_index_rebuilt,
            "store": self.store.to_meta(),
            "segments": self.segments,
            "segments_merged": self.segments_merged,
            "fusion": self.fusion,
            "tuned": self.tuning is not None,
            "restored": self.restored,
            "dense": self.dense,
            "dense_reason": self.dense_reason,
            "languages": self.languages,
            "languages_note": self.languages_note,
            "vectorised": self.vectorised,
            "sample": self.sample.to_dict() if self.sample else None,
            "resumed": self.resumed.to_dict() if self.resumed else None,
            "copied": self.copied.to_dict() if self.copied else None,
            "tokens": self.tokens,
            "embedded_tokens": self.embedded_tokens,
            "truncated_chunks": self.truncated_chunks,
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
            "seconds": round(self.seconds, 3),
            "embed_seconds": round(self.embed_seconds, 3),
            "vectors_per_second": round(self.vectors_per_second, 2),
            "tokens_per_second": round(self.tokens_per_second, 1),
        }


def describe_skips(skipped: Sequence[SkippedFile]) -> str:
    reasons = collections.Counter(s.reason for s in skipped)
    return ", ".join(f"{count} {reason}" for reason, count in reasons.most_common())


def build(
    paths: Sequence[str | Path], options: BuildOptions, loaded: dict[tuple[Any, ...], Any] | None = None
) -> BuildReport:
    """Bring the index up to date with the documents under ``paths``.

    New and changed documents (by SHA-256) are embedded; documents under ``paths`` that are gone
    are removed; documents elsewhere in the index are kept. ``options.rebuild`` re-embeds
    everything and makes the index exactly ``paths``. Settings not given are the index's own.
    A new index whose options do not ask for vectors embeds a sample first and keeps vectors only
    where they help (:mod:`.sampling`); what a build embeds is journalled as it goes, so an
    interrupted build resumes (:mod:`.journal`).
    ``loaded`` keeps the model between builds of one process (``watch``): it holds the last one.
    """
    started = time.perf_counter()
    if not paths:
        raise RagidxError("nothing to index: give at least one file or folder")
    with IndexWriter(options.index_dir) as writer:
        survey = _survey(paths, options, writer)
        done = _without_model(survey, options, writer, started)
        if done is not None:
            return done
        # An unreachable cluster is refused before the model loads.
        workers = connect(options.ray, options.ray_workers, options.device) if options.ray else 0
        source, runtime = _model(survey, options, loaded)
        strategy, chunker, settings = survey.resolution.resolved(runtime, survey.vector_index, survey.access)
        if survey.stored is not None and survey.unchanged_by(settings):
            return _report(options, writer, survey.plan, survey.skipped, started, survey.stored, None)
        embedder = EmbeddingSetup(source, strategy, chunker, workers)
        generation = _write_generation(survey, options, writer, embedder, settings)
        return _finish(survey, options, writer, strategy, generation, started)


@dataclass
class Survey:
    """What a build finds before any model loads: its settings resolved against the index's, the
    documents under its paths and what changes, and the chunks whose vectors were lost."""

    resolution: Resolution
    access: FileAccess
    scanned: ScanResult
    plan: ChangePlan
    lost: list[str]

    @property
    def stored(self) -> IndexSettings | None:
        return self.resolution.stored

    @property
    def vector_index(self) -> VectorIndexSettings:
        return self.resolution.vector_index

    @property
    def skipped(self) -> list[SkippedFile]:
        return self.scanned.skipped

    def unchanged_by(self, settings: IndexSettings) -> bool:
        """Whether a build with these resolved ``settings`` would write nothing new."""
        stored = self.stored
        return bool(
            stored is not None
            and not self.plan.changes_anything
            and not self.resolution.restructures
            and not self.lost
            and stored.dense == settings.dense
        )


@dataclass(frozen=True)
class EmbeddingSetup:
    """How a generation's documents get their vectors: the model's source, its strategy and
    chunker, and the Ray workers that embed in its place (0: this process)."""

    source: ModelSource
    strategy: Strategy
    chunker: Chunker
    workers: int


@dataclass
class Generation:
    """A committed generation: its settings, what the store committed, what was embedded (with
    the sample, where one decided), and what was resumed from the journal."""

    settings: IndexSettings
    committed: Committed
    embedded: Embedded
    sample: DecidedSample | None
    resumed: Resumed | None
    copied: Reused | None


def _survey(paths: Sequence[str | Path], options: BuildOptions, writer: IndexWriter) -> Survey:
    resolution = resolve(options, IndexSettings.from_meta(writer.meta))
    stored = resolution.stored
    indexed = writer.documents() if stored else {}
    access = resolution.access(paths)
    known = {path: found[1] for path, found in indexed.items()}
    scanned = _scan(paths, options.index_dir, known, access)
    lost = writer.lost_vectors() if stored else []  # their chunks are re-embedded from stored text
    return Survey(resolution, access, scanned, plan_changes(scanned, indexed, paths), lost)


def _without_model(
    survey: Survey, options: BuildOptions, writer: IndexWriter, started: float
) -> BuildReport | None:
    """The build's report where it needs no model: nothing to embed (stale documents removed, or
    the vector index restructured), or a lexical index that stays lexical; else None."""
    stored, plan, resolution = survey.stored, survey.plan, survey.resolution
    if stored and not plan.to_embed and not survey.lost and not resolution.changes_settings:
        committed = (
            writer.remove_documents(plan.stale, vector_index=survey.vector_index)
            if plan.stale or resolution.restructures
            else None
        )
        return _report(options, writer, plan, survey.skipped, started, stored, committed)
    if resolution.stays_lexical and stored is not None:
        access = survey.access
        settings = dataclasses.replace(
            stored, roots=resolution.roots(access), max_file_bytes=access.max_bytes
        )
        with writer.next_generation(plan.stale, False, survey.vector_index) as pending:
            embedded = _add_documents(plan.to_embed, resolution.lexical_chunker(), access, pending)
            committed = pending.commit({**settings.to_meta(), "ragidx_version": __version__})
        skipped = survey.skipped + embedded.skipped
        return _report(options, writer, plan, skipped, started, settings, committed, embedded)
    return None


def _model(
    survey: Survey, options: BuildOptions, loaded: dict[tuple[Any, ...], Any] | None
) -> tuple[ModelSource, ModelRuntime]:
    """The model the build embeds with: the one ``loaded`` holds where it is the same, else loaded
    (a changed GGUF file is refused before it is converted)."""
    source = resolve_model(survey.resolution.model)
    stored = survey.stored
    if stored and source.model_id == stored.model:
        check_same_file(source, stored.model_file)
    strategy = survey.resolution.strategy_asked or ""  # "": the default, unknown yet
    arguments = (source, options.device, survey.resolution.dtype, options.trust_remote_code, strategy)
    runtime = loaded.get(arguments) if loaded is not None else None
    if runtime is None:
        notice(f"loading model {source.model_id} ...", options.progress and sys.stderr.isatty())
        runtime = load_runtime(*arguments)
        if loaded is not None:
            loaded.clear()
            loaded[arguments] = runtime
    return source, runtime


def _write_generation(
    survey: Survey,
    options: BuildOptions,
    writer: IndexWriter,
    embedder: EmbeddingSetup,
    settings: IndexSettings,
) -> Generation:
    """Embed what changed (after the sample that decides whether a new index keeps vectors, and
    the chunks whose vectors were lost or that a lexical index gains) and commit it, journalled so
    an interrupted build resumes."""
    stored, lost, strategy = survey.stored, survey.lost, embedder.strategy
    journal = EmbeddingJournal(writer.directory, settings.to_meta())
    try:
        with writer.next_generation(
            survey.plan.stale, not stored, survey.vector_index, lost, survey.resolution.store
        ) as pending:
            vectorise = stored is not None and not stored.dense and settings.dense
            restored = pending.chunks_without_vectors() if lost or vectorise else np.zeros(0, np.int64)
            if len(restored):  # lost parts' chunks, or a lexical index's, surviving this build's removals
                pending.restore(restored, _reembed(writer, strategy, restored, options.progress))
            documents, sample = survey.plan.to_embed, None
            if survey.resolution.dense is None and not options.ray:
                sample = _decide_on_sample(
                    documents, embedder.chunker, strategy, survey.access, journal, settings, options
                )
            if sample is not None:
                documents = sample.drawn.rest
                settings = dataclasses.replace(
                    settings, dense=sample.report.keep_vectors, dense_reason=sample.reason
                )
                pending.add(sample.drawn.records, sample.vectors if settings.dense else None)
            embedded = _embed(documents, survey.access, pending, embedder, settings, options, journal)
            if sample is not None:
                sample.count_into(embedded)
            embedded.restored = len(restored) if lost else 0
            embedded.vectorised = len(restored) if vectorise else 0
            committed = pending.commit({**settings.to_meta(), "ragidx_version": __version__})
    finally:
        journal.close()
    journal.discard()
    resumed = journal.resumed if journal.resumed.documents else None
    copied = journal.copied if journal.copied.documents else None
    return Generation(settings, committed, embedded, sample, resumed, copied)


def _embed(
    documents: Sequence[SourceDocument],
    access: FileAccess,
    pending: NextGeneration,
    embedder: EmbeddingSetup,
    settings: IndexSettings,
    options: BuildOptions,
    journal: EmbeddingJournal,
) -> Embedded:
    """Add ``documents`` to the generation: their chunks alone where the index keeps no vectors,
    else with vectors embedded on Ray's workers or here."""
    if not settings.dense:
        return _add_documents(documents, embedder.chunker, access, pending)
    if options.ray:
        spec = WorkerSpec(
            source=embedder.source,
            device=options.device,
            dtype=settings.dtype,
            trust_remote_code=options.trust_remote_code,
            strategy=settings.strategy,
            params=embedder.strategy.params,
            batch=embedder.strategy.batch,
            chunker=embedder.chunker.settings,
            access=access,
        )
        return embed_documents_on_ray(
            documents, spec, options.ray, embedder.workers, pending, options.progress
        )
    return _embed_documents(
        documents, embedder.chunker, embedder.strategy, access, pending, options.progress, journal
    )


def _finish(
    survey: Survey,
    options: BuildOptions,
    writer: IndexWriter,
    strategy: Strategy,
    generation: Generation,
    started: float,
) -> BuildReport:
    """Tune the committed index's hybrid search (a lexical one keeps its sample's verdict) and report."""
    settings, sample = generation.settings, generation.sample
    stored = survey.stored
    if settings.dense:
        tuning = _tune(options, writer, strategy, fresh=not stored or not stored.dense)
    else:
        tuning = sample.report.tuning if sample is not None else None
        writer.update_meta({"fusion": lexical_fusion(tuning)})
    embedded = generation.embedded
    skipped = survey.skipped + embedded.skipped
    report = _report(
        options, writer, survey.plan, skipped, started, settings, generation.committed, embedded, tuning
    )
    report.sample = sample.report if sample is not None else None
    report.resumed = generation.resumed
    report.copied = generation.copied
    return report


@dataclass
class DecidedSample:
    """A sample embedded and tuned on (see :mod:`.sampling`), with why the index keeps vectors or not."""

    drawn: Sample
    vectors: np.ndarray
    report: SampleReport

    @property
    def reason(self) -> str:
        """What the index stores as why it keeps vectors or not."""
        ndcg = self.report.tuning.ndcg
        figures = ", ".join(
            f"{name} {ndcg[name]:.3f}" for name in ("dense", "lexical", "tuned") if name in ndcg
        )
        if self.report.unread:
            return self.report.unread
        verdict = "helped" if self.report.keep_vectors else "added nothing"
        return f"the vectors {verdict} on a sample of {self.report.chunks} chunks (nDCG@10 {figures})"

    def count_into(self, embedded: Embedded) -> None:
        """Add the sample's documents, chunks, tokens and embedding time to the build's account."""
        for record in self.drawn.records:
            embedded.count(record)
        embedded.seconds += self.report.embed_seconds
        embedded.embedded_tokens += self.report.embedded_tokens
        embedded.skipped.extend(self.drawn.skipped)


def _decide_on_sample(
    documents: Sequence[SourceDocument],
    chunker: Chunker,
    strategy: Strategy,
    access: FileAccess,
    journal: EmbeddingJournal,
    settings: IndexSettings,
    options: BuildOptions,
) -> DecidedSample | None:
    """Embed a sample of ``documents`` and tune on it (:mod:`.sampling`), saying what it found and
    what the rest costs; None where the corpus is too small for a sample to decide."""
    drawn = draw_sample(documents, chunker, access)
    if not drawn.decides:
        return None
    unread = unread_sample(settings.model, drawn.records)
    if unread:
        report = _unread_report(drawn, unread)
        notice(report.describe_decision(), options.progress)
        return DecidedSample(drawn, np.zeros((0, strategy.dimension), np.float32), report)
    vectors, seconds, tokens = embed_sample(drawn, strategy, journal.take, journal.save, options.progress)
    meta = {**settings.to_meta(), "ragidx_version": __version__}
    tuning = tune_sample(drawn.records, vectors, meta, strategy, options.device, options.progress)
    report = SampleReport(
        documents=len(drawn.records),
        chunks=drawn.chunks,
        tokens=drawn.tokens,
        embed_seconds=seconds,
        embedded_tokens=tokens,
        tuning=tuning,
        keep_vectors=vectors_help(tuning),
        rest_documents=len(drawn.rest),
        rest_tokens=drawn.rest_tokens,
    )
    notice(f"{report.describe_sample()}\n{report.describe_decision()}", options.progress)
    return DecidedSample(drawn, vectors, report)


def _unread_report(drawn: Sample, unread: str) -> SampleReport:
    """The decision of a sample whose languages the model cannot read: nothing embedded, no tuning."""
    return SampleReport(
        documents=len(drawn.records),
        chunks=drawn.chunks,
        tokens=drawn.tokens,
        embed_seconds=0.0,
        embedded_tokens=0,
        tuning=TuningReport(Fusion(0.0, 1.0), 0, 0.0, reason=unread),
        keep_vectors=False,
        rest_documents=len(drawn.rest),
        rest_tokens=drawn.rest_tokens,
        unread=unread,
    )


def _reembed(writer: IndexWriter, strategy: Strategy, chunk_ids: np.ndarray, progress: bool) -> np.ndarray:
    """:func:`reembed` with a progress bar: a lexical index getting vectors embeds all its chunks."""
    with progress_bar(len(chunk_ids), "embedding", "chunks", progress) as bar:
        return reembed(writer, strategy, chunk_ids, lambda rows, _tokens: bar.update(rows))


def _scan(
    paths: Sequence[str | Path], index_dir: Path, known: dict[str, str], access: FileAccess
) -> ScanResult:
    """The documents under ``paths`` (texts dropped; files whose hash is ``known`` not extracted)."""
    scanned = scan(paths, exclude=index_dir, keep_text=False, known=known, access=access)
    if not scanned.documents:
        detail = (
            f" ({len(scanned.skipped)} skipped: {describe_skips(scanned.skipped)})" if scanned.skipped else ""
        )
        raise RagidxError(f"no readable documents in {', '.join(map(str, paths))}{detail}")
    return scanned


def _tune(options: BuildOptions, writer: IndexWriter, strategy: Strategy, fresh: bool) -> TuningReport | None:
    """Tune the hybrid weights of a new index, or of one whose size moved enough since its tuning.

    A fresh index built with ``tune=False`` drops the weights a previous index left in the meta:
    they were measured for other vectors.
    """
    if not options.tune:
        if fresh:
            writer.update_meta({"fusion": None})
        return None
    chunks = writer.counts()["chunks"]
    if not (fresh or needs_tuning(writer.meta, chunks)):
        return None
    return tune_and_store(writer, strategy, build_queries(chunks), options.device, options.progress)


def _report(
    options: BuildOptions,
    writer: IndexWriter,
    plan: ChangePlan,
    skipped: list[SkippedFile],
    started: float,
    settings: IndexSettings,
    committed: Committed | None,
    embedded: Embedded | None = None,
    tuning: TuningReport | None = None,
) -> BuildReport:
    totals = writer.counts()
    return BuildReport(
        index_dir=str(options.index_dir),
        generation=int(writer.meta["generation"]),
        model=settings.model,
        dtype=settings.dtype,
        dtype_reason=settings.dtype_reason,
        strategy=settings.strategy,
        strategy_reason=settings.strategy_reason,
        strategy_notes=settings.strategy_notes,
        documents=embedded.documents if embedded else 0,
        chunks=embedded.chunks if embedded else 0,
        tokens=embedded.tokens if embedded else 0,
        truncated_chunks=embedded.truncated if embedded else 0,
        skipped=skipped,
        seconds=time.perf_counter() - started,
        embed_seconds=embedded.seconds if embedded else 0.0,
        changes=plan,
        total_documents=totals["documents"],
        total_chunks=totals["chunks"],
        vector_index=VectorIndexSettings.from_meta(writer.meta),
        vector_index_rebuilt=committed.rebuilt if committed else "",
        store=writer.store.spec,
        segments=writer.vector_parts(),
        segments_merged=committed.merged if committed else "",
        tuning=tuning,
        fusion=writer.meta.get("fusion"),
        restored=embedded.restored if embedded else 0,
        dense=settings.dense,
        dense_reason=settings.dense_reason,
        vectorised=embedded.vectorised if embedded else 0,
        embedded_tokens=embedded.embedded_tokens if embedded else 0,
        languages=dict(writer.meta.get("languages") or {}),
        languages_note=keyword_only_note(settings.model, writer.meta.get("languages") or {})
        if settings.dense
        else "",
    )


def _embed_documents(
    documents: Sequence[SourceDocument],
    chunker: Chunker,
    strategy: Strategy,
    access: FileAccess,
    pending: NextGeneration,
    progress: bool,
    journal: EmbeddingJournal,
) -> Embedded:
    """Re-read, chunk and embed ``documents`` a group of chunks at a time, handing each group's
    vectors to ``journal`` at once, and each document, once all its chunks have vectors, to
    ``pending``: memory holds one group's texts, not the corpus's, and an interrupted build loses
    one group at most. A group ends at :data:`EMBED_SLICE` chunks or a :data:`JOURNAL_PARTS`-th of
    the bytes, so a long document is cut into parts (a 107 kB README was 43% of one corpus); the
    chunks at the start of a document that the journal holds (an interrupted build embedded them)
    are not embedded again.

    A file that became unreadable since the scan is skipped and reported.
    """
    embedded = Embedded()
    started = time.perf_counter()
    group: list[Part] = []
    held: dict[int, list[np.ndarray]] = {}  # vectors so far of each document a group has part of
    fed = done = 0  # templated tokens through the model, chunks embedded: for what is shown
    total = sum(document.size for document in documents)
    part_bytes = total / JOURNAL_PARTS
    # Progress is counted in bytes of the files, moved on after every forward pass, so the bar
    # moves and its ETA holds however unequal the documents are.
    with progress_bar(total, "embedding", "B", progress, scale=True) as bar:
        shown = 0.0  # of the current group's bytes
        group_bytes = group_chunks = 0.0

        def advance(rows: int, batch_tokens: int) -> None:
            nonlocal fed, shown, done
            fed += batch_tokens
            done += rows
            step = group_bytes * rows / max(group_chunks, 1)
            shown += step
            bar.update(step)
            rate = fed / max(time.perf_counter() - started, 1e-9)
            bar.set_postfix(chunks=done, tok_s=f"{rate:.0f}")

        def filled() -> tuple[int, float]:
            """The chunks and the bytes the group holds."""
            return sum(len(part.chunks) for part in group), sum(part.size for part in group)

        def flush() -> None:
            nonlocal shown, group_bytes, group_chunks
            group_chunks, group_bytes = filled()
            shown = 0.0
            chunks = [chunk for part in group for chunk in part.chunks]
            vectors = embed_chunks(strategy, chunks, advance)
            embedded.embedded_tokens += sum(chunk.token_count for chunk in chunks)
            journal.save(group, vectors)
            ended, offset = [], 0
            for part in group:
                held[id(part.record)].append(vectors[offset : offset + len(part.chunks)])
                offset += len(part.chunks)
                if part.last:
                    ended.append(part.record)
            if ended:
                pending.add(ended, np.concatenate([v for record in ended for v in held.pop(id(record))]))
            bar.update(group_bytes - shown)  # what rounding left
            group.clear()

        for document in documents:
            record = read_record(document.path, chunker, access)
            if isinstance(record, SkippedFile):
                embedded.skipped.append(record)
                bar.update(document.size)
                continue
            embedded.count(record)
            count = len(record.chunks)
            kept = journal.take_start(record)
            start = 0 if kept is None else len(kept)
            if kept is not None and start == count:
                pending.add([record], kept)
                bar.update(document.size)
                continue
            held[id(record)] = [] if kept is None else [kept]
            bar.update(document.size * start / max(count, 1))
            while True:  # once at least: a document without chunks is a part too
                chunks, size = filled()
                fits = math.ceil((part_bytes - size) * count / max(record.source.size, 1))
                part = Part(record, start, start + min(count - start, EMBED_SLICE - chunks, max(fits, 1)))
                group.append(part)
                chunks, size = filled()
                if chunks >= EMBED_SLICE or size >= part_bytes:
                    flush()
                start = part.stop
                if part.last:
                    break
        if group:
            flush()
    embedded.seconds = time.perf_counter() - started
    embedded.truncated = strategy.truncated
    return embedded


def _add_documents(
    documents: Sequence[SourceDocument], chunker: Chunker, access: FileAccess, pending: NextGeneration
) -> Embedded:
    """Read and chunk ``documents`` into a lexical index (rows, no vectors), one at a time."""
    added = Embedded()
    for document in documents:
        record = read_record(document.path, chunker, access)
        if isinstance(record, SkippedFile):
            added.skipped.append(record)
            continue
        added.count(record)
        pending.add([record], None)
    return added

"""``ragidx rm`` and ``ragidx check``: remove documents, and verify (and repair) an index's parts agree."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragidx.indexer.build.settings import load_strategy
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.access import under
from ragidx.indexer.ingest.changes import absolute_roots
from ragidx.indexer.storage import repair as mend
from ragidx.indexer.storage.database import all_chunk_ids, damage, writable
from ragidx.indexer.storage.location import index_exists, no_index
from ragidx.indexer.storage.reader import IndexReader
from ragidx.indexer.storage.settings import IndexSettings
from ragidx.indexer.storage.writer import IndexWriter
from ragidx.indexer.wording import counted

if TYPE_CHECKING:
    from ragidx.indexer.strategies import Strategy
    from ragidx.indexer.strategies.base import ProgressCallback


@dataclass
class RemoveReport:
    removed: list[str]  # with ``dry_run``: what would be removed
    generation: int
    documents: int
    chunks: int
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return vars(self)


def remove(
    paths: Sequence[str | Path], index_dir: Path, everything: bool = False, dry_run: bool = False
) -> RemoveReport:
    """Drop the indexed documents at or under ``paths`` (which need not exist on disk any more),
    or every document with ``everything``; ``dry_run`` only says which.

    An empty path (an unset shell variable) is refused, not read as the current folder, and so is
    a folder that holds every indexed document unless ``everything`` says that is meant: one
    keystroke must not empty an index.
    """
    if everything and paths:
        raise RagidxError("give paths to remove, or --all, not both")
    if not paths and not everything:
        raise RagidxError("give at least one indexed file or folder to remove (or --all)")
    if any(not str(path).strip() for path in paths):
        raise RagidxError("an empty path would mean the current folder: give the file or folder to remove")
    roots = absolute_roots(paths)
    with _open_existing(index_dir) as writer:
        indexed = writer.documents()
        targets = {path: doc_id for path, (doc_id, _) in indexed.items() if everything or under(path, roots)}
        if not targets:
            raise RagidxError(f"no indexed document at or under {', '.join(map(str, paths))}")
        named = all(any(form in indexed for form in absolute_roots([path])) for path in paths)
        if len(targets) == len(indexed) > 1 and not everything and not named:
            raise RagidxError(
                f"{', '.join(map(str, paths))} holds every indexed document ({len(indexed)}): "
                "pass --all to remove them all, or --dry-run to list them"
            )
        counts = writer.counts()
        if dry_run:
            return RemoveReport(sorted(targets), int(writer.meta["generation"]), **counts, dry_run=True)
        generation = writer.remove_documents(list(targets.values())).generation
        counts = writer.counts()
    return RemoveReport(sorted(targets), generation, counts["documents"], counts["chunks"])


def _open_existing(index_dir: Path, tidy: bool = True) -> IndexWriter:
    """Write access to an index that has a committed generation; never creates one."""
    missing = no_index(Path(index_dir))
    if not index_exists(index_dir):
        raise missing
    writer = IndexWriter(index_dir, tidy)
    if not writer.meta.get("generation"):
        writer.close()
        raise missing
    return writer


REBUILD = "`ragidx build PATH... --rebuild` makes the index again from your documents"
UNIT_NORM_TOLERANCE = 1e-3  # every strategy stores unit vectors; float32 rounding stays far inside this


@dataclass
class Problem:
    kind: str
    detail: str
    repaired: bool = False


@dataclass
class CheckReport:
    generation: int
    problems: list[Problem] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return all(p.repaired for p in self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "healthy": self.healthy,
            "problems": [vars(p) for p in self.problems],
        }


def check(index_dir: Path, repair: bool = False, device: str = "auto") -> CheckReport:
    """Compare vectors, chunks, documents, the FTS5 table and the generation files.

    Repairs: stale generation files are deleted, the FTS5 table is rebuilt from the chunks,
    document chunk counts are recomputed, chunks without a document are deleted, vectors without
    a chunk are dropped, and chunks whose vectors are missing (a lost vector file included), not
    finite or not of unit length are re-embedded from their stored text with the index's model
    (loaded on ``device``). Each repair that touches vectors commits a new generation, so readers
    never see a half-repaired index.
    """
    read_only = index_exists(index_dir) and not writable(Path(index_dir))
    if read_only and repair:
        raise RagidxError(f"{index_dir} is read-only for this user: `ragidx check` without --repair reports")
    with _checked(index_dir, read_only) as index:
        report = CheckReport(int(index.meta["generation"]))
        damaged = damage(index.db)
        if damaged:  # nothing else read from the file can be trusted, and nothing is written onto it
            report.problems.append(Problem("database", f"SQLite quick_check: {damaged}; {REBUILD}", False))
            return report
        _check_files(index, report, repair)
        _check_fts(index, report, repair)
        for kind, (noun, detail, *_) in mend.ROW_RULES.items():
            found = mend.faulty_rows(index.db, kind)
            if found:
                report.problems.append(Problem(kind, f"{counted(found, noun)} {detail}", repair))
                if repair:
                    mend.repair_rows(index.db, kind)
        _check_vectors(index, report, repair, device)
        report.generation = int(index.meta["generation"])
    return report


@contextlib.contextmanager
def _checked(index_dir: Path, read_only: bool) -> Iterator[IndexReader | IndexWriter]:
    """The index to check: read through a reader where this user may not write its folder (which
    then writes nothing, not even the lock), else held by a writer that leaves it as found."""
    if not read_only:
        with _open_existing(index_dir, tidy=False) as writer:
            yield writer
        return
    reader = IndexReader(index_dir)
    try:
        yield reader
    finally:
        reader.close()


def _check_files(index: IndexReader | IndexWriter, report: CheckReport, repair: bool) -> None:
    stale = mend.stale_vector_files(index.directory, index.db, index.meta)
    if stale:
        report.problems.append(Problem("stale-files", ", ".join(path.name for path in stale), repair))
        if repair:
            mend.remove_files(stale)


def _check_fts(index: IndexReader | IndexWriter, report: CheckReport, repair: bool) -> None:
    fault = mend.lexical_fault(index.db, writable=isinstance(index, IndexWriter))
    if fault is None:
        return
    report.problems.append(
        Problem("lexical-index", f"FTS5 tables disagree with the chunks ({fault})", repair)
    )
    if repair:
        mend.rebuild_lexical(index.db)


def _check_vectors(index: IndexReader | IndexWriter, report: CheckReport, repair: bool, device: str) -> None:
    """Vectors must match the chunks one to one and be finite unit vectors; a repair drops the
    extra ones, leaves out parts of the store that are lost or unreadable (segment files), and
    re-embeds the missing and damaged ones from the chunks' stored text. An index that keeps no
    vectors (a lexical index) has none to check."""
    if not index.meta.get("dense", True):
        return
    try:
        inspection = index.store.inspect(index.db, index.meta)
    except RagidxError as error:  # nothing to compare with, nothing a repair could write to
        report.problems.append(Problem("vectors", str(error), False))
        return
    for _, why in inspection.unreadable:
        report.problems.append(Problem("vectors", why, repair))
    ids, vectors = inspection.ids, inspection.vectors
    dimension = int(index.meta.get("dimension") or 0)
    if vectors.size and vectors.shape[1] != dimension:
        detail = (
            f"the vectors have {vectors.shape[1]} dimensions, the index's settings say {dimension}; {REBUILD}"
        )
        report.problems.append(Problem("dimension", detail, False))
        return
    chunk_ids = all_chunk_ids(index.db)
    extra = np.setdiff1d(ids, chunk_ids)
    missing = np.setdiff1d(chunk_ids, ids)
    damaged = np.intersect1d(ids[~unit_vectors(vectors)], chunk_ids)
    for kind, found, noun in (
        ("vectors-without-chunks", extra, "vector"),
        ("chunks-without-vectors", missing, "chunk"),
        ("damaged-vectors", damaged, "vector"),
    ):
        if len(found):
            detail = counted(len(found), noun) + (
                " not finite or not of unit length" if kind == "damaged-vectors" else ""
            )
            report.problems.append(Problem(kind, detail, repair))
    if inspection.misrecorded:
        detail = f"{counted(len(inspection.misrecorded), 'segment')} whose recorded ids differ from its file"
        report.problems.append(Problem("segment-records", detail, repair))
    if repair and inspection.fix_records is not None:  # so that deletions find what the store holds
        inspection.fix_records()
    needed = len(extra) or len(missing) or len(damaged) or inspection.unreadable
    if not repair or not needed or not isinstance(index, IndexWriter):  # a repair holds a writer
        return
    writer = index
    restored = np.union1d(missing, damaged)
    with writer.next_generation(dropped=[name for name, _ in inspection.unreadable]) as pending:
        if len(restored):
            pending.restore(
                restored,
                reembed(
                    writer,
                    load_strategy(IndexSettings.of_index(index.meta, index.directory), device),
                    restored,
                ),
            )
        pending.commit(index.meta, drop_vectors=np.union1d(extra, damaged))
    if len(restored):
        report.problems.append(
            Problem("re-embedded", f"{counted(len(restored), 'chunk')} from their stored text", True)
        )


def unit_vectors(vectors: np.ndarray) -> np.ndarray:
    """Which rows are finite and of unit length (what dense search assumes)."""
    norms = np.linalg.norm(vectors, axis=1) if vectors.size else np.zeros(len(vectors))
    return np.isfinite(vectors).all(axis=1) & (np.abs(norms - 1) <= UNIT_NORM_TOLERANCE)


def reembed(
    writer: IndexWriter, strategy: Strategy, chunk_ids: np.ndarray, progress: ProgressCallback | None = None
) -> np.ndarray:
    """Vectors for chunks already in the index, from their stored text and sentence spans, as the
    build that stored them computed them; ``progress`` hears of every forward pass."""
    texts, sentences = writer.stored_chunks(chunk_ids.tolist())
    return strategy.encode(texts, "document", progress, sentences)

"""``ragidx rm`` and ``ragidx check``: remove documents, and verify (and repair) an index's parts agree."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from ragidx.indexer.changes import absolute_roots, under
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.store import DB_NAME, IndexWriter, in_batches, vectors_file
from ragidx.indexer.vector_index import stored_ids


@dataclass
class RemoveReport:
    removed: list[str]
    generation: int
    documents: int
    chunks: int


def remove(paths: Sequence[str | Path], index_dir: Path) -> RemoveReport:
    """Drop the indexed documents at or under ``paths`` (which need not exist on disk any more)."""
    if not paths:
        raise RagidxError("give at least one indexed file or folder to remove")
    roots = absolute_roots(paths)
    with _open_existing(index_dir) as writer:
        targets = {path: doc_id for path, (doc_id, _) in writer.documents().items() if under(path, roots)}
        if not targets:
            raise RagidxError(f"no indexed document at or under {', '.join(map(str, paths))}")
        empty = np.zeros((0, int(writer.meta["dimension"])), dtype=np.float32)
        generation = writer.commit([], empty, writer.meta, list(targets.values())).generation
        counts = writer.counts()
    return RemoveReport(sorted(targets), generation, counts["documents"], counts["chunks"])


def _open_existing(index_dir: Path, clean_stale: bool = True) -> IndexWriter:
    """Write access to an index that has a committed generation; never creates one."""
    missing = RagidxError(f"no index at {index_dir} (run `ragidx build PATH` first, or pass --index DIR)")
    if not (Path(index_dir) / DB_NAME).is_file():
        raise missing
    writer = IndexWriter(index_dir, clean_stale)
    if not writer.meta.get("generation"):
        writer.close()
        raise missing
    return writer


# (problem, detail, SQL counting the rows at fault, SQL repairing them)
ROW_RULES = (
    (
        "orphan-chunks",
        "{} chunks belong to no document",
        "select count(*) from chunks where document_id not in (select id from documents)",
        "delete from chunks where document_id not in (select id from documents)",
    ),
    (
        "chunk-counts",
        "{} documents have a wrong chunk count",
        "select count(*) from documents d where chunk_count != "
        "(select count(*) from chunks c where c.document_id = d.id)",
        "update documents set chunk_count = "
        "(select count(*) from chunks c where c.document_id = documents.id)",
    ),
)


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


def check(index_dir: Path, repair: bool = False) -> CheckReport:
    """Compare vectors, chunks, documents, the FTS5 table and the generation files.

    Repairs: stale generation files are deleted, the FTS5 table is rebuilt from the chunks,
    document chunk counts are recomputed, chunks without a document are deleted, vectors without
    a chunk are dropped, and documents with chunks but no vectors are removed (the next build
    re-embeds them, since they are then new). Each repair that touches vectors commits a new
    generation, so readers never see a half-repaired index.
    """
    with _open_existing(index_dir, clean_stale=False) as writer:
        report = CheckReport(int(writer.meta["generation"]))
        db = writer.db
        _check_files(writer, report, repair)
        _check_fts(db, report, repair)
        for kind, detail, count_sql, repair_sql in ROW_RULES:
            found = db.execute(count_sql).fetchone()[0]
            if found:
                report.problems.append(Problem(kind, detail.format(found), repair))
                if repair:
                    with db.atomic():
                        db.execute(repair_sql)
        _check_vectors(writer, report, repair)
        report.generation = int(writer.meta["generation"])
    return report


def _check_files(writer: IndexWriter, report: CheckReport, repair: bool) -> None:
    current = vectors_file(writer.directory, writer.meta["generation"]).name
    stale = sorted(p.name for p in writer.directory.glob("vectors-*.faiss*") if p.name != current)
    if stale:
        report.problems.append(Problem("stale-files", ", ".join(stale), repair))
        if repair:
            for name in stale:
                (writer.directory / name).unlink(missing_ok=True)


def _check_fts(db: Any, report: CheckReport, repair: bool) -> None:
    try:
        db.execute("insert into chunks_fts(chunks_fts, rank) values('integrity-check', 1)")
        return
    except sqlite3.DatabaseError as error:
        report.problems.append(
            Problem("lexical-index", f"FTS5 table disagrees with the chunks ({error})", repair)
        )
    if repair:
        with db.atomic():
            db.execute("insert into chunks_fts(chunks_fts) values('rebuild')")


def _check_vectors(writer: IndexWriter, report: CheckReport, repair: bool) -> None:
    unreadable = False
    try:
        stored = writer.current_vectors()
        vector_ids = set(np.setdiff1d(stored_ids(stored.index), stored.tombstones).tolist())
    except RagidxError as error:
        report.problems.append(Problem("vectors", str(error), repair))
        vector_ids, unreadable = set(), True
    chunk_ids = {row[0] for row in writer.db.execute("select id from chunks").fetchall()}
    extra = sorted(vector_ids - chunk_ids)
    missing = sorted(chunk_ids - vector_ids)
    if extra:
        report.problems.append(Problem("vectors-without-chunks", f"{len(extra)} vectors", repair))
    if missing:
        report.problems.append(Problem("chunks-without-vectors", f"{len(missing)} chunks", repair))
    if not repair or not (extra or missing):
        return
    documents = _documents_of(writer, missing)
    empty = np.zeros((0, int(writer.meta["dimension"])), dtype=np.float32)
    drop = np.array(extra, dtype=np.int64)
    writer.commit([], empty, writer.meta, documents, drop_vectors=drop, fresh_vectors=unreadable)
    if documents:
        report.problems.append(
            Problem(
                "removed", f"{len(documents)} documents without vectors: build again to re-add them", True
            )
        )


def _documents_of(writer: IndexWriter, chunk_ids: list[int]) -> list[int]:
    found: set[int] = set()
    for batch in in_batches(chunk_ids):
        marks = ",".join("?" for _ in batch)
        rows = writer.db.execute(f"select distinct document_id from chunks where id in ({marks})", batch)
        found.update(row[0] for row in rows)
    return sorted(found)

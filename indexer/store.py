"""The index on disk: SQLite rows (sqlite-utils, WAL) plus one FAISS file per generation.

Commit protocol: the new FAISS file is written under a new generation name and fsynced; then one
SQLite transaction replaces the rows and records the new generation; only then are older
generation files deleted. A crash at any point leaves the previous generation readable.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import functools
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragidx.indexer.errors import IndexLocked, RagidxError
from ragidx.indexer.faults import checkpoint
from ragidx.indexer.lexical import (
    CJK_TABLE,
    add_cjk_rows,
    create_cjk_table,
    fill_cjk_table,
    match_expression,
    remove_cjk_rows,
    rewrite_chunk_text,
)
from ragidx.indexer.sources import span_pages
from ragidx.indexer.vector_index import VectorIndex, VectorIndexSettings, update

if TYPE_CHECKING:
    from sqlite_utils import Database

    from ragidx.indexer.chunking import Chunk
    from ragidx.indexer.filters import Filters
    from ragidx.indexer.sources import SourceDocument

SCHEMA_VERSION = 1
DB_NAME = "ragidx.db"
LOCK_NAME = "build.lock"
DEFAULT_INDEX_DIR = ".ragidx"
GENERATION_FILE = re.compile(r"vectors-(\d+)\.faiss(?:\.partial)?")


def default_index_dir() -> Path:
    """``$RAGIDX_INDEX`` or ``./.ragidx``."""
    return Path(os.environ.get("RAGIDX_INDEX") or DEFAULT_INDEX_DIR)


def no_index(directory: Path) -> RagidxError:
    """The one error for a folder holding no committed index (none yet, or a first build running)."""
    return RagidxError(
        f"no index at {directory}: no build has completed there "
        "(run `ragidx build PATH` first, or pass --index DIR)"
    )


def index_exists(directory: str | Path) -> bool:
    """Whether ``directory`` holds an index database (committed or not)."""
    return (Path(directory) / DB_NAME).is_file()


def vectors_file(directory: Path, generation: int) -> Path:
    return directory / f"vectors-{generation}.faiss"


@dataclass(frozen=True)
class DocumentRecord:
    """A document and its chunks, ready to be written."""

    source: SourceDocument
    chunks: list[Chunk]
    metadata: dict[str, Any]


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _connect(path: Path) -> Database:
    """A connection any thread may use; callers that share one (the HTTP server) serialise access."""
    from sqlite_utils import Database

    db = Database(sqlite3.connect(str(path), check_same_thread=False))
    db.execute("PRAGMA busy_timeout = 10000")
    return db


def _create_schema(db: Database) -> None:
    db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db["documents"].create(
        {
            "id": int,
            "path": str,
            "content_hash": str,
            "size": int,
            "mtime": float,
            "title": str,
            "kind": str,
            "metadata": str,
            "chunk_count": int,
            "indexed_at": float,
            "page_starts": str,
        },
        pk="id",
        not_null={"path", "content_hash"},
        if_not_exists=True,
    )
    if "page_starts" not in db["documents"].columns_dict:  # added with PDF support; null elsewhere
        db["documents"].add_column("page_starts", str)
    db["documents"].create_index(["path"], unique=True, if_not_exists=True)
    db["chunks"].create(
        {
            "id": int,
            "document_id": int,
            "ordinal": int,
            "text": str,
            "char_start": int,
            "char_end": int,
            "token_count": int,
            "sentences": str,
        },
        pk="id",
        foreign_keys=[("document_id", "documents", "id")],
        if_not_exists=True,
    )
    db["chunks"].create_index(["document_id"], if_not_exists=True)
    db["tombstones"].create({"chunk_id": int}, pk="chunk_id", if_not_exists=True)
    if not db["chunks_fts"].exists():
        db["chunks"].enable_fts(["text"], create_triggers=True, tokenize="porter")
    create_cjk_table(db)


def _counts(db: Database) -> dict[str, int]:
    return {"documents": db["documents"].count, "chunks": db["chunks"].count}


def _chunk_ids(db: Database) -> np.ndarray:
    rows = db.execute("select id from chunks order by id").fetchall()
    return np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))


def _read_tombstones(db: Database) -> np.ndarray:
    """Deleted chunk ids still in an HNSW graph (see :mod:`ragidx.indexer.vector_index`)."""
    if not db["tombstones"].exists():
        return np.zeros(0, dtype=np.int64)
    rows = db.execute("select chunk_id from tombstones order by chunk_id").fetchall()
    return np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))


def _read_vectors(directory: Path, db: Database, meta: dict[str, Any]) -> VectorIndex:
    """The generation's FAISS file with its settings and tombstones; RuntimeError if unreadable."""
    import faiss

    index = faiss.read_index(str(vectors_file(directory, meta["generation"])))
    return VectorIndex(index, VectorIndexSettings.from_meta(meta), _read_tombstones(db))


def _newer_vector_files(directory: Path, generation: int) -> list[Path]:
    """Vector files (complete or being written) of generations after ``generation``."""
    found = (GENERATION_FILE.fullmatch(p.name) for p in directory.glob("vectors-*.faiss*"))
    return [directory / m.group(0) for m in found if m and int(m.group(1)) > generation]


def read_meta(db: Database) -> dict[str, Any]:
    if not db["meta"].exists():
        return {}
    return {row["key"]: json.loads(row["value"]) for row in db["meta"].rows}


@dataclass(frozen=True)
class Committed:
    """A committed generation, its vector index settings, and why the vector index was rebuilt."""

    generation: int
    vector_index: VectorIndexSettings
    rebuilt: str = ""


class IndexReader:
    """Read access to a committed index: its settings, its vectors, and its rows."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        path = self.directory / DB_NAME
        if not path.is_file():
            raise no_index(self.directory)
        try:
            self.db = _connect(path)
            self.meta = read_meta(self.db)
        except sqlite3.DatabaseError as error:
            raise RagidxError(f"index database {path} is unreadable: {error}") from error
        if not self.meta.get("generation"):
            raise no_index(self.directory)
        if self.meta.get("schema_version") != SCHEMA_VERSION:
            raise RagidxError(
                f"index at {self.directory} has schema {self.meta.get('schema_version')}, this ragidx reads "
                f"{SCHEMA_VERSION}: rebuild it"
            )

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read transaction: every read inside sees the same committed generation (WAL), even
        while a build commits the next one."""
        self.db.execute("begin")
        try:
            yield
        finally:
            self.db.execute("rollback")

    def load_vectors(self) -> VectorIndex | None:
        """The vector index of ``meta["generation"]``, or None when a newer build already replaced
        (and deleted) that file: take a new :meth:`snapshot` and read the new generation."""
        generation = int(self.meta["generation"])
        path = vectors_file(self.directory, generation)
        try:
            return _read_vectors(self.directory, self.db, self.meta)
        except RuntimeError as error:
            if path.exists():
                raise RagidxError(f"vector file {path} is unreadable: {error}".splitlines()[0]) from error
        if not _newer_vector_files(self.directory, generation):
            # A file is deleted only after a newer one is committed: this one was lost, not replaced.
            raise RagidxError(f"vector file {path} is missing: run `ragidx check --repair` to re-embed it")
        return None

    def chunk_rows(self, chunk_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Chunks joined with their documents, keyed by chunk id (ids that no longer exist are absent)."""
        if not chunk_ids:
            return {}
        marks = ",".join("?" for _ in chunk_ids)
        sql = f"""
            select c.id as chunk_id, c.text, c.char_start, c.char_end, c.ordinal, c.token_count,
                   c.sentences, d.path, d.title, d.metadata, d.id as document_id, {self._page_starts}
            from chunks c join documents d on d.id = c.document_id
            where c.id in ({marks})
        """
        found = {}
        for row in self.db.query(sql, [int(i) for i in chunk_ids]):
            page_starts = json.loads(row.pop("page_starts") or "null")
            found[row["chunk_id"]] = {
                **row,
                "metadata": json.loads(row["metadata"] or "{}"),
                "sentences": [tuple(span) for span in json.loads(row["sentences"] or "[]")],
                "pages": span_pages(page_starts, row["char_start"], row["char_end"]),
            }
        return found

    @functools.cached_property
    def _page_starts(self) -> str:
        """The page-starts column, or null for an index written before it existed."""
        return (
            "d.page_starts" if "page_starts" in self.db["documents"].columns_dict else "null as page_starts"
        )

    def filtered_chunk_ids(self, filters: Filters) -> np.ndarray:
        """Ids of the chunks whose documents pass ``filters``, ascending."""
        condition, params = filters.document_condition()
        rows = self.db.execute(
            f"select c.id from chunks c join documents d on d.id = c.document_id where {condition} "
            "order by c.id",
            params,
        ).fetchall()
        return np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))

    def lexical_search(
        self, query: str, limit: int, filters: Filters | None = None
    ) -> list[tuple[int, float]]:
        """Chunk ids and BM25 scores (higher is better) from the FTS5 table, best first.

        The query's words are each quoted, so FTS5 syntax in user text (quotes, ``*``, ``-``,
        ``NEAR``, parentheses) is matched as plain words and never raises; content words are
        OR-ed, as BM25 ranking expects (see :func:`match_expression`). Filters restrict the match
        itself, so ``limit`` matching chunks come back whenever that many exist.
        """
        found = match_expression(query)
        if found is None or not self.db[found[0]].exists():  # an index not written since CJK support
            return []
        table, match = found
        restriction, params = "", []
        if filters:
            condition, params = filters.document_condition()
            restriction = (
                " and rowid in (select c.id from chunks c join documents d on d.id = c.document_id "
                f"where {condition})"
            )
        rows = self.db.execute(
            f"select rowid, bm25({table}) from {table} where {table} match ?{restriction} "
            f"order by bm25({table}), rowid limit ?",
            [match, *params, int(limit)],
        ).fetchall()
        return [(int(rowid), -float(rank)) for rowid, rank in rows]

    def document_ids(self, chunk_ids: Sequence[int]) -> dict[int, int]:
        """Each chunk's document id (chunks that no longer exist are absent)."""
        found: dict[int, int] = {}
        for batch in in_batches([int(i) for i in chunk_ids]):
            marks = ",".join("?" for _ in batch)
            found.update(self.db.execute(f"select id, document_id from chunks where id in ({marks})", batch))
        return found

    def document_rows(self, path: str | None = None) -> list[dict[str, Any]]:
        """Indexed documents (all, or the one at ``path``) by path: title, kind, content hash,
        chunk count, metadata and page starts (null unless paged)."""
        where, params = ("where path = ?", [path]) if path is not None else ("", [])
        sql = f"""
            select path, title, kind, content_hash, size, chunk_count, metadata, {self._page_starts}
            from documents d {where} order by path
        """
        return [
            {
                **row,
                "metadata": json.loads(row["metadata"] or "{}"),
                "page_starts": json.loads(row["page_starts"] or "null"),
            }
            for row in self.db.query(sql, params)
        ]

    def counts(self) -> dict[str, int]:
        return _counts(self.db)

    def reread_meta(self) -> dict[str, Any]:
        """The settings as committed now (another process may have built or tuned since)."""
        self.meta = read_meta(self.db)
        return self.meta

    def bytes_on_disk(self) -> int:
        return sum(path.stat().st_size for path in self.directory.glob("*") if path.is_file())

    def chunk_ids(self) -> np.ndarray:
        return _chunk_ids(self.db)

    def chunk_source(self, chunk_id: int) -> tuple[int, int, str, int, str]:
        """A chunk's id, document id, text, start offset and sentence spans (JSON), as stored."""
        return self.db.execute(
            "select id, document_id, text, char_start, sentences from chunks where id = ?", [int(chunk_id)]
        ).fetchone()

    @contextlib.contextmanager
    def chunk_text_replaced(self, chunk_id: int, text: str) -> Iterator[None]:
        """Inside the block the chunk's full-text entry holds ``text``; the transaction is rolled
        back on leaving, so nothing is ever committed (tuning scores a chunk's remainder this way)."""
        self.db.execute("begin")
        try:
            rewrite_chunk_text(self.db, chunk_id, text)
            yield
        finally:
            self.db.execute("rollback")

    def close(self) -> None:
        self.db.close()


class IndexWriter:
    """Exclusive write access to an index directory, held for the whole build."""

    def __init__(self, directory: str | Path, clean_stale: bool = True):
        """``clean_stale=False`` leaves crashed builds' leftovers in place (for ``check`` to report)."""
        self.directory = Path(directory)
        self.meta: dict[str, Any] = {}
        self._created = [p for p in (self.directory, *self.directory.parents) if not p.exists()]
        self.directory.mkdir(parents=True, exist_ok=True)
        self._new_files = [p for p in self._files() if not p.exists()]
        self._lock_file = open(self.directory / LOCK_NAME, "w")  # noqa: SIM115 - held until close()
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise IndexLocked(f"index {self.directory} is locked: another build is writing to it") from None
        path = self.directory / DB_NAME
        try:
            self.db = _connect(path)
            self.db.enable_wal()
            _create_schema(self.db)
            self.meta = read_meta(self.db)
            if clean_stale and self.meta.get("generation"):
                self.remove_stale_vector_files()  # leftovers of crashed builds
        except sqlite3.DatabaseError as error:
            self.close()
            raise RagidxError(
                f"index database {path} is unreadable ({error}); move it away or build into another --index"
            ) from error

    def __enter__(self) -> IndexWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the index; a first build that committed nothing leaves no files behind."""
        with contextlib.suppress(Exception):
            self.db.close()
        if not self.meta.get("generation"):
            for path in self._new_files:
                path.unlink(missing_ok=True)
            for folder in self._created:  # innermost first; only the ones this writer made
                with contextlib.suppress(OSError):
                    folder.rmdir()
        self._lock_file.close()

    def _files(self) -> list[Path]:
        """What a writer may create in its folder: the lock and the database with its WAL files."""
        db = self.directory / DB_NAME
        return [
            self.directory / LOCK_NAME,
            db,
            db.with_name(DB_NAME + "-wal"),
            db.with_name(DB_NAME + "-shm"),
        ]

    def counts(self) -> dict[str, int]:
        return _counts(self.db)

    def documents(self) -> dict[str, tuple[int, str]]:
        """Every indexed document's path with its id and content hash."""
        rows = self.db.execute("select path, id, content_hash from documents").fetchall()
        return {path: (doc_id, content_hash) for path, doc_id, content_hash in rows}

    @contextlib.contextmanager
    def next_generation(self, removed: Sequence[int] = (), replace: bool = False) -> Iterator[NextGeneration]:
        """Write the next generation: the documents ``removed`` (ids), or all when ``replace``, are
        dropped, rows are added as they come inside one open SQLite transaction (readers keep
        seeing the committed generation), and :meth:`NextGeneration.commit` writes the vectors and
        commits. Leaving the block without committing rolls everything back."""
        pending = NextGeneration(self, removed, replace)
        try:
            yield pending
        finally:
            if self.db.conn.in_transaction:
                self.db.rollback()

    def commit(
        self,
        records: Sequence[DocumentRecord],
        vectors: np.ndarray,
        meta: dict[str, Any],
        removed: Sequence[int] = (),
        replace: bool = False,
        **options: Any,
    ) -> Committed:
        """:meth:`next_generation` in one call: add ``records`` (``vectors`` one row per chunk, in
        record order), drop ``removed``; ``options`` go to :meth:`NextGeneration.commit`."""
        with self.next_generation(removed, replace) as pending:
            pending.add(records, vectors)
            return pending.commit(meta, **options)

    def update_meta(self, values: dict[str, Any]) -> None:
        """Commit settings that belong to no generation (the tuned fusion weights) on their own;
        readers pick them up at their next search."""
        self.db.begin()
        self.db["meta"].upsert_all(({"key": k, "value": json.dumps(v)} for k, v in values.items()), pk="key")
        self.db.commit()
        self.meta = {**self.meta, **values}

    def _chunk_ids_of(self, document_ids: Sequence[int]) -> np.ndarray:
        found: list[int] = []
        for batch in in_batches(list(document_ids)):
            marks = ",".join("?" for _ in batch)
            rows = self.db.execute(f"select id from chunks where document_id in ({marks})", batch).fetchall()
            found.extend(row[0] for row in rows)
        return np.array(found, dtype=np.int64)

    def _write_vectors(self, generation: int, vectors: VectorIndex) -> None:
        """The next generation's FAISS file, fsynced and renamed into place."""
        import faiss

        final = vectors_file(self.directory, generation)
        partial = final.with_suffix(".faiss.partial")
        faiss.write_index(vectors.index, str(partial))
        checkpoint("faiss-write")
        _fsync(partial)
        os.replace(partial, final)
        _fsync(self.directory)
        checkpoint("faiss-renamed")

    def current_vectors(self) -> VectorIndex | None:
        if not self.meta.get("generation"):
            return None
        path = vectors_file(self.directory, self.meta["generation"])
        if not path.exists():
            raise RagidxError(f"vector file {path} is missing; run `ragidx check --repair` to re-embed it")
        try:
            return _read_vectors(self.directory, self.db, self.meta)
        except RuntimeError as error:
            raise RagidxError(
                f"vector file {path} is unreadable ({str(error).splitlines()[0]}); "
                "run `ragidx check --repair` to re-embed it"
            ) from error

    def vectors_lost(self) -> bool:
        """Whether the committed generation's vector file is gone (a cheap test, for every build)."""
        return (
            bool(self.meta.get("generation"))
            and not vectors_file(self.directory, self.meta["generation"]).exists()
        )

    def stored_chunks(self, chunk_ids: Sequence[int]) -> tuple[list[str], list[list[tuple[int, int]]]]:
        """The text of chunks and their sentence spans relative to the chunk: what embedding took."""
        rows: dict[int, tuple[str, int, str]] = {}
        for batch in in_batches([int(i) for i in chunk_ids]):
            marks = ",".join("?" for _ in batch)
            sql = f"select id, text, char_start, sentences from chunks where id in ({marks})"
            rows.update((row[0], row[1:]) for row in self.db.execute(sql, batch))
        texts, spans = [], []
        for chunk_id in chunk_ids:
            text, start, sentences = rows[int(chunk_id)]
            texts.append(text)
            spans.append([(a - start, b - start) for a, b in json.loads(sentences or "[]")])
        return texts, spans

    def chunk_ids(self) -> np.ndarray:
        return _chunk_ids(self.db)

    def remove_documents(self, document_ids: Sequence[int], **options: Any) -> Committed:
        """Commit a generation without these documents and adding nothing; ``options`` go to
        :meth:`NextGeneration.commit`."""
        empty = np.zeros((0, int(self.meta.get("dimension") or 0)), dtype=np.float32)
        return self.commit([], empty, self.meta, document_ids, **options)

    def stale_vector_files(self, keep: int | None = None) -> list[Path]:
        """Generation files other than ``keep``'s (default: the committed generation's): older
        generations and leftovers of crashed builds."""
        current = vectors_file(self.directory, keep if keep is not None else self.meta["generation"]).name
        return sorted(path for path in self.directory.glob("vectors-*.faiss*") if path.name != current)

    def remove_stale_vector_files(self, keep: int | None = None) -> None:
        for path in self.stale_vector_files(keep):
            path.unlink(missing_ok=True)

    def faulty_rows(self, rule: str) -> int:
        """How many rows break ``rule``, one of :data:`ROW_RULES`."""
        return int(self.db.execute(ROW_RULES[rule][2]).fetchone()[0])

    def repair_rows(self, rule: str) -> None:
        with self.db.atomic():
            self.db.execute(ROW_RULES[rule][3])

    def lexical_fault(self) -> str | None:
        """Why the FTS5 tables disagree with the chunks, or None when they agree."""
        try:
            self.db.execute("insert into chunks_fts(chunks_fts, rank) values('integrity-check', 1)")
            self.db.execute(f"insert into {CJK_TABLE}({CJK_TABLE}) values('integrity-check')")
        except sqlite3.DatabaseError as error:
            return str(error)
        return None

    def rebuild_lexical(self) -> None:
        """Refill both full-text tables from the chunks."""
        with self.db.atomic():
            self.db.execute("insert into chunks_fts(chunks_fts) values('rebuild')")
            self.db.execute(f"insert into {CJK_TABLE}({CJK_TABLE}) values('delete-all')")
            fill_cjk_table(self.db)


class NextGeneration:
    """A generation being written; see :meth:`IndexWriter.next_generation`."""

    def __init__(self, writer: IndexWriter, removed: Sequence[int], replace: bool):
        self.writer = writer
        self.db = writer.db
        self.replace = replace
        self.removed_chunks = writer._chunk_ids_of(removed)  # read before their rows go
        self.next_id = int(writer.meta.get("next_chunk_id", 1))
        self.vectors: list[np.ndarray] = []
        self.ids: list[np.ndarray] = []
        self.now = time.time()
        self.db.begin()
        if replace:
            self.db.execute("delete from chunks")
            self.db.execute("delete from documents")
            self.db.execute(f"insert into {CJK_TABLE} ({CJK_TABLE}) values ('delete-all')")
        for batch in in_batches(list(removed)):
            marks = ",".join("?" for _ in batch)
            old = self.db.execute(f"select id, text from chunks where document_id in ({marks})", batch)
            remove_cjk_rows(self.db, old.fetchall())
            self.db.execute(f"delete from chunks where document_id in ({marks})", batch)
            self.db.execute(f"delete from documents where id in ({marks})", batch)

    def add(self, records: Sequence[DocumentRecord], vectors: np.ndarray) -> None:
        """Insert ``records`` and keep their ``vectors`` (one row per chunk, in record order)."""
        n_chunks = sum(len(r.chunks) for r in records)
        if vectors.shape[0] != n_chunks:
            raise ValueError(f"{vectors.shape[0]} vectors for {n_chunks} chunks")
        for record in records:
            document_id = self.db["documents"].insert(_document_row(record, self.now)).last_pk
            first = self.next_id
            self.db["chunks"].insert_all(
                _chunk_row(chunk, document_id, first + offset) for offset, chunk in enumerate(record.chunks)
            )
            add_cjk_rows(
                self.db, ((first + offset, chunk.text) for offset, chunk in enumerate(record.chunks))
            )
            self.next_id += len(record.chunks)
        if n_chunks:
            self.vectors.append(np.asarray(vectors, dtype=np.float32))
            self.ids.append(np.arange(self.next_id - n_chunks, self.next_id, dtype=np.int64))

    def restore(self, chunk_ids: np.ndarray, vectors: np.ndarray) -> None:
        """Give chunks already in the index (whose vectors were lost or damaged) new ``vectors``."""
        if len(chunk_ids) != vectors.shape[0]:
            raise ValueError(f"{vectors.shape[0]} vectors for {len(chunk_ids)} chunks")
        if len(chunk_ids):
            self.vectors.append(np.asarray(vectors, dtype=np.float32))
            self.ids.append(np.asarray(chunk_ids, dtype=np.int64))

    def commit(
        self,
        meta: dict[str, Any],
        drop_vectors: np.ndarray | None = None,
        fresh_vectors: bool = False,
        vector_index: VectorIndexSettings | None = None,
    ) -> Committed:
        """Write the vector file (previous vectors minus the removed plus the added), then commit.

        ``vector_index`` is the index type and parameters asked for (default: the index's own).
        For repairs: ``drop_vectors`` are ids to remove from the vectors alone, and
        ``fresh_vectors`` starts from no vectors instead of the current (unreadable) file.
        Chunk ids are never reused, so a reader holding the previous generation's vectors can
        never be joined to a different chunk's text.
        """
        writer = self.writer
        generation = int(writer.meta.get("generation", 0)) + 1
        removed = self.removed_chunks
        if drop_vectors is not None:
            removed = np.concatenate([removed, drop_vectors])
        current = None if self.replace or fresh_vectors else writer.current_vectors()
        requested = vector_index or VectorIndexSettings.from_meta(writer.meta)
        added = (
            np.concatenate(self.vectors)
            if self.vectors
            else np.zeros((0, int(meta.get("dimension") or 0)), np.float32)
        )
        ids = np.concatenate(self.ids) if self.ids else np.zeros(0, dtype=np.int64)
        self.vectors, self.ids = [], []
        updated = update(current, requested, added, ids, removed)
        del added
        writer._write_vectors(generation, updated.vectors)
        self.db.execute("delete from tombstones")
        self.db.conn.executemany(
            "insert into tombstones (chunk_id) values (?)", ((int(i),) for i in updated.vectors.tombstones)
        )
        stamp = datetime.datetime.fromtimestamp(self.now, datetime.timezone.utc).isoformat(timespec="seconds")
        new_meta = {
            **meta,
            "schema_version": SCHEMA_VERSION,
            "generation": generation,
            "next_chunk_id": self.next_id,
            "vector_index": updated.vectors.settings.to_meta(),
            "updated_at": stamp,
        }
        new_meta.setdefault("created_at", writer.meta.get("created_at", stamp))
        self.db["meta"].upsert_all(
            ({"key": k, "value": json.dumps(v)} for k, v in new_meta.items()), pk="key"
        )
        checkpoint("sqlite-commit")
        self.db.commit()
        writer.meta = {**writer.meta, **new_meta}  # as the table now reads: keys not written stay
        writer.remove_stale_vector_files(generation)
        return Committed(generation, updated.vectors.settings, updated.rebuilt)


# rule: (what is counted, detail, SQL counting the rows at fault, SQL repairing them)
ROW_RULES = {
    "orphan-chunks": (
        "chunk",
        "belonging to no document",
        "select count(*) from chunks where document_id not in (select id from documents)",
        "delete from chunks where document_id not in (select id from documents)",
    ),
    "chunk-counts": (
        "document",
        "with a wrong chunk count",
        "select count(*) from documents d where chunk_count != "
        "(select count(*) from chunks c where c.document_id = d.id)",
        "update documents set chunk_count = "
        "(select count(*) from chunks c where c.document_id = documents.id)",
    ),
}
SQL_BATCH = 500  # ids per "in (...)" list, well under SQLite's parameter limit


def in_batches(ids: list[int]) -> list[list[int]]:
    return [ids[i : i + SQL_BATCH] for i in range(0, len(ids), SQL_BATCH)]


def _document_row(record: DocumentRecord, now: float) -> dict[str, Any]:
    source = record.source
    return {
        "path": source.path,
        "content_hash": source.content_hash,
        "size": source.size,
        "mtime": source.mtime,
        "title": source.title,
        "kind": source.kind,
        "metadata": json.dumps(record.metadata),
        "chunk_count": len(record.chunks),
        "indexed_at": now,
        "page_starts": json.dumps(source.page_starts) if source.page_starts is not None else None,
    }


def _chunk_row(chunk: Chunk, document_id: int, chunk_id: int) -> dict[str, Any]:
    return {
        "id": chunk_id,
        "document_id": document_id,
        "ordinal": chunk.ordinal,
        "text": chunk.text,
        "char_start": chunk.start,
        "char_end": chunk.end,
        "token_count": chunk.token_count,
        "sentences": json.dumps(chunk.sentences),
    }

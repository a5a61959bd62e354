"""The index on disk: SQLite rows (sqlite-utils, WAL) plus one FAISS file per generation.

A generation's vectors are segments (:mod:`ragidx.indexer.segments`). Commit protocol: the new
segment files (the build's vectors, and the merge run while it embedded) are written under the
new generation's names and fsynced; then one SQLite transaction replaces the rows, the segment
list and the deletions, and records the new generation; only then are files no longer listed
deleted. A crash at any point leaves the previous generation readable.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import functools
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
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
from ragidx.indexer.milvus_store import (
    LOCAL_FILE,
    MilvusCollection,
    MilvusLocation,
    MilvusVectors,
    id_list,
    visible,
)
from ragidx.indexer.segments import (
    BackgroundMerge,
    Segment,
    SegmentedVectors,
    SegmentUnreadable,
    create_segment_tables,
    file_generation,
    index_settings,
    load_segments,
    new_segment,
    plan_merge,
    read_segments,
    segment_file,
    segment_files,
    write_segments,
)
from ragidx.indexer.sources import span_pages
from ragidx.indexer.vector_index import VectorIndexSettings

if TYPE_CHECKING:
    from sqlite_utils import Database

    from ragidx.indexer.chunking import Chunk
    from ragidx.indexer.filters import Filters
    from ragidx.indexer.sources import SourceDocument

SCHEMA_VERSION = 1
DB_NAME = "ragidx.db"
LOCK_NAME = "build.lock"
DEFAULT_INDEX_DIR = ".ragidx"


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


@dataclass(frozen=True)
class DocumentRecord:
    """A document and its chunks, ready to be written."""

    source: SourceDocument
    chunks: list[Chunk]
    metadata: dict[str, Any]


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
    create_segment_tables(db)
    if not db["chunks_fts"].exists():
        db["chunks"].enable_fts(["text"], create_triggers=True, tokenize="porter")
    create_cjk_table(db)


def _counts(db: Database) -> dict[str, int]:
    return {"documents": db["documents"].count, "chunks": db["chunks"].count}


def _chunk_ids(db: Database) -> np.ndarray:
    rows = db.execute("select id from chunks order by id").fetchall()
    return np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))


def _newer_vector_files(directory: Path, generation: int) -> list[Path]:
    """Vector files (complete or being written) of generations after ``generation``."""
    return [
        path for path in directory.glob("vectors-*.faiss*") if (file_generation(path.name) or 0) > generation
    ]


def read_meta(db: Database) -> dict[str, Any]:
    if not db["meta"].exists():
        return {}
    return {row["key"]: json.loads(row["value"]) for row in db["meta"].rows}


@dataclass(frozen=True)
class Committed:
    """A committed generation, its vector index settings, why every segment was rebuilt, and what
    was merged."""

    generation: int
    vector_index: VectorIndexSettings
    rebuilt: str = ""
    merged: str = ""  # which segments were merged, when that was for size or deletions
    segments: int = 0


class IndexReader:
    """Read access to a committed index: its settings, its vectors, and its rows."""

    def __init__(self, directory: str | Path):
        self._collection: MilvusCollection | None = None
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

    def load_vectors(
        self, reuse: SegmentedVectors | MilvusVectors | None = None
    ) -> SegmentedVectors | MilvusVectors | None:
        """The segments of ``meta["generation"]`` (those in ``reuse`` not read again), or None when
        a newer build already merged (and deleted) one of them: take a new :meth:`snapshot` and
        read the new generation. An index in Milvus gives its collection, searched as committed."""
        location = MilvusLocation.from_meta(self.meta)
        if location is not None:
            settings = VectorIndexSettings.from_meta(self.meta)
            return MilvusVectors(self._milvus(location), settings, visible(self.meta))
        reuse = reuse if isinstance(reuse, SegmentedVectors) else None
        segments = read_segments(self.db, self.meta, self.directory)
        try:
            return load_segments(self.directory, segments, VectorIndexSettings.from_meta(self.meta), reuse)
        except SegmentUnreadable as error:
            # A file is deleted only after a newer one is committed: else it was lost, not replaced.
            if error.missing and _newer_vector_files(self.directory, int(self.meta["generation"])):
                return None
            raise

    def _milvus(self, location: MilvusLocation) -> MilvusCollection:
        """The index's collection, connected and verified once per reader."""
        if self._collection is None or self._collection.location != location:
            collection = MilvusCollection(location)
            collection.verify(int(self.meta.get("dimension") or 0))
            self._collection = collection
        return self._collection

    def segment_rows(self) -> list[dict[str, Any]]:
        """Each segment's file, structure and vector counts, largest first (for ``info``)."""
        return [
            {"file": s.file, "kind": s.kind, "vectors": len(s.ids), "deleted": len(s.deleted)}
            for s in read_segments(self.db, self.meta, self.directory)
        ]

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
        if self._collection is not None:
            self._collection.close()


class IndexWriter:
    """Exclusive write access to an index directory, held for the whole build."""

    def __init__(self, directory: str | Path, clean_stale: bool = True):
        """``clean_stale=False`` leaves crashed builds' leftovers in place (for ``check`` to report)."""
        self.directory = Path(directory)
        self.meta: dict[str, Any] = {}
        self._collections: dict[MilvusLocation, MilvusCollection] = {}
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
            self.settle_milvus()  # check too: owed rows would read as vectors without chunks
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
        for collection in self._collections.values():
            collection.close()
        if not self.meta.get("generation"):
            for path in self._new_files:
                if path.is_dir():  # milvus-lite's folder
                    shutil.rmtree(path, ignore_errors=True)
                path.unlink(missing_ok=True)
            for folder in self._created:  # innermost first; only the ones this writer made
                with contextlib.suppress(OSError):
                    folder.rmdir()
        self._lock_file.close()

    def _files(self) -> list[Path]:
        """What a writer may create in its folder: the lock, the database with its WAL files, and
        a milvus-lite folder."""
        db = self.directory / DB_NAME
        return [
            self.directory / LOCK_NAME,
            self.directory / LOCAL_FILE,
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
    def next_generation(
        self,
        removed: Sequence[int] = (),
        replace: bool = False,
        vector_index: VectorIndexSettings | None = None,
        dropped_segments: Sequence[str] = (),
    ) -> Iterator[NextGeneration]:
        """Write the next generation: the documents ``removed`` (ids), or all when ``replace``, are
        dropped, rows are added as they come inside one open SQLite transaction (readers keep
        seeing the committed generation), and :meth:`NextGeneration.commit` writes the vectors and
        commits. Segments are merged in the background meanwhile. ``vector_index``: the index type
        and parameters asked for (default: the index's own); ``dropped_segments``: files lost or
        unreadable, left out (the caller restores their chunks). Leaving the block without
        committing rolls everything back."""
        pending = NextGeneration(self, removed, replace, vector_index, dropped_segments)
        try:
            yield pending
        finally:
            pending.abandon()
            if self.db.conn.in_transaction:
                self.db.rollback()

    def commit(
        self,
        records: Sequence[DocumentRecord],
        vectors: np.ndarray,
        meta: dict[str, Any],
        removed: Sequence[int] = (),
        replace: bool = False,
        vector_index: VectorIndexSettings | None = None,
    ) -> Committed:
        """:meth:`next_generation` in one call: add ``records`` (``vectors`` one row per chunk, in
        record order), drop ``removed``."""
        with self.next_generation(removed, replace, vector_index) as pending:
            pending.add(records, vectors)
            return pending.commit(meta)

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

    def milvus(self, location: MilvusLocation) -> MilvusCollection:
        """A collection, connected once per writer."""
        if location not in self._collections:
            self._collections[location] = MilvusCollection(location)
        return self._collections[location]

    def settle_milvus(self) -> None:
        """Make the Milvus deletions a committed generation still owes (a build stopped between
        its commit and them leaves them to the next writer)."""
        location, owed = MilvusLocation.from_meta(self.meta), self.meta.get("milvus_owed")
        if location is not None and owed:
            checkpoint("milvus-delete")
            self.milvus(location).delete(owed)
            self.update_meta({"milvus_owed": None})

    def segments(self) -> list[Segment]:
        """The committed generation's segments, largest first."""
        return read_segments(self.db, self.meta, self.directory)

    def load(self, segments: Sequence[Segment]) -> SegmentedVectors:
        """Read these segments' files (:class:`SegmentUnreadable` when one cannot be read)."""
        return load_segments(self.directory, segments, VectorIndexSettings.from_meta(self.meta))

    def record_segment_ids(self, segment: Segment, ids: np.ndarray) -> None:
        """Record the ids a segment's file holds (a repair of a file changed behind ragidx's back;
        searches already go by the file's ids)."""
        gone = np.setdiff1d(segment.deleted, ids)
        with self.db.atomic():
            self.db.execute(
                "update segments set ids = ? where file = ?",
                [np.sort(ids).astype(np.int64).tobytes(), segment.file],
            )
            self.db.conn.executemany(
                "delete from deletions where segment = ? and chunk_id = ?",
                ((segment.file, int(i)) for i in gone),
            )

    def segment_count(self) -> int:
        return len(segment_files(self.db, self.meta))

    def lost_segments(self) -> list[str]:
        """Committed segment files that are gone (a cheap test, for every build)."""
        if not self.meta.get("generation"):
            return []
        return [name for name in segment_files(self.db, self.meta) if not (self.directory / name).exists()]

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

    def remove_documents(
        self, document_ids: Sequence[int], vector_index: VectorIndexSettings | None = None
    ) -> Committed:
        """Commit a generation without these documents and adding nothing."""
        empty = np.zeros((0, int(self.meta.get("dimension") or 0)), dtype=np.float32)
        return self.commit([], empty, self.meta, document_ids, vector_index=vector_index)

    def stale_vector_files(self) -> list[Path]:
        """Vector files the committed generation does not list: replaced segments and leftovers
        of crashed builds."""
        current = set(segment_files(self.db, self.meta))
        return sorted(path for path in self.directory.glob("vectors-*.faiss*") if path.name not in current)

    def remove_stale_vector_files(self) -> None:
        for path in self.stale_vector_files():
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

    def __init__(
        self,
        writer: IndexWriter,
        removed: Sequence[int],
        replace: bool,
        vector_index: VectorIndexSettings | None,
        dropped_segments: Sequence[str],
    ):
        self.writer = writer
        self.db = writer.db
        self.replace = replace
        self.generation = int(writer.meta.get("generation", 0)) + 1
        self.requested = vector_index or VectorIndexSettings.from_meta(writer.meta)
        self.before = writer.segments()
        self.kept = [] if replace else [s for s in self.before if s.file not in set(dropped_segments)]
        self.removed_chunks = writer._chunk_ids_of(removed)  # read before their rows go
        self.next_id = self.first_id = int(writer.meta.get("next_chunk_id", 1))
        self.vectors: list[np.ndarray] = []
        self.ids: list[np.ndarray] = []
        self.now = time.time()
        plan = plan_merge(self.kept, self.requested, VectorIndexSettings.from_meta(writer.meta))
        self.merge = (
            BackgroundMerge(writer.directory, self.generation, plan, self.requested) if plan else None
        )
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

    def chunks_without_vectors(self) -> np.ndarray:
        """Chunks (as the transaction now reads) live in no kept segment: those of dropped ones."""
        live = [s.live_ids() for s in self.kept]
        return np.setdiff1d(self.writer.chunk_ids(), np.concatenate(live) if live else np.zeros(0, np.int64))

    def restore(self, chunk_ids: np.ndarray, vectors: np.ndarray) -> None:
        """Give chunks already in the index (whose vectors were lost or damaged) new ``vectors``."""
        if len(chunk_ids) != vectors.shape[0]:
            raise ValueError(f"{vectors.shape[0]} vectors for {len(chunk_ids)} chunks")
        if len(chunk_ids):
            self.vectors.append(np.asarray(vectors, dtype=np.float32))
            self.ids.append(np.asarray(chunk_ids, dtype=np.int64))

    def commit(self, meta: dict[str, Any], drop_vectors: np.ndarray | None = None) -> Committed:
        """Write the added vectors (a new segment, or rows of the index's Milvus collection),
        record the deletions, then commit.

        For repairs, ``drop_vectors`` are ids deleted from the vectors alone (a restored chunk's
        new vector replaces its old one). Chunk ids are never reused, so a reader holding the
        previous generation's vectors can never be joined to a different chunk's text.
        """
        writer = self.writer
        removed = self.removed_chunks
        if drop_vectors is not None:
            removed = np.union1d(removed, drop_vectors)
        added = np.concatenate(self.vectors) if self.vectors else None
        ids = np.concatenate(self.ids) if self.ids else np.zeros(0, np.int64)
        self.vectors, self.ids = [], []
        location = MilvusLocation.from_meta(meta)
        if location is None:
            written = self._write_segments(removed, added, ids)
        else:
            written = self._write_milvus(meta, location, removed, added, ids)
        del added
        stamp = datetime.datetime.fromtimestamp(self.now, datetime.timezone.utc).isoformat(timespec="seconds")
        new_meta = {
            **meta,
            "schema_version": SCHEMA_VERSION,
            "generation": self.generation,
            "next_chunk_id": self.next_id,
            "vector_index": written.settings.to_meta(),
            "segmented": True,
            "milvus_owed": written.owed,
            "updated_at": stamp,
        }
        new_meta.setdefault("created_at", writer.meta.get("created_at", stamp))
        self.db["meta"].upsert_all(
            ({"key": k, "value": json.dumps(v)} for k, v in new_meta.items()), pk="key"
        )
        checkpoint("sqlite-commit")
        self.db.commit()
        self.merge = None  # its file is now the generation's
        previous = MilvusLocation.from_meta(writer.meta)
        writer.meta = {**writer.meta, **new_meta}  # as the table now reads: keys not written stay
        writer.remove_stale_vector_files()
        writer.settle_milvus()
        if previous is not None and previous != location:  # moved by --rebuild: the old one is ours
            writer.milvus(previous).drop()
        return Committed(self.generation, written.settings, written.rebuilt, written.merged, written.segments)

    def _write_segments(self, removed: np.ndarray, added: np.ndarray | None, ids: np.ndarray) -> Written:
        """Swap in the background merge's segment, record deletions, write the added vectors as a
        new segment."""
        segments, rebuilt, merged = list(self.kept), "", ""
        if self.merge is not None:
            result, plan = self.merge.result(), self.merge.plan
            sources = {s.file for s in plan.sources}
            segments = [s for s in segments if s.file not in sources] + ([result] if result else [])
            rebuilt, merged = plan.reason, "" if plan.reason else plan.describe()
        segments = [segment.deleting(removed) for segment in segments]
        if added is not None:
            file = segment_file(self.generation)
            segments.append(new_segment(self.writer.directory, file, added, ids, self.requested))
        segments.sort(key=lambda s: (-s.live, s.file))
        write_segments(self.db, self.before, segments)
        return Written(index_settings(segments, self.requested), None, rebuilt, merged, len(segments))

    def _write_milvus(
        self,
        meta: dict[str, Any],
        location: MilvusLocation,
        removed: np.ndarray,
        added: np.ndarray | None,
        ids: np.ndarray,
    ) -> Written:
        """Upsert the added vectors with their chunks' path, text and metadata; the deletions are
        owed until SQLite has committed (see :mod:`ragidx.indexer.milvus_store`)."""
        writer = self.writer
        collection = writer.milvus(location)
        dimension = int(meta.get("dimension") or 0)
        stored = VectorIndexSettings.from_meta(writer.meta)
        rebuilt = ""
        if MilvusLocation.from_meta(writer.meta) != location:
            collection.create(dimension, str(meta.get("model")), self.requested)
        else:
            collection.verify(dimension)
            if structure(self.requested) != structure(stored):
                collection.reindex(self.requested)
                rebuilt = f"Milvus index {stored.requested} -> {self.requested.requested}"
        collection.delete(f"chunk_id >= {self.first_id}")  # rows a killed build upserted, never committed
        if added is not None:
            collection.upsert(ids, added, self._chunk_payloads(ids))
        write_segments(self.db, self.before, [])  # moved here by --rebuild: the files go after commit
        if self.replace:
            owed = f"chunk_id < {self.first_id}" if self.first_id > 1 else None
        else:
            gone = np.setdiff1d(removed, ids)  # a restored chunk's upsert replaced its vector
            owed = id_list(gone) if len(gone) else None
        settings = replace(self.requested, kind=self.requested.requested, ivf_lists=0, trained_on=0)
        return Written(settings, owed, rebuilt)

    def _chunk_payloads(self, ids: np.ndarray) -> dict[int, tuple[str, str, str]]:
        """Each chunk's (path, text, metadata JSON) as this transaction reads them."""
        found: dict[int, tuple[str, str, str]] = {}
        for batch in in_batches(ids.tolist()):
            marks = ",".join("?" for _ in batch)
            sql = (
                "select c.id, d.path, c.text, d.metadata from chunks c join documents d "
                f"on d.id = c.document_id where c.id in ({marks})"
            )
            found.update((row[0], row[1:]) for row in self.db.execute(sql, batch))
        return found

    def abandon(self) -> None:
        """Stop waiting for a merge this generation will not commit, and delete its file."""
        if self.merge is not None:
            self.merge.abandon()
            self.merge = None


@dataclass(frozen=True)
class Written:
    """What a commit wrote to its vector store: the settings in use, the Milvus deletions owed
    until SQLite commits, and for the report why everything was rebuilt, what was merged, and
    how many segments there are."""

    settings: VectorIndexSettings
    owed: str | None
    rebuilt: str = ""
    merged: str = ""
    segments: int = 0


def structure(settings: VectorIndexSettings) -> tuple[Any, ...]:
    """What a vector index is built with (query-time parameters left out)."""
    return (settings.requested, settings.hnsw_m, settings.ef_construction, settings.nlist)


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

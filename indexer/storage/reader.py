"""Read access to a committed index: its settings, its vectors (through its vector store), and
its rows, each read able to run inside one snapshot of a generation."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.spans import span_pages
from ragidx.indexer.storage.database import (
    SCHEMA_VERSION,
    all_chunk_ids,
    connect,
    database_error,
    in_batches,
    opening,
    read_meta,
    relative_sentences,
    row_counts,
    writable,
)
from ragidx.indexer.storage.lexical import (
    LEGACY_TABLE,
    TERMS_TABLE,
    chunk_languages,
    legacy_match_expression,
    match_expression,
    query_language,
    rewrite_chunk_text,
)
from ragidx.indexer.storage.location import DB_NAME, no_index
from ragidx.indexer.storage.stores import store_from_meta
from ragidx.indexer.storage.vector_store import LoadedVectors, VectorStore

if TYPE_CHECKING:
    from ragidx.indexer.ingest.spans import Span
    from ragidx.indexer.storage.filters import Filters


class IndexReader:
    """Read access to a committed index: its settings, its vectors, and its rows."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self._held: int | None = None
        self._store: VectorStore | None = None
        self._open()

    def _open(self) -> None:
        """Connect to the database file at the index's path, holding a descriptor of that very
        file: :meth:`follow` compares it with what the path names later."""
        path = self.directory / DB_NAME
        self._held = hold_file(path)
        if self._held is None:
            raise no_index(self.directory)
        with opening(path, self.close):
            self.db = connect(path, read_only=not writable(self.directory))
            self.meta = read_meta(self.db)
        if not self.meta.get("generation"):
            self.close()
            raise no_index(self.directory)
        if self.meta.get("schema_version") != SCHEMA_VERSION:
            self.close()
            raise RagidxError(
                f"index at {self.directory} has schema {self.meta.get('schema_version')}, this ragidx reads "
                f"{SCHEMA_VERSION}: rebuild it"
            )

    def follow(self) -> bool:
        """Reopen the index when the database at its path is no longer the file this reader
        opened (the folder deleted and built again, replaced, or swapped with ``mv``), so a reader
        that stays up never answers from an index that is gone; :func:`no_index` when none is
        there now. Whether it reopened: what was loaded from the old one is stale."""
        if self._held is not None and same_file(self._held, self.directory / DB_NAME):
            return False
        self.close()
        self._open()
        return True

    @property
    def store(self) -> VectorStore:
        """The vector store the settings as last read name (a rebuild may have moved the vectors)."""
        spec = store_from_meta(self.meta)
        if self._store is None or self._store.spec != spec:
            if self._store is not None:
                self._store.close()
            self._store = spec.open(self.directory)
        return self._store

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read transaction: every read inside sees the same committed generation (WAL), even
        while a build commits the next one."""
        self.db.execute("begin")
        try:
            yield
        finally:
            self.db.execute("rollback")

    def load_vectors(self, reuse: LoadedVectors | None = None) -> LoadedVectors | None:
        """The vectors of ``meta["generation"]`` (parts ``reuse`` holds are not read again), or
        None when a newer build already replaced one of them: take a new :meth:`snapshot` and read
        the new generation."""
        return self.store.load(self.db, self.meta, reuse)

    def vector_parts(self) -> list[dict[str, Any]]:
        """Each part of the vector store (segment file) with its kind and counts, largest first."""
        return self.store.parts(self.db, self.meta)

    def chunk_rows(self, chunk_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Chunks joined with their documents, keyed by chunk id (ids that no longer exist are
        absent); ``sentences`` are spans into the chunk's own text."""
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
                "sentences": relative_sentences(row["sentences"], row["char_start"]),
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

    def languages(self) -> dict[str, int]:
        """The index's chunks in each language, most first (a build's own tables before it
        commits them to the settings)."""
        if "languages" not in self.meta:
            self.meta = {**self.meta, "languages": chunk_languages(self.db)}
        return dict(self.meta["languages"])

    def query_language(self, query: str) -> str:
        """The language to analyse ``query`` in, told among the index's (see :func:`query_language`)."""
        return query_language(query, self.languages())

    def lexical_search(
        self, query: str, limit: int, filters: Filters | None = None, language: str | None = None
    ) -> list[tuple[int, float]]:
        """Chunk ids and BM25 scores (higher is better) from the FTS5 table, best first.

        The query's words are each quoted, so FTS5 syntax in user text (quotes, ``*``, ``-``,
        ``NEAR``, parentheses) is matched as plain words and never raises; content words are
        OR-ed, as BM25 ranking expects (see :func:`match_expression`). Filters restrict the match
        itself, so ``limit`` matching chunks come back whenever that many exist. ``language``: the
        query's, where the caller told it already.
        """
        if self.db[TERMS_TABLE].exists():
            table, match = TERMS_TABLE, match_expression(query, language or self.query_language(query))
        elif self.db[LEGACY_TABLE].exists():  # written before languages, until its next build
            table, match = LEGACY_TABLE, legacy_match_expression(query)
        else:
            raise RagidxError(
                f"the keyword index of {self.directory} is missing: `ragidx check --repair` rebuilds it"
            )
        if match is None:
            return []
        restriction, params = "", list[Any]()
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
        return row_counts(self.db)

    def committed_generation(self) -> Any:
        """The generation committed now, whatever :attr:`meta` last read (outside a snapshot)."""
        row = self.db.execute("select value from meta where key = 'generation'").fetchone()
        return json.loads(row[0]) if row else None

    def reread_meta(self) -> dict[str, Any]:
        """The settings as committed now (another process may have built or tuned since)."""
        self.meta = read_meta(self.db)
        return self.meta

    def bytes_on_disk(self) -> int:
        return sum(path.stat().st_size for path in self.directory.glob("*") if path.is_file())

    def chunk_ids(self) -> np.ndarray:
        return all_chunk_ids(self.db)

    def chunk_source(self, chunk_id: int) -> tuple[int, int, str, list[Span]]:
        """A chunk's id, document id, text and sentence spans (relative to its text)."""
        found, document_id, text, start, sentences = self.db.execute(
            "select id, document_id, text, char_start, sentences from chunks where id = ?", [int(chunk_id)]
        ).fetchone()
        return found, document_id, text, relative_sentences(sentences, start)

    def shared_spans(self, chunk_id: int) -> list[Span]:
        """The parts of a chunk's text that other chunks of its document hold too (the sentences
        chunks overlap by), relative to its text."""
        rows = self.db.execute(
            """
            select max(o.char_start, c.char_start) - c.char_start, min(o.char_end, c.char_end) - c.char_start
            from chunks c join chunks o on o.document_id = c.document_id and o.id != c.id
            where c.id = ? and o.char_start < c.char_end and o.char_end > c.char_start
            """,
            [int(chunk_id)],
        )
        return [(int(start), int(end)) for start, end in rows]

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

    def failure(self, error: sqlite3.Error) -> RagidxError:
        """A read's database error in the user's words (see :func:`database_error`)."""
        return database_error(self.directory / DB_NAME, error)

    def close(self) -> None:
        """Release the database, the vector store and the held file (again: nothing happens)."""
        if self._held is None:
            return
        with contextlib.suppress(AttributeError):  # a database that failed to open
            self.db.close()
        if self._store is not None:
            self._store.close()
            self._store = None
        self.__dict__.pop("_page_starts", None)  # the next file may have been written without it
        os.close(self._held)
        self._held = None


# A descriptor that only names the file (Linux): closing one that was opened for reading would
# release every POSIX lock this process holds on the database, its other SQLite connections' too,
# and another process could then take the file as unused (SQLite deletes its WAL and shared
# memory when the last connection closes) under a connection still reading it.
HOLD_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_CLOEXEC


def hold_file(path: Path) -> int | None:
    """A descriptor of the regular file at ``path`` (None where there is none). Held open, the
    file's inode cannot be reused, so comparing it with the path later is exact; it holds no lock
    and closing it releases none (see :data:`HOLD_FLAGS`)."""
    try:
        held = os.open(path, HOLD_FLAGS)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as error:  # no permission, say: one line, as for the database itself
        raise RagidxError(f"cannot open {path}: {error.strerror or error}") from None
    if not stat.S_ISREG(os.fstat(held).st_mode):
        os.close(held)
        return None
    return held


def same_file(held: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``held``."""
    try:
        now = os.stat(path)
    except OSError:
        return False
    before = os.fstat(held)
    return (before.st_dev, before.st_ino) == (now.st_dev, now.st_ino)

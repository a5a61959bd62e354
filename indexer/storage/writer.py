"""Write access to an index: one writer at a time, and generations committed atomically.

Commit protocol: the new generation's vectors go to the index's vector store (for segments: new
files written under the generation's names and fsynced); then one SQLite transaction replaces the
rows, records what the store wrote, and the new generation; then the store finishes what had to
wait for the commit, and files no committed generation lists are deleted. A crash at any point
leaves the previous generation readable.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from ragidx.indexer.errors import IndexLocked, RagidxError
from ragidx.indexer.faults import checkpoint
from ragidx.indexer.ingest.spans import Span
from ragidx.indexer.storage.database import (
    SCHEMA_VERSION,
    DocumentRecord,
    all_chunk_ids,
    chunk_row,
    connect,
    create_schema,
    damage,
    database_error,
    document_row,
    in_batches,
    opening,
    read_meta,
    relative_sentences,
    row_counts,
    write_meta,
)
from ragidx.indexer.storage.index_settings import VectorIndexSettings
from ragidx.indexer.storage.lexical import (
    TERMS_TABLE,
    add_document_terms,
    chunk_languages,
    remove_terms_rows,
)
from ragidx.indexer.storage.location import DB_NAME, JOURNAL_NAME, LOCK_NAME
from ragidx.indexer.storage.repair import remove_files, stale_vector_files
from ragidx.indexer.storage.stores import store_from_meta
from ragidx.indexer.storage.vector_store import GenerationStart, StoreSpec, VectorChange, VectorStore


@dataclass(frozen=True)
class Committed:
    """A committed generation, its vector index settings, why every part was rebuilt, what was
    merged, and how many parts (segments) the store holds."""

    generation: int
    vector_index: VectorIndexSettings
    rebuilt: str = ""
    merged: str = ""  # which segments were merged, when that was for size or deletions
    segments: int = 0


def refuse_foreign_folder(directory: Path) -> None:
    """An index is written only into a new or empty folder, or one that holds an index: ``--index
    /`` or ``--index ~`` (a slip of the keyboard) must not scatter index files among the user's."""
    if not directory.is_dir() or (directory / DB_NAME).exists():
        return
    others = sorted(name for name in os.listdir(directory) if not name.startswith(".") and not _own(name))
    if others:
        named = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise RagidxError(
            f"--index {directory} holds other files ({named}) and no index: give a new or empty folder for it"
        )


def _own(name: str) -> bool:
    """Files an index folder may hold before its first commit: the lock, and the journal of a first
    build that was interrupted (:mod:`ragidx.indexer.build.journal`)."""
    return name == LOCK_NAME or name.startswith(JOURNAL_NAME)


class IndexWriter:
    """Exclusive write access to an index directory, held for the whole build."""

    def __init__(self, directory: str | Path, tidy: bool = True):
        """``tidy=False`` (for ``check`` to report them) leaves crashed builds' leftovers and a
        missing lexical index as they are and opens a damaged file; otherwise leftovers are
        deleted, the lexical index restored, and a damaged file refused before anything is
        written onto it."""
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise RagidxError(f"--index {self.directory} is a file, not a folder")
        refuse_foreign_folder(self.directory)
        self.meta: dict[str, Any] = {}
        self._created = [p for p in (self.directory, *self.directory.parents) if not p.exists()]
        self.directory.mkdir(parents=True, exist_ok=True)
        self._existing = set(os.listdir(self.directory))  # what a first build that fails leaves alone
        self._store: VectorStore | None = None
        try:
            lock = open(self.directory / LOCK_NAME, "w")  # noqa: SIM115 - held until close()
        except PermissionError:
            raise RagidxError(
                f"cannot write the index at {self.directory}: this user may only read it"
            ) from None
        self._lock_file: IO[str] = lock
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise IndexLocked(f"index {self.directory} is locked: another build is writing to it") from None
        path = self.directory / DB_NAME
        with opening(path, self.close):
            self.db = connect(path)
            self.db.enable_wal()
            self.meta = read_meta(self.db)
            committed = bool(self.meta.get("generation"))
            if tidy and committed:
                self.refuse_damage()
            create_schema(self.db, lexical=tidy or not committed)
            if tidy and committed:
                remove_files(stale_vector_files(self.directory, self.db, self.meta))  # crashed builds'
            self.finish_commit()  # check too: owed rows would read as vectors without chunks

    def refuse_damage(self) -> None:
        """Refuse to write onto a file SQLite's ``quick_check`` finds damaged (pages it would not
        touch can hide damage from a build, which then committed onto it)."""
        found = damage(self.db)
        if found:
            raise RagidxError(
                f"{self.directory / DB_NAME} is damaged ({found}); nothing is written onto it: "
                "`ragidx build PATH... --rebuild --index NEW` makes the index again from your documents"
            )

    def __enter__(self) -> IndexWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def store(self) -> VectorStore:
        """The vector store the committed settings name."""
        if self._store is None:
            self._store = store_from_meta(self.meta).open(self.directory)
        return self._store

    def close(self) -> None:
        """Release the index; a first build that committed nothing leaves nothing it made behind
        but the journal of what it embedded (the next build resumes from it)."""
        with contextlib.suppress(Exception):
            self.db.close()
        if self._store is not None:
            self._store.close()
        if not self.meta.get("generation"):
            for name in set(os.listdir(self.directory)) - self._existing:
                if name.startswith(JOURNAL_NAME):
                    continue
                path = self.directory / name
                if path.is_dir():  # a store's folder (milvus-lite's)
                    shutil.rmtree(path, ignore_errors=True)
                path.unlink(missing_ok=True)
            for folder in self._created:  # innermost first; only the ones this writer made
                with contextlib.suppress(OSError):
                    folder.rmdir()
        self._lock_file.close()

    def counts(self) -> dict[str, int]:
        return row_counts(self.db)

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
        dropped: Sequence[str] = (),
        store: StoreSpec | None = None,
    ) -> Iterator[NextGeneration]:
        """Write the next generation: the documents ``removed`` (ids), or all when ``replace``, are
        dropped, rows are added as they come inside one open SQLite transaction (readers keep
        seeing the committed generation), and :meth:`NextGeneration.commit` writes the vectors and
        commits. Segments are merged in the background meanwhile. ``vector_index``: the index type
        and parameters asked for (default: the index's own); ``dropped``: parts of the store that
        are lost or unreadable, left out (the caller restores their chunks); ``store``: where the
        vectors go (default: where they are). Leaving the block without committing rolls
        everything back."""
        pending = NextGeneration(self, removed, replace, vector_index, dropped, store)
        try:
            yield pending
        except sqlite3.DatabaseError as error:
            raise database_error(self.directory / DB_NAME, error) from error
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            raise RagidxError(
                f"the disk holding {self.directory} is full: nothing was committed, the index is as it was"
            ) from error
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
        write_meta(self.db, values)
        self.db.commit()
        self.meta = {**self.meta, **values}

    def finish_commit(self) -> None:
        """Finish what the committed generation still owes its vector store (a build stopped
        between its commit and that leaves it to the next writer)."""
        if self.meta.get("generation"):
            changed = self.store.finish_commit(self.meta)
            if changed:
                self.update_meta(changed)

    def _chunk_ids_of(self, document_ids: Sequence[int]) -> np.ndarray:
        found: list[int] = []
        for batch in in_batches(list(document_ids)):
            marks = ",".join("?" for _ in batch)
            rows = self.db.execute(f"select id from chunks where document_id in ({marks})", batch).fetchall()
            found.extend(row[0] for row in rows)
        return np.array(found, dtype=np.int64)

    def vector_parts(self) -> int:
        """How many parts (segment files) the vector store holds."""
        return len(self.store.parts(self.db, self.meta))

    def lost_vectors(self) -> list[str]:
        """Parts of the vector store whose data is gone (a cheap test, for every build)."""
        return self.store.lost(self.db, self.meta) if self.meta.get("generation") else []

    def stored_chunks(self, chunk_ids: Sequence[int]) -> tuple[list[str], list[list[Span]]]:
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
            spans.append(relative_sentences(sentences, start))
        return texts, spans

    def chunk_ids(self) -> np.ndarray:
        return all_chunk_ids(self.db)

    def remove_documents(
        self, document_ids: Sequence[int], vector_index: VectorIndexSettings | None = None
    ) -> Committed:
        """Commit a generation without these documents and adding nothing."""
        empty = np.zeros((0, int(self.meta.get("dimension") or 0)), dtype=np.float32)
        return self.commit([], empty, self.meta, document_ids, vector_index=vector_index)


class NextGeneration:
    """A generation being written; see :meth:`IndexWriter.next_generation`."""

    def __init__(
        self,
        writer: IndexWriter,
        removed: Sequence[int],
        replace: bool,
        vector_index: VectorIndexSettings | None,
        dropped: Sequence[str],
        store: StoreSpec | None,
    ):
        self.writer = writer
        self.db = writer.db
        self.replace = replace
        self.generation = int(writer.meta.get("generation", 0)) + 1
        requested = vector_index or VectorIndexSettings.from_meta(writer.meta)
        current = writer.store
        self.moves = store is not None and store != current.spec
        self.store = store.open(writer.directory) if self.moves and store is not None else current
        previous = current.spec if writer.meta.get("generation") else None
        self.vectors_write = self.store.begin(
            GenerationStart(
                self.db, writer.meta, self.generation, requested, dropped, replace or self.moves, previous
            )
        )
        self.removed_chunks = writer._chunk_ids_of(removed)  # read before their rows go
        self.next_id = self.first_id = int(writer.meta.get("next_chunk_id", 1))
        self.vectors: list[np.ndarray] = []
        self.ids: list[np.ndarray] = []
        self.now = time.time()
        self.committed = False
        self.db.begin()
        if replace:
            self.db.execute("delete from chunks")
            self.db.execute("delete from documents")
            self.db.execute(f"delete from {TERMS_TABLE}")
        for batch in in_batches(list(removed)):
            marks = ",".join("?" for _ in batch)
            old = self.db.execute(f"select id from chunks where document_id in ({marks})", batch)
            remove_terms_rows(self.db, (row[0] for row in old.fetchall()))
            self.db.execute(f"delete from chunks where document_id in ({marks})", batch)
            self.db.execute(f"delete from documents where id in ({marks})", batch)

    def add(self, records: Sequence[DocumentRecord], vectors: np.ndarray | None) -> None:
        """Insert ``records`` and keep their ``vectors`` (one row per chunk, in record order);
        ``None`` for an index that keeps no vectors (a lexical index)."""
        n_chunks = sum(len(r.chunks) for r in records)
        if vectors is not None and vectors.shape[0] != n_chunks:
            raise ValueError(f"{vectors.shape[0]} vectors for {n_chunks} chunks")
        for record in records:
            document_id = self.db.table("documents").insert(document_row(record, self.now)).last_pk
            assert isinstance(document_id, int)
            first = self.next_id
            self.db.table("chunks").insert_all(
                chunk_row(chunk, document_id, first + offset) for offset, chunk in enumerate(record.chunks)
            )
            add_document_terms(
                self.db, [(first + offset, chunk.text) for offset, chunk in enumerate(record.chunks)]
            )
            self.next_id += len(record.chunks)
        if n_chunks and vectors is not None:
            self.vectors.append(np.asarray(vectors, dtype=np.float32))
            self.ids.append(np.arange(self.next_id - n_chunks, self.next_id, dtype=np.int64))

    def chunks_without_vectors(self) -> np.ndarray:
        """Chunks (as the transaction now reads) whose vectors the new generation does not keep:
        those of dropped parts."""
        return np.setdiff1d(self.writer.chunk_ids(), self.vectors_write.kept_ids())

    def restore(self, chunk_ids: np.ndarray, vectors: np.ndarray) -> None:
        """Give chunks already in the index (whose vectors were lost or damaged) new ``vectors``."""
        if len(chunk_ids) != vectors.shape[0]:
            raise ValueError(f"{vectors.shape[0]} vectors for {len(chunk_ids)} chunks")
        if len(chunk_ids):
            self.vectors.append(np.asarray(vectors, dtype=np.float32))
            self.ids.append(np.asarray(chunk_ids, dtype=np.int64))

    def commit(self, meta: dict[str, Any], drop_vectors: np.ndarray | None = None) -> Committed:
        """Write the added vectors to the store, record what it wrote, then commit.

        For repairs, ``drop_vectors`` are ids deleted from the vectors alone (a restored chunk's
        new vector replaces its old one). Chunk ids are never reused, so a reader holding the
        previous generation's vectors can never be joined to a different chunk's text.
        """
        writer = self.writer
        removed = self.removed_chunks
        if drop_vectors is not None:
            removed = np.union1d(removed, drop_vectors)
        change = VectorChange(
            added=np.concatenate(self.vectors) if self.vectors else None,
            ids=np.concatenate(self.ids) if self.ids else np.zeros(0, np.int64),
            removed=removed,
            first_id=self.first_id,
            replace=self.replace or self.moves,
            dimension=int(meta.get("dimension") or 0),
            model=str(meta.get("model")),
        )
        self.vectors, self.ids = [], []
        written = self.vectors_write.write(change)
        del change
        if self.moves:
            writer.store.release(self.db, writer.meta)
        stamp = datetime.datetime.fromtimestamp(self.now, datetime.timezone.utc).isoformat(timespec="seconds")
        new_meta = {
            **meta,
            "schema_version": SCHEMA_VERSION,
            "generation": self.generation,
            "next_chunk_id": self.next_id,
            "vector_index": written.settings.to_meta(),
            "segmented": True,
            "store": self.store.spec.to_meta(),
            **written.meta,
            "languages": chunk_languages(self.db),
            "updated_at": stamp,
        }
        new_meta.setdefault("created_at", writer.meta.get("created_at", stamp))
        write_meta(self.db, new_meta)
        checkpoint("sqlite-commit")
        self.db.commit()
        self.committed = True
        writer.meta = {**writer.meta, **new_meta}  # as the table now reads: keys not written stay
        if self.moves:
            writer.store.retire()
            writer.store.close()
            writer._store = self.store
        remove_files(stale_vector_files(writer.directory, writer.db, writer.meta))
        writer.finish_commit()
        return Committed(self.generation, written.settings, written.rebuilt, written.merged, written.parts)

    def abandon(self) -> None:
        """A generation that will not commit: the store undoes what it started (a background
        merge's file)."""
        if not self.committed:
            self.vectors_write.abandon()
        if self.moves and not self.committed:
            self.store.close()

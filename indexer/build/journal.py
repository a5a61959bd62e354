"""What a build has embedded so far, kept on disk as it goes, so an interrupted build resumes.

A generation commits in one SQLite transaction at the end of a build (the previous generation
stays readable until then), so a build stopped by Ctrl-C, a crash or a full disk committed
nothing, and before this journal the next build embedded everything again: on a 35-minute build,
35 minutes lost to one keystroke. Each group of documents a build embeds is written here as soon
as its vectors exist (one small SQLite transaction, durable like any commit), keyed by the
document's content hash; a later build with the same embedding settings (the journal's
fingerprint) takes those documents' vectors from here instead of the model. A successful commit
deletes the journal: its vectors are then in the index.

The journal sits beside the index database (:data:`JOURNAL_NAME`), and outlives a first build
that committed nothing (the writer leaves it when it clears such a build's files).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ragidx.indexer.faults import JOURNAL_KILL_POINT, checkpoint
from ragidx.indexer.storage.database import DocumentRecord
from ragidx.indexer.storage.location import JOURNAL_NAME

# What a vector depends on, among an index's settings: a journal written under others is stale.
FINGERPRINT_KEYS = (
    "model",
    "model_file",
    "model_revision",
    "strategy",
    "strategy_params",
    "chunker",
    "dtype",
)


def fingerprint(settings: Mapping[str, Any]) -> str:
    """A digest of the settings (as an index's meta holds them) that decide a document's vectors."""
    chosen = {key: settings.get(key) for key in FINGERPRINT_KEYS}
    return hashlib.sha256(json.dumps(chosen, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Resumed:
    """What a build took from the journal instead of embedding it."""

    documents: int = 0
    chunks: int = 0
    tokens: int = 0
    since: float | None = None  # when the interrupted build saved its first vectors (epoch seconds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "chunks": self.chunks,
            "tokens": self.tokens,
            "since": self.since,
        }

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.since)) if self.since else "earlier"
        return (
            f"resumed: {self.chunks} chunks of {self.documents} documents ({self.tokens} tokens) embedded by "
            f"an interrupted build ({when}) were taken from its journal, not embedded again"
        )


class EmbeddingJournal:
    """The vectors embedded by builds with one set of settings that have not committed yet."""

    def __init__(self, directory: Path, settings: Mapping[str, Any]):
        self.path = Path(directory) / JOURNAL_NAME
        self.fingerprint = fingerprint(settings)
        self.resumed = Resumed()
        self._db: sqlite3.Connection | None = None
        self._found: dict[str, tuple[int, float]] | None = None  # content hash -> (chunks, saved at)

    def _connection(self) -> sqlite3.Connection:
        """The journal's database, made on first use; rows of other settings are dropped. A
        damaged journal is deleted and made again: it only costs the work it held."""
        if self._db is None:
            try:
                self._db = self._open()
            except sqlite3.DatabaseError:
                self.path.unlink(missing_ok=True)
                self._db = self._open()
        return self._db

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            db.execute("create table if not exists settings (fingerprint text)")
            db.execute(
                "create table if not exists documents (content_hash text primary key, chunks integer, "
                "dimension integer, vectors blob, saved_at real)"
            )
            stored = db.execute("select fingerprint from settings").fetchone()
            if stored is None or stored[0] != self.fingerprint:
                with db:
                    db.execute("begin")
                    db.execute("delete from documents")
                    db.execute("delete from settings")
                    db.execute("insert into settings values (?)", [self.fingerprint])
        except BaseException:
            db.close()
            raise
        return db

    def _index(self) -> dict[str, tuple[int, float]]:
        if self._found is None:
            if not self.path.exists():
                self._found = {}
            else:
                rows = self._connection().execute("select content_hash, chunks, saved_at from documents")
                self._found = {digest: (chunks, saved) for digest, chunks, saved in rows}
        return self._found

    def take(self, record: DocumentRecord) -> np.ndarray | None:
        """The vectors of ``record``'s chunks if an earlier build embedded this very content with
        these settings (counted in :attr:`resumed`), else None."""
        found = self._index().get(record.source.content_hash)
        if found is None or found[0] != len(record.chunks):
            return None
        row = (
            self._connection()
            .execute(
                "select dimension, vectors from documents where content_hash = ?",
                [record.source.content_hash],
            )
            .fetchone()
        )
        dimension, blob = row
        vectors = np.frombuffer(blob, dtype=np.float32).reshape(len(record.chunks), dimension).copy()
        resumed = self.resumed
        resumed.documents += 1
        resumed.chunks += len(record.chunks)
        resumed.tokens += sum(chunk.token_count for chunk in record.chunks)
        resumed.since = min(found[1], resumed.since or found[1])
        return vectors

    def save(self, records: Sequence[DocumentRecord], vectors: np.ndarray) -> None:
        """Keep the vectors of ``records`` (one row per chunk, in record order) in one transaction."""
        rows, start, now = [], 0, time.time()
        for record in records:
            count = len(record.chunks)
            part = np.ascontiguousarray(vectors[start : start + count], dtype=np.float32)
            start += count
            if count:
                rows.append((record.source.content_hash, count, part.shape[1], part.tobytes(), now))
        if not rows:
            return
        db = self._connection()
        with db:
            db.execute("begin")
            db.executemany("insert or replace into documents values (?, ?, ?, ?, ?)", rows)
        self._index().update({digest: (count, now) for digest, count, *_ in rows})
        checkpoint(JOURNAL_KILL_POINT)

    def discard(self) -> None:
        """Forget everything: the build committed, so its vectors are in the index."""
        self.close()
        for leftover in (self.path, self.path.with_name(self.path.name + "-journal")):
            leftover.unlink(missing_ok=True)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

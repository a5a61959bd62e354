"""What a build has embedded so far, kept on disk as it goes, so an interrupted build resumes.

A generation commits in one SQLite transaction at the end of a build (the previous generation
stays readable until then), so a build stopped by Ctrl-C, a crash or a full disk committed
nothing, and before this journal the next build embedded everything again: on a 35-minute build,
35 minutes lost to one keystroke. Each group of chunks a build embeds (whole documents, or parts
of a long one) is written here as soon as its vectors exist (one small SQLite transaction, durable
like any commit), keyed by the document's content hash and the chunks' place in it; a later build
with the same embedding settings (the journal's fingerprint) takes the vectors of each document's
chunks from here, as far as they run unbroken from its first, and embeds only the rest. A
successful commit deletes the journal: its vectors are then in the index. A file whose content
another file of the same build has (a copy, a page installed under two names) takes its vectors
from here too, counted as a copy, not as resumed work.

The journal sits beside the index database (:data:`JOURNAL_NAME`), and outlives a first build
that committed nothing (the writer leaves it when it clears such a build's files).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ragidx.indexer.build.embedding import Part
from ragidx.indexer.faults import JOURNAL_KILL_POINT, checkpoint
from ragidx.indexer.storage.database import DocumentRecord
from ragidx.indexer.storage.location import JOURNAL_NAME
from ragidx.indexer.wording import counted

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
class Reused:
    """Chunks a build took from the journal instead of embedding them."""

    documents: int = 0
    chunks: int = 0
    tokens: int = 0

    def add(self, chunks: int, tokens: int) -> None:
        self.documents += 1
        self.chunks += chunks
        self.tokens += tokens

    def to_dict(self) -> dict[str, Any]:
        return {"documents": self.documents, "chunks": self.chunks, "tokens": self.tokens}


@dataclass
class Resumed(Reused):
    """What a build took from the journal of an interrupted one instead of embedding it."""

    since: float | None = None  # when the interrupted build saved its first vectors (epoch seconds)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "since": self.since}

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.since)) if self.since else "earlier"
        return (
            f"resumed: {self.chunks} chunks of {self.documents} documents ({self.tokens} tokens) embedded by "
            f"an interrupted build ({when}) were taken from its journal, not embedded again"
        )


def pending(directory: str | Path) -> Resumed | None:
    """What an interrupted build left in the journal beside ``directory``'s index, read without
    writing (None: no journal, or an empty or unreadable one). Its tokens are not recorded."""
    path = Path(directory) / JOURNAL_NAME
    if not path.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            counted = "select count(distinct content_hash), coalesce(sum(stop - start), 0), min(saved_at)"
            documents, chunks, since = db.execute(f"{counted} from parts").fetchone()
    except sqlite3.Error:
        return None
    return Resumed(documents, chunks, since=since) if chunks else None


def describe_pending(kept: Resumed) -> str:
    """What an interrupted build's journal keeps, and how to resume it."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(kept.since)) if kept.since else "earlier"
    return (
        f"it kept {counted(kept.chunks, 'embedded chunk')} of {counted(kept.documents, 'document')} "
        f"({JOURNAL_NAME}, since {when}): the same `ragidx build` resumes from them; until then the "
        "index is as it was"
    )


@dataclass(frozen=True)
class _Saved:
    """Where a journalled part lies in its document, when it was saved, and whether by this build
    (then a file taking it is a copy of one embedded earlier, not resumed work)."""

    start: int
    stop: int
    total: int  # the document's chunks when it was saved: another chunking is another document
    saved_at: float
    here: bool = False


class EmbeddingJournal:
    """The vectors embedded by builds with one set of settings that have not committed yet."""

    def __init__(self, directory: Path, settings: Mapping[str, Any]):
        self.path = Path(directory) / JOURNAL_NAME
        self.fingerprint = fingerprint(settings)
        self.resumed = Resumed()
        self.copied = Reused()  # documents whose content an earlier one of this build has
        self._db: sqlite3.Connection | None = None
        self._found: dict[str, list[_Saved]] | None = None  # content hash -> its parts

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
                "create table if not exists parts (content_hash text, start integer, stop integer, "
                "total integer, dimension integer, vectors blob, saved_at real, "
                "primary key (content_hash, start, stop))"
            )
            stored = db.execute("select fingerprint from settings").fetchone()
            if stored is None or stored[0] != self.fingerprint:
                with db:
                    db.execute("begin")
                    db.execute("delete from parts")
                    db.execute("delete from settings")
                    db.execute("insert into settings values (?)", [self.fingerprint])
        except BaseException:
            db.close()
            raise
        return db

    def _index(self) -> dict[str, list[_Saved]]:
        if self._found is None:
            self._found = {}
            if self.path.exists():
                rows = self._connection().execute(
                    "select content_hash, start, stop, total, saved_at from parts order by start"
                )
                for digest, *where in rows:
                    self._found.setdefault(digest, []).append(_Saved(*where))
        return self._found

    def take(self, record: DocumentRecord) -> np.ndarray | None:
        """The vectors of all of ``record``'s chunks if builds embedded this very content with
        these settings (counted in :attr:`resumed` or :attr:`copied`), else None."""
        chosen = self._held(record)
        if not chosen or chosen[-1][0].stop < len(record.chunks):
            return None
        return self._taken(record, chosen)

    def take_start(self, record: DocumentRecord) -> np.ndarray | None:
        """The vectors of ``record``'s first chunks, as many in a row as the journal holds (None:
        none), counted as :meth:`take` counts them: the build embeds the chunks after them."""
        chosen = self._held(record)
        return self._taken(record, chosen) if chosen else None

    def _held(self, record: DocumentRecord) -> list[tuple[_Saved, int]]:
        """The journalled parts that hold ``record``'s chunks unbroken from its first, each with
        the first chunk taken from it (empty: none)."""
        total = len(record.chunks)
        parts = [part for part in self._index().get(record.source.content_hash, []) if part.total == total]
        reached, chosen = 0, []
        for part in parts:  # in order of start; a later build may have cut other parts
            if part.start <= reached < part.stop:
                chosen.append((part, reached))
                reached = part.stop
        return chosen

    def _taken(self, record: DocumentRecord, chosen: Sequence[tuple[_Saved, int]]) -> np.ndarray:
        """The vectors of the chunks ``chosen`` holds, counted: those of parts this build saved
        (an earlier file with the same content) as copied, the others as resumed."""
        digest, db = record.source.content_hash, self._connection()
        pieces = []
        for part, first in chosen:
            dimension, blob = db.execute(
                "select dimension, vectors from parts where content_hash = ? and start = ? and stop = ?",
                [digest, part.start, part.stop],
            ).fetchone()
            rows = np.frombuffer(blob, dtype=np.float32).reshape(part.stop - part.start, dimension)
            pieces.append(rows[first - part.start :])
        for here, reused in ((False, self.resumed), (True, self.copied)):
            mine = [(part, first) for part, first in chosen if part.here is here]
            if mine:
                tokens = sum(
                    chunk.token_count for part, first in mine for chunk in record.chunks[first : part.stop]
                )
                reused.add(sum(part.stop - first for part, first in mine), tokens)
        earlier = [part.saved_at for part, _ in chosen if not part.here]
        if earlier:
            self.resumed.since = min(*earlier, self.resumed.since or earlier[0])
        return np.concatenate(pieces)

    def save(self, parts: Sequence[Part], vectors: np.ndarray) -> None:
        """Keep the vectors of ``parts`` (one row per chunk, in part order) in one transaction."""
        rows, offset, now = [], 0, time.time()
        for part in parts:
            count = part.stop - part.start
            block = np.ascontiguousarray(vectors[offset : offset + count], dtype=np.float32)
            offset += count
            if count:
                digest, total = part.record.source.content_hash, len(part.record.chunks)
                rows.append((digest, part.start, part.stop, total, block.shape[1], block.tobytes(), now))
        if not rows:
            return
        db = self._connection()
        with db:
            db.execute("begin")
            db.executemany("insert or replace into parts values (?, ?, ?, ?, ?, ?, ?)", rows)
        found = self._index()
        for digest, start, stop, total, *_ in rows:
            found.setdefault(digest, []).append(_Saved(start, stop, total, now, here=True))
        for digest in {row[0] for row in rows}:
            found[digest].sort(key=lambda part: part.start)  # as _held reads them
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

"""The SQLite side of an index: where it lives, its schema, its settings, and the rows a build
writes. Every index keeps its documents, chunks, lexical tables and settings here, whichever
vector store holds its vectors."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.spans import relative_spans
from ragidx.indexer.storage.lexical import create_terms_table
from ragidx.indexer.storage.local.segments import create_segment_tables
from ragidx.indexer.wording import excerpt

if TYPE_CHECKING:
    from sqlite_utils import Database

    from ragidx.indexer.ingest.chunking import Chunk
    from ragidx.indexer.ingest.sources import SourceDocument
    from ragidx.indexer.ingest.spans import Span

SCHEMA_VERSION = 1
SQL_BATCH = 500  # ids per "in (...)" list, well under SQLite's parameter limit


def database_error(path: Path, error: sqlite3.Error) -> RagidxError:
    """What a failure of the index database means for the user, in one line: a full disk leaves
    the index as it was; a damaged file needs a rebuild (never "move it away" for a healthy index)."""
    code = getattr(error, "sqlite_errorname", "")
    reason = " ".join(str(error).split())
    if code == "SQLITE_FULL" or "disk is full" in reason:
        return RagidxError(f"the disk holding {path} is full: free some space and run the command again")
    if code == "SQLITE_CORRUPT" or "malformed" in reason:
        return RagidxError(
            f"{path} is damaged ({reason}): `ragidx build PATH... --rebuild` makes the index again from "
            "your documents (move the folder away first to keep the damaged copy)"
        )
    if code == "SQLITE_NOTADB":
        return RagidxError(f"{path} is not a ragidx index database ({reason})")
    if code.startswith(("SQLITE_CANTOPEN", "SQLITE_READONLY", "SQLITE_PERM", "SQLITE_IOERR")):
        return RagidxError(f"cannot use {path}: {reason} (check its permissions and the free space)")
    return RagidxError(f"{path}: {reason}")


@contextlib.contextmanager
def opening(path: Path, close: Callable[[], None]) -> Iterator[None]:
    """The steps that open an index's database: any failure ``close``s what they opened, and
    SQLite's own errors become one line (:func:`database_error`)."""
    try:
        yield
    except sqlite3.DatabaseError as error:
        close()
        raise database_error(path, error) from error
    except BaseException:
        close()
        raise


def damage(db: Database) -> str | None:
    """What SQLite's ``quick_check`` finds wrong with the file (its first line), or None."""
    try:
        found = [row[0] for row in db.execute("PRAGMA quick_check").fetchall()]
    except sqlite3.DatabaseError as error:  # damage where the check itself must read
        return str(error)
    return None if found == ["ok"] else found[0]


@dataclass(frozen=True)
class DocumentRecord:
    """A document and its chunks, ready to be written."""

    source: SourceDocument
    chunks: list[Chunk]
    metadata: dict[str, Any]


def connect(path: Path, read_only: bool = False) -> Database:
    """A connection any thread may use; callers that share one (the HTTP server) serialise access.

    ``read_only``: the file opened as immutable, for a folder this user may not write (a copy of an
    index on read-only media, or one shared read-only): SQLite's WAL readers need to create a
    shared-memory file beside the database, which such a folder cannot hold. Nobody who opens it
    this way can commit there, so nothing changes under the reader."""
    from sqlite_utils import Database

    if read_only:
        uri = f"{path.absolute().as_uri()}?mode=ro&immutable=1"
        db = Database(sqlite3.connect(uri, uri=True, check_same_thread=False))
    else:
        db = Database(sqlite3.connect(str(path), check_same_thread=False))
    db.execute("PRAGMA busy_timeout = 10000")
    return db


def writable(directory: Path) -> bool:
    """Whether this process may create files in ``directory`` (else indexes there open read-only)."""
    return os.access(directory, os.W_OK)


def create_schema(db: Database, lexical: bool = True) -> None:
    """The tables of an index (those missing); ``lexical=False`` leaves a missing keyword
    index missing (``check`` reports it; a repair or the next build restores it)."""
    db.table("meta").create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db.table("documents").create(
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
        db.table("documents").add_column("page_starts", str)
    db.table("documents").create_index(["path"], unique=True, if_not_exists=True)
    db.table("chunks").create(
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
    db.table("chunks").create_index(["document_id"], if_not_exists=True)
    create_segment_tables(db)
    if lexical:
        create_terms_table(db)


def read_meta(db: Database) -> dict[str, Any]:
    if not db["meta"].exists():
        return {}
    meta = {}
    for row in db["meta"].rows:
        try:
            meta[row["key"]] = json.loads(row["value"])
        except (TypeError, ValueError):
            raise RagidxError(
                f"the index's setting {excerpt(row['key'])} is damaged (not JSON): rebuild the index"
            ) from None
    return meta


def write_meta(db: Database, values: dict[str, Any]) -> None:
    """Upsert settings inside the caller's transaction."""
    db.table("meta").upsert_all(({"key": k, "value": json.dumps(v)} for k, v in values.items()), pk="key")


def row_counts(db: Database) -> dict[str, int]:
    return {"documents": db["documents"].count, "chunks": db["chunks"].count}


def all_chunk_ids(db: Database) -> np.ndarray:
    rows = db.execute("select id from chunks order by id").fetchall()
    return np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))


def in_batches(ids: list[int]) -> list[list[int]]:
    return [ids[i : i + SQL_BATCH] for i in range(0, len(ids), SQL_BATCH)]


def relative_sentences(stored: str | None, start: int) -> list[Span]:
    """A chunk's sentence spans as stored (JSON, offsets into its document) made relative to the
    chunk's own text, which is what embedding and snippets read."""
    return relative_spans(json.loads(stored or "[]"), start)


def document_row(record: DocumentRecord, now: float) -> dict[str, Any]:
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


def chunk_row(chunk: Chunk, document_id: int, chunk_id: int) -> dict[str, Any]:
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

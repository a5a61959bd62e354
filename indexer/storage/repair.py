"""What ``ragidx check`` finds wrong in an index's rows, lexical tables and files, and how it
mends them: each check reads through a reader or a writer's connection, each repair writes
through a writer's (the vector checks, which re-embed, are the build's: ``build/maintenance.py``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragidx.indexer.storage.database import restore_lexical
from ragidx.indexer.storage.lexical import CJK_TABLE, fill_cjk_table
from ragidx.indexer.storage.local.segments import stale_segment_files

if TYPE_CHECKING:
    from sqlite_utils import Database

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


def faulty_rows(db: Database, rule: str) -> int:
    """How many rows break ``rule``, one of :data:`ROW_RULES`."""
    return int(db.execute(ROW_RULES[rule][2]).fetchone()[0])


def repair_rows(db: Database, rule: str) -> None:
    with db.atomic():
        db.execute(ROW_RULES[rule][3])


def stale_vector_files(directory: Path, db: Database, meta: Mapping[str, Any]) -> list[Path]:
    """Vector files no committed generation lists (the local store's naming: a store's files stay
    after its vectors moved to another)."""
    return stale_segment_files(directory, db, meta)


def remove_files(paths: Iterable[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def lexical_fault(db: Database, writable: bool) -> str | None:
    """Why the FTS5 tables disagree with the chunks, or None when they agree. FTS5's check is an
    insert, so on a connection that may not write it runs on a copy of the database."""
    if not db["chunks_fts"].exists():
        return "the table chunks_fts is missing"
    copy = None
    run: Any = db.execute
    if not writable:
        copy = sqlite3.connect(":memory:")
        db.conn.backup(copy)
        run = copy.execute
    try:
        run("insert into chunks_fts(chunks_fts, rank) values('integrity-check', 1)")
        run(f"insert into {CJK_TABLE}({CJK_TABLE}) values('integrity-check')")
    except sqlite3.DatabaseError as error:
        return str(error)
    finally:
        if copy is not None:
            copy.close()
    return None


def rebuild_lexical(db: Database) -> None:
    """Refill both full-text tables from the chunks (the main one made again if it is gone)."""
    restore_lexical(db)
    with db.atomic():
        db.execute("insert into chunks_fts(chunks_fts) values('rebuild')")
        db.execute(f"insert into {CJK_TABLE}({CJK_TABLE}) values('delete-all')")
        fill_cjk_table(db)

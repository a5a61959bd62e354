"""What ``ragidx check`` finds wrong in an index's rows, lexical tables and files, and how it
mends them: each check reads through a reader or a writer's connection, each repair writes
through a writer's (the vector checks, which re-embed, are the build's: ``build/maintenance.py``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragidx.indexer.storage.lexical import LEGACY_TABLE, TERMS_TABLE, create_terms_table
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
    """Why the keyword table disagrees with the chunks, or None when they agree (an index
    written before languages keeps its English table until its next build). FTS5's check is an
    insert, so on a connection that may not write it runs on a copy of the database."""
    if not db[TERMS_TABLE].exists():
        return None if db[LEGACY_TABLE].exists() else f"the table {TERMS_TABLE} is missing"
    copy = None
    run: Any = db.execute
    if not writable:
        copy = sqlite3.connect(":memory:")
        db.conn.backup(copy)
        run = copy.execute
    try:
        run(f"insert into {TERMS_TABLE}({TERMS_TABLE}, rank) values('integrity-check', 1)")
        unmatched = run(
            f"select (select count(*) from chunks where id not in (select rowid from {TERMS_TABLE})), "
            f"(select count(*) from {TERMS_TABLE} where rowid not in (select id from chunks))"
        ).fetchone()
    except sqlite3.DatabaseError as error:
        return str(error)
    finally:
        if copy is not None:
            copy.close()
    missing, extra = unmatched
    if missing or extra:
        return f"{missing} chunks without terms, {extra} terms without a chunk"
    return None


def rebuild_lexical(db: Database) -> None:
    """Make the keyword table again from the chunks (one transaction)."""
    with db.atomic():
        db.execute(f"drop table if exists {TERMS_TABLE}")
        create_terms_table(db)

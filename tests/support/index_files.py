"""An index's files read with plain sqlite3 and faiss, independent of ragidx's reader."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np


def segment_vectors(index: Path) -> dict[int, np.ndarray]:
    """Chunk id -> vector of every chunk, read with plain sqlite3 and faiss: the files the
    segments table lists, less the recorded deletions; every chunk live in exactly one."""
    import faiss

    with sqlite3.connect(index / "ragidx.db") as db:
        files = [row[0] for row in db.execute("select file from segments")]
        deleted = set(db.execute("select segment, chunk_id from deletions"))
        chunk_ids = [row[0] for row in db.execute("select id from chunks order by id")]
    found: dict[int, np.ndarray] = {}
    for name in files:
        vectors = faiss.read_index(str(index / name))
        for chunk_id in faiss.vector_to_array(vectors.id_map).tolist():
            if (name, chunk_id) not in deleted:
                assert chunk_id not in found, f"chunk {chunk_id} live in two segments"
                found[chunk_id] = vectors.reconstruct(chunk_id)
    assert sorted(found) == chunk_ids
    return found


def stored_vectors(index: Path) -> dict[tuple[str, int], tuple[int, np.ndarray]]:
    """(path, ordinal) -> (chunk id, vector), read with plain sqlite3 and faiss."""
    with sqlite3.connect(index / "ragidx.db") as db:
        rows = db.execute(
            "select c.id, d.path, c.ordinal from chunks c join documents d on d.id = c.document_id"
        ).fetchall()
    vectors = segment_vectors(index)
    return {(path, ordinal): (chunk_id, vectors[chunk_id]) for chunk_id, path, ordinal in rows}

"""The on-disk index: generations, atomic commits, locking, and unreadable files."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.storage import writer as writer_module
from ragidx.indexer.storage.reader import IndexReader
from ragidx.indexer.storage.vector_store import VectorQuery
from ragidx.indexer.storage.writer import IndexWriter
from tests.support.index_records import record, vectors


def commit(directory, records, vecs):
    with IndexWriter(directory) as writer:
        meta = {"model": "m", "strategy": "mean", "strategy_params": {}}
        return writer.commit(records, vecs, meta, replace=True).generation


def test_generations_ids_and_stale_files(tmp_path):
    first = vectors(3, 0)
    assert commit(tmp_path, [record("a", ["x", "y"]), record("b", ["z"])], first) == 1
    reader = IndexReader(tmp_path)
    index = reader.load_vectors()
    scores, ids = index.search(VectorQuery(first[2:3], 1))
    assert ids[0][0] == 3 and scores[0][0] == pytest.approx(1.0, abs=1e-5)
    assert reader.chunk_rows([3])[3]["text"] == "z" and reader.chunk_rows([3])[3]["metadata"] == {"team": "b"}
    reader.close()

    assert commit(tmp_path, [record("c", ["w"])], vectors(1, 1)) == 2
    reader = IndexReader(tmp_path)
    assert reader.meta["next_chunk_id"] == 5
    assert list(reader.chunk_rows([1, 2, 3, 4])) == [4]  # ids are never reused
    assert sorted(p.name for p in tmp_path.glob("vectors-*")) == ["vectors-2.faiss"]
    assert reader.counts() == {"documents": 1, "chunks": 1}


def held_locks(path: Path) -> list[str]:
    """This process's POSIX locks on ``path``'s inode, as /proc/locks lists them."""
    inode = f":{os.stat(path).st_ino} "
    lines = Path("/proc/locks").read_text().splitlines()
    return [line for line in lines if f" {os.getpid()} " in line and inode in line]


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="reads Linux's /proc/locks")
def test_a_reader_closing_keeps_the_locks_of_other_connections(tmp_path):
    """A reader holds a descriptor of the database to notice it replaced; closing one opened for
    reading released every POSIX lock this process held on the file, another connection's too, and
    another process then took the file for unused and deleted its WAL and shared memory under that
    connection (a later read in the process: "disk I/O error")."""
    commit(tmp_path, [record("a", ["x"])], vectors(1, 0))
    database = tmp_path / "ragidx.db"
    with closing(sqlite3.connect(database)) as other:
        with other:
            other.execute("update documents set title = 'read in this process'")
        locked = held_locks(database)
        assert locked  # a connection in WAL mode holds a shared lock on the file while open
        IndexReader(tmp_path).close()
        assert held_locks(database) == locked
        elsewhere = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('select 1'); c.close()"
        subprocess.run([sys.executable, "-c", elsewhere, str(database)], check=True)
        assert (tmp_path / "ragidx.db-wal").exists()  # that process knew this one still reads
        assert other.execute("select title from documents").fetchone() == ("read in this process",)


def test_a_failed_commit_leaves_the_previous_generation(tmp_path, monkeypatch):
    commit(tmp_path, [record("a", ["x", "y"])], vectors(2, 0))

    def explode(*args):
        raise OSError("disk full")

    monkeypatch.setattr(writer_module, "chunk_row", explode)
    with pytest.raises(OSError):
        commit(tmp_path, [record("b", ["z"])], vectors(1, 1))
    monkeypatch.undo()
    reader = IndexReader(tmp_path)
    assert reader.meta["generation"] == 1 and reader.counts() == {"documents": 1, "chunks": 2}
    assert reader.load_vectors().ntotal == 2
    assert reader.chunk_rows([1])[1]["path"] == "/docs/a"
    reader.close()
    commit(tmp_path, [record("c", ["w"])], vectors(1, 2))
    assert sorted(p.name for p in tmp_path.glob("vectors-*")) == ["vectors-2.faiss"]


def test_one_writer_at_a_time(tmp_path):
    with IndexWriter(tmp_path), pytest.raises(RagidxError, match="locked"):
        IndexWriter(tmp_path)
    IndexWriter(tmp_path).close()  # released


def test_readers_explain_missing_empty_and_corrupt_indexes(tmp_path):
    with pytest.raises(RagidxError, match="no index at"):
        IndexReader(tmp_path / "none")
    IndexWriter(tmp_path / "never" / "built").close()  # a first build that failed: no litter
    assert not (tmp_path / "never").exists()
    (tmp_path / "empty").mkdir()
    IndexWriter(tmp_path / "empty").close()
    assert list((tmp_path / "empty").iterdir()) == []  # a folder that was there stays
    first_build = IndexWriter(tmp_path / "running")
    with first_build, pytest.raises(RagidxError, match=r"no index at .*: no build has completed"):
        IndexReader(tmp_path / "running")  # a first build still writing: the same story
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "ragidx.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(RagidxError, match="is not a ragidx index database"):
        IndexReader(tmp_path / "bad")
    with pytest.raises(RagidxError, match="is not a ragidx index database"):
        IndexWriter(tmp_path / "bad")
    assert (tmp_path / "bad" / "ragidx.db").read_bytes() == b"this is not sqlite" * 100  # left alone

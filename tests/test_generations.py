"""The on-disk index: generations, atomic commits, locking, and unreadable files."""

from __future__ import annotations

import pytest

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.storage import writer as writer_module
from ragidx.indexer.storage.reader import IndexReader
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
    scores, ids = index.search(first[2:3], 1)
    assert ids[0][0] == 3 and scores[0][0] == pytest.approx(1.0, abs=1e-5)
    assert reader.chunk_rows([3])[3]["text"] == "z" and reader.chunk_rows([3])[3]["metadata"] == {"team": "b"}
    reader.close()

    assert commit(tmp_path, [record("c", ["w"])], vectors(1, 1)) == 2
    reader = IndexReader(tmp_path)
    assert reader.meta["next_chunk_id"] == 5
    assert list(reader.chunk_rows([1, 2, 3, 4])) == [4]  # ids are never reused
    assert sorted(p.name for p in tmp_path.glob("vectors-*")) == ["vectors-2.faiss"]
    assert reader.counts() == {"documents": 1, "chunks": 1}


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

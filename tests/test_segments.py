"""Segmented vectors: the merge policy, searches over segments against exact numpy search,
deletions and repairs across segments, what an update writes, background merges, and indexes
written before segments."""

from __future__ import annotations

import json
import math
import sqlite3

import numpy as np
import pytest

from ragidx.indexer.storage.index_settings import VectorIndexSettings
from ragidx.indexer.storage.local.segments import (
    DELETED_FRACTION,
    MERGE_SIZE_RATIO,
    Segment,
    SegmentUnreadable,
    plan_merge,
)
from ragidx.indexer.storage.reader import IndexReader
from ragidx.indexer.storage.vector_store import VectorQuery
from ragidx.indexer.storage.writer import IndexWriter
from tests.support.index_files import segment_vectors
from tests.support.index_records import record, vectors

AUTO = VectorIndexSettings()
META = {"model": "m", "strategy": "mean", "strategy_params": {}, "dimension": 8}


def segment(name: str, size: int, deleted: int = 0, kind: str = "flat") -> Segment:
    ids = np.arange(size, dtype=np.int64) + 1000 * len(name)
    return Segment(name, kind, ids, ids[:deleted])


def planned(*segments: Segment, requested: VectorIndexSettings = AUTO) -> list[str]:
    plan = plan_merge(list(segments), requested, AUTO)
    return sorted(s.file for s in plan.sources) if plan else []


def test_the_merge_policy_takes_the_smallest_within_the_ratio_and_mostly_deleted_ones():
    assert MERGE_SIZE_RATIO == 2.0 and DELETED_FRACTION == 0.2
    assert planned(segment("big", 200_000), segment("a", 3)) == []
    assert planned(segment("big", 200_000), segment("a", 3), segment("b", 3)) == ["a", "b"]
    assert planned(segment("big", 200_000), segment("a", 9), segment("b", 3)) == []  # 9 > 2 x 3
    # 5+6 = 11, then 7 and 8 (7+8 = 15), then 11 and 15: all four; 100 > 2 x 26 stays
    assert planned(*(segment(n, s) for n, s in zip("abcde", (5, 6, 7, 8, 100), strict=True))) == list("abcd")
    assert planned(segment("big", 1000, deleted=201), segment("a", 3)) == ["big"]  # 20.1% deleted
    assert planned(segment("big", 1000, deleted=200), segment("a", 3)) == []
    assert planned(segment("gone", 5, deleted=5)) == ["gone"]  # written away without a file
    hnsw = VectorIndexSettings(requested="hnsw")
    plan = plan_merge([segment("big", 500), segment("a", 3)], hnsw, AUTO)
    assert plan.reason == "index type flat -> hnsw at 503 vectors" and len(plan.sources) == 2
    assert planned(segment("big", 500, kind="hnsw"), segment("a", 3, kind="hnsw"), requested=hnsw) == []


def test_appending_one_vector_at_a_time_keeps_few_segments_and_rewrites_each_vector_log_times():
    """The policy alone, simulated as builds use it: plan from the committed segments, then append."""
    segments: list[Segment] = []
    rewritten = 0
    for step in range(1, 2001):
        plan = plan_merge(segments, AUTO, AUTO)
        if plan:
            merged = np.concatenate([s.ids for s in plan.sources])
            rewritten += len(merged)
            segments = [s for s in segments if s not in plan.sources] + [Segment(f"m{step}", "flat", merged)]
        segments.append(Segment(f"s{step}", "flat", np.array([step], dtype=np.int64) * 10_000))
        assert len(segments) <= 2 * math.log2(step + 1) + 2
    assert rewritten / 2000 <= 2 * math.log2(2000)


def write(directory, records, vecs, removed=(), replace=False):
    with IndexWriter(directory) as writer:
        committed = writer.commit(records, vecs, META, removed, replace)
        return committed, {path: doc_id for path, (doc_id, _) in writer.documents().items()}


def live_by_numpy(directory) -> tuple[np.ndarray, np.ndarray]:
    found = segment_vectors(directory)
    ids = np.array(sorted(found), dtype=np.int64)
    return ids, np.stack([found[i] for i in ids]) if len(ids) else np.zeros((0, 8), np.float32)


def exact(ids: np.ndarray, stored: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    return ids[np.argsort(-(queries @ stored.T), axis=1, kind="stable")[:, :k]]


def test_updates_add_segments_that_search_as_one_exact_index(tmp_path):
    rng = np.random.default_rng(0)
    write(tmp_path, [record(f"d{i}", ["x"] * 4) for i in range(10)], vectors(40, 0), replace=True)
    for step in range(1, 7):  # each update replaces one document and adds one
        _, documents = write(tmp_path, [], np.zeros((0, 8), np.float32))
        victim = documents[f"/docs/d{step}"]
        write(
            tmp_path, [record(f"n{step}", ["y"] * 2), record(f"d{step}", ["z"])], vectors(3, step), [victim]
        )
    ids, stored = live_by_numpy(tmp_path)
    assert len(ids) == 40 - 6 * 4 + 6 * 3
    with sqlite3.connect(tmp_path / "ragidx.db") as db:
        files = sorted(row[0] for row in db.execute("select file from segments"))
    assert sorted(p.name for p in tmp_path.glob("vectors-*")) == files and 1 < len(files) < 7
    assert any(name.endswith("-merged.faiss") for name in files)  # the small ones were merged
    reader = IndexReader(tmp_path)
    loaded = reader.load_vectors()
    assert loaded.live_count == len(ids)
    queries = vectors(5, 99)
    scores, found = loaded.search(VectorQuery(queries, 10))
    np.testing.assert_array_equal(found, exact(ids, stored, queries, 10))
    np.testing.assert_allclose(scores, np.sort(queries @ stored.T, axis=1)[:, ::-1][:, :10], rtol=1e-5)
    allowed = np.sort(rng.choice(ids, 7, replace=False))
    found = loaded.search(VectorQuery(queries, 10, allowed=allowed))[1]
    rows = np.isin(ids, allowed)
    np.testing.assert_array_equal(found, exact(ids[rows], stored[rows], queries, 7))
    _, everything = loaded.search(VectorQuery(queries, 1000))
    assert sorted(everything[0].tolist()) == ids.tolist()  # deleted vectors never come back
    rows = reader.vector_parts()
    lives = [row["vectors"] - row["deleted"] for row in rows]
    assert sorted(row["file"] for row in rows) == files and lives == sorted(lives, reverse=True)
    reader.close()


def test_a_reader_following_updates_reads_only_new_segments(tmp_path):
    write(tmp_path, [record(f"d{i}", ["x"] * 10) for i in range(20)], vectors(200, 0), replace=True)
    reader = IndexReader(tmp_path)
    first = reader.load_vectors()
    _, documents = write(tmp_path, [], np.zeros((0, 8), np.float32))
    write(tmp_path, [record("new", ["y"] * 2)], vectors(2, 1), [documents["/docs/d3"]])
    with reader.snapshot():
        reader.reread_meta()
        followed, fresh = reader.load_vectors(first), reader.load_vectors()
    assert followed.files == fresh.files == ["vectors-1.faiss", "vectors-3.faiss"]
    assert followed.parts[0].index is first.parts[0].index  # not read again
    assert fresh.parts[0].index is not first.parts[0].index
    queries = vectors(4, 7)
    for got, want in zip(
        followed.search(VectorQuery(queries, 300)), fresh.search(VectorQuery(queries, 300)), strict=True
    ):
        np.testing.assert_array_equal(got, want)
    assert not np.isin(followed.search(VectorQuery(queries, 300))[1], np.arange(31, 41)).any()  # d3's chunks
    reader.close()


def test_an_update_writes_its_own_vectors_not_the_index(tmp_path):
    write(tmp_path, [record(f"d{i}", ["x"] * 10) for i in range(500)], vectors(5000, 0), replace=True)
    big = tmp_path / "vectors-1.faiss"
    before = (big.stat().st_ino, big.stat().st_mtime_ns, big.stat().st_size)
    _, documents = write(tmp_path, [], np.zeros((0, 8), np.float32))
    committed, _ = write(tmp_path, [record("d7", ["new"] * 3)], vectors(3, 1), [documents["/docs/d7"]])
    assert (big.stat().st_ino, big.stat().st_mtime_ns, big.stat().st_size) == before  # not rewritten
    new = [p for p in tmp_path.glob("vectors-*") if p != big]
    assert len(new) == 1 and new[0].stat().st_size < big.stat().st_size / 100
    assert committed.merged == "" and committed.segments == 2
    with sqlite3.connect(tmp_path / "ragidx.db") as db:
        deleted = sorted(row[0] for row in db.execute("select chunk_id from deletions"))
    assert deleted == list(range(71, 81))  # d7's ten chunks, recorded, not rewritten


def test_a_merge_runs_while_the_build_embeds_and_deletions_made_meanwhile_stick(tmp_path):
    write(tmp_path, [record("a", ["x"] * 50)], vectors(50, 0), replace=True)
    write(tmp_path, [record("b", ["x"] * 3)], vectors(3, 1))
    write(tmp_path, [record("c", ["x"] * 3)], vectors(3, 2))
    with IndexWriter(tmp_path) as writer:
        documents = {path: doc_id for path, (doc_id, _) in writer.documents().items()}
        with writer.next_generation([documents["/docs/b"]]) as pending:
            assert sorted(s.file for s in pending.vectors_write.merge.plan.sources) == [
                "vectors-2.faiss",
                "vectors-3.faiss",
            ]
            merged = (
                pending.vectors_write.merge.result()
            )  # finished before the build adds anything or commits
            assert (tmp_path / "vectors-4-merged.faiss").is_file() and len(merged.ids) == 6
            pending.add([record("d", ["y"])], vectors(1, 3))
            committed = pending.commit(META)
    assert committed.merged == "2 segments into one of 6 vectors" and committed.segments == 3
    assert sorted(p.name for p in tmp_path.glob("vectors-*")) == [
        "vectors-1.faiss",
        "vectors-4-merged.faiss",
        "vectors-4.faiss",
    ]
    ids, _ = live_by_numpy(tmp_path)
    assert not np.isin(np.arange(51, 54), ids).any()  # b's chunks, deleted during the merge


def test_a_build_that_fails_leaves_no_merge_behind(tmp_path):
    write(tmp_path, [record("a", ["x"] * 50)], vectors(50, 0), replace=True)
    write(tmp_path, [record("b", ["x"] * 3)], vectors(3, 1))
    write(tmp_path, [record("c", ["x"] * 3)], vectors(3, 2))
    with pytest.raises(ValueError), IndexWriter(tmp_path) as writer, writer.next_generation() as pending:
        assert pending.vectors_write.merge is not None
        pending.add([record("d", ["y"])], vectors(2, 3))  # two vectors for one chunk
    assert sorted(p.name for p in tmp_path.glob("vectors-*")) == [f"vectors-{g}.faiss" for g in (1, 2, 3)]
    (tmp_path / "vectors-2.faiss").write_bytes(b"damaged")
    with pytest.raises(SegmentUnreadable, match=r"vectors-2\.faiss is unreadable"):
        write(tmp_path, [record("d", ["y"])], vectors(1, 3))
    reader = IndexReader(tmp_path)
    assert reader.meta["generation"] == 3 and not list(tmp_path.glob("vectors-4*"))
    reader.close()


def test_an_index_from_before_segments_is_read_then_upgraded(tmp_path):
    """Built as ragidx wrote indexes until segments: one vectors-<generation>.faiss file, no
    segment tables, HNSW deletions in ``tombstones``."""
    write(tmp_path, [record("a", ["x"] * 6), record("b", ["y"] * 2)], vectors(8, 0), replace=True)
    with sqlite3.connect(tmp_path / "ragidx.db") as db:
        db.execute("drop table segments")
        db.execute("drop table deletions")
        db.execute("delete from meta where key = 'segmented'")
        db.execute("create table tombstones (chunk_id integer primary key)")
        db.execute("insert into tombstones values (2)")  # 1 of 8: below the rewrite share
        db.execute("delete from chunks where id = 2")
    reader = IndexReader(tmp_path)
    assert [(r["file"], r["vectors"], r["deleted"]) for r in reader.vector_parts()] == [
        ("vectors-1.faiss", 8, 1)
    ]
    found = reader.load_vectors().search(VectorQuery(vectors(8, 0), 8))[1]
    assert 2 not in found and sorted(found[0].tolist()) == [1, 3, 4, 5, 6, 7, 8]
    reader.close()
    write(tmp_path, [record("c", ["z"])], vectors(1, 1))
    with sqlite3.connect(tmp_path / "ragidx.db") as db:
        assert db.execute("select count(*) from sqlite_master where name = 'tombstones'").fetchone()[0] == 0
        assert list(db.execute("select segment, chunk_id from deletions")) == [("vectors-1.faiss", 2)]
        assert json.loads(db.execute("select value from meta where key = 'segmented'").fetchone()[0])
    ids, _ = live_by_numpy(tmp_path)
    assert ids.tolist() == [1, 3, 4, 5, 6, 7, 8, 9]

"""Vector index types: exactness, deletions (in place or tombstones), rebuilds, auto sizing,
search parameters and filtered search, each checked against exact numpy search."""

from __future__ import annotations

import numpy as np
import pytest

from ragidx.indexer import vector_index
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.vector_index import VectorIndexSettings, stored_ids, update

DIMENSION = 32
N = 2000


def clustered(n: int, seed: int) -> np.ndarray:
    centres = np.random.default_rng(0).standard_normal((40, DIMENSION))
    rng = np.random.default_rng(seed)
    points = centres[rng.integers(0, 40, n)] + 0.7 * rng.standard_normal((n, DIMENSION))
    return (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)


VECTORS = clustered(N, 1)
IDS = np.arange(100, 100 + N, dtype=np.int64)  # ids are not row numbers, as in an index
QUERIES = clustered(20, 2)


def exact(ids: np.ndarray, vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    order = np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, :k]
    return ids[order]


def built(kind: str, **settings) -> vector_index.VectorIndex:
    return update(None, VectorIndexSettings(requested=kind, **settings), VECTORS, IDS, np.zeros(0)).vectors


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)])


def test_each_type_finds_the_exact_neighbours():
    truth = exact(IDS, VECTORS, QUERIES, 10)
    flat = built("flat")
    assert flat.settings.kind == "flat"
    np.testing.assert_array_equal(flat.search(QUERIES, 10)[1], truth)
    ivf = built("ivf")
    assert ivf.settings.ivf_lists == 32 and ivf.settings.trained_on == N  # 2^round(log2 sqrt 2000) lists
    np.testing.assert_array_equal(ivf.search(QUERIES, 10, nprobe=ivf.settings.ivf_lists)[1], truth)
    hnsw = built("hnsw")
    assert recall(hnsw.search(QUERIES, 10, ef_search=200)[1], truth) >= 0.99
    scores, ids = hnsw.search(QUERIES, 10)
    rows = {i: row for i, row in zip(IDS, VECTORS, strict=True)}
    np.testing.assert_allclose(scores[0], [QUERIES[0] @ rows[i] for i in ids[0]], rtol=1e-5)


def test_nprobe_limits_the_lists_scanned():
    """With nprobe=1 every hit lies in the query's nearest list (unclustered vectors, whose true
    neighbours spread over many lists); the full probe is exact."""
    rng = np.random.default_rng(3)
    vectors, queries = rng.standard_normal((N, DIMENSION)), rng.standard_normal((20, DIMENSION))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    ivf = update(None, VectorIndexSettings(requested="ivf", nprobe=1), vectors, IDS, np.zeros(0)).vectors
    members = {
        int(i): list_no
        for list_no in range(ivf.settings.ivf_lists)
        for i in vector_index.list_ids(ivf.index.invlists, list_no)
    }
    nearest = ivf.index.quantizer.search(queries.astype(np.float32), 1)[1][:, 0]
    probed, full = ivf.search(queries, 10)[1], ivf.search(queries, 10, nprobe=10_000)[1]
    assert all({members[int(i)] for i in ids if i >= 0} == {nearest[row]} for row, ids in enumerate(probed))
    assert any(len({members[int(i)] for i in ids}) > 1 for ids in full)
    np.testing.assert_array_equal(full, exact(IDS, vectors, queries.astype(np.float32), 10))


def test_ef_search_is_at_least_the_number_of_results():
    hnsw = built("hnsw", ef_search=16)
    assert hnsw._parameters(100, None, None, None).efSearch == 100
    assert hnsw._parameters(10, None, 40, None).efSearch == 40
    assert hnsw._parameters(10, None, None, None).efSearch == 16


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_deleted_vectors_are_never_returned(kind):
    removed = IDS[::3]
    keep = ~np.isin(IDS, removed)
    result = update(built(kind), VectorIndexSettings(requested=kind), VECTORS[:0], IDS[:0], removed)
    vectors = result.vectors
    if kind == "hnsw":  # the graph keeps its nodes; the ids become tombstones, 33% > 20%: rebuilt
        assert result.rebuilt == "667 deleted vectors in the HNSW graph"
        assert len(vectors.tombstones) == 0 and vectors.ntotal == keep.sum()
    else:
        assert result.rebuilt == "" and vectors.ntotal == keep.sum()
    np.testing.assert_array_equal(stored_ids(vectors.index), IDS[keep])
    truth = exact(IDS[keep], VECTORS[keep], QUERIES, 10)
    found = vectors.search(QUERIES, 10, ef_search=400, nprobe=10_000)[1]
    assert recall(found, truth) >= (0.99 if kind == "hnsw" else 1.0)


def test_hnsw_tombstones_below_the_rebuild_fraction():
    removed = IDS[:100]  # 5%
    result = update(built("hnsw"), VectorIndexSettings(requested="hnsw"), VECTORS[:0], IDS[:0], removed)
    vectors = result.vectors
    assert result.rebuilt == "" and vectors.ntotal == N and vectors.live_count == N - 100
    np.testing.assert_array_equal(vectors.tombstones, removed)
    queries = VECTORS[:100]  # each removed vector's own nearest neighbour is itself
    found = vectors.search(queries, 5, ef_search=200)[1]
    assert not np.isin(found, removed).any()
    truth = exact(IDS[100:], VECTORS[100:], queries, 5)
    assert recall(found, truth) >= 0.99


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_filtered_search_is_exact_among_the_allowed(kind):
    vectors = built(kind)
    for allowed in (IDS[::500], IDS[1::2]):  # 4 ids: answered exactly; 1000 ids: selector
        scores, ids = vectors.search(QUERIES, 10, allowed=allowed, ef_search=400, nprobe=10_000)
        rows = np.isin(IDS, allowed)
        truth = exact(IDS[rows], VECTORS[rows], QUERIES, min(10, len(allowed)))
        assert np.isin(ids, allowed).all() and recall(ids, truth) >= 0.99
    scores, ids = vectors.search(QUERIES[:1], 10, allowed=IDS[5:6])
    assert ids.tolist() == [[IDS[5]]] and scores[0][0] == pytest.approx(
        float(QUERIES[0] @ VECTORS[5]), abs=1e-5
    )


def test_a_filter_that_ann_misses_falls_back_to_exact(monkeypatch):
    """IVF with nprobe=1 cannot reach allowed ids outside the probed list: the search is redone exactly."""
    monkeypatch.setattr(vector_index, "EXACT_FILTER_LIMIT", 1)
    monkeypatch.setattr(vector_index, "EXACT_BLOCK", 7)  # the exact pass keeps a running top k
    vectors = built("ivf", nprobe=1)
    allowed = IDS[::50]
    ids = vectors.search(QUERIES, 10, allowed=allowed)[1]
    rows = np.isin(IDS, allowed)
    np.testing.assert_array_equal(ids, exact(IDS[rows], VECTORS[rows], QUERIES, 10))


def test_auto_switches_type_by_size_with_hysteresis(monkeypatch):
    monkeypatch.setattr(vector_index, "FLAT_SCAN_BYTES", 1000 * 4 * DIMENSION)  # 1000 vectors
    auto = VectorIndexSettings()
    first = update(None, auto, VECTORS[:900], IDS[:900], np.zeros(0))
    assert first.vectors.settings.kind == "flat"
    grown = update(first.vectors, auto, VECTORS[900:1200], IDS[900:1200], np.zeros(0))
    assert (
        grown.vectors.settings.kind == "hnsw" and grown.rebuilt == "index type flat -> hnsw at 1200 vectors"
    )
    np.testing.assert_array_equal(stored_ids(grown.vectors.index), IDS[:1200])
    shrunk = update(grown.vectors, grown.vectors.settings, VECTORS[:0], IDS[:0], IDS[:600])
    assert shrunk.vectors.settings.kind == "hnsw"  # 600 >= 1000 / 2: stays
    flat_again = update(shrunk.vectors, shrunk.vectors.settings, VECTORS[:0], IDS[:0], IDS[600:701])
    assert flat_again.vectors.settings.kind == "flat"  # 499 live, below half the limit
    np.testing.assert_array_equal(stored_ids(flat_again.vectors.index), IDS[701:1200])


def test_ivf_is_retrained_when_it_outgrows_its_lists():
    small = update(None, VectorIndexSettings(requested="ivf"), VECTORS[:400], IDS[:400], np.zeros(0)).vectors
    assert (small.settings.ivf_lists, small.settings.trained_on) == (10, 400)  # 400 // 39 caps sqrt(400)
    same = update(small, small.settings, VECTORS[400:1000], IDS[400:1000], np.zeros(0))
    assert same.rebuilt == "" and same.vectors.settings.trained_on == 400
    grown = update(same.vectors, same.vectors.settings, VECTORS[1000:], IDS[1000:], np.zeros(0))
    assert grown.rebuilt == f"IVF trained with 32 lists on {N} vectors"
    truth = exact(IDS, VECTORS, QUERIES, 10)
    np.testing.assert_array_equal(grown.vectors.search(QUERIES, 10, nprobe=32)[1], truth)


def test_settings_validate_and_describe():
    with pytest.raises(RagidxError, match="unknown index type 'annoy'"):
        VectorIndexSettings().with_overrides(requested="annoy")
    with pytest.raises(RagidxError, match="ef-search must be a positive integer"):
        VectorIndexSettings().with_overrides(ef_search=0)
    assert VectorIndexSettings.from_meta({}).requested == "auto"
    assert vector_index.flat_limit(896) == 37449 and vector_index.flat_limit(384) == 87381
    described = built("hnsw").settings.describe()
    assert described == "hnsw (M 32, efConstruction 80, efSearch 64)"


def test_an_empty_index_answers_nothing():
    empty = update(built("ivf"), VectorIndexSettings(requested="ivf"), VECTORS[:0], IDS[:0], IDS).vectors
    ids = empty.search(QUERIES, 10)[1]
    assert ids.shape == (len(QUERIES), 0)
    refilled = update(empty, empty.settings, VECTORS[:500], IDS[:500], np.zeros(0))
    assert "IVF trained" in refilled.rebuilt
    np.testing.assert_array_equal(
        refilled.vectors.search(QUERIES, 5, nprobe=1000)[1], exact(IDS[:500], VECTORS[:500], QUERIES, 5)
    )

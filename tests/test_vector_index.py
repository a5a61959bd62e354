"""Vector index types: exactness, deleted ids (tombstones), auto sizing, search parameters and
filtered search, each checked against exact numpy search. How structures combine into segments:
test_segments.py."""

from __future__ import annotations

import numpy as np
import pytest

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.storage import index_settings
from ragidx.indexer.storage.index_settings import VectorIndexSettings, flat_limit
from ragidx.indexer.storage.local import faiss_index as vector_index
from ragidx.indexer.storage.local.faiss_index import new_vector_index, sized_settings, stored_ids
from ragidx.indexer.storage.vector_store import VectorQuery

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
    return new_vector_index(VectorIndexSettings(requested=kind, **settings), VECTORS, IDS)


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)])


def test_each_type_finds_the_exact_neighbours():
    truth = exact(IDS, VECTORS, QUERIES, 10)
    flat = built("flat")
    assert flat.settings.kind == "flat"
    np.testing.assert_array_equal(flat.search(VectorQuery(QUERIES, 10))[1], truth)
    ivf = built("ivf")
    assert ivf.settings.ivf_lists == 32 and ivf.settings.trained_on == N  # 2^round(log2 sqrt 2000) lists
    np.testing.assert_array_equal(
        ivf.search(VectorQuery(QUERIES, 10, nprobe=ivf.settings.ivf_lists))[1], truth
    )
    hnsw = built("hnsw")
    assert recall(hnsw.search(VectorQuery(QUERIES, 10, ef_search=200))[1], truth) >= 0.99
    scores, ids = hnsw.search(VectorQuery(QUERIES, 10))
    rows = {i: row for i, row in zip(IDS, VECTORS, strict=True)}
    np.testing.assert_allclose(scores[0], [QUERIES[0] @ rows[i] for i in ids[0]], rtol=1e-5)


def test_nprobe_limits_the_lists_scanned():
    """With nprobe=1 every hit lies in the query's nearest list (unclustered vectors, whose true
    neighbours spread over many lists); the full probe is exact."""
    rng = np.random.default_rng(3)
    vectors, queries = rng.standard_normal((N, DIMENSION)), rng.standard_normal((20, DIMENSION))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    ivf = new_vector_index(VectorIndexSettings(requested="ivf", nprobe=1), vectors, IDS)
    members = {
        int(i): list_no
        for list_no in range(ivf.settings.ivf_lists)
        for i in vector_index.list_ids(ivf.index.invlists, list_no)
    }
    nearest = ivf.index.quantizer.search(queries.astype(np.float32), 1)[1][:, 0]
    probed, full = (
        ivf.search(VectorQuery(queries, 10))[1],
        ivf.search(VectorQuery(queries, 10, nprobe=10_000))[1],
    )
    assert all({members[int(i)] for i in ids if i >= 0} == {nearest[row]} for row, ids in enumerate(probed))
    assert any(len({members[int(i)] for i in ids}) > 1 for ids in full)
    np.testing.assert_array_equal(full, exact(IDS, vectors, queries.astype(np.float32), 10))


def test_ef_search_is_at_least_the_number_of_results():
    hnsw = built("hnsw", ef_search=16)
    assert hnsw._parameters(100, None, None, None).efSearch == 100
    assert hnsw._parameters(10, None, 40, None).efSearch == 40
    assert hnsw._parameters(10, None, None, None).efSearch == 16


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_tombstoned_vectors_are_never_returned(kind):
    vectors = built(kind)
    removed = IDS[::3]
    vectors.tombstones = removed
    keep = ~np.isin(IDS, removed)
    assert vectors.ntotal == N and vectors.live_count == keep.sum()
    truth = exact(IDS[keep], VECTORS[keep], QUERIES, 10)
    found = vectors.search(VectorQuery(QUERIES, 10, ef_search=400, nprobe=10_000))[1]
    assert not np.isin(found, removed).any()
    assert recall(found, truth) >= (0.99 if kind == "hnsw" else 1.0)
    own = vectors.search(VectorQuery(VECTORS[:100:3], 1, ef_search=200))[
        1
    ]  # each removed vector's nearest is itself
    assert not np.isin(own, removed).any()


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_filtered_search_is_exact_among_the_allowed(kind):
    vectors = built(kind)
    for allowed in (IDS[::500], IDS[1::2]):  # 4 ids: answered exactly; 1000 ids: selector
        scores, ids = vectors.search(VectorQuery(QUERIES, 10, allowed=allowed, ef_search=400, nprobe=10_000))
        rows = np.isin(IDS, allowed)
        truth = exact(IDS[rows], VECTORS[rows], QUERIES, min(10, len(allowed)))
        assert np.isin(ids, allowed).all() and recall(ids, truth) >= 0.99
    scores, ids = vectors.search(VectorQuery(QUERIES[:1], 10, allowed=IDS[5:6]))
    assert ids.tolist() == [[IDS[5]]] and scores[0][0] == pytest.approx(
        float(QUERIES[0] @ VECTORS[5]), abs=1e-5
    )


def test_a_filter_that_ann_misses_falls_back_to_exact(monkeypatch):
    """IVF with nprobe=1 cannot reach allowed ids outside the probed list: the search is redone exactly."""
    monkeypatch.setattr(vector_index, "EXACT_FILTER_LIMIT", 1)
    monkeypatch.setattr(vector_index, "EXACT_BLOCK", 7)  # the exact pass keeps a running top k
    vectors = built("ivf", nprobe=1)
    allowed = IDS[::50]
    ids = vectors.search(VectorQuery(QUERIES, 10, allowed=allowed))[1]
    rows = np.isin(IDS, allowed)
    np.testing.assert_array_equal(ids, exact(IDS[rows], VECTORS[rows], QUERIES, 10))


def test_auto_picks_the_type_by_size_with_hysteresis(monkeypatch):
    monkeypatch.setattr(index_settings, "FLAT_SCAN_BYTES", 1000 * 4 * DIMENSION)  # 1000 vectors
    auto = VectorIndexSettings()
    assert sized_settings(auto, 1000, DIMENSION, None).kind == "flat"
    hnsw = sized_settings(auto, 1001, DIMENSION, None)
    assert hnsw.kind == "hnsw" and hnsw.requested == "auto"
    assert sized_settings(auto, 600, DIMENSION, hnsw).kind == "hnsw"  # replacing an HNSW graph: 600 >= 500
    assert sized_settings(auto, 499, DIMENSION, hnsw).kind == "flat"  # below half the limit
    assert sized_settings(auto, 600, DIMENSION, None).kind == "flat"
    np.testing.assert_array_equal(
        stored_ids(new_vector_index(auto, VECTORS[:1200], IDS[:1200]).index), IDS[:1200]
    )


def test_ivf_lists_follow_the_count_trained_on():
    small = sized_settings(VectorIndexSettings(requested="ivf"), 400, DIMENSION, None)
    assert (small.ivf_lists, small.trained_on) == (10, 400)  # 400 // 39 caps sqrt(400)
    assert sized_settings(VectorIndexSettings(requested="ivf"), N, DIMENSION, small).ivf_lists == 32
    assert sized_settings(VectorIndexSettings(requested="ivf", nlist=8), N, DIMENSION, None).ivf_lists == 8


def test_settings_validate_and_describe():
    with pytest.raises(RagidxError, match="unknown index type 'annoy'"):
        VectorIndexSettings().with_overrides(requested="annoy")
    with pytest.raises(RagidxError, match="ef-search must be a positive integer"):
        VectorIndexSettings().with_overrides(ef_search=0)
    assert VectorIndexSettings.from_meta({}).requested == "auto"
    assert flat_limit(896) == 37449 and flat_limit(384) == 87381
    described = built("hnsw").settings.describe()
    assert described == "hnsw (M 32, efConstruction 80, efSearch 64)"


def test_an_empty_index_answers_nothing():
    empty = new_vector_index(VectorIndexSettings(requested="ivf"), VECTORS[:0], IDS[:0])
    assert empty.search(VectorQuery(QUERIES, 10))[1].shape == (len(QUERIES), 0)
    everything_deleted = built("flat")
    everything_deleted.tombstones = IDS
    assert everything_deleted.search(VectorQuery(QUERIES, 10))[1].shape == (len(QUERIES), 0)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_one_query_searches_on_one_faiss_thread_and_the_count_comes_back(kind, monkeypatch):
    import faiss

    index = built(kind)
    faiss.omp_set_num_threads(2)
    seen = []
    search = type(index.index).search

    def counting(self, *args, **kwargs):
        seen.append(faiss.omp_get_max_threads())
        return search(self, *args, **kwargs)

    monkeypatch.setattr(type(index.index), "search", counting)
    one = index.search(VectorQuery(QUERIES[:1], 10))
    many = index.search(VectorQuery(QUERIES, 10))
    assert seen == [1, 2] and faiss.omp_get_max_threads() == 2
    np.testing.assert_array_equal(one[1], many[1][:1])  # the same neighbours either way

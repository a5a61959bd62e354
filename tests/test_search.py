"""Dense, lexical (FTS5 BM25) and hybrid (reciprocal rank fusion) search through the Python API."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from ragidx.app import Index
from ragidx.app.retriever import reciprocal_rank_fusion
from ragidx.indexer.errors import RagidxError


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_models, sample_corpus):
    from ragidx.indexer.pipeline import BuildOptions, build

    folder = tmp_path_factory.mktemp("search") / "index"
    build(
        [sample_corpus / "faq", sample_corpus / "notes"],
        BuildOptions(index_dir=folder, model=str(tiny_models["qwen2"]), device="cpu", progress=False),
    )
    with Index.open(folder, device="cpu") as opened:
        yield opened


def test_rrf_against_a_hand_computed_example():
    dense = [(1, 0.9), (2, 0.8), (3, 0.7)]
    lexical = [(3, 5.0), (4, 4.0)]
    fused = reciprocal_rank_fusion([dense, lexical])
    assert [item for item, _ in fused] == [3, 1, 2, 4]  # 2 and 4 tie at 1/62: lower id first
    assert dict(fused) == pytest.approx({3: 1 / 63 + 1 / 61, 1: 1 / 61, 2: 1 / 62, 4: 1 / 62})


def independent_lexical(index: Index, words: list[str]) -> list[tuple[int, float]]:
    with sqlite3.connect(index.reader.directory / "ragidx.db") as db:
        rows = db.execute(
            "select rowid, bm25(chunks_fts) from chunks_fts where chunks_fts match ? order by 2, 1 limit 100",
            [" OR ".join(words)],
        ).fetchall()
    return [(rowid, -score) for rowid, score in rows]


def independent_dense(index: Index, query: str) -> list[tuple[int, float]]:
    import faiss

    stored = faiss.read_index(str(index.reader.directory / f"vectors-{index.meta['generation']}.faiss"))
    ids = faiss.vector_to_array(stored.id_map)
    vectors = np.stack([stored.reconstruct(int(i)) for i in ids])
    scores = vectors @ index.strategy.encode([query], "query")[0]
    order = np.argsort(-scores, kind="stable")[:100]
    return [(int(ids[i]), float(scores[i])) for i in order]


def test_each_mode_matches_an_independent_ranking(index):
    query = "How long does shipping take for a refund?"
    lexical = independent_lexical(index, ["how", "long", "does", "shipping", "take", "for", "a", "refund"])
    dense = independent_dense(index, query)
    got = {mode: index.search(query, k=5, mode=mode) for mode in ("dense", "lexical", "hybrid")}
    assert [(h.chunk_id, round(h.score, 4)) for h in got["lexical"]] == [
        (i, round(s, 4)) for i, s in lexical[:5]
    ]
    assert [h.chunk_id for h in got["dense"]] == [i for i, _ in dense[:5]]
    np.testing.assert_allclose([h.score for h in got["dense"]], [s for _, s in dense[:5]], atol=1e-5)
    fused = reciprocal_rank_fusion([dense, lexical])[:5]
    assert [h.chunk_id for h in got["hybrid"]] == [i for i, _ in fused]
    assert [h.score for h in got["hybrid"]] == pytest.approx([s for _, s in fused])
    dense_ranks = {chunk_id: rank for rank, (chunk_id, _) in enumerate(dense, start=1)}
    lexical_ranks = {chunk_id: rank for rank, (chunk_id, _) in enumerate(lexical, start=1)}
    for hit in got["hybrid"]:
        assert (hit.dense_rank, hit.lexical_rank) == (
            dense_ranks.get(hit.chunk_id),
            lexical_ranks.get(hit.chunk_id),
        )


@pytest.mark.parametrize(
    "query",
    ['"unbalanced quote', "warrant*", "-returns", "NEAR(return policy)", "((( )", "AND OR NOT", "a:b ^c"],
)
def test_fts_syntax_in_queries_never_errors(index, query):
    for mode in ("lexical", "hybrid"):
        assert isinstance(index.search(query, k=3, mode=mode), list)


def test_punctuation_only_query_falls_back_to_dense_in_hybrid(index):
    assert index.search('"*()', k=3, mode="lexical") == []
    hybrid = index.search('"*()', k=3, mode="hybrid")
    assert [h.chunk_id for h in hybrid] == [h.chunk_id for h in index.search('"*()', k=3, mode="dense")]


def test_bad_mode_and_k_are_refused(index):
    with pytest.raises(RagidxError, match="unknown mode"):
        index.search("x", mode="sparse")
    with pytest.raises(RagidxError, match="k must be"):
        index.search("x", k=0)

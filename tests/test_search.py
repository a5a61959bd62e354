"""Dense, lexical (FTS5 BM25) and hybrid (reciprocal rank fusion) search through the Python API."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragidx.app import Index
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.search.fusion import Fusion
from tests.support.search_checks import independent_dense, independent_fusion, independent_lexical


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_models, sample_corpus):
    from ragidx.indexer.build.pipeline import BuildOptions, build

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
    fused = Fusion().fuse({"dense": dense, "lexical": lexical})
    assert [item for item, _ in fused] == [3, 1, 2, 4]  # 2 and 4 tie at 1/62: lower id first
    assert dict(fused) == pytest.approx({3: 1 / 63 + 1 / 61, 1: 1 / 61, 2: 1 / 62, 4: 1 / 62})


def test_weighted_rrf_against_a_hand_computed_example():
    dense = [(1, 0.9), (2, 0.8), (3, 0.7)]
    lexical = [(3, 5.0), (4, 4.0)]
    fused = Fusion(dense=0.2, lexical=0.8).fuse({"dense": dense, "lexical": lexical})
    expected = {3: 0.2 / 63 + 0.8 / 61, 4: 0.8 / 62, 1: 0.2 / 61, 2: 0.2 / 62}
    assert [item for item, _ in fused] == [3, 4, 1, 2]
    assert dict(fused) == pytest.approx(expected)


def test_minmax_fusion_against_a_hand_computed_example():
    dense = [(1, 0.9), (2, 0.8), (3, 0.5)]  # normalised: 1, 0.75, 0
    lexical = [(3, 5.0), (4, 4.0), (5, 1.0)]  # normalised: 1, 0.75, 0
    fused = Fusion(dense=0.4, lexical=0.6, method="minmax").fuse({"dense": dense, "lexical": lexical})
    expected = {4: 0.45, 1: 0.4, 3: 0.6, 2: 0.3, 5: 0.0}
    assert [item for item, _ in fused] == [3, 4, 1, 2, 5]
    assert dict(fused) == pytest.approx(expected)


def test_a_list_weighted_zero_takes_no_part():
    dense = [(1, 0.9), (2, 0.8), (3, 0.7)]
    lexical = [(3, 5.0), (4, 4.0)]
    fused = Fusion(dense=0.0, lexical=1.0).fuse({"dense": dense, "lexical": lexical})
    assert [item for item, _ in fused] == [3, 4]  # no zero-score dense items after them
    assert [score for _, score in fused] == pytest.approx([1 / 61, 1 / 62])
    assert Fusion(dense=0.0, lexical=1.0).searched() == ("lexical",)
    assert Fusion(dense=2.0, lexical=0.0).searched() == ("dense",) and Fusion().searched() == (
        "dense",
        "lexical",
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dense=0.3,lexcial=0.7", "weights look like"),
        ("dense=abc", "not a number"),
        ("dense=0,lexical=0", "not all zero"),
        ("dense=-1,lexical=1", "non-negative"),
        ("dense=nan", "finite"),
        ("", "at least one"),
    ],
)
def test_bad_weights_are_refused_in_one_line(text, message):
    with pytest.raises(RagidxError, match=message):
        Fusion.parse(text)


def test_weights_parse_and_normalise():
    assert Fusion.parse("dense=3, lexical=1").normalised() == Fusion(0.75, 0.25)
    assert Fusion(3, 1, "minmax").normalised() == Fusion(0.75, 0.25, "minmax")
    with pytest.raises(RagidxError, match="unknown fusion method 'zscore'"):
        Fusion(method="zscore")
    assert Fusion.parse("lexical=2") == Fusion(0.0, 2.0)


def test_each_mode_matches_an_independent_ranking(index):
    query = "How long does shipping take for a refund?"
    lexical = independent_lexical(index, ["long", "shipping", "refund"])  # the query's content words
    dense = independent_dense(index, query)
    got = {mode: index.search(query, k=5, mode=mode) for mode in ("dense", "lexical", "hybrid")}
    assert [(h.chunk_id, round(h.score, 4)) for h in got["lexical"]] == [
        (i, round(s, 4)) for i, s in lexical[:5]
    ]
    assert [h.chunk_id for h in got["dense"]] == [i for i, _ in dense[:5]]
    np.testing.assert_allclose([h.score for h in got["dense"]], [s for _, s in dense[:5]], atol=1e-5)
    tuned = index.meta["fusion"]["weights"] if index.meta.get("fusion") else {"dense": 1, "lexical": 1}
    fused = independent_fusion(dense, lexical, tuned["dense"], tuned["lexical"])[:5]
    assert [h.chunk_id for h in got["hybrid"]] == [i for i, _ in fused]
    assert [h.score for h in got["hybrid"]] == pytest.approx([s for _, s in fused])
    dense_ranks = {chunk_id: rank for rank, (chunk_id, _) in enumerate(dense, start=1)}
    lexical_ranks = {chunk_id: rank for rank, (chunk_id, _) in enumerate(lexical, start=1)}
    for hit in got["hybrid"]:
        assert (hit.dense_rank, hit.lexical_rank) == (
            dense_ranks.get(hit.chunk_id),
            lexical_ranks.get(hit.chunk_id),
        )


@pytest.mark.parametrize("method", ["rrf", "minmax"])
@pytest.mark.parametrize("weights", [{"dense": 0.3, "lexical": 0.7}, {"dense": 1.0}, {"lexical": 1.0}])
def test_given_weights_match_an_independent_fusion(index, weights, method):
    query = "How long does shipping take for a refund?"
    lexical = independent_lexical(index, ["long", "shipping", "refund"])  # the query's content words
    dense = independent_dense(index, query)
    hits = index.search(query, k=8, weights=weights, fusion=method)
    w_dense, w_lexical = weights.get("dense", 0.0), weights.get("lexical", 0.0)
    fused = independent_fusion(dense, lexical, w_dense, w_lexical, method)[:8]
    assert [h.chunk_id for h in hits] == [i for i, _ in fused]
    assert [h.score for h in hits] == pytest.approx([s for _, s in fused])
    if weights == {"lexical": 1.0}:  # the lexical order alone: the query is not even embedded
        lexical_hits = [h.chunk_id for h in index.search(query, k=8, mode="lexical")]
        assert [h.chunk_id for h in hits] == lexical_hits and all(h.dense_rank is None for h in hits)


def test_weights_are_refused_outside_hybrid(index):
    with pytest.raises(RagidxError, match="weights and fusion apply to hybrid search"):
        index.search("refund", mode="dense", weights={"dense": 1.0})
    with pytest.raises(RagidxError, match="apply to hybrid search"):
        index.search("refund", mode="lexical", fusion="minmax")
    with pytest.raises(RagidxError, match="unknown fusion 'zscore': choose one of rrf, minmax"):
        index.search("refund", fusion="zscore")


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
    with pytest.raises(RagidxError, match="k must be at least 1, got 0"):
        index.search("x", k=0)
    with pytest.raises(RagidxError, match="k must be at most 1000, got 100000000000000000000"):
        index.search("x", k=10**20)
    with pytest.raises(RagidxError, match="k needs a whole number, got True"):
        index.search("x", k=True)
    with pytest.raises(RagidxError, match="min_score needs a finite number, got nan"):
        index.search("x", min_score=float("nan"))
    with pytest.raises(RagidxError, match="unknown search option 'top_k'"):
        index.search("x", top_k=3)
    with pytest.raises(RagidxError, match="keywords"):
        index.search("x", 5)


def test_stop_words_do_not_outvote_content_words(index):
    """An OR of every word let "how", "does" and "take" rank chunks full of them over the answer."""
    hits = index.search("How long does shipping take", k=3, mode="lexical")
    assert hits[0].path.endswith("shipping.txt")
    assert [h.chunk_id for h in hits] == [i for i, _ in independent_lexical(index, ["long", "shipping"])[:3]]
    only_stop_words = index.search("what is it", k=3, mode="lexical")  # nothing else to go on: kept
    assert [h.chunk_id for h in only_stop_words] == [
        i for i, _ in independent_lexical(index, ["what", "is", "it"])[:3]
    ]


def test_a_spelled_out_name_also_searches_its_acronym():
    """ "JSON Web Tokens" finds a README that only says ``import jwt``: three or more capitalised
    words in a row (hyphens join them) add their initials as one more OR-ed word; two do not."""
    from ragidx.indexer.storage.lexical import match_expression

    assert match_expression("encode and verify JSON Web Tokens") == (
        '"encod" OR "verifi" OR "json" OR "web" OR "token" OR "jwt"'  # Porter stems, as FTS5's
    )
    assert match_expression("what is a Write-Ahead Log?").endswith('"log" OR "wal"')
    assert match_expression("stream Server-Sent Events to Large Language Models").endswith('"sse" OR "llm"')
    assert match_expression("Map Python classes") == '"map" OR "python" OR "class"'  # two: none
    assert match_expression("HTTP/2 Push Promise Frames") == (
        '"http" OR "2" OR "push" OR "promis" OR "frame" OR "ppf"'
    )


CJK_DOCUMENTS = {
    "tokyo.txt": "日本の首都は東京です。東京には多くの人が住んでいます。",
    "beijing.txt": "北京是中国的首都。北京有很多名胜古迹。",
    "seoul.txt": "서울은 대한민국의 수도입니다.",
    "lisbon.txt": "Lisbon is the capital of Portugal, built on seven hills.",
}


def test_text_written_without_spaces_is_searchable(tmp_path, tiny_models):
    from ragidx.indexer.build.maintenance import check, remove

    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in CJK_DOCUMENTS.items():
        (docs / name).write_text(text, encoding="utf-8")
    folder = tmp_path / "index"
    with Index.build([docs], folder, model=str(tiny_models["qwen2"]), device="cpu", progress=False) as built:

        def found(query: str) -> list[str]:
            return [Path(h.path).name for h in built.search(query, k=5, mode="lexical")]

        assert set(found("首都")) == {"tokyo.txt", "beijing.txt"}  # two characters, inside longer runs
        assert found("東京") == ["tokyo.txt"] and found("北京 名胜") == ["beijing.txt"]
        assert found("수도") == ["seoul.txt"] and found("capital") == ["lisbon.txt"]
        assert found("京都") == []  # the characters of 東京都 apart do not make the word
        remove([docs / "tokyo.txt"], folder)
        assert found("首都") == ["beijing.txt"]
    assert check(folder).healthy


def test_a_query_that_is_not_valid_unicode_is_refused_in_one_line(index):
    with pytest.raises(RagidxError, match="not valid Unicode"):
        index.search("\ud800 tides", mode="lexical")


def test_explain_gives_each_lists_rank_and_score_and_the_fused_score(index):
    """Against the independent rankings: each hit's place and score in the dense and the lexical
    list, and its fused score as the weighted sum of 1/(60 + rank) over the lists it is in."""
    query = "How long does shipping take for a refund?"
    lexical = independent_lexical(index, ["long", "shipping", "refund"])
    dense = independent_dense(index, query)
    weights = {"dense": 0.3, "lexical": 0.7}
    hits = index.search(query, k=8, weights=weights, fusion="rrf", explain=True)
    plain = index.search(query, k=8, weights=weights, fusion="rrf")
    assert [(h.chunk_id, h.score) for h in hits] == [(h.chunk_id, h.score) for h in plain]
    assert all(h.explain is None for h in plain) and "explain" not in plain[0].to_dict()
    listed = {
        "dense": {i: (rank, s) for rank, (i, s) in enumerate(dense, start=1)},
        "lexical": {i: (rank, s) for rank, (i, s) in enumerate(lexical, start=1)},
    }
    for hit in hits:
        why = hit.explain
        assert why is not None and why.fusion == "rrf" and why.weights == weights
        fused = 0.0
        for name, found in (("dense", why.dense), ("lexical", why.lexical)):
            expected = listed[name].get(hit.chunk_id)
            if expected is None:
                assert found is None
                continue
            assert found is not None and found.rank == expected[0]
            assert found.score == pytest.approx(expected[1], abs=1e-5)
            fused += weights[name] / (60 + expected[0])
        assert why.fused == pytest.approx(fused) == pytest.approx(hit.score)
        shown = hit.to_dict()["explain"]
        assert shown["fused"] == why.fused and shown["dense"] == (
            {"rank": why.dense.rank, "score": why.dense.score} if why.dense else None
        )
    lexical_only = index.search(query, k=3, mode="lexical", explain=True)
    assert all(h.explain.dense is None and h.explain.fused is None for h in lexical_only)
    assert lexical_only and [h.explain.lexical.rank for h in lexical_only] == [
        rank for rank, _ in enumerate(lexical_only, start=1)
    ]

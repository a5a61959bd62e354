"""Retrieval and similarity metrics against hand-computed values."""

from __future__ import annotations

import math

import pytest

from ragidx.app.research.metrics import (
    average_ranks,
    mean_retrieval_metrics,
    mrr_at,
    ndcg_at,
    ordered,
    recall_at,
    spearman,
)

RANKING = [("d1", 0.9), ("d2", 0.8), ("d3", 0.7), ("d4", 0.6)]
GRADED = {"d2": 2, "d4": 1, "d9": 1}


def test_ndcg_with_graded_relevance():
    # gains 0, 2, 0, 1 at ranks 1-4; ideal gains 2, 1, 1
    dcg = 2 / math.log2(3) + 1 / math.log2(5)
    ideal = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at(RANKING, GRADED, 10) == pytest.approx(dcg / ideal)
    assert ndcg_at(RANKING, GRADED, 2) == pytest.approx((2 / math.log2(3)) / (2 + 1 / math.log2(3)))
    assert ndcg_at([("d2", 1.0), ("d4", 0.5), ("d9", 0.1)], GRADED, 10) == pytest.approx(1.0)


def test_ties_are_broken_by_document_id():
    tied = [("b", 0.5), ("a", 0.5), ("c", 0.9)]
    assert ordered(tied) == ["c", "a", "b"]
    assert mrr_at(tied, {"b": 1}, 10) == pytest.approx(1 / 3)
    assert mrr_at(list(reversed(tied)), {"b": 1}, 10) == pytest.approx(1 / 3)


def test_recall_and_mrr():
    assert recall_at(RANKING, GRADED, 10) == pytest.approx(2 / 3)
    assert recall_at(RANKING, GRADED, 2) == pytest.approx(1 / 3)
    assert mrr_at(RANKING, GRADED, 10) == pytest.approx(1 / 2)
    assert mrr_at(RANKING, {"d4": 1}, 3) == 0.0


def test_nothing_relevant_retrieved_scores_zero():
    judged = {"x": 1}
    assert (ndcg_at(RANKING, judged, 10), recall_at(RANKING, judged, 10), mrr_at(RANKING, judged, 10)) == (
        0.0,
        0.0,
        0.0,
    )
    assert ndcg_at(RANKING, {"d1": 0}, 10) == 0.0  # judged non-relevant only


def test_means_skip_unjudged_queries_and_count_missing_rankings_as_zero():
    qrels = {"q1": {"d2": 1}, "q2": {"d1": 1}, "q3": {"d1": 0}}
    rankings = {"q1": [("d2", 1.0)], "q3": RANKING}
    means = mean_retrieval_metrics(rankings, qrels)
    assert means == {"ndcg@10": 0.5, "recall@10": 0.5, "recall@100": 0.5, "mrr@10": 0.5}


def test_spearman_with_ties_and_without():
    assert average_ranks([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]
    x, y = [1, 2, 3, 4, 5], [2, 1, 4, 3, 5]
    d2 = sum((a - b) ** 2 for a, b in zip(x, y, strict=True))
    assert spearman(x, y) == pytest.approx(1 - 6 * d2 / (5 * 24))
    # ties: ranks x = 1, 2.5, 2.5, 4 and y = 1, 2, 3, 4 -> Pearson of those ranks
    rx, ry = [1, 2.5, 2.5, 4], [1, 2, 3, 4]
    mx, my = sum(rx) / 4, sum(ry) / 4
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    norm = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    assert spearman([0.1, 0.5, 0.5, 0.9], [3, 4, 5, 6]) == pytest.approx(cov / norm)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)

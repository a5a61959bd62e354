"""Retrieval and similarity metrics, defined once for `ragidx eval` (the BEIR / trec_eval conventions).

A ranking is a list of (document id, score); it is ordered by score, highest first, ties by
document id, so equal scores never make a result depend on input order. Relevance judgements
(qrels) map document ids to graded relevance; a grade above zero counts as relevant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

Ranking = Sequence[tuple[str, float]]
Judgements = Mapping[str, int]


def ordered(ranking: Ranking) -> list[str]:
    """Document ids by descending score; equal scores in ascending id order."""
    return [doc for doc, _ in sorted(ranking, key=lambda item: (-item[1], item[0]))]


def ndcg_at(ranking: Ranking, judged: Judgements, k: int) -> float:
    """nDCG@k with the grade as gain and log2(rank + 1) as discount; 0 when nothing is relevant."""
    gains = [max(judged.get(doc, 0), 0) for doc in ordered(ranking)[:k]]
    ideal = sorted((grade for grade in judged.values() if grade > 0), reverse=True)[:k]
    best = sum(grade / math.log2(rank + 2) for rank, grade in enumerate(ideal))
    if best == 0:
        return 0.0
    return sum(gain / math.log2(rank + 2) for rank, gain in enumerate(gains)) / best


def recall_at(ranking: Ranking, judged: Judgements, k: int) -> float:
    """Share of the relevant documents found in the top k."""
    relevant = {doc for doc, grade in judged.items() if grade > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ordered(ranking)[:k])) / len(relevant)


def mrr_at(ranking: Ranking, judged: Judgements, k: int) -> float:
    """1 / rank of the first relevant document within the top k, else 0."""
    for rank, doc in enumerate(ordered(ranking)[:k], start=1):
        if judged.get(doc, 0) > 0:
            return 1.0 / rank
    return 0.0


RETRIEVAL_METRICS = {
    "ndcg@10": lambda ranking, judged: ndcg_at(ranking, judged, 10),
    "recall@10": lambda ranking, judged: recall_at(ranking, judged, 10),
    "recall@100": lambda ranking, judged: recall_at(ranking, judged, 100),
    "mrr@10": lambda ranking, judged: mrr_at(ranking, judged, 10),
}


def mean_retrieval_metrics(
    rankings: Mapping[str, Ranking], qrels: Mapping[str, Judgements]
) -> dict[str, float]:
    """Every metric averaged over the judged queries (a query with no ranking scores 0)."""
    queries = [query for query, judged in qrels.items() if any(g > 0 for g in judged.values())]
    return {
        name: float(np.mean([metric(rankings.get(q, []), qrels[q]) for q in queries])) if queries else 0.0
        for name, metric in RETRIEVAL_METRICS.items()
    }


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks; tied values share the mean of the ranks they span."""
    array = np.asarray(values, dtype=np.float64)
    order = np.argsort(array, kind="stable")
    ranks = np.empty(len(array), dtype=np.float64)
    sorted_values = array[order]
    start = 0
    while start < len(array):
        stop = start
        while stop + 1 < len(array) and sorted_values[stop + 1] == sorted_values[start]:
            stop += 1
        ranks[order[start : stop + 1]] = (start + stop) / 2 + 1
        start = stop + 1
    return ranks


def spearman(first: Sequence[float], second: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the average ranks."""
    if len(first) != len(second) or len(first) < 2:
        raise ValueError("spearman needs two sequences of the same length, at least 2")
    a, b = average_ranks(first), average_ranks(second)
    a, b = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / denominator if denominator else 0.0

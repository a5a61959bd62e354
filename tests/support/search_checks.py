"""Rankings computed without ragidx's search code: BM25 straight from FTS5, dense by a matrix
product over the stored vectors, fusion by its formulas written out."""

from __future__ import annotations

import sqlite3

import numpy as np

from ragidx.app import Index
from tests.support.index_files import segment_vectors


def independent_fusion(
    dense: list[tuple[int, float]],
    lexical: list[tuple[int, float]],
    w_dense: float,
    w_lexical: float,
    method: str = "rrf",
) -> list[tuple[int, float]]:
    """Σ w·part over the lists weighted above 0, the part 1/(60 + rank) (rrf) or (score - min)/(max -
    min) over the list (minmax), ties by the equal-weight RRF sum and then by id: the formulas,
    written out."""
    items = ({i for i, _ in dense} if w_dense else set()) | ({i for i, _ in lexical} if w_lexical else set())
    d_rank = {i: r for r, (i, _) in enumerate(dense, start=1)}
    l_rank = {i: r for r, (i, _) in enumerate(lexical, start=1)}

    def rrf(ranks: dict[int, int], i: int) -> float:
        return 1 / (60 + ranks[i]) if i in ranks else 0.0

    def minmax(ranking: list[tuple[int, float]], i: int) -> float:
        scores = dict(ranking)
        if i not in scores:
            return 0.0
        low, high = min(scores.values()), max(scores.values())
        return (scores[i] - low) / (high - low) if high > low else 1.0

    def part(name: str, i: int) -> float:
        if method == "rrf":
            return rrf(d_rank if name == "dense" else l_rank, i)
        return minmax(dense if name == "dense" else lexical, i)

    scored = [(i, w_dense * part("dense", i) + w_lexical * part("lexical", i)) for i in items]

    def tie(i: int) -> float:  # equal-weight RRF over the lists taking part
        return (rrf(d_rank, i) if w_dense else 0.0) + (rrf(l_rank, i) if w_lexical else 0.0)

    return sorted(scored, key=lambda p: (-p[1], -tie(p[0]), p[0]))


def porter_bm25(
    connection: sqlite3.Connection, words: list[str], limit: int = 100
) -> list[tuple[int, float]]:
    """BM25 (higher is better) of the chunks in ``connection`` for ``words`` OR-ed, as FTS5's own
    English analysis (``porter unicode61``) reads them, in a table of their own: what ragidx's
    keyword table must equal on English text."""
    memory = sqlite3.connect(":memory:")
    memory.execute("create virtual table t using fts5(text, tokenize='porter unicode61')")
    memory.executemany(
        "insert into t (rowid, text) values (?, ?)", connection.execute("select id, text from chunks")
    )
    rows = memory.execute(
        "select rowid, bm25(t) from t where t match ? order by 2, 1 limit ?",
        [" OR ".join(f'"{w}"' for w in words), limit],
    ).fetchall()
    memory.close()
    return [(rowid, -score) for rowid, score in rows]


def independent_lexical(index: Index, words: list[str]) -> list[tuple[int, float]]:
    with sqlite3.connect(index.reader.directory / "ragidx.db") as db:
        return porter_bm25(db, words)


def independent_dense(index: Index, query: str, limit: int = 100) -> list[tuple[int, float]]:
    stored = segment_vectors(index.reader.directory)
    ids = np.array(list(stored))
    vectors = np.stack(list(stored.values()))
    scores = vectors @ index.strategy.encode([query], "query")[0]
    order = np.argsort(-scores, kind="stable")[:limit]
    return [(int(ids[i]), float(scores[i])) for i in order]

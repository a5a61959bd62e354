"""Open an index and answer queries with the same model, strategy and templates it was built with."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.store import IndexReader, default_index_dir

if TYPE_CHECKING:
    from ragidx.indexer.strategies import Role, Strategy

SNIPPET_CHARS = 240
MODES = ("hybrid", "dense", "lexical")
RRF_K = 60
MIN_CANDIDATES = 100  # per list before fusion: enough that fusion can promote a chunk from far down


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk; ``start``/``end`` are character offsets into the document's text."""

    rank: int
    score: float
    chunk_id: int
    path: str
    title: str
    start: int
    end: int
    text: str
    metadata: dict[str, Any]
    dense_rank: int | None = None
    lexical_rank: int | None = None

    @property
    def snippet(self) -> str:
        flat = " ".join(self.text.split())
        return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1].rsplit(" ", 1)[0] + "…"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Index:
    """A committed index; the model is loaded on first use, so settings can be read without it."""

    def __init__(self, reader: IndexReader, device: str = "auto", dtype: str | None = None):
        self.reader = reader
        self.device = device
        self.dtype = dtype or reader.meta.get("dtype", "auto")
        self._strategy: Strategy | None = None
        self._vectors: Any = None

    @classmethod
    def open(
        cls, directory: str | Path | None = None, *, device: str = "auto", dtype: str | None = None
    ) -> Index:
        return cls(IndexReader(directory or default_index_dir()), device, dtype)

    @property
    def meta(self) -> dict[str, Any]:
        return self.reader.meta

    @property
    def strategy(self) -> Strategy:
        if self._strategy is None:
            from ragidx.indexer.runtime import load_runtime
            from ragidx.indexer.strategies import create_strategy

            runtime = load_runtime(self.meta["model"], self.device, self.dtype)
            self._strategy = create_strategy(self.meta["strategy"], runtime, **self.meta["strategy_params"])
        return self._strategy

    def check_compatible(self, model: str | None = None, strategy: str | None = None) -> None:
        """Refuse a query that names another model or strategy than the index was built with."""
        from ragidx.indexer.runtime import canonical_model_id

        model = canonical_model_id(model) if model else None
        for option, given, stored in (
            ("--model", model, self.meta["model"]),
            ("--strategy", strategy, self.meta["strategy"]),
        ):
            if given is not None and given != stored:
                raise RagidxError(
                    f"{option} {given!r} does not match the index, which was built with {stored!r}; "
                    "queries must use the index's own settings"
                )

    def embed(self, texts: Sequence[str], role: Role = "query") -> np.ndarray:
        """Vectors as this index would store (documents) or search with (queries)."""
        return self.strategy.encode(list(texts), role)

    def search(self, query: str, k: int = 10, mode: str = "hybrid") -> list[Hit]:
        """The ``k`` best chunks for ``query``.

        ``dense``: inner product of the vectors (the score is the cosine); ``lexical``: FTS5 BM25
        over the chunk text (the score is -bm25); ``hybrid`` (default): reciprocal rank fusion,
        Σ 1/(60 + rank), of both lists' top candidates (the score is the fused value).
        """
        return self.search_many([query], k, mode)[0]

    def search_many(self, queries: Sequence[str], k: int = 10, mode: str = "hybrid") -> list[list[Hit]]:
        """:meth:`search` for several queries, embedding them in one batch."""
        if k < 1:
            raise RagidxError(f"k must be at least 1, got {k}")
        if mode not in MODES:
            raise RagidxError(f"unknown mode '{mode}': choose one of {', '.join(MODES)}")
        if any(not query.strip() for query in queries):
            raise RagidxError("the query is empty")
        candidates = k if mode != "hybrid" else max(MIN_CANDIDATES, 2 * k)
        dense = self._dense_rankings(queries, candidates) if mode != "lexical" else None
        results = []
        for index, query in enumerate(queries):
            ranked = {
                "dense": dense[index] if dense is not None else [],
                "lexical": self.reader.lexical_search(query, candidates) if mode != "dense" else [],
            }
            scored = reciprocal_rank_fusion(ranked.values()) if mode == "hybrid" else ranked[mode]
            results.append(self._hits(scored[:k], ranked))
        return results

    def _dense_rankings(self, queries: Sequence[str], limit: int) -> list[list[tuple[int, float]]]:
        if self._vectors is None:
            self._vectors = self.reader.load_vectors()
        vectors = self.embed(list(queries), "query")
        scores, ids = self._vectors.search(vectors, min(limit, max(self._vectors.ntotal, 1)))
        return [
            [(int(i), float(s)) for s, i in zip(row_scores, row_ids, strict=True) if i >= 0]
            for row_scores, row_ids in zip(scores, ids, strict=True)
        ]

    def _hits(
        self, scored: Sequence[tuple[int, float]], ranked: dict[str, list[tuple[int, float]]]
    ) -> list[Hit]:
        rows = self.reader.chunk_rows([chunk_id for chunk_id, _ in scored])
        ranks = {
            name: {chunk_id: rank for rank, (chunk_id, _) in enumerate(found, start=1)}
            for name, found in ranked.items()
        }
        found = [(chunk_id, score) for chunk_id, score in scored if chunk_id in rows]
        hits = []
        for rank, (chunk_id, score) in enumerate(found, start=1):
            row = rows[chunk_id]
            hits.append(
                Hit(
                    rank=rank,
                    score=score,
                    chunk_id=chunk_id,
                    path=row["path"],
                    title=row["title"],
                    start=row["char_start"],
                    end=row["char_end"],
                    text=row["text"],
                    metadata=row["metadata"],
                    dense_rank=ranks["dense"].get(chunk_id),
                    lexical_rank=ranks["lexical"].get(chunk_id),
                )
            )
        return hits

    def info(self) -> dict[str, Any]:
        files = sorted(self.reader.directory.glob("*"))
        return {
            "index": str(self.reader.directory),
            **self.meta,
            **self.reader.counts(),
            "bytes_on_disk": sum(f.stat().st_size for f in files if f.is_file()),
        }

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reciprocal_rank_fusion(
    rankings: Iterable[Sequence[tuple[int, float]]], k: int = RRF_K
) -> list[tuple[int, float]]:
    """Σ 1/(k + rank) over the lists an item appears in (rank from 1), best first, ties by id."""
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, (item, _) in enumerate(ranking, start=1):
            fused[item] = fused.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(fused.items(), key=lambda pair: (-pair[1], pair[0]))

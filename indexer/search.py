"""Dense, lexical and hybrid search over one index, each call inside one committed generation.

The engine knows the stored rows and vectors, not the model: queries are embedded through the
``embed`` callable it is given (``app.Index`` passes its strategy's), so a build's tuning and a
long-running server share this code with the Python API.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

import numpy as np

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.filters import Filters
from ragidx.indexer.fusion import Fusion
from ragidx.indexer.runtime import resolve_device
from ragidx.indexer.snippets import Snippet, make_snippet, query_stems
from ragidx.indexer.store import IndexReader
from ragidx.indexer.wording import encodable

MODES = ("hybrid", "dense", "lexical")
SNAPSHOT_ATTEMPTS = 5
MIN_CANDIDATES = 100  # per list before fusion: enough that fusion can promote a chunk from far down

Ranked = dict[str, list[tuple[int, float]]]  # "dense" / "lexical" -> (chunk id, score), best first
FilterSpec = Filters | Mapping[str, Any] | None
WeightSpec = Fusion | Mapping[str, float] | str | None  # str: "dense=0.3,lexical=0.7"
Embed = Callable[[Sequence[str]], np.ndarray]
Result = TypeVar("Result")


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk; ``span`` is its (start, end) character offsets into the document's text.

    ``score`` depends on the mode: cosine (dense), -BM25 (lexical), the fused value (hybrid).
    """

    rank: int
    score: float
    chunk_id: int
    path: str
    title: str
    span: tuple[int, int]
    text: str
    snippet: Snippet
    metadata: dict[str, Any]
    dense_rank: int | None = None
    lexical_rank: int | None = None
    pages: list[int] | None = None  # PDFs: the 1-based pages the chunk's span touches

    @property
    def page(self) -> int | None:
        """The page the chunk starts on (PDFs only)."""
        return self.pages[0] if self.pages else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "page": self.page}


@dataclass(frozen=True)
class SearchRequest:
    """One search's parameters, checked before any work is done."""

    k: int
    mode: str
    filters: Filters
    min_score: float | None
    weights: Fusion | None
    method: str | None
    tuning: dict[str, int | None]

    @classmethod
    def checked(
        cls,
        queries: Sequence[str],
        k: int,
        mode: str,
        filters: FilterSpec,
        min_score: float | None,
        weights: WeightSpec,
        fusion: str | None,
        ef_search: int | None,
        nprobe: int | None,
    ) -> SearchRequest:
        if k < 1:
            raise RagidxError(f"k must be at least 1, got {k}")
        for name, value in (("ef_search", ef_search), ("nprobe", nprobe)):
            if value is not None and value < 1:
                raise RagidxError(f"{name} must be at least 1, got {value}")
        if mode not in MODES:
            raise RagidxError(f"unknown mode '{mode}': choose one of {', '.join(MODES)}")
        if (weights is not None or fusion is not None) and mode != "hybrid":
            raise RagidxError(f"weights and fusion apply to hybrid search, not to {mode}")
        if any(not query.strip() for query in queries):
            raise RagidxError("the query is empty")
        if not all(encodable(query) for query in queries):
            raise RagidxError("the query is not valid Unicode text (it holds a lone surrogate)")
        if isinstance(weights, str):  # the weights alone: the method stays the index's unless ``fusion``
            weights = Fusion.parse(weights).weights()
        given = weights if isinstance(weights, Fusion) or weights is None else Fusion.from_weights(weights)
        method = fusion or (weights.method if isinstance(weights, Fusion) else None)
        if method is not None:
            Fusion(method=method)  # refused here, before any work, if unknown
        chosen = filters if isinstance(filters, Filters) else Filters.from_mapping(filters)
        return cls(k, mode, chosen, min_score, given, method, {"ef_search": ef_search, "nprobe": nprobe})

    @property
    def candidates(self) -> int:
        """How deep each list is read: hybrid fusion needs more than ``k`` to promote from below."""
        return self.k if self.mode != "hybrid" else max(MIN_CANDIDATES, 2 * self.k)


class SearchEngine:
    """Searches an index's newest committed generation; vectors are loaded once per generation."""

    def __init__(self, reader: IndexReader, embed: Embed, device: str = "auto"):
        self.reader = reader
        self.embed = embed
        self.device = device
        self._vectors: Any = None
        self._earlier: Any = None  # the last generation's segments, whose files a new one may share

    @property
    def meta(self) -> dict[str, Any]:
        return self.reader.meta

    def refresh(self) -> None:
        """Follow a build or a tuning committed since the last read; a new generation drops the
        loaded vectors."""
        generation = self.meta.get("generation")
        if self.reader.reread_meta().get("generation") != generation:
            self._earlier, self._vectors = self._vectors or self._earlier, None

    def search(
        self, queries: Sequence[str], request: SearchRequest, vectors: np.ndarray | None = None
    ) -> list[list[Hit]]:
        """Each query's ``request.k`` best chunks (``app.Index.search`` documents the parameters);
        ``vectors``: the queries' embeddings where the caller has them."""
        return self._in_snapshot(request.mode != "lexical", lambda: self._search(queries, request, vectors))

    def rankings(self, queries: Sequence[str], depth: int, vectors: np.ndarray | None = None) -> list[Ranked]:
        """Each query's dense and lexical candidates (chunk id, score), best first: what hybrid
        search fuses. ``vectors``: the queries' embeddings, where the caller has them. For tuning."""
        return self._in_snapshot(
            True, lambda: self._ranked_lists(queries, depth, "hybrid", Filters(), {}, vectors)
        )

    def _in_snapshot(self, needs_vectors: bool, read: Callable[[], Result]) -> Result:
        """``read()`` inside one snapshot of the newest committed generation (retried if that
        generation's vector file is replaced before it can be opened)."""
        for _ in range(SNAPSHOT_ATTEMPTS):
            with self.reader.snapshot():
                self.refresh()
                if needs_vectors and self._vectors is None:
                    self._vectors = self.reader.load_vectors(self._earlier)
                    if self._vectors is None:
                        continue  # this generation's file is already gone: a newer snapshot has its own
                    self._earlier = None  # what the new generation shares with it is kept, the rest freed
                    if resolve_device(self.device) == "cuda":
                        self._vectors.use_gpu()
                return read()
        raise RagidxError("the index changed during every attempt to read it; try again")

    def _search(
        self, queries: Sequence[str], request: SearchRequest, vectors: np.ndarray | None
    ) -> list[list[Hit]]:
        stored = Fusion.of_index(self.meta)
        fusion = replace(request.weights or stored, method=request.method or stored.method)
        lists = self._ranked_lists(
            queries, request.candidates, request.mode, request.filters, request.tuning, vectors
        )
        results = []
        for query, ranked in zip(queries, lists, strict=True):
            scored = fusion.fuse(ranked) if request.mode == "hybrid" else ranked[request.mode]
            if request.min_score is not None:
                scored = [(chunk_id, score) for chunk_id, score in scored if score >= request.min_score]
            results.append(self._hits(query, scored[: request.k], ranked))
        return results

    def _ranked_lists(
        self,
        queries: Sequence[str],
        limit: int,
        mode: str,
        filters: Filters,
        tuning: dict[str, int | None],
        vectors: np.ndarray | None = None,
    ) -> list[Ranked]:
        """Per query, the dense and lexical candidates the mode needs (the other list empty)."""
        allowed = self.reader.filtered_chunk_ids(filters) if filters else None
        if allowed is not None and not len(allowed):
            return [{"dense": [], "lexical": []} for _ in queries]
        dense = None
        if mode != "lexical":
            vectors = self.embed(list(queries)) if vectors is None else vectors
            dense = self._dense_rankings(vectors, limit, allowed, tuning)
        return [
            {
                "dense": dense[index] if dense is not None else [],
                "lexical": self.reader.lexical_search(query, limit, filters) if mode != "dense" else [],
            }
            for index, query in enumerate(queries)
        ]

    def _dense_rankings(
        self, vectors: np.ndarray, limit: int, allowed: np.ndarray | None, tuning: dict[str, int | None]
    ) -> list[list[tuple[int, float]]]:
        """Nearest chunks by inner product; ``allowed`` ids restrict the search itself, so
        filtered-out chunks never cost results (see :meth:`VectorIndex.search`)."""
        scores, ids = self._vectors.search(vectors, limit, allowed, **tuning)
        return [
            [(int(i), float(s)) for s, i in zip(row_scores, row_ids, strict=True) if i >= 0]
            for row_scores, row_ids in zip(scores, ids, strict=True)
        ]

    def _hits(self, query: str, scored: Sequence[tuple[int, float]], ranked: Ranked) -> list[Hit]:
        rows = self.reader.chunk_rows([chunk_id for chunk_id, _ in scored])
        ranks = {
            name: {chunk_id: rank for rank, (chunk_id, _) in enumerate(found, start=1)}
            for name, found in ranked.items()
        }
        found = [(chunk_id, score) for chunk_id, score in scored if chunk_id in rows]
        stems = query_stems(query)
        hits = []
        for rank, (chunk_id, score) in enumerate(found, start=1):
            row = rows[chunk_id]
            start = row["char_start"]
            sentences = [(s - start, e - start) for s, e in row["sentences"]]
            hits.append(
                Hit(
                    rank=rank,
                    score=score,
                    chunk_id=chunk_id,
                    path=row["path"],
                    title=row["title"],
                    span=(start, row["char_end"]),
                    text=row["text"],
                    snippet=make_snippet(row["text"], sentences, stems),
                    metadata=row["metadata"],
                    dense_rank=ranks["dense"].get(chunk_id),
                    lexical_rank=ranks["lexical"].get(chunk_id),
                    pages=row["pages"],
                )
            )
        return hits

"""Open an index and answer queries with the same model, strategy and templates it was built with."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ragidx.app.snippets import Snippet, make_snippet, query_stems
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.filters import Filters
from ragidx.indexer.fusion import Fusion
from ragidx.indexer.store import IndexReader, default_index_dir, read_meta
from ragidx.indexer.wording import encodable

if TYPE_CHECKING:
    from ragidx.indexer.strategies import Role, Strategy

MODES = ("hybrid", "dense", "lexical")
MODEL_SETTINGS = ("model", "model_file", "strategy", "strategy_params")
SNAPSHOT_ATTEMPTS = 5
MIN_CANDIDATES = 100  # per list before fusion: enough that fusion can promote a chunk from far down


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


FilterSpec = Filters | Mapping[str, Any] | None
WeightSpec = Fusion | Mapping[str, float] | None
Result = TypeVar("Result")


class Index:
    """A committed index; the model is loaded on first use, so settings can be read without it."""

    def __init__(
        self,
        reader: IndexReader,
        device: str = "auto",
        dtype: str | None = None,
        trust_remote_code: bool = False,
        strategy: Strategy | None = None,
    ):
        """``strategy``: one already loaded with the index's settings (a build tuning its result)."""
        self.reader = reader
        self.device = device
        self.dtype = dtype or reader.meta.get("dtype", "auto")
        self.trust_remote_code = trust_remote_code
        self._strategy: Strategy | None = strategy
        self._vectors: Any = None

    @classmethod
    def open(
        cls,
        directory: str | Path | None = None,
        *,
        device: str = "auto",
        dtype: str | None = None,
        trust_remote_code: bool = False,
    ) -> Index:
        """Open a built index; ``trust_remote_code`` lets a hub model's own code run (never by default)."""
        return cls(IndexReader(directory or default_index_dir()), device, dtype, trust_remote_code)

    @classmethod
    def build(cls, paths: Sequence[str | Path], index: str | Path | None = None, **options: Any) -> Index:
        """Index the documents under ``paths`` into ``index`` and open it.

        ``options`` are ``ragidx build``'s, in Python spelling (``model=``, ``strategy="htp"``,
        ``chunk_tokens=``, ``device=``, strategy options such as ``layers="20-27"``...).
        """
        from ragidx.indexer.pipeline import build, build_options

        settings = build_options(index, **options)
        build(list(paths), settings)
        return cls.open(
            settings.index_dir, device=settings.device, trust_remote_code=settings.trust_remote_code
        )

    @property
    def meta(self) -> dict[str, Any]:
        return self.reader.meta

    def refresh(self) -> None:
        """Follow a build or a tuning that committed since this index was opened (a server stays up
        across builds); a new generation drops the loaded vectors, another model the strategy."""
        meta = read_meta(self.reader.db)
        old, self.reader.meta = self.meta, meta
        if meta.get("generation") != old.get("generation"):
            self._vectors = None
        if any(old.get(key) != meta.get(key) for key in MODEL_SETTINGS):
            self._strategy = None

    def _on_gpu(self) -> bool:
        """Whether this index runs on CUDA (``--device cuda``, or ``auto`` with a GPU present)."""
        from ragidx.indexer.runtime import resolve_device

        return resolve_device(self.device) == "cuda"

    @property
    def strategy(self) -> Strategy:
        if self._strategy is None:
            from ragidx.indexer.strategies import load_index_strategy

            self._strategy = load_index_strategy(self.meta, self.device, self.dtype, self.trust_remote_code)
        return self._strategy

    def check_compatible(self, model: str | None = None, strategy: str | None = None) -> None:
        """Refuse a query that names another model or strategy than the index was built with."""
        from ragidx.indexer.models import canonical_model_id

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

    def search(
        self,
        query: str,
        k: int = 10,
        mode: str = "hybrid",
        filters: FilterSpec = None,
        min_score: float | None = None,
        *,
        weights: WeightSpec = None,
        fusion: str | None = None,
        ef_search: int | None = None,
        nprobe: int | None = None,
        query_vector: np.ndarray | None = None,
    ) -> list[Hit]:
        """The ``k`` best chunks for ``query``.

        ``dense``: inner product of the vectors (the score is the cosine); ``lexical``: FTS5 BM25
        over the chunk text (the score is -bm25); ``hybrid`` (default): both lists' top candidates
        fused (the score is the fused value) with the index's tuned method and weights, unless
        ``weights`` (``{"dense": 0.3, "lexical": 0.7}`` or a :class:`Fusion`) or ``fusion``
        (``"rrf"``, weighted reciprocal rank Σ w/(60 + rank); ``"minmax"``, weighted sum of min-max
        normalised scores) are given.
        ``filters`` (a :class:`Filters` or ``{"path": ..., "ext": ..., "meta": {...}}``) restrict
        the candidates inside each search, so ``k`` hits come back whenever ``k`` chunks match;
        ``min_score`` then drops hits scoring below it. ``ef_search`` (HNSW) and ``nprobe`` (IVF)
        override the index's stored search parameters for this call. ``query_vector`` (shape
        ``(1, dimension)``) is the query's embedding where the caller already has it (a server
        embedding queued queries in one batch).
        """
        return self.search_many(
            [query],
            k,
            mode,
            filters,
            min_score,
            weights=weights,
            fusion=fusion,
            ef_search=ef_search,
            nprobe=nprobe,
            vectors=query_vector,
        )[0]

    def search_many(
        self,
        queries: Sequence[str],
        k: int = 10,
        mode: str = "hybrid",
        filters: FilterSpec = None,
        min_score: float | None = None,
        *,
        weights: WeightSpec = None,
        fusion: str | None = None,
        ef_search: int | None = None,
        nprobe: int | None = None,
        vectors: np.ndarray | None = None,
    ) -> list[list[Hit]]:
        """:meth:`search` for several queries, embedding them in one batch (unless ``vectors``,
        their embeddings, are given)."""
        if k < 1:
            raise RagidxError(f"k must be at least 1, got {k}")
        for name, value in (("ef_search", ef_search), ("nprobe", nprobe)):
            if value is not None and value < 1:
                raise RagidxError(f"{name} must be at least 1, got {value}")
        tuning = {"ef_search": ef_search, "nprobe": nprobe}
        if mode not in MODES:
            raise RagidxError(f"unknown mode '{mode}': choose one of {', '.join(MODES)}")
        if (weights is not None or fusion is not None) and mode != "hybrid":
            raise RagidxError(f"weights and fusion apply to hybrid search, not to {mode}")
        if any(not query.strip() for query in queries):
            raise RagidxError("the query is empty")
        if not all(encodable(query) for query in queries):
            raise RagidxError("the query is not valid Unicode text (it holds a lone surrogate)")
        chosen = filters if isinstance(filters, Filters) else Filters.from_mapping(filters)
        given = weights if isinstance(weights, Fusion) or weights is None else Fusion.from_weights(weights)
        method = fusion or (weights.method if isinstance(weights, Fusion) else None)
        if method is not None:
            Fusion(method=method)  # refused here, before any work, if unknown
        return self._in_snapshot(
            mode != "lexical",
            lambda: self._search_snapshot(
                queries, k, mode, chosen, min_score, (given, method), tuning, vectors
            ),
        )

    def rankings(
        self, queries: Sequence[str], depth: int, vectors: np.ndarray | None = None
    ) -> list[dict[str, list[tuple[int, float]]]]:
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
                    self._vectors = self.reader.load_vectors()
                    if self._vectors is None:
                        continue  # this generation's file is already gone: a newer snapshot has its own
                    if self._on_gpu():
                        self._vectors.use_gpu()
                return read()
        raise RagidxError("the index changed during every attempt to read it; try again")

    def _search_snapshot(
        self,
        queries: Sequence[str],
        k: int,
        mode: str,
        filters: Filters,
        min_score: float | None,
        override: tuple[Fusion | None, str | None],
        tuning: dict[str, int | None],
        vectors: np.ndarray | None,
    ) -> list[list[Hit]]:
        candidates = k if mode != "hybrid" else max(MIN_CANDIDATES, 2 * k)
        fusion = self._fusion(*override)
        results = []
        for query, ranked in zip(
            queries, self._ranked_lists(queries, candidates, mode, filters, tuning, vectors), strict=True
        ):
            scored = fusion.fuse(ranked) if mode == "hybrid" else ranked[mode]
            if min_score is not None:
                scored = [(chunk_id, score) for chunk_id, score in scored if score >= min_score]
            results.append(self._hits(query, scored[:k], ranked))
        return results

    def _fusion(self, weights: Fusion | None, method: str | None) -> Fusion:
        """The index's fusion, with the weights and the method given for this search (if any)."""
        stored = Fusion.of_index(self.meta)
        return replace(weights or stored, method=method or stored.method)

    def _ranked_lists(
        self,
        queries: Sequence[str],
        limit: int,
        mode: str,
        filters: Filters,
        tuning: dict[str, int | None],
        vectors: np.ndarray | None = None,
    ) -> list[dict[str, list[tuple[int, float]]]]:
        """Per query, the dense and lexical candidates the mode needs (the other list empty)."""
        allowed = self.reader.filtered_chunk_ids(filters) if filters else None
        if allowed is not None and not len(allowed):
            return [{"dense": [], "lexical": []} for _ in queries]
        dense = None
        if mode != "lexical":
            vectors = self.embed(list(queries), "query") if vectors is None else vectors
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

    def _hits(
        self, query: str, scored: Sequence[tuple[int, float]], ranked: dict[str, list[tuple[int, float]]]
    ) -> list[Hit]:
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

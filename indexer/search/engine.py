"""Dense, lexical and hybrid search over one index, each call inside one committed generation.

The engine knows the stored rows and vectors, not the model: queries are embedded through the
``embed`` callable it is given (``app.Index`` passes its strategy's), so a build's tuning and a
long-running server share this code with the Python API.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.choices import resolve_device
from ragidx.indexer.model.sources import unread_languages
from ragidx.indexer.search.fusion import LISTS, Fusion
from ragidx.indexer.search.hits import Explanation, Hit, Listed
from ragidx.indexer.search.options import SearchOptions, check_queries
from ragidx.indexer.search.snippets import make_snippet, query_stems
from ragidx.indexer.storage.filters import Filters
from ragidx.indexer.storage.reader import IndexReader
from ragidx.indexer.storage.vector_store import VectorQuery

SNAPSHOT_ATTEMPTS = 5

Ranked = dict[str, list[tuple[int, float]]]  # "dense" / "lexical" -> (chunk id, score), best first
Embed = Callable[[Sequence[str]], np.ndarray]
Result = TypeVar("Result")


def no_vectors(meta: dict[str, Any]) -> RagidxError:
    """The error for a search that reads vectors in an index that keeps none (a lexical index)."""
    why = meta.get("dense_reason") or "built without them"
    return RagidxError(
        f"this index keeps no vectors ({why}): search it with --mode lexical or hybrid (keyword search "
        "here), or add vectors with `ragidx build PATH... --dense`"
    )


class SearchEngine:
    """Searches an index's newest committed generation; vectors are loaded once per generation."""

    def __init__(self, reader: IndexReader, embed: Embed, device: str = "auto"):
        self.reader = reader
        self.embed = embed
        self.device = device
        self._local = threading.local()  # a thread's own way to embed queries, while it says so
        self._vectors: Any = None
        self._earlier: Any = None  # the last generation's segments, whose files a new one may share

    @property
    def meta(self) -> dict[str, Any]:
        return self.reader.meta

    @contextlib.contextmanager
    def embedding_with(self, embed: Embed) -> Iterator[None]:
        """Searches of this thread embed their queries with ``embed`` while the block runs (a
        server's: it keeps the model to one thread of its own)."""
        previous = getattr(self._local, "embed", None)
        self._local.embed = embed
        try:
            yield
        finally:
            self._local.embed = previous

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        return (getattr(self._local, "embed", None) or self.embed)(texts)

    def refresh(self) -> None:
        """Follow the index at the reader's path (reopened when it was replaced; :func:`no_index`
        once deleted) and a build or a tuning committed since the last read."""
        self._follow_file()
        self._reread_meta()

    def _follow_file(self) -> None:
        """Reopen the index when its file was replaced; nothing loaded from the old one is kept."""
        if self.reader.follow():
            self._earlier = self._vectors = None

    def _reread_meta(self) -> None:
        """A new generation drops the loaded vectors (keeping them as the next one's source of
        unchanged segments)."""
        generation = self.meta.get("generation")
        if self.reader.reread_meta().get("generation") != generation:
            self._earlier, self._vectors = self._vectors or self._earlier, None

    def _overtaken(self) -> bool:
        """Whether a newer generation committed during the read, in a store that deletes the
        previous generation's rows in place."""
        return self.reader.store.deletes_in_place and self.reader.committed_generation() != self.meta.get(
            "generation"
        )

    def search(
        self, queries: Sequence[str], options: SearchOptions, vectors: np.ndarray | None = None
    ) -> list[list[Hit]]:
        """Each query's ``options.k`` best chunks (``app.Index.search`` documents the options);
        ``vectors``: the queries' embeddings where the caller has them."""
        check_queries(queries)
        return self._in_snapshot(
            lambda: self.embeds_queries(options), lambda: self._search(queries, options, vectors)
        )

    def rankings(self, queries: Sequence[str], depth: int, vectors: np.ndarray | None = None) -> list[Ranked]:
        """Each query's dense and lexical candidates (chunk id, score), best first: what hybrid
        search fuses. ``vectors``: the queries' embeddings, where the caller has them. For tuning."""
        return self._in_snapshot(
            lambda: True, lambda: self._ranked_lists(queries, depth, LISTS, Filters(), {}, vectors)
        )

    def _in_snapshot(self, needs_vectors: Callable[[], bool], read: Callable[[], Result]) -> Result:
        """``read()`` inside one snapshot of the newest committed generation (retried if that
        generation's vector file is replaced before it can be opened); ``needs_vectors()``, asked
        once the snapshot's settings are read, says whether ``read`` searches the vectors."""
        try:
            return self._snapshot_read(needs_vectors, read)
        except sqlite3.DatabaseError as error:
            raise self.reader.failure(error) from error

    def _snapshot_read(self, needs_vectors: Callable[[], bool], read: Callable[[], Result]) -> Result:
        for _ in range(SNAPSHOT_ATTEMPTS):
            self._follow_file()
            with self.reader.snapshot():
                self._reread_meta()
                dense = needs_vectors()
                if dense and not self.meta.get("dense", True):
                    raise no_vectors(self.meta)
                if dense and self._vectors is None:
                    self._vectors = self.reader.load_vectors(self._earlier)
                    if self._vectors is None:
                        continue  # this generation's file is already gone: a newer snapshot has its own
                    self._earlier = None  # what the new generation shares with it is kept, the rest freed
                    if resolve_device(self.device) == "cuda":
                        self._vectors.use_gpu()
                result = read()
            if dense and self._overtaken():
                continue  # a commit may have deleted rows of this generation while they were searched
            return result
        raise RagidxError("the index changed during every attempt to read it; try again")

    def _fusion(self, options: SearchOptions) -> Fusion:
        """The fusion a hybrid search uses: the index's tuned one, or what the options give."""
        stored = Fusion.of_index(self.meta)
        return replace(options.weights or stored, method=options.fusion or stored.method)

    def _query_fusion(self, language: str, fusion: Fusion, options: SearchOptions) -> tuple[Fusion, str]:
        """The fusion for one query, and why it reads one list alone ("" where it reads both).
        Keyword search alone for a query in a language the index's model was not trained to read
        (MiniLM and a Japanese question: its vector is noise, and fused in it cost Japanese help
        pages one question of nine, docs/choosing.md#languages), unless the options weigh."""
        model = self.meta.get("model")
        if options.weights is None and fusion.dense and unread_languages(str(model), [language]):
            keywords = replace(fusion, dense=0.0, lexical=1.0)
            return keywords, f"{model} does not read the query's language ({language})"
        if len(fusion.searched()) == 2:
            return fusion, ""
        if not self.meta.get("dense", True):
            return fusion, "the index keeps no vectors"
        if options.weights:
            return fusion, "the weights given weigh the other list 0"
        return fusion, "the index's fusion weighs the other list 0"

    def embeds_queries(self, options: SearchOptions) -> bool:
        """Whether a search with ``options`` embeds its queries: it reads the dense list (its
        mode's, or a hybrid fusion that weighs it above 0)."""
        return "dense" in self._lists(options)

    def _lists(self, options: SearchOptions) -> tuple[str, ...]:
        """The lists a search reads: its mode's, or for hybrid those its fusion weighs above 0."""
        return self._fusion(options).searched() if options.mode == "hybrid" else (options.mode,)

    def _search(
        self, queries: Sequence[str], options: SearchOptions, vectors: np.ndarray | None
    ) -> list[list[Hit]]:
        fusion = self._fusion(options)
        languages = [self.reader.query_language(query) for query in queries]  # told once a query
        lists = self._ranked_lists(
            queries,
            options.candidates,
            self._lists(options),
            options.filters,
            options.breadth,
            vectors,
            languages,
        )
        results = []
        for query, language, ranked in zip(queries, languages, lists, strict=True):
            fused, alone = self._query_fusion(language, fusion, options)
            scored = fused.fuse(ranked) if options.mode == "hybrid" else ranked[options.mode]
            if options.min_score is not None:
                scored = [(chunk_id, score) for chunk_id, score in scored if score >= options.min_score]
            hybrid = options.mode == "hybrid"
            ran = (fused.searched()[0] if alone else "hybrid") if hybrid else options.mode
            ran_as = (ran, alone if hybrid else "")
            explained = fused if hybrid else None
            results.append(
                self._hits(query, language, scored[: options.k], ranked, ran_as, options.explain, explained)
            )
        return results

    def _ranked_lists(
        self,
        queries: Sequence[str],
        limit: int,
        lists: Sequence[str],
        filters: Filters,
        tuning: dict[str, int | None],
        vectors: np.ndarray | None = None,
        languages: Sequence[str | None] | None = None,
    ) -> list[Ranked]:
        """Per query, the candidates of each of ``lists`` (a list not read is empty: a query is
        embedded only where the dense list is read); ``languages``: the queries', where told."""
        allowed = self.reader.filtered_chunk_ids(filters) if filters else None
        if allowed is not None and not len(allowed):
            return [{"dense": [], "lexical": []} for _ in queries]
        dense = None
        if "dense" in lists:
            vectors = self._embed(list(queries)) if vectors is None else vectors
            dense = self._dense_rankings(vectors, limit, allowed, tuning)
        return [
            {
                "dense": dense[index] if dense is not None else [],
                "lexical": (
                    self.reader.lexical_search(query, limit, filters, language) if "lexical" in lists else []
                ),
            }
            for index, (query, language) in enumerate(
                zip(queries, languages or [None] * len(queries), strict=True)
            )
        ]

    def _dense_rankings(
        self, vectors: np.ndarray, limit: int, allowed: np.ndarray | None, tuning: dict[str, int | None]
    ) -> list[list[tuple[int, float]]]:
        """Nearest chunks by inner product; ``allowed`` ids restrict the search itself, so
        filtered-out chunks never cost results (see :meth:`VectorIndex.search`)."""
        scores, ids = self._vectors.search(VectorQuery(vectors, limit, allowed, **tuning))
        return [
            [(int(i), float(s)) for s, i in zip(row_scores, row_ids, strict=True) if i >= 0]
            for row_scores, row_ids in zip(scores, ids, strict=True)
        ]

    def _hits(
        self,
        query: str,
        language: str,
        scored: Sequence[tuple[int, float]],
        ranked: Ranked,
        ran_as: tuple[str, str],
        explain: bool = False,
        fusion: Fusion | None = None,
    ) -> list[Hit]:
        """The scored chunks as hits, joined with their rows, each with the mode the search ran in
        and why (``ran_as``); ``explain`` adds each one's place in both lists and, for ``fusion``
        (hybrid search), the method and weights that fused them."""
        rows = self.reader.chunk_rows([chunk_id for chunk_id, _ in scored])
        listed = {
            name: {chunk_id: Listed(rank, score) for rank, (chunk_id, score) in enumerate(found, start=1)}
            for name, found in ranked.items()
        }
        found = [(chunk_id, score) for chunk_id, score in scored if chunk_id in rows]
        stems = query_stems(query, language)
        hits = []
        for rank, (chunk_id, score) in enumerate(found, start=1):
            row = rows[chunk_id]
            dense, lexical = listed["dense"].get(chunk_id), listed["lexical"].get(chunk_id)
            explanation = None
            if explain:
                weights = fusion.weights() if fusion else None
                method = fusion.method if fusion else None
                explanation = Explanation(dense, lexical, method, weights, score if fusion else None)
            hits.append(
                Hit(
                    rank=rank,
                    score=score,
                    chunk_id=chunk_id,
                    path=row["path"],
                    title=row["title"],
                    span=(row["char_start"], row["char_end"]),
                    text=row["text"],
                    snippet=make_snippet(row["text"], row["sentences"], stems, language),
                    metadata=row["metadata"],
                    dense_rank=dense.rank if dense else None,
                    lexical_rank=lexical.rank if lexical else None,
                    pages=row["pages"],
                    explain=explanation,
                    mode=ran_as[0],
                    mode_reason=ran_as[1],
                )
            )
        return hits

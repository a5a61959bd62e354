"""Answer concurrent searches together: one forward pass embeds every query waiting for the model.

The model runs one forward at a time (see :mod:`ragidx.app.server`), so under load requests used
to queue behind each other, each paying a whole forward for one query. A forward takes many
queries for little more than the cost of one, so one worker thread takes every search waiting
(up to ``max_batch``) and has the model's thread embed their queries in one call and answer each
with its own options.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from ragidx.app.model_thread import ModelThread
from ragidx.app.retriever import Hit, Index, SearchOptions

MAX_BATCH = 64  # queries per forward: past this, padding and memory grow faster than the gain


@dataclass
class PendingSearch:
    query: str
    options: SearchOptions
    answer: Future[list[Hit]] = field(default_factory=Future)


class SearchBatcher:
    """Gathers queued requests on one worker thread and runs each batch's :meth:`Index.search`
    calls on ``on_model``, the thread that uses the model."""

    def __init__(self, index: Index, on_model: ModelThread, max_batch: int = MAX_BATCH):
        self.index = index
        self.on_model = on_model
        self.max_batch = max_batch
        self.pending: queue.SimpleQueue[PendingSearch] = queue.SimpleQueue()
        self.worker = threading.Thread(target=self._serve, name="ragidx-search", daemon=True)
        self.worker.start()

    def submit(self, query: str, options: SearchOptions) -> Future[list[Hit]]:
        """Queue one search; the future holds its hits, or the error it raised."""
        search = PendingSearch(query, options)
        self.pending.put(search)
        return search.answer

    def _serve(self) -> None:
        while True:
            batch = [self.pending.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.pending.get_nowait())
                except queue.Empty:
                    break
            self.on_model.run(self._answer, batch)

    def _answer(self, batch: list[PendingSearch]) -> None:
        dense = [search for search in batch if self.index.engine.embeds_queries(search.options)]
        try:
            vectors = self.index.embed([search.query for search in dense]) if len(dense) > 1 else None
        except Exception:  # one bad query must not fail the others: each runs alone below
            vectors = None
        rows = {id(search): row for row, search in enumerate(dense)}
        for search in batch:
            given = vectors[rows[id(search)]][None] if vectors is not None and id(search) in rows else None
            try:
                search.answer.set_result(self.index.search(search.query, search.options, query_vector=given))
            except Exception as error:  # handed to the request that asked
                search.answer.set_exception(error)

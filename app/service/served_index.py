"""An index served to many clients at once, its model work through the scheduler.

The daemon, ``ragidx serve`` and ``ragidx mcp`` answer searches, context, answers and embeddings
for clients that come and go. Each request runs on its caller's thread; what needs the model (a
query's or a text's embedding, a token of a local answer, loading the model) goes to the
:class:`~ragidx.app.service.scheduler.Scheduler` in slices, and what does not (a keyword search, a hybrid
search that weighs the vectors 0, context assembly, info, a chat endpoint's answer) never waits
for it. The index's SQLite and FAISS reads are serialised by :attr:`ServedIndex.reading`, held for
milliseconds at a time, never while the model runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ragidx.app.answering import DEFAULT_NEW_TOKENS, Answer, messages, refuse_unfitted
from ragidx.app.generation import Generated, Generator, LocalGenerator
from ragidx.app.reranking import BATCH, candidate_options, question_likelihoods, ranked
from ragidx.app.retriever import Index, check_budget, check_new_tokens, token_counter
from ragidx.app.service.scheduler import SLICE_SECONDS, Job, Scheduler
from ragidx.indexer.errors import Cancelled
from ragidx.indexer.model.runtime import model_tokenizer
from ragidx.indexer.search.context import DEFAULT_MAX_TOKENS, Context
from ragidx.indexer.search.hits import Hit
from ragidx.indexer.search.options import SearchOptions
from ragidx.indexer.strategies.traced_readout import settle

if TYPE_CHECKING:
    from ragidx.indexer.roles import Role

FIRST_SLICE_ROWS = 4  # an embedding job's first slice, before its pace is known
MAX_SLICE_ROWS = 256


class NeedsModel(Exception):
    """A search reached for query vectors off the model's thread (see :meth:`ServedIndex.search`)."""


@dataclass(frozen=True)
class Asked:
    """What ``ask`` is told besides the question and the search options."""

    llm: str | None = None
    llm_url: str | None = None
    max_new_tokens: int = DEFAULT_NEW_TOKENS
    max_tokens: int = DEFAULT_MAX_TOKENS
    closed_book: bool = False
    relative_to: str | None = None


class ServedIndex:
    """An open :class:`Index`, its model used through ``scheduler`` alone (see the module)."""

    def __init__(self, index: Index, scheduler: Scheduler):
        self.index = index
        self.scheduler = scheduler
        self.reading = threading.RLock()
        self.counting = threading.Lock()  # a tokenizer shared by request threads counts one text at a time

    def refresh(self) -> None:
        with self.reading:
            self.index.refresh()

    def meta(self) -> dict[str, Any]:
        with self.reading:
            self.index.refresh()
            return dict(self.index.meta)

    def info(self) -> dict[str, Any]:
        with self.reading:
            self.index.refresh()
            return self.index.info()

    def embeds_queries(self, options: SearchOptions | None = None) -> bool:
        """Whether a search with ``options`` (default: the index's own) embeds its query."""
        with self.reading:
            self.index.refresh()
            if not self.index.meta.get("dense", True):
                return False
            return self.index.engine.embeds_queries(options or SearchOptions())

    def traces_queries(self, job: Job) -> bool:
        """Whether the strategy replays a traced readout for one query (loading the model)."""
        return bool(self.scheduler.run(job, lambda: self.index.strategy.one_row is not None))

    def settle(self, job: Job) -> None:
        """Load the index's model now (it is otherwise loaded by the first work that needs it) and
        settle its traced query readout (:func:`~ragidx.indexer.strategies.traced_readout.settle`)."""
        self.scheduler.run(job, lambda: settle(self.index.strategy))

    def search(self, query: str, options: SearchOptions, job: Job) -> list[Hit]:
        """The search's hits: at once where it reads no vectors, else with its query embedded on
        the model's thread together with every other query waiting for it; a reranked search's
        candidates so, then scored on the model's thread a batch per slice of its time (a query from
        another client waits for one batch, not for the whole reranking)."""
        if options.rerank is not None:
            return self._reranked(query, options, job)
        try:
            with self.reading, self.index.engine.embedding_with(_needs_model):
                return self.index.search(query, options)
        except NeedsModel:
            key = ("search", id(self))
            return list(self.scheduler.run_batched(job, key, (query, options), self._searches))

    def _reranked(self, query: str, options: SearchOptions, job: Job) -> list[Hit]:
        hits = self.search(query, candidate_options(options), job)
        generator = self.scheduler.run(job, self._local_generator, options.rerank)
        scores: list[float] = []
        for start in range(0, len(hits), BATCH):
            texts = [hit.text for hit in hits[start : start + BATCH]]
            scores += self.scheduler.run(job, question_likelihoods, generator, query, texts)
        return ranked(hits, scores, options.k)

    def _local_generator(self, name: str) -> LocalGenerator:
        with self.reading:
            return self.index.local_generator(name)

    def _searches(self, batch: list[tuple[str, SearchOptions]]) -> list[list[Hit] | Exception]:
        """Searches answered together on the model's thread: the queries of those that read the
        vectors embedded in one forward, then each searched with its own options (an error in one
        is its own)."""
        with self.reading:
            self.index.refresh()
            dense = [n for n, (_, options) in enumerate(batch) if self.index.engine.embeds_queries(options)]
        vectors: np.ndarray | None = None
        if len(dense) > 1:
            try:
                vectors = self.index.embed([batch[n][0] for n in dense], "query")
            except Exception:  # one bad query must not fail the others: each embeds alone below
                vectors = None
        rows = {n: row for row, n in enumerate(dense)}
        answers: list[list[Hit] | Exception] = []
        for number, (query, options) in enumerate(batch):
            given = vectors[rows[number]][None] if vectors is not None and number in rows else None
            try:
                with self.reading:
                    answers.append(self.index.search(query, options, query_vector=given))
            except Exception as error:
                answers.append(error)
        return answers

    def embed(self, texts: Sequence[str], role: Role, job: Job) -> np.ndarray:
        """The texts' vectors with the index's model as it is now (a rebuild with another model
        is followed; a deleted index is an error), a slice of about :data:`SLICE_SECONDS` at a time."""
        with self.reading:
            self.index.refresh()
        return embed_in_slices(self.scheduler, job, self.index.embed, texts, role)

    def context(
        self,
        query: str,
        options: SearchOptions,
        job: Job,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        tokenizer: str | None = None,
        relative_to: str | None = None,
    ) -> Context:
        """:meth:`Index.context`, its search as :meth:`search` runs it, assembled off the model's thread."""
        check_budget(max_tokens)
        hits = self.search(query, options, job)
        with self.reading:
            name = tokenizer or self.index.settings.model
        counting = token_counter(model_tokenizer(name))
        assert counting is not None

        def count(text: str) -> int:
            with self.counting:
                return counting(text)

        with self.reading:
            return self.index.context_of(query, hits, max_tokens, tokenizer, relative_to, count)

    def ask(
        self, question: str, options: SearchOptions, asked: Asked, job: Job, on_text: Callable[[str], None]
    ) -> Answer:
        """:meth:`Index.ask`: a local model writes a token per slice; a chat endpoint is read on this
        thread, with no model held, and closed once ``job`` is cancelled."""
        check_new_tokens(asked.max_new_tokens)
        started = time.perf_counter()
        generator: Generator = (
            self.index.generator(asked.llm, asked.llm_url)  # an endpoint: nothing to load
            if asked.llm_url
            else self.scheduler.run(job, self.index.generator, asked.llm, None)
        )
        context = None
        if not asked.closed_book:
            tokenizer = self.index.context_tokenizer(generator)
            context = self.context(question, options, job, asked.max_tokens, tokenizer, asked.relative_to)
            refuse_unfitted(context)
        chat = messages(question, context)
        prepared = time.perf_counter() - started
        if isinstance(generator, LocalGenerator):
            generated = self._write(generator, chat, asked.max_new_tokens, job, on_text)
        else:
            generated = generator.generate(chat, asked.max_new_tokens, on_text, cancel=job.cancel)
        return generated.answer(question, generator.name, context, prepared)

    def _write(
        self,
        generator: LocalGenerator,
        chat: list[dict[str, str]],
        max_new_tokens: int,
        job: Job,
        on_text: Callable[[str], None],
    ) -> Generated:
        decoding = self.scheduler.run(job, generator.start, chat, max_new_tokens)
        while (piece := self.scheduler.run(job, decoding.step)) is not None:
            if piece:
                on_text(piece)
        return decoding.result()

    def close(self, job: Job) -> None:
        """Close the index, its models freed on the model's thread."""
        self.scheduler.run(job, self.index.close)


def _needs_model(texts: Sequence[str]) -> np.ndarray:
    """How a search off the model's thread finds it reads vectors: it then queues for them."""
    raise NeedsModel


def embed_in_slices(
    scheduler: Scheduler,
    job: Job,
    embed: Callable[[list[str], Role], np.ndarray],
    texts: Sequence[str],
    role: Role,
) -> np.ndarray:
    """``embed(texts, role)`` on the scheduler's thread, a slice of about :data:`SLICE_SECONDS`
    at a time (the first of :data:`FIRST_SLICE_ROWS` texts, the next sized by its pace), so a
    client embedding thousands of texts holds the model from others one slice at a time;
    :class:`Cancelled` between slices once ``job`` is cancelled."""
    texts = list(texts)
    if not texts:
        return np.asarray(scheduler.run(job, embed, texts, role))
    parts: list[np.ndarray] = []
    rows, done = FIRST_SLICE_ROWS, 0
    while done < len(texts):
        if job.cancel.is_set():
            raise Cancelled
        chunk = texts[done : done + rows]
        seconds, vectors = scheduler.run(job, _timed, embed, chunk, role)
        parts.append(vectors)
        done += len(chunk)
        pace = seconds / len(chunk)
        rows = max(1, min(MAX_SLICE_ROWS, int(SLICE_SECONDS / pace) if pace > 0 else MAX_SLICE_ROWS))
    return np.concatenate(parts)


def _timed(work: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    value = work(*args)
    return time.perf_counter() - started, value

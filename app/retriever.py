"""Open an index and answer queries with the same model, strategy and templates it was built with."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragidx.app.answering import DEFAULT_NEW_TOKENS, Answer, messages, refuse_unfitted
from ragidx.app.generation import ChatEndpoint, Generator, LocalGenerator, chat_template
from ragidx.app.reranking import candidate_options, rerank
from ragidx.indexer.build.journal import describe_pending, pending
from ragidx.indexer.build.maintenance import CheckReport, RemoveReport, check, remove
from ragidx.indexer.build.pipeline import BuildReport, build
from ragidx.indexer.build.settings import BuildOptions, load_strategy
from ragidx.indexer.build.tuning import DEFAULT_PSEUDO_QUERIES, TuningReport, tune_and_store
from ragidx.indexer.build.watch import watch
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.runtime import model_tokenizer
from ragidx.indexer.model.sources import canonical_model_id, keyword_only_note
from ragidx.indexer.search.context import DEFAULT_MAX_TOKENS, Context, CountTokens, fit, merge_hits
from ragidx.indexer.search.engine import Ranked, SearchEngine
from ragidx.indexer.search.hits import Hit
from ragidx.indexer.search.options import SearchOptions
from ragidx.indexer.storage.location import default_index_dir
from ragidx.indexer.storage.reader import IndexReader
from ragidx.indexer.storage.settings import IndexSettings
from ragidx.indexer.storage.writer import IndexWriter

if TYPE_CHECKING:
    from ragidx.indexer.roles import Role
    from ragidx.indexer.strategies import Strategy

__all__ = ["Hit", "Index", "SearchOptions"]


def token_counter(tokenizer: Any) -> CountTokens | None:
    """A function counting a text's tokens with ``tokenizer`` (none: None)."""
    if tokenizer is None:
        return None
    return lambda text: len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def check_budget(max_tokens: Any) -> None:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RagidxError(f"max_tokens must be a whole number of at least 1, got {max_tokens!r}")


def check_new_tokens(max_new_tokens: Any) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise RagidxError(f"max_new_tokens must be a whole number of at least 1, got {max_new_tokens!r}")


def build_options(
    index: str | Path | None, options: BuildOptions | None, keywords: dict[str, Any]
) -> BuildOptions:
    """A build's options, given as one :class:`BuildOptions` or as keywords, never both (which
    would win would be a guess)."""
    if options is None:
        return BuildOptions.of(index, **keywords)
    if keywords or index is not None:
        raise RagidxError("give a build's options as keywords or as one BuildOptions, not both")
    return options


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
        self.dtype = dtype or self.settings.dtype or "auto"
        self.trust_remote_code = trust_remote_code
        self._strategy: Strategy | None = strategy
        self._loading = threading.Lock()
        self._strategy_settings = self.settings.model_identity
        self._generators: dict[tuple[str, int], LocalGenerator] = {}
        self.engine = SearchEngine(reader, lambda texts: self.embed(texts, "query"), device)

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
    def build(
        cls,
        paths: Sequence[str | Path],
        index: str | Path | None = None,
        options: BuildOptions | None = None,
        **keywords: Any,
    ) -> Index:
        """Index the documents under ``paths`` into ``index`` and open it (see :meth:`update`)."""
        given = build_options(index, options, keywords)
        report = build(list(paths), given)
        return cls.open(report.index_dir, device=given.device, trust_remote_code=given.trust_remote_code)

    @staticmethod
    def update(
        paths: Sequence[str | Path],
        index: str | Path | None = None,
        options: BuildOptions | None = None,
        **keywords: Any,
    ) -> BuildReport:
        """Create the index at ``index`` or bring it up to date with ``paths``, as ``ragidx build``
        does: new and changed files are embedded, files gone from ``paths`` removed.

        The options are ``ragidx build``'s, as keywords in Python spelling (``model=``,
        ``strategy="htp"``, ``chunk_tokens=``, ``device=``, strategy options such as
        ``layers="20-27"``...) or as one :class:`BuildOptions` (what the CLI passes); settings not
        given are the index's own.
        """
        return build(list(paths), build_options(index, options, keywords))

    @staticmethod
    def watch(
        paths: Sequence[str | Path],
        index: str | Path | None = None,
        options: BuildOptions | None = None,
        *,
        on_build: Callable[[BuildReport], None],
        on_error: Callable[[str], None],
        settle: float = 1.0,
        on_start: Callable[[], None] = lambda: None,
        stop: threading.Event | None = None,
        **keywords: Any,
    ) -> None:
        """:meth:`update` now and again after every settled burst of changes under ``paths``, until
        ``stop`` is set or KeyboardInterrupt (``ragidx watch``); options as for :meth:`update`."""
        given = build_options(index, options, keywords)
        watch(list(paths), given, on_build, on_error, settle, stop, on_start)

    @property
    def meta(self) -> dict[str, Any]:
        return self.reader.meta

    def refresh(self) -> None:
        """Follow a build or a tuning that committed since this index was opened (a server stays up
        across builds), and the index at this path itself: one deleted raises "no index at ...",
        one replaced (rebuilt elsewhere and moved here, or deleted and built again) is reopened. A
        new generation drops the loaded vectors, another model the strategy. Searches do this by
        themselves; call it before :meth:`embed` or :attr:`meta` in a process that stays up."""
        self.engine.refresh()

    @property
    def settings(self) -> IndexSettings:
        """What the index was built with (as committed when it was last read)."""
        return IndexSettings.of_index(self.meta, self.reader.directory)

    @property
    def strategy(self) -> Strategy:
        """The index's strategy with its model, loaded on first use and again after a rebuild with
        other model settings."""
        with self._loading:  # threads searching at once load it once
            settings = self.settings
            if self._strategy is None or settings.model_identity != self._strategy_settings:
                self._strategy = load_strategy(settings, self.device, self.dtype, self.trust_remote_code)
                self._strategy_settings = settings.model_identity
            return self._strategy

    def check_compatible(self, model: str | None = None, strategy: str | None = None) -> None:
        """Refuse a query that names another model or strategy than the index was built with."""
        model = canonical_model_id(model) if model else None
        for option, given, stored in (
            ("--model", model, self.settings.model),
            ("--strategy", strategy, self.settings.strategy),
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
        options: SearchOptions | None = None,
        *,
        query_vector: np.ndarray | None = None,
        **given: Any,
    ) -> list[Hit]:
        """The best chunks for ``query``.

        ``options`` (a :class:`SearchOptions`) or its fields as keywords (``k=10``,
        ``mode="hybrid"``, ``filters=``, ``min_score=``, ``weights=``, ``fusion=``, ``ef_search=``,
        ``nprobe=``, ``explain=``; ``ragidx.app.catalog.SEARCH_OPTION_SPECS`` lists each with its
        help) say how. ``dense`` ranks by the vectors' inner product (the score is the cosine),
        ``lexical`` by FTS5 BM25 over the chunk text (the score is -bm25), and ``hybrid``
        (default) fuses both lists' top candidates with the index's tuned method and weights
        unless ``weights`` (``{"dense": 0.3, "lexical": 0.7}``, ``"dense=0.3,lexical=0.7"`` or a
        :class:`Fusion`) or ``fusion`` (``"rrf"`` or ``"minmax"``) are given. ``filters`` (a
        :class:`Filters` or ``{"path": ..., "ext": ..., "meta": {...}}``) restrict the candidates
        inside each search, so ``k`` hits come back whenever ``k`` chunks match. ``query_vector``
        (shape ``(1, dimension)``) is the query's embedding where the caller already has it (a
        server embedding queued queries in one batch).
        """
        return self.search_many([query], options, vectors=query_vector, **given)[0]

    def search_many(
        self,
        queries: Sequence[str],
        options: SearchOptions | None = None,
        *,
        vectors: np.ndarray | None = None,
        **given: Any,
    ) -> list[list[Hit]]:
        """:meth:`search` for several queries, embedding them in one batch (unless ``vectors``,
        their embeddings, are given)."""
        if options is not None and not isinstance(options, SearchOptions):
            raise RagidxError(
                "search options are a SearchOptions or keywords (k=, mode=, ...), not positional"
            )
        chosen = SearchOptions.of(options, **given)
        if chosen.rerank is None:
            return self.engine.search(queries, chosen, vectors)
        found = self.engine.search(queries, candidate_options(chosen), vectors)
        generator = self.local_generator(chosen.rerank)
        return [rerank(generator, query, hits, chosen.k) for query, hits in zip(queries, found, strict=True)]

    def context(
        self,
        query: str,
        options: SearchOptions | None = None,
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        tokenizer: str | None = None,
        relative_to: str | None = None,
        **given: Any,
    ) -> Context:
        """The search's hits as context for a prompt (``ragidx query --context``): overlapping or
        consecutive chunks of a document merged into one passage, duplicates dropped, passages
        numbered ``[1]``… best first with path, span and title, and cut to whole sentences so the
        whole text is at most ``max_tokens`` tokens of ``tokenizer`` (a model name; default: the
        index's model). ``relative_to``: a folder whose documents are shown by relative path.
        Search options as for :meth:`search`."""
        check_budget(max_tokens)
        hits = self.search(query, options, **given)
        loaded = self.strategy.runtime.tokenizer if tokenizer is None and self.model_loaded else None
        return self.context_of(query, hits, max_tokens, tokenizer, relative_to, token_counter(loaded))

    def context_of(
        self,
        query: str,
        hits: Sequence[Hit],
        max_tokens: int = DEFAULT_MAX_TOKENS,
        tokenizer: str | None = None,
        relative_to: str | None = None,
        count: CountTokens | None = None,
    ) -> Context:
        """:meth:`context` from hits already found; ``count``: the tokens of a text in the model
        ``tokenizer`` names (default: that model's tokenizer, loaded alone)."""
        rows = self.reader.chunk_rows([hit.chunk_id for hit in hits])
        name = tokenizer or self.settings.model
        counting = count or token_counter(model_tokenizer(name))
        assert counting is not None
        return fit(query, merge_hits(hits, rows), counting, max_tokens, name, relative_to)

    def ask(
        self,
        question: str,
        options: SearchOptions | None = None,
        *,
        llm: str | None = None,
        llm_url: str | None = None,
        max_new_tokens: int = DEFAULT_NEW_TOKENS,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        closed_book: bool = False,
        on_text: Callable[[str], None] | None = None,
        **given: Any,
    ) -> Answer:
        """An answer to ``question`` from the index's passages (``ragidx ask``): the search's
        context (:meth:`context`, ``max_tokens`` of the answering model's tokenizer) given to a chat
        model that is asked to cite ``[n]``; ``on_text`` gets each piece of the answer as it is
        written. The model: ``llm`` (a model name ragidx loads; default the index's own, when it
        has a chat template), or the OpenAI-compatible chat endpoint at ``llm_url`` (``llm`` then
        names its model; the key comes from ``$RAGIDX_LLM_API_KEY`` or ``$OPENAI_API_KEY``).
        ``closed_book``: no retrieval, the model alone (to measure what retrieval adds). A
        loaded model is kept for the next question."""
        check_new_tokens(max_new_tokens)
        started = time.perf_counter()
        generator = self.generator(llm, llm_url)
        context = None
        if not closed_book:
            tokenizer = self.context_tokenizer(generator)
            context = self.context(question, options, max_tokens=max_tokens, tokenizer=tokenizer, **given)
            refuse_unfitted(context)
        prepared = time.perf_counter() - started
        generated = generator.generate(
            messages(question, context), max_new_tokens, on_text or (lambda text: None)
        )
        return generated.answer(question, generator.name, context, prepared)

    def context_tokenizer(self, generator: Generator) -> str | None:
        """Whose tokens an answer's context is counted in: the answering model's where ragidx
        runs it and it is not the index's own, else the index's model's (None)."""
        reads_with = generator.name if isinstance(generator, LocalGenerator) else None
        return None if reads_with is None or reads_with == self.settings.model else reads_with

    def generator(self, llm: str | None = None, llm_url: str | None = None) -> Generator:
        """The model that answers (see :meth:`ask`), loaded once: the index's own model is the
        loaded one, under its causal-LM head, never a second copy."""
        if llm_url:
            return ChatEndpoint(llm_url, llm)
        local = self.local_generator(llm)
        chat_template(local.runtime)  # one that cannot answer is refused before any search
        return local

    def local_generator(self, llm: str | None = None) -> LocalGenerator:
        """:meth:`generator` for a model ragidx runs itself (``llm``; default: the index's own)."""
        name = canonical_model_id(llm) if llm else self.settings.model
        runtime = self.strategy.runtime if name == self.settings.model else None
        key = (name, id(runtime))
        if key not in self._generators:
            self._generators = {
                key: LocalGenerator(runtime) if runtime else LocalGenerator.load(name, self.device)
            }  # one at a time: each holds a model
        return self._generators[key]

    @property
    def model_loaded(self) -> bool:
        """Whether the index's own model is loaded (its tokenizer is then at hand)."""
        return self._strategy is not None and self._strategy_settings == self.settings.model_identity

    def rankings(self, queries: Sequence[str], depth: int, vectors: np.ndarray | None = None) -> list[Ranked]:
        """Each query's dense and lexical candidates (chunk id, score), best first: what hybrid
        search fuses (see :meth:`SearchEngine.rankings`)."""
        return self.engine.rankings(queries, depth, vectors)

    def remove(
        self, paths: Sequence[str | Path] = (), *, everything: bool = False, dry_run: bool = False
    ) -> RemoveReport:
        """Drop the indexed documents at or under ``paths`` (which need not exist on disk any more)
        in a new generation, as ``ragidx rm`` does: a folder holding every document needs
        ``everything=True``; ``dry_run`` only reports what would go."""
        report = remove(paths, self.reader.directory, everything, dry_run)
        self.refresh()
        return report

    def tune(self, queries: int | None = None) -> TuningReport:
        """Tune the hybrid fusion weights on ``queries`` pseudo-queries from the index's own
        documents and store them, as ``ragidx tune`` does; searches use them at once."""
        self.refresh()
        loaded = self._strategy if self.model_loaded else None
        with IndexWriter(self.reader.directory) as writer:
            report = tune_and_store(writer, loaded, queries or DEFAULT_PSEUDO_QUERIES, self.device)
        self.refresh()
        return report

    @classmethod
    def check(
        cls, directory: str | Path | None = None, *, repair: bool = False, device: str = "auto"
    ) -> CheckReport:
        """Verify (and with ``repair`` fix) that vectors, chunks, lexical rows and generation files
        agree, as ``ragidx check`` does. A class method: a damaged index need not open."""
        return check(Path(directory or default_index_dir()), repair, device)

    def info(self) -> dict[str, Any]:
        meta = {key: value for key, value in self.meta.items() if key != "segmented"}
        tuned = meta.get("fusion")
        finding = TuningReport.from_meta(tuned).finding() if tuned and tuned.get("weights") else None
        unread = (
            keyword_only_note(str(meta.get("model")), meta.get("languages") or {})
            if meta.get("dense", True)
            else ""
        )
        return {
            "index": str(self.reader.directory),
            **meta,
            **({"tuning_finding": finding} if finding else {}),
            **({"languages_note": unread} if unread else {}),
            **({"pending_build": waiting} if (waiting := self.pending_build(self.reader.directory)) else {}),
            **self.reader.counts(),
            "segments": self.reader.vector_parts(),
            "bytes_on_disk": self.reader.bytes_on_disk(),
        }

    @classmethod
    def pending_build(cls, directory: str | Path | None = None) -> str:
        """What an interrupted build keeps for the next one to resume ("" where none is pending).
        A class method: a folder whose first build was interrupted holds no index to open yet."""
        kept = pending(Path(directory or default_index_dir()))
        return f"an interrupted build is pending: {describe_pending(kept)}" if kept else ""

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

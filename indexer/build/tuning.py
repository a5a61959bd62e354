"""Per-index fusion weights without labelled queries (``ragidx tune``, and after builds).

How far hybrid search should trust the dense list depends on the model and the corpus: with a
strong encoder the two lists help each other, with a small decoder the dense list pulls BM25
down. Tuning measures it on cloze pseudo-queries drawn from the corpus itself (the inverse cloze
task of Lee et al., 2019): a sentence is cut out of its chunk and searched for, and the rest of
the chunk stands in for the chunk in both lists (re-embedded for the dense list; written into the
full-text index inside a transaction that is rolled back, for the lexical list). The answer is
the chunk's document, and no searched text contains the sentence.

A corpus of few long documents (a handful of meeting transcripts, hundreds of chunks) has too few
answers to rank at the document level (ten of eleven documents are in any top 10), so there the
answer is the chunk itself: the answers are whichever of documents and chunks first reach
``MIN_ANSWERS``, and at the chunk level a sentence that overlapping chunks share is never cut (its
neighbour would hold it verbatim).

Every dense weight on a grid is scored by nDCG@10 over the answers with weighted RRF, and equal
weights with min-max fusion too; equal weights are kept where they score above the better single
list, else that list alone, chosen on half the pseudo-queries and confirmed on the other (see
:func:`choose_fusion`). The result is stored in the index's meta with the figures behind it.
(Searching a sentence with its own chunk left out, for the document's other chunks, tracked
real queries worse on SciFact: see docs/hybrid-search.md.)
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ragidx.indexer.build.settings import load_strategy
from ragidx.indexer.ingest.spans import Span
from ragidx.indexer.progress import progress as progress_bar
from ragidx.indexer.search.engine import Ranked, SearchEngine, no_vectors
from ragidx.indexer.search.fusion import Fusion
from ragidx.indexer.storage.reader import IndexReader
from ragidx.indexer.storage.settings import IndexSettings

if TYPE_CHECKING:
    from ragidx.indexer.storage.writer import IndexWriter
    from ragidx.indexer.strategies import Strategy

# Each costs one query and one document embedding; half choose the fusion, half confirm it.
DEFAULT_PSEUDO_QUERIES = 200
SAMPLE_PSEUDO_QUERIES = 100  # a new index's sample (see sampling.py) weighs vectors on all of them
# A build tunes on at most this share of its index's chunks in pseudo-queries: each costs about
# one chunk's embedding (its remainder, and the short query), so tuning takes about this share of
# what embedding the index took, searches included (0.22-0.23 measured; 100 pseudo-queries took
# half of it on 218 chunks, and as long as embedding on smaller corpora: docs/hybrid-search.md).
BUILD_SHARE = 0.2
# Below these, pseudo-queries measure too little (a handful of answers to choose from, or too
# few queries) and equal weights are kept.
MIN_ANSWERS = 50  # documents in the index, else chunks
MIN_QUERIES = 20
MIN_WORDS, MAX_WORDS = 5, 30  # a sentence a person might type as a query
DEPTH = 100  # candidates per list, as hybrid search fuses
CUTOFF = 10
DENSE_WEIGHTS = tuple(round(float(w), 2) for w in np.linspace(0.0, 1.0, 21))
SEED = 0
SCAN_FACTOR = 10  # chunks read per query wanted, at most (most chunks have a usable sentence)
RETUNE_CHANGE = 0.1  # an incremental build retunes once the chunk count moved this much
NO_VECTORS_WEIGHT = 0.05  # a tuned dense weight at or below this: the vectors were switched off
WORD = re.compile(r"\w+")
Level = Literal["documents", "chunks"]  # what a pseudo-query's answer is


@dataclass(frozen=True)
class PseudoQuery:
    """A sentence cut from chunk ``chunk_id``, whose ``remainder`` (with its sentence spans) is
    searched in the chunk's place; the answer is document ``document_id`` or the chunk itself."""

    text: str
    chunk_id: int
    document_id: int
    remainder: str
    remainder_sentences: tuple[Span, ...]


@dataclass
class TuningReport:
    """What tuning found: the chosen weights and each candidate's nDCG@10 on the pseudo-queries."""

    fusion: Fusion
    queries: int
    seconds: float
    chunks: int = 0
    ndcg: dict[str, float] = field(default_factory=dict)
    grid: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    level: Level = "documents"
    confirmation: str = ""  # how the fusion held on the half of the pseudo-queries it was not chosen on

    def to_meta(self) -> dict[str, Any]:
        return {
            "method": self.fusion.method,
            "weights": self.fusion.normalised().weights(),
            "pseudo_queries": self.queries,
            "answers": self.level,
            "ndcg@10": {name: round(value, 4) for name, value in self.ndcg.items()},
            "grid": {name: round(value, 4) for name, value in self.grid.items()},
            "seconds": round(self.seconds, 2),
            "chunks": self.chunks,
            "reason": self.reason,
            "confirmation": self.confirmation,
        }

    @classmethod
    def from_meta(cls, stored: Mapping[str, Any]) -> TuningReport:
        """The report as an index's meta keeps it (see :meth:`to_meta`)."""
        return cls(
            Fusion.from_weights(stored["weights"], stored.get("method", "rrf")),
            int(stored.get("pseudo_queries", 0)),
            float(stored.get("seconds", 0.0)),
            int(stored.get("chunks", 0)),
            dict(stored.get("ndcg@10", {})),
            dict(stored.get("grid", {})),
            str(stored.get("reason", "")),
            stored.get("answers", "documents"),
            str(stored.get("confirmation", "")),
        )

    def finding(self) -> str | None:
        """What the user should know of a tuning that switched the vectors (nearly) off, in plain
        words; None otherwise."""
        if self.reason or self.fusion.normalised().dense > NO_VECTORS_WEIGHT:
            return None
        return (
            "on this corpus the vectors added nothing over keyword search, so hybrid search is keyword "
            "search (queries are not embedded); another embedding model may change that (docs/choosing.md)"
        )

    def describe(self) -> str:
        """One line for the build summary and ``ragidx tune``."""
        weights = self.fusion.normalised()
        head = f"hybrid fusion {weights.method}, dense {weights.dense:g}, lexical {weights.lexical:g}"
        if self.reason:
            return f"{head}, not tuned: {self.reason}"
        figures = ", ".join(f"{name} {value:.3f}" for name, value in self.ndcg.items())
        answers = "" if self.level == "documents" else f" answered by {self.level}"
        confirmation = f"; {self.confirmation}" if self.confirmation else ""
        return (
            f"{head}, tuned on {self.queries} pseudo-queries{answers} in {self.seconds:.1f} s"
            f" (nDCG@10 {figures}{confirmation})"
        )


def pseudo_queries(
    reader: IndexReader, limit: int = DEFAULT_PSEUDO_QUERIES, seed: int = SEED, level: Level = "documents"
) -> list[PseudoQuery]:
    """Up to ``limit`` cloze queries from chunks in a seeded random order: one per chunk while
    there are more usable chunks than ``limit``, else taken in turns from each (at most
    ``SCAN_FACTOR * limit`` chunks are read). The fixed seed makes tuning the same index twice give
    the same weights. Answered by chunks, a sentence another chunk also holds is not cut."""
    chunk_ids = reader.chunk_ids()
    rng = np.random.default_rng(seed)
    pools: list[list[PseudoQuery]] = []
    for position in rng.permutation(len(chunk_ids))[: SCAN_FACTOR * limit]:
        if len(pools) >= limit:
            break
        chunk_id = chunk_ids[position]
        shared = reader.shared_spans(chunk_id) if level == "chunks" else []
        pool = _cloze_options(*reader.chunk_source(chunk_id), shared)
        if pool:
            pools.append([pool[i] for i in rng.permutation(len(pool))])
    chosen: list[PseudoQuery] = []
    while len(chosen) < limit and any(pools):
        chosen.extend(pool.pop() for pool in pools if pool)
    return chosen[:limit]


def _cloze_options(
    chunk_id: int, document_id: int, text: str, spans: list[Span], shared: Sequence[Span] = ()
) -> list[PseudoQuery]:
    """Every sentence of the chunk that can be cut out, leaving at least as many words behind,
    but those overlapping a ``shared`` span."""
    found = []
    for first, last in spans:
        if any(start < last and first < end for start, end in shared):
            continue
        sentence = text[first:last].strip()
        remainder = text[:first] + text[last:]
        words = len(WORD.findall(sentence))
        if MIN_WORDS <= words <= MAX_WORDS and len(WORD.findall(remainder)) >= words:
            cut = last - first
            kept = tuple(
                (s, e) if e <= first else (s - cut, e - cut) for s, e in spans if (s, e) != (first, last)
            )
            found.append(PseudoQuery(sentence, chunk_id, document_id, remainder, kept))
    return found


def answer_ndcg(fused: Sequence[tuple[int, float]], answers: Mapping[int, int], answer: int) -> float:
    """nDCG@10 of ``answer`` among the answers of ``fused``'s chunks (``answers``: chunk -> its
    document, or -> itself); a document ranks where its best chunk does."""
    seen: set[int] = set()
    for chunk_id, _ in fused:
        if chunk_id not in answers:
            continue
        found = answers[chunk_id]
        if found in seen:
            continue
        seen.add(found)
        if found == answer:
            return 1.0 / math.log2(len(seen) + 1)
        if len(seen) >= CUTOFF:
            break
    return 0.0


def answer_level(counts: Mapping[str, int]) -> Level | None:
    """Documents where there are enough of them, else chunks where there are, else None."""
    if counts["documents"] >= MIN_ANSWERS:
        return "documents"
    return "chunks" if counts["chunks"] >= MIN_ANSWERS else None


def build_queries(chunks: int) -> int:
    """How many pseudo-queries a build tunes its index of ``chunks`` on (see :data:`BUILD_SHARE`),
    never fewer than tuning needs (an index of 50 to 80 chunks spends a little more)."""
    return min(DEFAULT_PSEUDO_QUERIES, max(MIN_QUERIES, int(BUILD_SHARE * chunks)))


def tune(
    engine: SearchEngine,
    strategy: Callable[[], Strategy],
    limit: int = DEFAULT_PSEUDO_QUERIES,
    progress: bool = False,
) -> TuningReport:
    """Score every weight of the grid on the index's pseudo-queries and keep equal weights or the
    better single list (see :func:`choose_fusion`). An index of fewer than ``MIN_ANSWERS``
    documents and chunks, or one that yields fewer than ``MIN_QUERIES`` pseudo-queries, keeps
    equal weights.
    ``strategy`` gives the index's strategy, called only when there is enough to tune on (it may
    load the model); ``progress`` shows the pseudo-queries embedded so far."""
    started = time.perf_counter()
    counts = engine.reader.counts()
    level = answer_level(counts)

    def untuned(reason: str, queries: int = 0) -> TuningReport:
        elapsed = time.perf_counter() - started
        return TuningReport(
            Fusion(), queries, elapsed, counts["chunks"], reason=reason, level=level or "documents"
        )

    if level is None:
        return untuned(
            f"{counts['documents']} documents in {counts['chunks']} chunks are too few to tune on"
            f" ({MIN_ANSWERS} needed)"
        )
    queries = pseudo_queries(engine.reader, limit, level=level)
    answer_of = (lambda q: q.document_id) if level == "documents" else (lambda q: q.chunk_id)
    answers = len({answer_of(query) for query in queries})
    if len(queries) < MIN_QUERIES or 2 * answers < MIN_QUERIES:
        return untuned(
            f"too little text for pseudo-queries ({len(queries)} from {answers} {level})", len(queries)
        )
    rankings = _rankings(engine, strategy(), queries, progress)
    ids = sorted({chunk for lists in rankings for ranking in lists.values() for chunk, _ in ranking})
    documents = engine.reader.document_ids(ids)
    answer_ids = documents if level == "documents" else {chunk: chunk for chunk in documents}

    def per_query(fusion: Fusion) -> np.ndarray:
        return np.array(
            [
                answer_ndcg(fusion.fuse(lists), answer_ids, answer_of(q))
                for lists, q in zip(rankings, queries, strict=True)
            ]
        )

    scores = {weight: per_query(Fusion(weight, 1.0 - weight)) for weight in DENSE_WEIGHTS}
    minmax = per_query(Fusion(0.5, 0.5, "minmax"))
    fusion, confirmation = choose_fusion(scores, minmax)
    grid = {weight: float(values.mean()) for weight, values in scores.items()}
    return TuningReport(
        fusion,
        len(queries),
        time.perf_counter() - started,
        counts["chunks"],
        ndcg={
            "dense": grid[1.0],
            "lexical": grid[0.0],
            "equal": grid[0.5],
            "minmax": float(minmax.mean()),
            "tuned": float(
                (minmax if fusion.method == "minmax" else scores[fusion.normalised().dense]).mean()
            ),
        },
        grid={f"{weight:g}": value for weight, value in grid.items()},
        level=level,
        confirmation=confirmation,
    )


def choose_fusion(rrf: Mapping[float, np.ndarray], minmax: np.ndarray) -> tuple[Fusion, str]:
    """The fusion to store, from the per-query scores of each RRF weight (``rrf``; 0 and 1 are the
    single lists) and of equal-weight min-max fusion (``minmax``), and a few words on how it was
    chosen: equal weights where they score above the better single list, else that list alone
    (:func:`_decide`), chosen on one half of the pseudo-queries and confirmed on the other; where
    the halves disagree, decided on all of them.

    Only equal weights and the single lists are candidates: pseudo-queries lifted from the text
    rate the dense list lower against keyword search than people's questions do (on every
    development set), so a weight they find best leans to keyword search where questions would
    not (docs/hybrid-search.md#questions-people-ask). The grid is kept for ``ragidx info``."""
    count = len(minmax)
    chosen_on, confirmed_on = np.arange(0, count, 2), np.arange(1, count, 2)
    first, second = _decide(rrf, minmax, chosen_on), _decide(rrf, minmax, confirmed_on)
    if first == second:
        return (
            first,
            f"{_named(first)}, chosen on {len(chosen_on)} of them, held on the other {len(confirmed_on)}",
        )
    return _decide(rrf, minmax, np.arange(count)), (
        f"{_named(first)} on {len(chosen_on)} of them, {_named(second)} on the other {len(confirmed_on)}: "
        "decided on all of them"
    )


def _decide(rrf: Mapping[float, np.ndarray], minmax: np.ndarray, rows: np.ndarray) -> Fusion:
    """Equal weights (min-max where it scores at least RRF on ``rows``: with both lists trusted
    alike it keeps how far apart the scores are) where they score above the better single list
    on ``rows``, else that list (a tie: the single list, which searches one list; between the
    lists, keyword search, which embeds no query)."""
    equal, scores = (
        (Fusion(0.5, 0.5, "minmax"), minmax)
        if minmax[rows].mean() >= rrf[0.5][rows].mean()
        else (Fusion(0.5, 0.5), rrf[0.5])
    )
    single = 1.0 if rrf[1.0][rows].mean() > rrf[0.0][rows].mean() else 0.0
    return equal if scores[rows].mean() > rrf[single][rows].mean() else Fusion(single, 1.0 - single)


def _named(fusion: Fusion) -> str:
    dense = fusion.normalised().dense
    if dense in (0.0, 1.0):
        return "the dense list alone" if dense else "keyword search alone"
    return f"equal weights ({fusion.method})"


def _rankings(
    engine: SearchEngine, strategy: Strategy, queries: Sequence[PseudoQuery], progress: bool = False
) -> list[Ranked]:
    """Both lists with each query's chunk replaced by its remainder (see the module docstring);
    the remainder's BM25 comes from the index's own tokenizer and statistics, nothing committed."""
    texts = [q.text for q in queries]
    with progress_bar(2 * len(queries), "tuning", "texts", progress) as bar:
        vectors = strategy.encode(texts, "query", lambda rows, tokens: bar.update(rows))
        remainders = strategy.encode(
            [q.remainder for q in queries],
            "document",
            lambda rows, tokens: bar.update(rows),
            sentences=[q.remainder_sentences for q in queries],
        )
    # One more than kept: the query's own chunk, if found, leaves as its remainder comes in.
    rankings = engine.rankings(texts, DEPTH + 2, vectors)
    for query, lists, vector, remainder in zip(queries, rankings, vectors, remainders, strict=True):
        dense = [(chunk, score) for chunk, score in lists["dense"] if chunk != query.chunk_id]
        dense.append((query.chunk_id, float(vector @ remainder)))
        lists["dense"] = sorted(dense, key=lambda pair: -pair[1])[: DEPTH + 1]
    for query, lists in zip(queries, rankings, strict=True):
        with engine.reader.chunk_text_replaced(query.chunk_id, query.remainder):
            lists["lexical"] = engine.reader.lexical_search(query.text, DEPTH + 1)
    return rankings


def lexical_fusion(measured: TuningReport | None) -> dict[str, Any]:
    """The fusion an index without vectors stores: keyword search alone, with the figures of the
    sample that decided it where one did (its tuned dense weight may be up to
    :data:`NO_VECTORS_WEIGHT`: there are no vectors to weigh now)."""
    report = measured or TuningReport(Fusion(), 0, 0.0, reason="the index keeps no vectors (--no-dense)")
    return {**report.to_meta(), "method": "rrf", "weights": Fusion(0.0, 1.0).normalised().weights()}


def needs_tuning(meta: Mapping[str, Any], chunks: int) -> bool:
    """Never tuned, or the corpus grew or shrank by more than ``RETUNE_CHANGE`` since: small
    incremental builds keep their weights rather than pay for tuning each time."""
    stored = meta.get("fusion")
    if not stored:
        return True
    tuned_on = int(stored.get("chunks") or 0)
    return abs(chunks - tuned_on) > RETUNE_CHANGE * max(tuned_on, 1)


def tune_and_store(
    writer: IndexWriter,
    strategy: Strategy | None = None,
    limit: int = DEFAULT_PSEUDO_QUERIES,
    device: str = "auto",
    progress: bool = False,
) -> TuningReport:
    """Tune the index ``writer`` holds (its committed generation) and store the weights in its meta.

    ``strategy`` reuses a model the build already loaded; without it the index's own is loaded.
    An index without vectors has nothing to tune.
    """
    if not writer.meta.get("dense", True):
        raise no_vectors(writer.meta)
    reader = IndexReader(writer.directory)

    @functools.cache
    def index_strategy() -> Strategy:
        return strategy or load_strategy(IndexSettings.of_index(reader.meta, reader.directory), device)

    try:
        engine = SearchEngine(reader, lambda texts: index_strategy().encode(list(texts), "query"), device)
        report = tune(engine, index_strategy, limit, progress)
    finally:
        reader.close()
    writer.update_meta({"fusion": report.to_meta()})
    return report

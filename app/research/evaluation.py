"""`ragidx eval`: retrieval quality on BEIR-layout datasets and similarity quality on STS files.

Retrieval goes through the product's own path (documents written as files, ``build``, then
``Index.search``), so the figures measure what users get, chunking and storage included.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import numpy as np

from ragidx.app import Index
from ragidx.app.research.metrics import mean_retrieval_metrics, spearman
from ragidx.indexer.build.pipeline import build
from ragidx.indexer.build.settings import BuildOptions
from ragidx.indexer.build.tuning import TuningReport
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.runtime import load_runtime
from ragidx.indexer.progress import progress as progress_bar
from ragidx.indexer.search.fusion import Fusion
from ragidx.indexer.search.options import MAX_K
from ragidx.indexer.storage.location import index_exists
from ragidx.indexer.strategies import (
    create_strategy,
    model_for,
    named_or_default,
    strategy_class,
)

DOCUMENTS_PER_QUERY = 100  # the deepest cut-off any metric reads (Recall@100)
# Eval modes: the search modes, plus hybrid with fixed equal weights to set beside the tuned ones.
EVAL_MODES: dict[str, tuple[str, Fusion | None]] = {
    "dense": ("dense", None),
    "lexical": ("lexical", None),
    "hybrid-equal": ("hybrid", Fusion()),
    "hybrid": ("hybrid", None),
}


@dataclass(frozen=True)
class Variant:
    """One row group of an eval: a strategy (``None``: the model's default) with given options."""

    strategy: str | None
    options: dict[str, Any] = field(default_factory=dict)

    def label(self, strategy: str | None = None) -> str:
        """``htp`` or ``htp rewire=1-5 exit_layer=-4``: the strategy and the options it was given."""
        given = " ".join(f"{key}={_shown(value)}" for key, value in self.options.items())
        return " ".join(part for part in (strategy or self.strategy or "default", given) if part)


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def expand_variants(strategies: Sequence[str | None], sweeps: Mapping[str, Sequence[Any]]) -> list[Variant]:
    """Every strategy with every combination of the swept option values it takes.

    An option is applied to the strategies that take it (a baseline listed beside a swept
    strategy runs once, as it is); one that no listed strategy takes is refused.
    """
    sweeps = {name: list(values) for name, values in sweeps.items() if values}
    if sweeps and None in strategies:
        raise RagidxError("name the strategies (--strategy) whose options are given")
    takes = {name: strategy_class(name).takes() for name in strategies if name}
    unused = sorted(option for option in sweeps if not any(option in opts for opts in takes.values()))
    if unused:
        flags = ", ".join("--" + option.replace("_", "-") for option in unused)
        raise RagidxError(f"{flags} does not apply to strategy {', '.join(map(str, takes))}")
    variants = []
    for name in strategies:
        own = {option: values for option, values in sweeps.items() if name and option in takes[name]}
        for combination in itertools.product(*own.values()):
            variants.append(Variant(name, dict(zip(own, combination, strict=True))))
    return variants


@dataclass(frozen=True)
class BeirDataset:
    """A corpus (id -> title, text), queries (id -> text) and graded judgements (query -> doc -> grade)."""

    name: str
    corpus: dict[str, tuple[str, str]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise RagidxError(f"{path} not found: a BEIR folder has corpus.jsonl, queries.jsonl and qrels/")
    records = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError:
                    raise RagidxError(f"{path}:{number}: not a JSON object") from None
    return records


def load_beir(directory: Path, split: str) -> BeirDataset:
    """Read ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv`` (header, query, doc, grade)."""
    qrels_path = directory / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        available = sorted(p.stem for p in (directory / "qrels").glob("*.tsv"))
        raise RagidxError(
            f"no qrels for split '{split}' in {directory}"
            + (f": choose --split {' or '.join(available)}" if available else " (no qrels/ folder)")
        )
    corpus = {
        str(r["_id"]): (str(r.get("title") or ""), str(r.get("text") or ""))
        for r in _read_jsonl(directory / "corpus.jsonl")
    }
    queries = {str(r["_id"]): str(r["text"]) for r in _read_jsonl(directory / "queries.jsonl")}
    qrels: dict[str, dict[str, int]] = {}
    with qrels_path.open(encoding="utf-8") as rows:
        for row in csv.reader(rows, delimiter="\t"):
            if len(row) < 3 or not row[2].strip().lstrip("-").isdigit():
                continue  # the header, or a blank line
            query, document, grade = row[0], row[1], int(row[2])
            if query in queries and document in corpus:
                qrels.setdefault(query, {})[document] = grade
    return BeirDataset(directory.name, corpus, queries, qrels)


def subsample(dataset: BeirDataset, max_docs: int | None, max_queries: int | None) -> BeirDataset:
    """Keep judged queries only (at most ``max_queries``), every document they judge, and fill up
    to ``max_docs`` with other documents. Draws use a fixed seed, so runs are comparable.

    Where those queries judge more than ``max_docs`` documents (QMSum: a few questions per long
    meeting), queries are kept in a seeded random order while their documents fit, so the corpus
    is ``max_docs`` documents with every kept question they answer.
    """
    rng = np.random.default_rng(0)
    judged = sorted(q for q, docs in dataset.qrels.items() if any(g > 0 for g in docs.values()))
    if max_queries and len(judged) > max_queries:
        judged = [judged[i] for i in sorted(rng.choice(len(judged), max_queries, replace=False))]
    needed = {doc for q in judged for doc in dataset.qrels[q]}
    if max_docs is not None and len(needed) > max_docs:
        judged, needed = _queries_within(dataset, judged, max_docs)
    others = sorted(set(dataset.corpus) - needed)
    room = len(others) if max_docs is None else max(0, max_docs - len(needed))
    if room < len(others):
        others = [others[i] for i in sorted(rng.choice(len(others), room, replace=False))]
    keep = needed | set(others)
    return replace(
        dataset,
        corpus={doc: value for doc, value in dataset.corpus.items() if doc in keep},
        queries={q: dataset.queries[q] for q in judged},
        qrels={q: dataset.qrels[q] for q in judged},
    )


def _queries_within(
    dataset: BeirDataset, queries: Sequence[str], max_docs: int
) -> tuple[list[str], set[str]]:
    """The queries, taken in a seeded random order, whose judged documents fit in ``max_docs``
    together (the first one always), and those documents."""
    kept: set[str] = set()
    chosen: list[str] = []
    for position in np.random.default_rng(1).permutation(len(queries)):
        documents = set(dataset.qrels[queries[position]])
        if not chosen or len(kept | documents) <= max_docs:
            kept |= documents
            chosen.append(queries[position])
    return sorted(chosen), kept


def document_text(title: str, text: str) -> str:
    """A BEIR document as ragidx indexes it: the title as its own paragraph, then the text.

    Stripped, because a chunk never starts or ends with whitespace.
    """
    return f"{title.strip()}\n\n{text.strip()}" if title.strip() else text.strip()


def write_corpus(dataset: BeirDataset, folder: Path) -> None:
    """One ``.txt`` file per document, named by its percent-encoded id (see :func:`document_id`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for doc, (title, text) in dataset.corpus.items():
        (folder / f"{quote(doc, safe='')}.txt").write_text(document_text(title, text), encoding="utf-8")


def document_id(path: str) -> str:
    return unquote(Path(path).stem)


@dataclass
class RetrievalRow:
    strategy: str
    mode: str
    metrics: dict[str, float]
    build_seconds: float
    query_ms: float
    options: dict[str, Any] = field(default_factory=dict)  # the variant's given strategy options
    label: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "options": self.options,
            "label": self.label,
            "mode": self.mode,
            **self.metrics,
            "build_seconds": self.build_seconds,
            "query_ms": self.query_ms,
        }


@dataclass
class RetrievalReport:
    dataset: str
    split: str
    documents: int
    queries: int
    model: str
    rows: list[RetrievalRow] = field(default_factory=list)
    fusion: dict[str, Any] = field(default_factory=dict)  # variant label -> its index's tuned weights

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "split": self.split,
            "documents": self.documents,
            "queries": self.queries,
            "model": self.model,
            "rows": [row.to_dict() for row in self.rows],
            "fusion": self.fusion,
        }

    def fusion_lines(self) -> list[str]:
        """Each variant's hybrid fusion as its build tuned it, one line each."""
        return [
            f"{label}: {TuningReport.from_meta(fusion).describe()}"
            for label, fusion in self.fusion.items()
            if fusion
        ]


def rank_documents(index: Any, queries: Sequence[str], mode: str) -> list[list[tuple[str, float]]]:
    """Each query's top documents in an eval ``mode`` (see ``EVAL_MODES``): chunk hits grouped by
    document, a document scored by its best chunk."""
    search_mode, weights = EVAL_MODES[mode]
    counts = index.reader.counts()
    chunks_per_document = counts["chunks"] / max(counts["documents"], 1)
    # Enough chunks for 100 documents, within what a search may return (long documents with
    # many chunks each are ranked from the best MAX_K chunks: Recall@100 is then a lower bound).
    depth = min(math.ceil(DOCUMENTS_PER_QUERY * chunks_per_document) + 10, MAX_K)
    rankings = []
    for hits in index.search_many(list(queries), k=depth, mode=search_mode, weights=weights):
        best: dict[str, float] = {}
        for hit in hits:
            doc = document_id(hit.path)
            best[doc] = max(best.get(doc, -math.inf), hit.score)
        rankings.append(sorted(best.items(), key=lambda item: (-item[1], item[0]))[:DOCUMENTS_PER_QUERY])
    return rankings


def evaluate_index(
    index: Any, dataset: BeirDataset, variant: Variant, modes: Sequence[str], build_seconds: float
) -> list[RetrievalRow]:
    query_ids = list(dataset.queries)
    texts = [dataset.queries[q] for q in query_ids]
    name = index.settings.strategy
    rows = []
    for mode in modes:
        started = time.perf_counter()
        rankings = rank_documents(index, texts, mode)
        query_ms = 1000 * (time.perf_counter() - started) / max(len(texts), 1)
        metrics = mean_retrieval_metrics(dict(zip(query_ids, rankings, strict=True)), dataset.qrels)
        rows.append(
            RetrievalRow(name, mode, metrics, build_seconds, query_ms, variant.options, variant.label(name))
        )
    return rows


def evaluate_retrieval(
    dataset: BeirDataset,
    split: str,
    variants: Sequence[Variant | str | None],
    modes: Sequence[str],
    index_dir: Path | None = None,
    **shared: Any,
) -> RetrievalReport:
    """Build (or reuse ``index_dir``) an index of the corpus per variant and score every query.

    ``shared`` holds the build options (as ``ragidx build`` takes them) common to every variant;
    the strategy, its options and the index folder are set per variant (a plain name is a
    variant without options).
    """
    options = BuildOptions.of(**shared)
    model = options.model or model_for(v.strategy if isinstance(v, Variant) else v for v in variants)
    report = RetrievalReport(dataset.name, split, len(dataset.corpus), len(dataset.queries), model)
    with tempfile.TemporaryDirectory(prefix="ragidx-eval-") as scratch:
        documents = Path(scratch) / "documents"
        for number, variant in enumerate(v if isinstance(v, Variant) else Variant(v) for v in variants):
            target = index_dir or Path(scratch) / f"index-{number}"
            build_seconds = 0.0
            if not (index_dir and index_exists(index_dir)):
                if not documents.exists():
                    write_corpus(dataset, documents)
                started = time.perf_counter()
                strategy_options = {**options.strategy_options, **variant.options}
                settings = replace(
                    options,
                    strategy=variant.strategy,
                    strategy_options=strategy_options,
                    index_dir=target,
                    # Only the tuned hybrid mode reads the weights; a kept index (--index) gets them.
                    tune=options.tune and ("hybrid" in modes or index_dir is not None),
                    dense=True,  # the vectors are what is measured: no sample decides against them
                )
                build([documents], settings)
                build_seconds = time.perf_counter() - started
            with Index.open(target, device=options.device, dtype=None) as index:
                rows = evaluate_index(index, dataset, variant, modes, build_seconds)
                report.fusion[rows[0].label if rows else variant.label()] = index.meta.get("fusion")
                report.rows.extend(rows)
    return report


@dataclass(frozen=True)
class SimilarityPairs:
    first: list[str]
    second: list[str]
    gold: list[float]


def load_sts(path: Path, max_pairs: int | None = None) -> SimilarityPairs:
    """STS-B (tab-separated, gold in column 5, sentences in 6 and 7) or SICK (a header names the columns)."""
    if not path.is_file():
        raise RagidxError(f"{path} not found")
    with path.open(encoding="utf-8", newline="") as file:
        rows = list(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
    header = [cell.strip() for cell in rows[0]] if rows else []
    if {"sentence_A", "sentence_B", "relatedness_score"} <= set(header):
        columns = [header.index(name) for name in ("relatedness_score", "sentence_A", "sentence_B")]
        rows = rows[1:]
    else:
        columns = [4, 5, 6]
    pairs = SimilarityPairs([], [], [])
    for number, row in enumerate(rows, 1):
        if len(row) <= max(columns):
            continue
        try:
            score = float(row[columns[0]])
        except ValueError:
            raise RagidxError(
                f"{path}:{number}: expected a similarity score, got {row[columns[0]]!r}"
            ) from None
        pairs.gold.append(score)
        pairs.first.append(row[columns[1]])
        pairs.second.append(row[columns[2]])
        if max_pairs and len(pairs.gold) >= max_pairs:
            break
    if len(pairs.gold) < 2:
        raise RagidxError(f"{path}: no STS-B or SICK sentence pairs found")
    return pairs


def evaluate_sts(
    pairs: SimilarityPairs, strategy: Any, progress: Callable[[int, int], None] | None = None
) -> float:
    """Spearman × 100 between the cosine of the two sentences' vectors and the gold scores.

    Both sentences are embedded as documents: the task is symmetric, and a query template would
    make one side differ from the other for no reason. ``progress(texts, tokens)`` is called
    after each batch.
    """
    first = strategy.encode(pairs.first, "document", progress)
    second = strategy.encode(pairs.second, "document", progress)
    return 100.0 * spearman((first * second).sum(axis=1).tolist(), pairs.gold)


@dataclass
class StsRow:
    strategy: str
    options: dict[str, Any]
    label: str
    spearman: float
    seconds: float


@dataclass
class StsReport:
    file: str
    pairs: int
    model: str
    rows: list[StsRow] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate_sts_variants(
    path: Path,
    pairs: SimilarityPairs,
    model: str | None,
    variants: Sequence[Variant],
    device: str = "auto",
    dtype: str = "auto",
    progress: bool = True,
) -> StsReport:
    """Spearman × 100 of each variant, all on one loaded model, with a bar over the texts. One
    strategy (or the default) runs in the dtype a build of it would (``auto`` may take integer
    products for it); several share float products."""
    named = {variant.strategy or "" for variant in variants}
    embeds_with = named.pop() if len(named) == 1 else None
    runtime = load_runtime(
        model or model_for(variant.strategy for variant in variants), device, dtype, strategy=embeds_with
    )
    report = StsReport(str(path), len(pairs.gold), runtime.model_id)
    for variant in variants:
        name = named_or_default(variant.strategy, runtime)
        label = variant.label(name)
        started = time.perf_counter()
        strategy = create_strategy(name, runtime, **variant.options)
        with progress_bar(2 * len(pairs.gold), label, "texts", progress) as bar:
            score = evaluate_sts(pairs, strategy, lambda texts, tokens: bar.update(texts))
        report.rows.append(StsRow(name, variant.options, label, score, time.perf_counter() - started))
    return report

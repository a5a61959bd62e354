"""What reranking (``--rerank MODEL``) gains and costs: each query searched as the index is tuned,
then again reranked by each model; nDCG@10 (a BEIR dataset) or questions with an accepted page in
the top 3 (the help or manual pages' questions), and the milliseconds a query takes either way.

    python -m tests.benchmarks.rerank beir ../shared/eval/scifact --split train --max-docs 500 \\
        --max-queries 200 --index DIR --rerank smollm2,gemma3-270m
    python -m tests.benchmarks.rerank pages man_pages:en --index DIR --rerank smollm2

The BEIR index is the one ``ragidx eval retrieval DIR --index INDEX`` built from the same subsample
(the same ``--max-docs`` and ``--max-queries``: another draws other documents); the pages' index
the one ``python -m tests.benchmarks.man_pages check ... --index INDEX`` built.
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable
from pathlib import Path

from ragidx.app import Index
from ragidx.app.research.evaluation import document_id, load_beir, subsample
from ragidx.app.research.metrics import ndcg_at
from ragidx.indexer.search.hits import Hit

Judge = Callable[[list[Hit]], float]  # one query's figure from its hits


def beir_questions(args: argparse.Namespace) -> list[tuple[str, Judge]]:
    """Each query, judged by nDCG@10 over documents (a document ranks where its best chunk does)."""
    dataset = subsample(load_beir(args.source, args.split), args.max_docs, args.max_queries)

    def judge(query_id: str) -> Judge:
        def ndcg(hits: list[Hit]) -> float:
            best: dict[str, float] = {}
            for hit in hits:
                best.setdefault(document_id(hit.path), 1.0 / hit.rank)
            return ndcg_at(list(best.items()), dataset.qrels[query_id], 10)

        return ndcg

    return [(text, judge(query_id)) for query_id, text in dataset.queries.items()]


def page_questions(args: argparse.Namespace, index: Index) -> list[tuple[str, Judge]]:
    """Each question a page of the index answers, judged by whether one is in the top 3."""
    module, language = str(args.source).split(":")
    asked = importlib.import_module(f"tests.benchmarks.{module}").QUESTIONS[language]
    present = {Path(row["path"]).stem for row in index.reader.document_rows()}

    def judge(names: tuple[str, ...]) -> Judge:
        def top3(hits: list[Hit]) -> float:
            pages = list(dict.fromkeys(Path(hit.path).stem for hit in hits))[:3]
            return float(any(page in names for page in pages))

        return top3

    return [(question, judge(names)) for question, names in asked if present & set(names)]


def measured(index: Index, questions: list[tuple[str, Judge]], rerank: str | None) -> tuple[float, float]:
    """The mean figure and the milliseconds per query, searching ``k`` 10 (reranked: of 20)."""
    index.search(questions[0][0], k=10, rerank=rerank)  # loads what the search needs, untimed
    figures, started = [], time.perf_counter()
    for question, judge in questions:
        figures.append(judge(index.search(question, k=10, rerank=rerank)))
    return sum(figures) / len(figures), 1000 * (time.perf_counter() - started) / len(questions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["beir", "pages"])
    parser.add_argument(
        "source", type=Path, help="the BEIR folder, or MODULE:LANGUAGE of the pages' questions"
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-docs", type=int)
    parser.add_argument("--max-queries", type=int)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--rerank", required=True, help="models, comma-separated")
    args = parser.parse_args()
    with Index.open(args.index) as index:
        questions = beir_questions(args) if args.kind == "beir" else page_questions(args, index)
        figure, ms = measured(index, questions, None)
        print(f"{len(questions)} queries; {index.meta['model']} {index.meta.get('fusion', {}).get('method')}")
        print(f"{'search':<24}{figure:>8.4f}{ms:>10.0f} ms/query")
        for model in args.rerank.split(","):
            figure, ms = measured(index, questions, model)
            print(f"{'reranked by ' + model:<24}{figure:>8.4f}{ms:>10.0f} ms/query")


if __name__ == "__main__":
    main()

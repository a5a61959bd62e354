"""How far a query embedded with others (the daemon and ``serve`` embed the queries that wait
together in one forward, up to 64) is from the same query embedded alone (one row, through the
traced readout, on the threads a lone query takes), and whether its ranking changes.

Usage: python -m tests.benchmarks.batched_queries [--model minilm] [--strategy S] [--dtype auto]
       [--docs 500] [--queries 200] [--batch 64] [--data ../shared/eval/scifact]

SciFact claims are the queries and its abstracts the documents (embedded once, as an index holds
them). Prints the largest difference of a vector element, the smallest cosine between the two
vectors of a query, the largest difference of a query-document score, and how many queries' top
10 documents differ, in order or in membership.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

SCIFACT = Path(__file__).resolve().parents[3] / "shared" / "eval" / "scifact"
TOP = 10


def read_jsonl(path: Path, limit: int) -> list[dict]:
    with path.open(encoding="utf-8") as file:
        return [json.loads(line) for _, line in zip(range(limit), file, strict=False)]


def main() -> None:
    from ragidx.app import Embedder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--strategy", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--docs", type=int, default=500)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--data", type=Path, default=SCIFACT)
    arguments = parser.parse_args()

    embedder = Embedder(arguments.model, arguments.strategy, device="cpu", dtype=arguments.dtype)
    documents = [
        f"{d['title']}\n{d['text']}" for d in read_jsonl(arguments.data / "corpus.jsonl", arguments.docs)
    ]
    queries = [q["text"] for q in read_jsonl(arguments.data / "queries.jsonl", arguments.queries)]
    stored = embedder.embed(documents, "document")
    for query in queries[:3]:  # record and settle the one-row trace, as the daemon does
        embedder.embed([query])
    alone = np.stack([embedder.embed([query])[0] for query in queries])
    together = np.concatenate(
        [embedder.embed(queries[i : i + arguments.batch]) for i in range(0, len(queries), arguments.batch)]
    )
    cosines = np.sum(alone * together, axis=1)
    scores_alone, scores_together = alone @ stored.T, together @ stored.T
    top_alone = np.argsort(-scores_alone, axis=1)[:, :TOP]
    top_together = np.argsort(-scores_together, axis=1)[:, :TOP]
    reordered = int(np.sum(np.any(top_alone != top_together, axis=1)))
    other_members = sum(set(a) != set(b) for a, b in zip(top_alone, top_together, strict=True))
    print(
        f"{embedder.model}, {embedder.strategy.name}, {embedder.strategy.runtime.precision}; "
        f"{len(queries)} queries alone and in batches of {arguments.batch}, {len(documents)} documents"
    )
    score_difference = np.max(np.abs(scores_alone - scores_together))
    print(
        f"largest element difference {np.max(np.abs(alone - together)):.2e}; smallest cosine "
        f"{np.min(cosines):.7f}; largest score difference {score_difference:.2e}"
    )
    print(f"top {TOP} in another order: {reordered} of {len(queries)}; other documents: {other_members}")


if __name__ == "__main__":
    main()

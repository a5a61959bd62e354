"""Warm query latency end to end: embed one query and search the sample-corpus index, per mode.

Usage: python -m tests.benchmarks.query_latency [--model smollm2] [--strategy S] [--dtype auto]
       [--queries 50]

Builds ragidx's sample corpus with the model into a temporary index, opens it with the library
(`ragidx.Index`, what `ragidx serve` uses), runs five warm-up queries, then times ``search`` (one
query at a time, k=10: embedding, FAISS, FTS5, fusion and hits with snippets) for each mode and
prints p50 and p95 in milliseconds, with the embedding's share measured alone. The warm-up
records the strategy's one-row trace (indexer/strategies/traced_readout.py); the eager readout it
replaces is timed alternately with it on the same queries, so their ratio comes from one run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ragidx.indexer.strategies.base import Strategy

QUERY_WORDS = 8


def percentiles(milliseconds: list[float]) -> str:
    return f"p50 {np.percentile(milliseconds, 50):6.1f} ms   p95 {np.percentile(milliseconds, 95):6.1f} ms"


def milliseconds(step: Callable[[], object]) -> float:
    started = time.perf_counter()
    step()
    return 1000 * (time.perf_counter() - started)


def eager_readout(strategy: Strategy, query: str) -> None:
    """The strategy's readout of the query's one-row batch as written (what the trace replaces)."""
    import torch

    from ragidx.indexer.model.runtime import Batch

    ids = torch.tensor([strategy.token_ids(query, "query")])
    with torch.inference_mode():
        strategy.readout(Batch.single(ids), ())


def main() -> None:
    from ragidx.app import Index
    from ragidx.app.research.calibrate import SAMPLE_CORPUS
    from ragidx.indexer.build.pipeline import BuildOptions, build
    from ragidx.indexer.ingest.sources import scan

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--strategy", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--queries", type=int, default=50)
    args = parser.parse_args()
    sentences = [
        line.strip()
        for document in scan([SAMPLE_CORPUS]).documents
        for line in document.text.splitlines()
        if len(line.split()) >= QUERY_WORDS
    ]
    queries = [" ".join(line.split()[:QUERY_WORDS]) for line in sentences][: args.queries]
    with tempfile.TemporaryDirectory() as scratch:
        given = {"model": args.model, "strategy": args.strategy, "dtype": args.dtype}
        report = build([SAMPLE_CORPUS], BuildOptions(index_dir=Path(scratch), progress=False, **given))
        print(f"{report.model} ({report.dtype}), {report.strategy}: {report.chunks} chunks")
        with Index.open(Path(scratch)) as index:
            for query in queries[:5]:
                index.search(query)
            traced, eager = [], []
            for query in queries:
                traced.append(milliseconds(partial(index.embed, [query], "query")))
                eager.append(milliseconds(partial(eager_readout, index.strategy, query)))
            traced_by = "traced" if index.strategy.one_row and index.strategy.one_row.trace else "eager"
            print(f"{'embed one query':<16}{percentiles(traced)}   ({traced_by})")
            print(f"{'  eager readout':<16}{percentiles(eager)}   (model forward only, no trace)")
            for mode in ("dense", "lexical", "hybrid"):
                timings = [milliseconds(partial(index.search, query, k=10, mode=mode)) for query in queries]
                print(f"{mode:<16}{percentiles(timings)}")


if __name__ == "__main__":
    main()

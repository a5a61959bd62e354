"""Warm query latency end to end: embed one query and search the sample-corpus index, per mode.

Usage: python tests/benchmarks/query_latency.py [--model smollm2] [--strategy S] [--dtype auto]
       [--queries 50]

Builds ragidx's sample corpus with the model into a temporary index, opens it with the library
(`ragidx.Index`, what `ragidx serve` uses), runs five warm-up queries, then times ``search`` (one
query at a time, k=10: embedding, FAISS, FTS5, fusion and hits with snippets) for each mode and
prints p50 and p95 in milliseconds, with the embedding's share measured alone.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

QUERY_WORDS = 8


def percentiles(milliseconds: list[float]) -> str:
    return f"p50 {np.percentile(milliseconds, 50):6.1f} ms   p95 {np.percentile(milliseconds, 95):6.1f} ms"


def main() -> None:
    from ragidx.app import Index
    from ragidx.app.research.calibrate import SAMPLE_CORPUS
    from ragidx.indexer.pipeline import BuildOptions, build
    from ragidx.indexer.sources import scan

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
            timings = []
            for query in queries:
                started = time.perf_counter()
                index.embed([query], "query")
                timings.append(1000 * (time.perf_counter() - started))
            print(f"{'embed one query':<16}{percentiles(timings)}")
            for mode in ("dense", "lexical", "hybrid"):
                timings = []
                for query in queries:
                    started = time.perf_counter()
                    index.search(query, k=10, mode=mode)
                    timings.append(1000 * (time.perf_counter() - started))
                print(f"{mode:<16}{percentiles(timings)}")


if __name__ == "__main__":
    main()

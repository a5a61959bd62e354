"""FAISS's OpenMP threads beside the model's: a query's hybrid search with FAISS on one thread for
the one query (ragidx's way, ``one_thread_for_one_query`` in indexer/storage/vector_index.py)
against FAISS on all of its threads.

Usage: python tests/benchmarks/faiss_threads.py --index IDX [--rounds 2] [--queries 21]

The effect belongs to a process (threads that have run a FAISS search go on spinning and waking
beside the model's), so each setting runs in processes of its own, alternated ``--rounds`` times
in one sitting; each prints the median of embedding one query and of a hybrid search (k=10).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time

QUERIES = [
    "why are there two tides a day?",
    "how do I reset my password?",
    "how does a heat pump warm a house?",
]


def measure(index_dir: str, queries: int, all_threads: bool) -> str:
    """In this process: the medians (ms) of embedding a query and of a hybrid search."""
    from ragidx.app import Index
    from ragidx.indexer.storage import vector_index

    if all_threads:
        vector_index.one_thread_for_one_query = lambda count: contextlib.nullcontext()
    with Index.open(index_dir) as index:
        for query in QUERIES:
            index.search(query)

        def median_ms(step) -> float:
            seconds = []
            for i in range(queries):
                started = time.perf_counter()
                step(QUERIES[i % len(QUERIES)])
                seconds.append(time.perf_counter() - started)
            return 1000 * statistics.median(seconds)

        embed = median_ms(lambda query: index.embed([query]))
        hybrid = median_ms(lambda query: index.search(query, k=10))
    return f"embed {embed:5.1f} ms, hybrid search {hybrid:5.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--queries", type=int, default=21)
    parser.add_argument("--measure", choices=("one", "all"), help=argparse.SUPPRESS)  # a child's setting
    arguments = parser.parse_args()
    if arguments.measure:
        print(measure(arguments.index, arguments.queries, arguments.measure == "all"))
        return
    command = [sys.executable, __file__, "--index", arguments.index, "--queries", str(arguments.queries)]
    for round_number in range(1, arguments.rounds + 1):
        for setting, label in (("all", "FAISS on all threads"), ("one", "FAISS on one thread ")):
            found = subprocess.run([*command, "--measure", setting], capture_output=True, text=True)
            print(f"round {round_number}, {label}: {found.stdout.strip() or found.stderr[-400:]}")


if __name__ == "__main__":
    main()

"""How long a query waits behind another client's reranked search on a served index (the daemon,
``ragidx serve`` and ``ragidx mcp`` serve an index so): the reranking scores its candidates a batch
per slice of the scheduler's time, so the query should wait about one batch, not the reranking.

Usage:
  python -m tests.benchmarks.rerank_wait INDEX [--rerank smollm2] [--runs 5]

Prints the reranking's time alone (the model loaded) and each dense query's time when sent 0.3 s
after another client's reranked search started.
"""

from __future__ import annotations

import argparse
import threading
import time

from ragidx.app import Index
from ragidx.app.service.scheduler import Scheduler
from ragidx.app.service.served_index import ServedIndex
from ragidx.indexer.search.options import SearchOptions

QUERIES = ["compost heap smells", "keeping ships off the rocks", "refund for a bike", "gift cards", "tides"]
RERANKED = "why are there two tides a day"
HEAD_START = 0.3  # seconds the reranking runs before the query is sent


def timed(
    served: ServedIndex, scheduler: Scheduler, client: str, query: str, options: SearchOptions
) -> float:
    with scheduler.job(client, "search") as job:
        started = time.perf_counter()
        served.search(query, options, job)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("index")
    parser.add_argument("--rerank", default="smollm2")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    reranked = SearchOptions.of(k=10, rerank=args.rerank)
    dense = SearchOptions.of(k=3, mode="dense")
    with Scheduler() as scheduler, Index.open(args.index) as index:
        served = ServedIndex(index, scheduler)
        timed(served, scheduler, "warm", "warm up", dense)
        timed(served, scheduler, "warm", RERANKED, reranked)  # loads the reranking model
        alone = timed(served, scheduler, "warm", RERANKED, reranked)
        waits = []
        for query in QUERIES[: args.runs]:
            other = threading.Thread(target=timed, args=(served, scheduler, "other", RERANKED, reranked))
            other.start()
            time.sleep(HEAD_START)
            waits.append(timed(served, scheduler, "query", query, dense))
            other.join()
    shown = ", ".join(f"{wait:.2f}" for wait in waits)
    print(f"reranked search alone: {alone:.2f} s; a dense query behind one: {shown} s (max {max(waits):.2f})")


if __name__ == "__main__":
    main()

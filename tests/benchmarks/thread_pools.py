"""OpenMP thread pools beside the model's, each setting in processes of its own:

- ``--compare faiss``: a query's hybrid search with FAISS on one thread for the one query
  (ragidx's way, ``one_thread_for_one_query`` in indexer/storage/vector_index.py) against FAISS on
  all of its threads; prints the medians of embedding the query and of the search (k=10).
- ``--compare daemon``: the daemon's model work on its scheduler's one thread (ragidx's way,
  app/service/scheduler.py) against each request's own thread (the scheduler's calls run where they are
  made), and the main thread alone for reference; each request comes from a new thread, as a
  connection does, 50 ms apart; prints the median of a hybrid search answered by ``Daemon.answer``.
- ``--compare http``: the HTTP API (``create_app`` through Starlette's test client) with the model
  loaded and used on the scheduler's thread (ragidx's way) against the model loaded on the main
  thread and used on the threads that answer requests (anyio's workers); prints the medians of
  ``POST /search`` (hybrid) and ``POST /v1/embeddings`` (one text).
- ``--compare langchain``: LangChain's retriever (``RagidxRetriever``) searching through its own
  scheduler (ragidx's way) against searching on the thread LangChain calls from; prints the medians
  of ``await retriever.ainvoke(query)`` (LangChain runs it in a pool of threads) and then of
  ``retriever.invoke(query)`` from the main thread.

Usage: python -m tests.benchmarks.thread_pools --compare faiss|daemon|http|langchain --index IDX
       [--rounds 3] [--queries 21]

Threads that have run an operator stay in their pools, waking and spinning beside the model's
for the rest of the process, so a setting cannot be timed alternately with another in one
process: the settings' processes alternate ``--rounds`` times in one sitting instead.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

QUERIES = [
    "why are there two tides a day?",
    "how do I reset my password?",
    "how does a heat pump warm a house?",
]
SETTINGS = {
    "faiss": {"all": "FAISS on all threads", "one": "FAISS on one thread (ragidx)"},
    "daemon": {
        "model": "the scheduler's thread (ragidx)",
        "request": "each request's own thread",
        "main": "the main thread, no request threads",
    },
    "http": {"model": "the scheduler's thread (ragidx)", "request": "the request's thread"},
    "langchain": {"model": "the scheduler's thread (ragidx)", "caller": "the caller's thread"},
}


def median_ms(step: Callable[[str], object], queries: int, pause: float = 0.0) -> float:
    seconds = []
    for i in range(queries):
        time.sleep(pause)
        started = time.perf_counter()
        step(QUERIES[i % len(QUERIES)])
        seconds.append(time.perf_counter() - started)
    return 1000 * statistics.median(seconds)


def run_where_called(scheduler) -> None:
    """Make ``scheduler`` run every call on the thread that makes it (the setting ragidx left)."""
    scheduler.run = lambda job, work, *args, **kwargs: work(*args, **kwargs)
    scheduler.run_batched = lambda job, key, item, merge: merge([item])[0]


def faiss_threads(index_dir: str, queries: int, setting: str) -> str:
    from ragidx.app import Index
    from ragidx.indexer.storage.local import faiss_index as vector_index

    if setting == "all":
        vector_index.one_thread_for_one_query = lambda count: contextlib.nullcontext()
    with Index.open(index_dir) as index:
        for query in QUERIES:
            index.search(query)
        embed = median_ms(lambda query: index.embed([query]), queries)
        hybrid = median_ms(lambda query: index.search(query, k=10), queries)
    return f"embed {embed:5.1f} ms, hybrid search {hybrid:5.1f} ms"


def daemon_threads(index_dir: str, queries: int, setting: str) -> str:
    from ragidx.app.daemon.server import Daemon

    with tempfile.TemporaryDirectory(prefix="rgx-") as scratch:
        daemon = Daemon(Path(scratch) / "d.sock", idle=600)
        if setting == "request":
            run_where_called(daemon.scheduler)

        def answer(query: str) -> None:
            request = {"op": "search", "query": query, "index": index_dir, "device": "auto", "dtype": None}
            answered = daemon.answer(request)
            if "error" in answered:
                raise SystemExit(answered["error"])

        def ask(query: str) -> None:
            if setting == "main":
                answer(query)
                return
            connection = threading.Thread(target=answer, args=(query,))
            connection.start()
            connection.join()

        for query in QUERIES * 2:
            ask(query)
        return f"hybrid search {median_ms(ask, queries, pause=0.05):5.1f} ms"


def http_threads(index_dir: str, queries: int, setting: str) -> str:
    from fastapi.testclient import TestClient

    from ragidx.app import Index
    from ragidx.app.http.server import create_app
    from ragidx.app.service.scheduler import Scheduler

    index = Index.open(index_dir)
    scheduler = Scheduler()
    if setting == "request":
        run_where_called(scheduler)
    with scheduler.job("benchmark", "load") as job:
        scheduler.run(job, lambda: index.strategy)  # loaded where it is used, as `ragidx serve` loads it
    client = TestClient(create_app(index, scheduler=scheduler), base_url="http://localhost")
    model = client.get("/v1/models").json()["data"][0]["id"]

    def search(query: str) -> None:
        client.post("/search", json={"query": query, "k": 10}).raise_for_status()

    def embeddings(query: str) -> None:
        client.post("/v1/embeddings", json={"input": query, "model": model}).raise_for_status()

    for query in QUERIES:
        search(query)
        embeddings(query)
    search_ms, embeddings_ms = median_ms(search, queries), median_ms(embeddings, queries)
    return f"hybrid search {search_ms:5.1f} ms, embeddings {embeddings_ms:5.1f} ms"


def langchain_threads(index_dir: str, queries: int, setting: str) -> str:
    import asyncio

    from ragidx.app.integrations.langchain import RagidxRetriever

    retriever = RagidxRetriever.from_index(index_dir, k=10)
    if setting == "caller":
        run_where_called(retriever.source.scheduler)

    async def in_pool() -> float:
        for query in QUERIES:
            await retriever.ainvoke(query)
        seconds = []
        for i in range(queries):
            started = time.perf_counter()
            await retriever.ainvoke(QUERIES[i % len(QUERIES)])
            seconds.append(time.perf_counter() - started)
        return 1000 * statistics.median(seconds)

    pooled = asyncio.run(in_pool())
    return f"ainvoke {pooled:5.1f} ms, then invoke {median_ms(retriever.invoke, queries):5.1f} ms"


MEASURES = {
    "faiss": faiss_threads,
    "daemon": daemon_threads,
    "http": http_threads,
    "langchain": langchain_threads,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", choices=SETTINGS, required=True)
    parser.add_argument("--index", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=21)
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # a child's setting
    arguments = parser.parse_args()
    index = str(Path(arguments.index).resolve())
    if arguments.measure:
        print(MEASURES[arguments.compare](index, arguments.queries, arguments.measure))
        return
    command = [sys.executable, __file__, "--compare", arguments.compare, "--index", index]
    command += ["--queries", str(arguments.queries)]
    for round_number in range(1, arguments.rounds + 1):
        for setting, label in SETTINGS[arguments.compare].items():
            found = subprocess.run([*command, "--measure", setting], capture_output=True, text=True)
            print(f"round {round_number}, {label:<36}: {found.stdout.strip() or found.stderr[-400:]}")


if __name__ == "__main__":
    main()

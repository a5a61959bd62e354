"""Threads for the served model's slices, on a quiet machine and on a busy one.

Usage: python -m tests.benchmarks.served_threads --index IDX [--busy 0,2] [--seconds 20]
       [--embedders 2] [--texts 500]

Opens IDX once behind one scheduler, as the daemon does, then for each number of busy processes
(each spinning on a core) and each setting, torch's own thread count held fixed
(``RAGIDX_QUERY_THREADS``, how every slice ran before) and ragidx's choice (``auto``: the cores
idle as each slice starts, :func:`ragidx.indexer.model.threads.on_idle_cores`), runs for
``--seconds``: ``--embedders`` clients embedding ``--texts`` texts each in slices, again and again,
and one client searching (hybrid, k 3) every 0.1 s. Prints the texts embedded per second of
model time and the searches' p50, p95 and longest wait in seconds. The settings alternate twice
per busy count, so they share the machine's noise.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np

from tests.benchmarks.cli_latency import QUERIES
from tests.benchmarks.daemon_load import spinning

SETTINGS = ("fixed", "auto")


def run_phase(served, scheduler, texts: list[str], seconds: float, embedders: int) -> dict[str, list[float]]:
    """One phase: embedders and one searcher side by side; the texts per embed call and its
    seconds, and each search's seconds."""
    from ragidx.indexer.search.options import SearchOptions

    embedded: list[tuple[int, float]] = []
    searches: list[float] = []
    stop = threading.Event()

    def embedder(number: int) -> None:
        while not stop.is_set():
            with scheduler.job(f"embedder {number}", "embed") as job:
                started = time.perf_counter()
                served.embed(texts, "query", job)
                embedded.append((len(texts), time.perf_counter() - started))

    workers = [threading.Thread(target=embedder, args=(n,)) for n in range(embedders)]
    for worker in workers:
        worker.start()
    options = SearchOptions.of(mode="hybrid", k=3)
    end = time.monotonic() + seconds
    turn = 0
    while time.monotonic() < end:
        with scheduler.job(f"searcher {turn}", "search") as job:
            started = time.perf_counter()
            served.search(QUERIES[turn % len(QUERIES)], options, job)
            searches.append(time.perf_counter() - started)
        turn += 1
        time.sleep(0.1)
    stop.set()
    for worker in workers:
        worker.join()
    return {
        "texts": [float(n) for n, _ in embedded],
        "embed_seconds": [s for _, s in embedded],
        "search": searches,
    }


def main() -> None:
    import torch

    from ragidx.app import Index
    from ragidx.app.service.scheduler import Scheduler
    from ragidx.app.service.served_index import ServedIndex
    from ragidx.indexer.model.threads import THREADS_VARIABLE

    parser = argparse.ArgumentParser()
    parser.add_argument("--index", required=True)
    parser.add_argument("--busy", default="0,2", help="Comma-separated counts of busy processes.")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--embedders", type=int, default=2)
    parser.add_argument("--texts", type=int, default=500)
    arguments = parser.parse_args()
    texts = [f"line {n}: a sentence about tides, passwords and heat pumps" for n in range(arguments.texts)]
    fixed = torch.get_num_threads()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, torch's count {fixed} threads")
    print(
        "| busy | threads | texts/s | search p50 s | p95 s | max s |\n| --- | --- | --- | --- | --- | --- |"
    )
    with Scheduler() as scheduler, Index.open(arguments.index) as index:
        served = ServedIndex(index, scheduler)
        with scheduler.job("warm-up", "embed") as job:
            served.embed(texts[:64], "query", job)
        for count in (int(n) for n in arguments.busy.split(",")):
            figures: dict[str, dict[str, list[float]]] = {
                s: {"texts": [], "embed_seconds": [], "search": []} for s in SETTINGS
            }
            with spinning(count):
                time.sleep(1.0)
                for setting in SETTINGS * 2:
                    if setting == "fixed":
                        os.environ[THREADS_VARIABLE] = str(fixed)
                    else:
                        os.environ.pop(THREADS_VARIABLE, None)
                    phase = run_phase(served, scheduler, texts, arguments.seconds / 2, arguments.embedders)
                    for key, values in phase.items():
                        figures[setting][key] += values
            for setting in SETTINGS:
                found = figures[setting]
                rate = sum(found["texts"]) / max(sum(found["embed_seconds"]), 1e-9) * arguments.embedders
                p50, p95 = np.percentile(found["search"], [50, 95])
                shown = f"{fixed} (fixed)" if setting == "fixed" else "auto"
                print(
                    f"| {count} | {shown} | {rate:.0f} | {p50:.2f} | {p95:.2f} | {max(found['search']):.2f} |"
                )


if __name__ == "__main__":
    main()

"""How many threads one query's forward pass should use, on a quiet machine and on a busy one.

Usage: python -m tests.benchmarks.query_threads [--model smollm2] [--strategy S] [--queries 30]
       [--busy 0,1,2] [--busy-kind spin|matmul]

Loads the model once (``ragidx.Embedder``), then for each number of busy processes (each keeps
one core busy: a Python loop, or float32 matrix products on one thread, as a build on that core
would) and each thread count from 1 to the CPU count (fixed with ``RAGIDX_QUERY_THREADS``), then
ragidx's own choice (``auto``: the cores idle at that moment, indexer/model/threads.py), embeds one
query at a time and prints the median and p95 in milliseconds. The settings alternate query by
query, so they share the machine's noise. Warm-up queries record the traced one-row readout
first, as the daemon does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

from tests.benchmarks.cli_latency import QUERIES

BUSY_CODE = {
    "spin": "while True: pass",
    "matmul": ("import torch\ntorch.set_num_threads(1)\na = torch.randn(1024, 1024)\nwhile True: a @ a"),
}


def busy(count: int, kind: str) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY_CODE[kind]]) for _ in range(count)]


def main() -> None:
    import torch

    from ragidx.app import Embedder
    from ragidx.indexer.model.threads import THREADS_VARIABLE

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--strategy", default=None)
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--busy", default="0,1,2", help="Comma-separated counts of busy processes.")
    parser.add_argument("--busy-kind", choices=sorted(BUSY_CODE), default="matmul")
    arguments = parser.parse_args()

    embedder = Embedder(arguments.model, arguments.strategy)
    cpus = os.cpu_count() or 1
    print(
        f"{embedder.model}, {embedder.strategy.name}, torch {torch.__version__}, {cpus} CPUs, "
        f"default {torch.get_num_threads()} threads, busy: {arguments.busy_kind}"
    )
    for text in QUERIES:  # records the one-row trace and settles the executor
        embedder.embed([text])
    threads: list[int | None] = [*range(1, cpus + 1), None]  # None: ragidx's choice
    for count in (int(n) for n in arguments.busy.split(",")):
        workers = busy(count, arguments.busy_kind)
        time.sleep(1.0)
        try:
            seconds: dict[int | None, list[float]] = {n: [] for n in threads}
            for i in range(arguments.queries):
                for n in threads:
                    if n is None:
                        os.environ.pop(THREADS_VARIABLE, None)
                    else:
                        os.environ[THREADS_VARIABLE] = str(n)
                    started = time.perf_counter()
                    embedder.embed([QUERIES[i % len(QUERIES)]])
                    seconds[n].append(1000 * (time.perf_counter() - started))
        finally:
            for worker in workers:
                worker.kill()
                worker.wait()
        for n in threads:
            p50, p95 = np.percentile(seconds[n], [50, 95])
            print(f"busy {count}: {n or 'auto'} thread(s): p50 {p50:7.1f} ms   p95 {p95:7.1f} ms")


if __name__ == "__main__":
    main()

"""Wall time and peak memory of the CLI on sample_corpus/ with small random Qwen2 models.

Usage: python -m tests.benchmarks.foundation [--shape tiny|0.5b]
`tiny` is the test suite's model (hidden 64, 6 layers); `0.5b` has Qwen2.5-0.5B's real
dimensions with random weights, so its timings are those of the default model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.tiny_models import SAMPLE_CORPUS, save_tiny_model

RAGIDX = str(Path(sys.executable).parent / "ragidx")


def timed(*args: str) -> tuple[float, float]:
    """Seconds and peak RSS (MiB) of one ragidx run in a fresh process."""
    started = time.perf_counter()
    process = subprocess.Popen([RAGIDX, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"ragidx {' '.join(args)} failed")
    return seconds, usage.ru_maxrss / 1024


def warm_query_latency(index: Path, queries: list[str]) -> list[float]:
    from ragidx.app import Index

    with Index.open(index) as opened:
        opened.search("warm up", k=5)
        latencies = []
        for query in queries:
            started = time.perf_counter()
            opened.search(query, k=5)
            latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=["tiny", "0.5b"], default="tiny")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.shape == "tiny":
            model = save_tiny_model("qwen2", Path(tmp) / "qwen2")
        else:
            from tests.benchmarks.dtype import qwen2_05b_shaped

            model = qwen2_05b_shaped(Path(tmp) / "qwen2-0.5b-shaped")
        index = Path(tmp) / "index"
        help_seconds = min(timed("--help")[0] for _ in range(5))
        build_seconds, build_rss = timed(
            "build", str(SAMPLE_CORPUS), "--model", str(model), "--index", str(index)
        )
        query_seconds, query_rss = timed("query", "why are there two tides a day?", "--index", str(index))
        latencies = warm_query_latency(
            index, [f"question number {i} about tides and lenses" for i in range(20)]
        )
    print(f"model: random Qwen2, {args.shape} shape; corpus: sample_corpus/")
    print(f"ragidx --help          {help_seconds * 1000:8.0f} ms (best of 5)")
    print(f"ragidx build           {build_seconds:8.1f} s   peak RSS {build_rss:7.0f} MiB")
    print(f"ragidx query (cold)    {query_seconds:8.1f} s   peak RSS {query_rss:7.0f} MiB")
    print(f"query, warm in-process {statistics.median(latencies):8.1f} ms p50, {max(latencies):.1f} ms max")


if __name__ == "__main__":
    main()

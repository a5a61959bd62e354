"""`ragidx bench`: speed, memory and hardware efficiency of each strategy on this machine.

Per strategy: embedding throughput (tokens/s and vectors/s), peak resident memory while
embedding, warm query latency (embed one query, exact search), the fraction of decoder layers
executed (early exit), and achieved FLOP/s against a matrix-multiply probe in the same dtype.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ragidx.indexer.runtime import ModelRuntime
    from ragidx.indexer.strategies import Strategy

PROBE_SIZE = 1024
PROBE_SECONDS = 1.0
QUERY_WORDS = 16


class PeakRss:
    """Highest resident set size a sampling thread sees while the block runs (bytes)."""

    def __enter__(self) -> PeakRss:
        import psutil

        self.process = psutil.Process()
        self.before = self.peak = self.process.memory_info().rss
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc: object) -> None:
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def matmul_peak_flops(runtime: ModelRuntime, seconds: float = PROBE_SECONDS) -> float:
    """Best FLOP/s of a square matrix product in the model's dtype on its device (a short probe)."""
    import torch

    size = PROBE_SIZE
    a = torch.randn(size, size, dtype=runtime.dtype, device=runtime.device)
    b = torch.randn(size, size, dtype=runtime.dtype, device=runtime.device)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        (a @ b).sum().item()
        best = max(best, 2 * size**3 / (time.perf_counter() - started))
    return best


def count_flops(strategy: Strategy, texts: Sequence[str]) -> int:
    """Floating-point operations of embedding ``texts``, as torch's FLOP counter tallies them."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        strategy.encode(list(texts))
    return int(counter.get_total_flops())


def bench_queries(texts: Sequence[str], count: int) -> list[str]:
    """``count`` queries: the first words of evenly spaced texts."""
    step = max(1, len(texts) // max(count, 1))
    return [" ".join(text.split()[:QUERY_WORDS]) for text in texts[::step][:count]]


@dataclass
class BenchRow:
    strategy: str
    texts: int
    tokens: int
    seconds: float
    tokens_per_second: float
    vectors_per_second: float
    peak_rss_mib: float
    rss_growth_mib: float
    query_p50_ms: float
    query_p95_ms: float
    fraction_of_layers: float
    flops: int
    flops_per_second: float
    matmul_peak_flops_per_second: float
    fraction_of_peak: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bench_strategy(
    strategy: Strategy, name: str, texts: Sequence[str], queries: Sequence[str], peak: float
) -> BenchRow:
    import faiss

    runtime = strategy.runtime
    strategy.encode(list(texts[:2]))  # warm-up: first-call allocations and lazy set-up
    runtime.layers_run = runtime.layers_available = 0
    tokens = 0

    def count(rows: int, batch_tokens: int) -> None:
        nonlocal tokens
        tokens += batch_tokens

    with PeakRss() as rss:
        started = time.perf_counter()
        vectors = strategy.encode(list(texts), "document", count)
        seconds = time.perf_counter() - started
    fraction = runtime.fraction_of_layers_run
    flops = count_flops(strategy, texts)
    search = faiss.IndexFlatIP(vectors.shape[1])
    search.add(vectors)
    latencies = []
    for query in queries:
        started = time.perf_counter()
        search.search(strategy.encode([query], "query"), 10)
        latencies.append(1000 * (time.perf_counter() - started))
    return BenchRow(
        strategy=name,
        texts=len(texts),
        tokens=tokens,
        seconds=seconds,
        tokens_per_second=tokens / seconds,
        vectors_per_second=len(texts) / seconds,
        peak_rss_mib=rss.peak / 2**20,
        rss_growth_mib=(rss.peak - rss.before) / 2**20,
        query_p50_ms=float(np.percentile(latencies, 50)) if latencies else 0.0,
        query_p95_ms=float(np.percentile(latencies, 95)) if latencies else 0.0,
        fraction_of_layers=fraction,
        flops=flops,
        flops_per_second=flops / seconds,
        matmul_peak_flops_per_second=peak,
        fraction_of_peak=flops / seconds / peak if peak else 0.0,
    )


def bench_texts(runtime: ModelRuntime, source: Path, chunk_tokens: int, limit: int | None) -> list[str]:
    """Chunks of the documents under ``source``, cut as ``build`` cuts them."""
    from ragidx.indexer.chunking import Chunker
    from ragidx.indexer.errors import RagidxError
    from ragidx.indexer.sources import scan

    chunker = Chunker(runtime.tokenizer, chunk_tokens=chunk_tokens, overlap_sentences=0)
    texts = [chunk.text for document in scan([source]).documents for chunk in chunker.chunk(document.text)]
    if not texts:
        raise RagidxError(f"no readable text under {source}")
    return texts[:limit] if limit else texts

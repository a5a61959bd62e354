"""`ragidx bench`: speed, memory and hardware efficiency of each strategy on this machine.

Per strategy: embedding throughput (tokens/s and vectors/s), peak resident memory while
embedding, warm query latency (embed one query, exact search; each query runs once untimed
first), the fraction of decoder layers executed (early exit), and achieved FLOP/s against
matrix-product probes in float32 and bfloat16. Beside them, an anchor: the same chunks through a
hand-written transformers forward with mean pooling (or sentence-transformers' ``encode`` for an
encoder, where installed), in the same dtype and batch size, so that ragidx's own overhead shows
as a ratio measured in one run.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.chunking import Chunker
from ragidx.indexer.ingest.sources import scan
from ragidx.indexer.model.choices import resolve_device
from ragidx.indexer.model.packed_linear import can_pack_linear_weights
from ragidx.indexer.model.precision import best_flops_per_second, linear_flops_per_second
from ragidx.indexer.model.runtime import load_runtime, resolve_dtype
from ragidx.indexer.storage.faiss_module import faiss_module
from ragidx.indexer.strategies import create_strategy, model_for, named_or_default

if TYPE_CHECKING:
    from ragidx.indexer.model.runtime import ModelRuntime
    from ragidx.indexer.strategies import Strategy

PROBE_SIZES = {"cpu": 1024, "cuda": 8192}  # a GPU's 1024^3 product is over before its launch cost
PROBE_SECONDS = 1.0
PEAK_DTYPES = ("float32", "bfloat16")
QUERY_WORDS = 16
ANCHOR_ROWS = 32  # the strategies' default BatchSettings.max_rows
ANCHOR_MAX_LENGTH = 512  # the strategies' default max_length


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


class PeakDeviceMemory:
    """The most a GPU's allocator held while the block ran (bytes; 0 elsewhere)."""

    def __init__(self, device: Any):
        self.cuda = getattr(device, "type", device) == "cuda"
        self.peak = 0

    def __enter__(self) -> PeakDeviceMemory:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            import torch

            self.peak = torch.cuda.max_memory_allocated()


def probe_size(device: str) -> int:
    """The side of the square product that measures ``device``'s peak."""
    return PROBE_SIZES.get(device, PROBE_SIZES["cpu"])


def matmul_peak_flops(dtype: str, device: str, seconds: float = PROBE_SECONDS) -> float:
    """Best FLOP/s of a square matrix product in ``dtype`` on ``device`` (0 where it cannot run):
    on a CPU the faster of torch's product and oneDNN's on a packed weight, which a loaded model
    may run instead (on AMD CPUs 2.3x torch's in float32: docs/precision.md)."""
    import torch

    size = probe_size(device)
    try:
        a = torch.randn(size, size, dtype=getattr(torch, dtype), device=device)
        b = torch.randn(size, size, dtype=getattr(torch, dtype), device=device)
        plain = best_flops_per_second(lambda: (a @ b).sum().item(), 2 * size**3, seconds)
    except (RuntimeError, TypeError):  # a dtype the device does not multiply in
        return 0.0
    if device != "cpu" or not can_pack_linear_weights(dtype):
        return plain
    return max(plain, linear_flops_per_second(dtype, size, size, size, seconds, packed=True))


def matmul_peaks(device: str) -> dict[str, float]:
    """The probe in every dtype worth comparing, so each run can be set against the faster one."""
    return {dtype: matmul_peak_flops(dtype, device) for dtype in PEAK_DTYPES}


@dataclass
class Anchor:
    """The hand-written baseline: what it was, and its speed on the same chunks."""

    name: str
    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


def anchor_rate(runtime: ModelRuntime, texts: Sequence[str]) -> Anchor:
    """sentence-transformers' ``encode`` for an encoder where installed, else the plain forward."""
    if not runtime.arch.is_decoder and runtime.folder and importlib.util.find_spec("sentence_transformers"):
        return _sentence_transformers_rate(runtime, texts)
    return _plain_forward_rate(runtime, texts)


def _plain_forward_rate(runtime: ModelRuntime, texts: Sequence[str]) -> Anchor:
    """Ten lines of transformers: tokenizer padding in input order, full forward, masked mean, on
    the same weights loaded anew as transformers ships them (ragidx's bf16 CPU layers are packed)."""
    import torch
    from transformers import AutoModel

    tokenizer = runtime.tokenizer
    model = AutoModel.from_pretrained(runtime.folder or runtime.model_id, dtype=runtime.dtype)
    model.to(runtime.device).eval()

    def run(chunk: Sequence[str]) -> int:
        tokens = 0
        with torch.inference_mode():
            for start in range(0, len(chunk), ANCHOR_ROWS):
                encoded = tokenizer(
                    list(chunk[start : start + ANCHOR_ROWS]),
                    padding=True,
                    truncation=True,
                    max_length=ANCHOR_MAX_LENGTH,
                    return_tensors="pt",
                ).to(runtime.device)
                states = model(**encoded).last_hidden_state
                mask = encoded["attention_mask"].unsqueeze(-1).to(states.dtype)
                ((states * mask).sum(1) / mask.sum(1)).float().cpu()
                tokens += int(encoded["attention_mask"].sum())
        return tokens

    run(texts[:2])
    started = time.perf_counter()
    tokens = run(texts)
    seconds = time.perf_counter() - started
    return Anchor("transformers forward + mean", tokens, seconds)


def _sentence_transformers_rate(runtime: ModelRuntime, texts: Sequence[str]) -> Anchor:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(runtime.folder, device=str(runtime.device)).to(runtime.dtype)
    model.encode(list(texts[:2]), batch_size=ANCHOR_ROWS)
    started = time.perf_counter()
    model.encode(list(texts), batch_size=ANCHOR_ROWS)
    seconds = time.perf_counter() - started
    longest = model.max_seq_length
    tokens = sum(min(len(ids), longest) for ids in runtime.tokenizer(list(texts))["input_ids"])
    return Anchor("sentence-transformers encode", tokens, seconds)


def count_flops(strategy: Strategy, texts: Sequence[str]) -> int:
    """Floating-point operations of embedding ``texts``, as torch's FLOP counter tallies them: run
    eagerly, since a one-row batch's traced readout cannot be recorded or replayed under the counter."""
    from torch.utils.flop_counter import FlopCounterMode

    one_row, strategy.one_row = strategy.one_row, None
    try:
        with FlopCounterMode(display=False) as counter:
            strategy.encode(list(texts))
    finally:
        strategy.one_row = one_row
    return int(counter.get_total_flops())


def bench_queries(texts: Sequence[str], count: int) -> list[str]:
    """``count`` queries: the first words of evenly spaced texts."""
    step = max(1, len(texts) // max(count, 1))
    return [" ".join(text.split()[:QUERY_WORDS]) for text in texts[::step][:count]]


@dataclass
class BenchRow:
    strategy: str
    dtype: str
    texts: int
    tokens: int
    padding: float  # padded cells that were not tokens, over all cells
    batch_rows: int
    batch_tokens: int
    seconds: float
    tokens_per_second: float
    vectors_per_second: float
    peak_rss_mib: float
    rss_growth_mib: float
    peak_device_mib: float  # a GPU's peak allocation while embedding (0 on a CPU)
    query_p50_ms: float
    query_p95_ms: float
    fraction_of_layers: float
    flops: int
    flops_per_second: float
    matmul_peak_flops_per_second: float
    fraction_of_peak: float
    best_matmul_peak_flops_per_second: float
    fraction_of_best_peak: float
    anchor: str
    anchor_tokens_per_second: float
    ratio_to_anchor: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bench_strategy(
    strategy: Strategy,
    name: str,
    texts: Sequence[str],
    queries: Sequence[str],
    peaks: dict[str, float],
    anchor: Anchor,
) -> BenchRow:
    faiss = faiss_module()

    runtime = strategy.runtime
    strategy.encode(list(texts[:2]))  # warm-up: first-call allocations and lazy set-up
    runtime.layers_run = runtime.layers_available = runtime.padded_tokens = 0
    tokens = 0

    def count(rows: int, batch_tokens: int) -> None:
        nonlocal tokens
        tokens += batch_tokens

    with PeakRss() as rss, PeakDeviceMemory(runtime.device) as device_memory:
        started = time.perf_counter()
        vectors = strategy.encode(list(texts), "document", count)
        seconds = time.perf_counter() - started
    fraction, padded = runtime.fraction_of_layers_run, runtime.padded_tokens
    flops = count_flops(strategy, texts)
    search = faiss.IndexFlatIP(vectors.shape[1])
    search.add(vectors)
    for query in queries:  # warm, untimed: the second single text records a CPU's one-row trace,
        strategy.encode([query], "query")  # and on a GPU a length's first run picks its kernels
    latencies = []
    for query in queries:
        started = time.perf_counter()
        search.search(strategy.encode([query], "query"), 10)
        latencies.append(1000 * (time.perf_counter() - started))
    dtype = runtime.precision
    products = str(runtime.dtype).removeprefix("torch.")  # held int8 or float16 weights multiply in float32
    peak, best = peaks.get(products, 0.0), max(peaks.values(), default=0.0)
    return BenchRow(
        strategy=name,
        dtype=dtype,
        texts=len(texts),
        tokens=tokens,
        padding=1 - tokens / padded if padded else 0.0,
        batch_rows=strategy.batch.max_rows,
        batch_tokens=strategy.batch.max_tokens,
        seconds=seconds,
        tokens_per_second=tokens / seconds,
        vectors_per_second=len(texts) / seconds,
        peak_rss_mib=rss.peak / 2**20,
        rss_growth_mib=(rss.peak - rss.before) / 2**20,
        peak_device_mib=device_memory.peak / 2**20,
        query_p50_ms=float(np.percentile(latencies, 50)) if latencies else 0.0,
        query_p95_ms=float(np.percentile(latencies, 95)) if latencies else 0.0,
        fraction_of_layers=fraction,
        flops=flops,
        flops_per_second=flops / seconds,
        matmul_peak_flops_per_second=peak,
        fraction_of_peak=flops / seconds / peak if peak else 0.0,
        best_matmul_peak_flops_per_second=best,
        fraction_of_best_peak=flops / seconds / best if best else 0.0,
        anchor=anchor.name,
        anchor_tokens_per_second=anchor.tokens_per_second,
        ratio_to_anchor=tokens / seconds / anchor.tokens_per_second,
    )


def bench_texts(runtime: ModelRuntime, source: Path, chunk_tokens: int, limit: int | None) -> list[str]:
    """Chunks of the documents under ``source``, cut as ``build`` cuts them."""
    chunker = Chunker(runtime.tokenizer, chunk_tokens=chunk_tokens, overlap_sentences=0)
    texts = [chunk.text for document in scan([source]).documents for chunk in chunker.chunk(document.text)]
    if not texts:
        raise RagidxError(f"no readable text under {source}")
    return texts[:limit] if limit else texts


@dataclass
class BenchReport:
    model: str
    device: str
    texts: int
    chunk_tokens: int
    probe_size: int
    matmul_peaks: dict[str, float]
    rows: list[BenchRow]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # rows included: asdict recurses into dataclasses


def run_bench(
    model: str | None,
    strategies: Sequence[str | None],
    dtypes: Sequence[str],
    device: str,
    source: Path,
    chunk_tokens: int,
    max_texts: int | None,
    queries: int,
) -> BenchReport:
    """Every strategy in every dtype over the same chunks, with the probes and anchors in one run."""
    device = resolve_device(device)
    model = model or model_for(strategies)
    for dtype in dtypes:
        resolve_dtype(dtype, device)  # a misspelt dtype fails now, not after the probes
    peaks = matmul_peaks(device)
    rows: list[BenchRow] = []
    chunks: list[str] = []
    for dtype in dtypes:
        runtime = load_runtime(model, device, dtype)
        chunks = chunks or bench_texts(runtime, source, chunk_tokens, max_texts)
        anchor = anchor_rate(runtime, chunks)
        for name in strategies:
            name = named_or_default(name, runtime)
            strategy = create_strategy(name, runtime)
            rows.append(bench_strategy(strategy, name, chunks, bench_queries(chunks, queries), peaks, anchor))
    return BenchReport(runtime.model_id, device, len(chunks), chunk_tokens, probe_size(device), peaks, rows)

"""float32 products on this CPU: torch's own (MKL) against oneDNN's with the weight packed once.

Usage: python -m tests.benchmarks.float32_products [--model gemma3-270m] [--strategy S] [--rounds 4]

First a table of single products, model-shaped (SmolLM2's 576 -> 1536, Gemma 3's 640 -> 2048 and
2048 -> 640, a 1B model's 2048 -> 8192) at 1 to 2,048 rows: GFLOP/s of each, their ratio and the
largest difference relative to the output's largest value. Then the model itself in float32,
loaded twice (weights packed and plain), the two alternating: one query embedded alone (median of
20) and a build batch of 32 texts of about 300 tokens, best of ``--rounds``; and the smallest cosine
between the two loads' vectors. To approximate a CPU without AVX-512 on one that has it, run with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

SHAPES = ((576, 1536), (640, 2048), (2048, 640), (2048, 8192))
ROWS = (1, 20, 256, 2048)
QUERY = "why are there two tides a day?"


def best_seconds(step: Callable[[], object], rounds: int) -> float:
    """The fastest of ``rounds`` calls, after one untimed (oneDNN builds a kernel per shape)."""
    step()
    return min(timeit.repeat(step, number=1, repeat=rounds))


def products() -> None:
    reorder, packed_product = torch.ops.mkldnn._reorder_linear_weight, torch.ops.mkldnn._linear_pointwise
    print("product        rows  torch GFLOP/s  packed GFLOP/s  packed/torch time  max rel. difference")
    for inputs, outputs in SHAPES:
        weight = torch.randn(outputs, inputs)
        packed = reorder(weight, None)
        for rows in ROWS:
            batch = torch.randn(rows, inputs)
            rounds = 50 if rows <= 256 else 10
            plain = partial(torch.nn.functional.linear, batch, weight)
            blocked = partial(packed_product, batch, packed, None, "none", [], "")
            plain_seconds, packed_seconds = best_seconds(plain, rounds), best_seconds(blocked, rounds)
            expected = plain()
            difference = float((blocked() - expected).abs().max() / expected.abs().max())
            flops = 2.0 * rows * inputs * outputs
            ratio = packed_seconds / plain_seconds
            print(
                f"{inputs:>4} -> {outputs:<5} {rows:>5}  {flops / plain_seconds / 1e9:13.0f}  "
                f"{flops / packed_seconds / 1e9:14.0f}  {ratio:17.2f}  {difference:.1e}"
            )


def whole_model(model: str, strategy_name: str | None, rounds: int) -> None:
    from ragidx.indexer.model import runtime as runtime_module
    from ragidx.indexer.strategies import create_strategy, named_or_default

    loads = {}
    for packed in (True, False):
        runtime_module.packs_float32 = lambda hidden, intermediate, packed=packed: packed  # type: ignore[assignment]
        loads["packed" if packed else "torch"] = runtime_module.load_runtime(model, "cpu", "float32")
    name = strategy_name or named_or_default(None, loads["packed"])
    strategies = {label: create_strategy(name, runtime) for label, runtime in loads.items()}
    texts = [f"{QUERY} " + " ".join(["the tide comes in and goes out"] * 40)] * 32
    query_ms: dict[str, list[float]] = {label: [] for label in strategies}
    batch_seconds: dict[str, float] = dict.fromkeys(strategies, float("inf"))
    for strategy in strategies.values():
        strategy.encode([QUERY], "query")  # oneDNN builds its kernels for a shape on the first call
    for _ in range(20):
        for label, strategy in strategies.items():
            started = time.perf_counter()
            strategy.encode([QUERY], "query")
            query_ms[label].append(1000 * (time.perf_counter() - started))
    for _ in range(rounds):
        for label, strategy in strategies.items():
            seconds = best_seconds(partial(strategy.encode, texts), 1)
            batch_seconds[label] = min(batch_seconds[label], seconds)
    vectors = {label: strategy.encode([QUERY, *texts[:2]]) for label, strategy in strategies.items()}
    a, b = vectors["packed"], vectors["torch"]
    cosine = float(np.min((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))
    print(f"\n{model}, {name}, float32, {torch.get_num_threads()} threads:")
    for label in strategies:
        print(
            f"  {label:6s}  one query: {statistics.median(query_ms[label]):6.1f} ms   "
            f"32 x ~300-token batch: {batch_seconds[label]:6.2f} s"
        )
    print(f"  smallest cosine, packed vs torch: {cosine:.7f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--strategy", default=None)
    parser.add_argument("--rounds", type=int, default=4)
    arguments = parser.parse_args()
    print(f"torch {torch.__version__}, kernels {torch.backends.cpu.get_cpu_capability()}")
    products()
    whole_model(arguments.model, arguments.strategy, arguments.rounds)


if __name__ == "__main__":
    main()

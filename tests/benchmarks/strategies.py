"""Embedding throughput per strategy and the fraction of decoder layers each one runs.

Usage: python -m tests.benchmarks.strategies [--shape tiny|0.5b] [--strategies mean,aligned-wva]
       [--chunks N] [--repeats R]
Texts are the sample corpus cut into chunks of at most 128 tokens; weights are random, so only
speed and layer counts mean anything here.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tests.benchmarks.dtype import chunk_texts, qwen2_05b_shaped
from tests.support.tiny_models import save_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=["tiny", "0.5b"], default="tiny")
    parser.add_argument(
        "--strategies", default="mean,prompteol,cot,knowledge,cp,echo,kv-embedding,htp,tp,aligned-wva,wva,va"
    )
    parser.add_argument("--chunks", type=int, default=0, help="Use only the first N chunks (0: all).")
    parser.add_argument(
        "--repeats", type=int, default=1, help="Rounds over all strategies, interleaved; the median is shown."
    )
    args = parser.parse_args()
    from ragidx.indexer.model.runtime import load_runtime, plan_batches
    from ragidx.indexer.strategies import BatchSettings, create_strategy

    batch = BatchSettings()
    names = args.strategies.split(",")

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        model = str(save_tiny_model("qwen2", folder) if args.shape == "tiny" else qwen2_05b_shaped(folder))
        texts = chunk_texts(model)[: args.chunks or None]
        print(f"random Qwen2, {args.shape} shape, float32, {len(texts)} chunks of <= 128 tokens")
        runtime = load_runtime(model, device="cpu", dtype="float32")
        strategies = {name: create_strategy(name, runtime, batch=batch) for name in names}
        seconds: dict[str, list[float]] = {name: [] for name in names}
        layers_per_batch: dict[str, float] = {}
        for strategy in strategies.values():
            strategy.encode(texts[:4])
        for _ in range(args.repeats):
            for name, strategy in strategies.items():
                runtime.layers_run = 0
                started = time.perf_counter()
                strategy.encode(texts)
                seconds[name].append(time.perf_counter() - started)
                prepared = strategy.prepare(texts, "document", None)
                batches = plan_batches([len(row.ids) for row in prepared], batch.max_rows, batch.max_tokens)
                layers_per_batch[name] = runtime.layers_run / len(batches)
        for name in names:
            median = statistics.median(seconds[name])
            print(
                f"{name:>12}: {len(texts) / median:8.2f} vectors/s ({median:6.2f} s median of "
                f"{args.repeats}), {layers_per_batch[name]:5.1f} decoder layers run per batch "
                f"(a full forward pass runs {runtime.arch.num_layers})"
            )


if __name__ == "__main__":
    main()

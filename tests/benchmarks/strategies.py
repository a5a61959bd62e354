"""Embedding throughput per strategy and the fraction of decoder layers each one runs.

Usage: python tests/benchmarks/strategies.py [--shape tiny|0.5b] [--strategies mean,aligned-wva]
Texts are the sample corpus cut into chunks of at most 128 tokens; weights are random, so only
speed and layer counts mean anything here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from dtype import chunk_texts, qwen2_05b_shaped
from tiny_models import save_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=["tiny", "0.5b"], default="tiny")
    parser.add_argument("--strategies", default="mean,prompteol,aligned-wva,wva,va")
    args = parser.parse_args()
    from ragidx.indexer.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        model = str(save_tiny_model("qwen2", folder) if args.shape == "tiny" else qwen2_05b_shaped(folder))
        texts = chunk_texts(model)
        print(f"random Qwen2, {args.shape} shape, float32, {len(texts)} chunks of <= 128 tokens")
        for name in args.strategies.split(","):
            runtime = load_runtime(model, device="cpu", dtype="float32")
            strategy = create_strategy(name, runtime)
            strategy.encode(texts[:4])
            runtime.layers_run = runtime.layers_available = 0
            started = time.perf_counter()
            strategy.encode(texts)
            seconds = time.perf_counter() - started
            print(
                f"{name:>12}: {len(texts) / seconds:8.1f} vectors/s, "
                f"layers run {runtime.fraction_of_layers_run:.3f} of {runtime.arch.num_layers}"
            )


if __name__ == "__main__":
    main()

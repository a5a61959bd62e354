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
    parser.add_argument(
        "--strategies", default="mean,prompteol,cot,knowledge,cp,echo,htp,tp,aligned-wva,wva,va"
    )
    args = parser.parse_args()
    from ragidx.indexer.runtime import load_runtime, plan_batches
    from ragidx.indexer.strategies import BatchSettings, create_strategy

    batch = BatchSettings()

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        model = str(save_tiny_model("qwen2", folder) if args.shape == "tiny" else qwen2_05b_shaped(folder))
        texts = chunk_texts(model)
        print(f"random Qwen2, {args.shape} shape, float32, {len(texts)} chunks of <= 128 tokens")
        for name in args.strategies.split(","):
            runtime = load_runtime(model, device="cpu", dtype="float32")
            strategy = create_strategy(name, runtime, batch=batch)
            strategy.encode(texts[:4])
            runtime.layers_run = runtime.layers_available = 0
            started = time.perf_counter()
            strategy.encode(texts)
            seconds = time.perf_counter() - started
            prepared = strategy.prepare(texts, "document", None)
            batches = len(plan_batches([len(row.ids) for row in prepared], batch.max_rows, batch.max_tokens))
            print(
                f"{name:>12}: {len(texts) / seconds:8.1f} vectors/s, {runtime.layers_run / batches:5.1f} "
                f"decoder layers run per batch (a full forward pass runs {runtime.arch.num_layers})"
            )


if __name__ == "__main__":
    main()

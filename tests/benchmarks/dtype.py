"""float32 vs bfloat16 on this CPU: embedding speed and how close bf16 vectors stay to float32.

Usage: python -m tests.benchmarks.dtype [--real-model DIR]
Builds a random model with Qwen2.5-0.5B's real dimensions (speed is about shapes, not weights),
embeds the sample corpus's chunks with `mean` and `prompteol`, and prints vectors/s and the
cosine between the two precisions. A real model folder (e.g. all-MiniLM-L6-v2) gives a cosine
figure that reflects trained weights.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from tests.support.tiny_models import SAMPLE_CORPUS, _wrap, train_tokenizer


def qwen2_05b_shaped(folder: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    tokenizer = train_tokenizer()
    config = Qwen2Config(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    _wrap(tokenizer, None, 32768).save_pretrained(folder)
    return folder


def chunk_texts(model_dir: str) -> list[str]:
    from ragidx.indexer.ingest.chunking import Chunker
    from ragidx.indexer.ingest.sources import scan
    from ragidx.indexer.model.runtime import load_runtime

    runtime = load_runtime(model_dir, device="cpu", dtype="float32")
    chunker = Chunker(runtime.tokenizer, chunk_tokens=128, overlap_sentences=0)
    return [c.text for d in scan([SAMPLE_CORPUS]).documents for c in chunker.chunk(d.text)]


def measure(model_dir: str, strategies: list[str], texts: list[str]) -> None:
    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    for name in strategies:
        vectors = {}
        for dtype in ("float32", "bfloat16"):
            strategy = create_strategy(name, load_runtime(model_dir, device="cpu", dtype=dtype))
            strategy.encode(texts[:8])  # warm-up
            started = time.perf_counter()
            vectors[dtype] = strategy.encode(texts)
            seconds = time.perf_counter() - started
            print(f"{Path(model_dir).name:>24} {name:>10} {dtype:>9}: {len(texts) / seconds:7.1f} vectors/s")
        cosine = np.sum(vectors["float32"] * vectors["bfloat16"], axis=1)
        print(f"{'':>24} {name:>10} cosine(bf16, fp32): min {cosine.min():.5f} mean {cosine.mean():.5f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--real-model", default=None)
    args = parser.parse_args()
    import torch

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, cpu capability "
        f"{torch.backends.cpu.get_cpu_capability()}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(qwen2_05b_shaped(Path(tmp) / "qwen2-0.5b-shaped"))
        texts = chunk_texts(model_dir)
        print(f"{len(texts)} chunks of at most 128 tokens from sample_corpus")
        measure(model_dir, ["mean", "prompteol"], texts)
        if args.real_model:
            measure(args.real_model, ["mean"], chunk_texts(args.real_model))


if __name__ == "__main__":
    main()

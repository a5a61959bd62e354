"""ragidx against llama.cpp on the same GGUF file and the same passages, mean pooling, one after
the other in one sitting: the anchor for ragidx's CPU speed (issue 49).

Usage: python -m tests.benchmarks.llama_cpp_anchor [--model smollm2 | FILE.gguf] [--passages 16]
       [--words 200] [--threads 2] [--rounds 2] [--dtype auto[,float32,...]] [--queries 20]
       [--no-llama-cpp] [--strategy mean]

The passages are ragidx's sample corpus cut into ``--words``-word pieces. ragidx embeds them with
``Embedder(model, "mean")`` in the document role; llama.cpp (the ``xllamacpp`` wheel: prebuilt,
``pip install xllamacpp``) with mean pooling, in process, ``--threads`` threads. Each side embeds
one passage first (loading, tracing), then the passages ``--rounds`` times, the two sides
alternating; the best round of each is printed with tokens/s (the model's tokens, as ragidx
counts them), their ratio, and the mean cosine between the two sides' vectors, which says whether
both computed the same thing (ragidx's template and llama.cpp's BOS handling may differ a little).
Several ``--dtype``s are compared in the same sitting (each ratio and cosine is to the first side),
and ``--queries N`` adds each dtype's median one-text query time; ``--strategy`` with
``--no-llama-cpp`` compares the dtypes' vectors for another strategy.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

CORPUS = Path(__file__).resolve().parents[2] / "sample_corpus"


def passages(count: int, words: int) -> list[str]:
    """``count`` passages of ``words`` words from the sample corpus (cycling through it)."""
    text = " ".join(path.read_text() for path in sorted(CORPUS.rglob("*.md"))).split()
    return [" ".join(text[(i * words + j) % len(text)] for j in range(words)) for i in range(count)]


def gguf_path(model: str) -> str:
    from ragidx.indexer.model.sources import PACKAGED_MODELS

    if model in PACKAGED_MODELS:
        parts = PACKAGED_MODELS[model].paths()
        if parts is None or len(parts) != 1:
            raise SystemExit(f"{model} is not installed as one GGUF file")
        return str(parts[0])
    return model


def llama_cpp(path: str, threads: int) -> Callable[[list[str]], np.ndarray]:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = path
    params.embedding = True
    params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    params.n_ctx = params.n_batch = params.n_ubatch = 4096
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads
    server = xllamacpp.Server(params)

    def embed(texts: list[str]) -> np.ndarray:
        answer = server.handle_embeddings({"input": texts})
        rows = sorted(answer["data"], key=lambda row: row["index"])
        vectors = np.array([row["embedding"] for row in rows], dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    return embed


def seconds(embed: Callable[[list[str]], np.ndarray], texts: list[str]) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    vectors = embed(texts)
    return time.perf_counter() - started, vectors


def query_p50(embedder: Any, texts: list[str], count: int) -> float:
    """Median seconds of a one-text query (a passage's first eight words), after two warm-ups that
    record the one-row trace."""
    queries = [" ".join(text.split()[i : i + 8]) for text in texts for i in (0, 40, 80)][: count + 2]
    for query in queries[:2]:
        embedder.embed([query], "query")
    times = [seconds(partial(embedder.embed, role="query"), [query])[0] for query in queries[2:]]
    return float(np.median(times))


def main() -> None:
    import torch

    from ragidx.app import Embedder

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--passages", type=int, default=16)
    parser.add_argument("--words", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="auto", help="ragidx dtypes to compare, comma-separated")
    parser.add_argument("--queries", type=int, default=0, help="also time this many one-text queries")
    parser.add_argument("--no-llama-cpp", action="store_true", help="compare ragidx's dtypes only")
    parser.add_argument("--strategy", default="mean", help="ragidx's (llama.cpp pools the mean)")
    arguments = parser.parse_args()

    texts = passages(arguments.passages, arguments.words)
    torch.set_num_threads(arguments.threads)
    embedders = {
        dtype: Embedder(arguments.model, arguments.strategy, dtype=dtype)
        for dtype in arguments.dtype.split(",")
    }
    first = next(iter(embedders.values()))
    tokens = sum(len(first.strategy.token_ids(text, "document")) for text in texts)
    sides: dict[str, Callable[[list[str]], np.ndarray]] = {
        f"ragidx {dtype} ({embedder.strategy.runtime.precision})": partial(embed_documents, embedder)
        for dtype, embedder in embedders.items()
    }
    if not arguments.no_llama_cpp:
        sides["llama.cpp"] = llama_cpp(gguf_path(arguments.model), arguments.threads)
    best: dict[str, float] = {}
    vectors: dict[str, np.ndarray] = {}
    for embed in sides.values():
        embed(texts[:1])
    for _ in range(arguments.rounds):
        for name, embed in sides.items():
            took, vectors[name] = seconds(embed, texts)
            best[name] = min(best.get(name, took), took)
    shape = f"{len(texts)} passages of {arguments.words} words, {tokens} tokens"
    print(f"{Path(arguments.model).name}, {shape}, {arguments.threads} threads")
    names = list(sides)
    for name, took in best.items():
        versus = f", {took / best[names[0]]:.2f}x the first's time" if name != names[0] else ""
        cosine = np.sum(vectors[name] * vectors[names[0]], axis=1)
        speed = f"{took:6.2f} s ({tokens / took:7.1f} tokens/s){versus}"
        print(f"{name:>28}: {speed}; cosine to the first: min {cosine.min():.6f}")
    for dtype, embedder in embedders.items() if arguments.queries else ():
        p50 = 1000 * query_p50(embedder, texts, arguments.queries)
        print(f"{'ragidx ' + dtype:>28}: one-text query p50 {p50:.1f} ms")


def embed_documents(embedder: Any, texts: list[str]) -> np.ndarray:
    return embedder.embed(texts, "document")


if __name__ == "__main__":
    main()

"""Each decoder strategy with integer products (``--dtype w8a8``) against float32 on a real decoder:
the measurements behind which strategies ``--dtype auto`` admits (indexer/model/integer_admission.py).

Usage: python -m tests.benchmarks.integer_admission [--model smollm2|gemma3-270m] [--strategies mean,...]
       [--sts ../shared/eval/stsb/sts-dev.csv] [--max-pairs N] [--worst N]

One process loads the model twice (float32 and w8a8) and, per strategy, embeds every sentence of
the STS-B dev pairs (all 1,500 unless ``--max-pairs``) and 8 sample-corpus passages of 200 words in
each dtype. Printed: the smallest and the mean cosine between the two dtypes' vectors, STS-B
Spearman x 100 in each, their difference and its spread (the standard deviation of the difference
over 200 paired bootstrap resamples of the pairs). The whole dev set, because the difference over a
200-pair subset varies by 0.7 point from subset to subset (docs/integer-products.md), more than the
0.5-point bound it is held to. nDCG@10 comes from ``ragidx eval retrieval ... --dtype float32``
and ``--dtype w8a8``.

``--worst N``: also each strategy's N texts farthest from float32 in w8a8, with their cosines when
only the weights are rounded (``int8``: int8 weights, float products; ``float16``): whether a text
that decides the smallest cosine moves under integer products alone, or under any rounding.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from ragidx.app.research.evaluation import SimilarityPairs, load_sts
from ragidx.app.research.metrics import spearman
from ragidx.indexer.model.runtime import load_runtime
from ragidx.indexer.strategies import create_strategy
from tests.benchmarks.llama_cpp_anchor import passages
from tests.support.held_weights import decoder_strategies

RESAMPLES = 200
WEIGHTS_ONLY = ("int8", "float16")  # held forms that round the weights but multiply in float


def compared_texts(pairs: SimilarityPairs) -> list[str]:
    """Every sentence of ``pairs`` (first sentences, then second ones) and 8 passages of 200 words."""
    return list(pairs.first) + list(pairs.second) + passages(8, 200)


def pair_cosines(vectors: np.ndarray, pairs: int) -> np.ndarray:
    """Each pair's cosine, from the vectors of :func:`compared_texts`."""
    return np.sum(vectors[:pairs] * vectors[pairs : 2 * pairs], axis=1)


def spearman_difference_spread(first: np.ndarray, second: np.ndarray, gold: np.ndarray) -> float:
    """Standard deviation of ``spearman(second) - spearman(first)`` (x 100) over paired bootstrap
    resamples of the pairs: how far the difference itself is from being noise."""
    generator = np.random.default_rng(0)
    differences = []
    for _ in range(RESAMPLES):
        chosen = generator.integers(0, len(gold), len(gold))
        scores = [spearman(cosines[chosen].tolist(), gold[chosen].tolist()) for cosines in (first, second)]
        differences.append(100.0 * (scores[1] - scores[0]))
    return float(np.std(differences))


def comparison(expected: np.ndarray, got: np.ndarray, pairs: SimilarityPairs) -> str:
    """Smallest and mean cosine between the two sets of vectors of :func:`compared_texts`, STS-B
    Spearman x 100 of each, their difference and its spread."""
    cosines = np.sum(expected * got, axis=1)
    similarities = [pair_cosines(each, len(pairs.gold)) for each in (expected, got)]
    scores = [100.0 * spearman(each.tolist(), pairs.gold) for each in similarities]
    spread = spearman_difference_spread(*similarities, np.array(pairs.gold))
    return (
        f"{cosines.min():.4f}, {cosines.mean():.5f}, {scores[0]:.2f}, {scores[1]:.2f}, "
        f"{scores[1] - scores[0]:+.2f} (spread {spread:.2f})"
    )


def worst_texts(
    texts: list[str], expected: np.ndarray, got: np.ndarray, count: int, strategies: dict[str, Any]
) -> str:
    """The ``count`` texts of lowest cosine between ``expected`` (float32) and ``got`` (w8a8), a line
    each: that cosine, the same text's under each of ``strategies`` (weights-only forms), the text."""
    cosines = np.sum(expected * got, axis=1)
    worst = np.argsort(cosines)[:count]
    chosen = [texts[number] for number in worst]
    vectors = {dtype: strategy.encode(chosen, "document") for dtype, strategy in strategies.items()}
    lines = []
    for row, number in enumerate(worst):
        others = ", ".join(
            f"{dtype} {float(expected[number] @ each[row]):.4f}" for dtype, each in vectors.items()
        )
        lines.append(f"  w8a8 {cosines[number]:.4f}, {others}: {texts[number][:80]!r}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--strategies", default=",".join(decoder_strategies()))
    parser.add_argument("--sts", type=Path, default=Path("../shared/eval/stsb/sts-dev.csv"))
    parser.add_argument("--max-pairs", type=int, default=None)
    parser.add_argument("--worst", type=int, default=0)
    arguments = parser.parse_args()
    pairs = load_sts(arguments.sts, arguments.max_pairs)
    texts = compared_texts(pairs)
    runtimes = {dtype: load_runtime(arguments.model, "cpu", dtype) for dtype in ("float32", "w8a8")}
    weights_only = (
        {dtype: load_runtime(arguments.model, "cpu", dtype) for dtype in WEIGHTS_ONLY}
        if arguments.worst
        else {}
    )
    print(
        f"{arguments.model}, {len(pairs.gold)} pairs: strategy, smallest cosine, mean cosine, "
        "STS-B float32, w8a8, difference"
    )
    for name in arguments.strategies.split(","):
        expected, got = (
            create_strategy(name, runtime).encode(texts, "document") for runtime in runtimes.values()
        )
        print(f"{name}, {comparison(expected, got, pairs)}", flush=True)
        if arguments.worst:
            rounded = {dtype: create_strategy(name, runtime) for dtype, runtime in weights_only.items()}
            print(worst_texts(texts, expected, got, arguments.worst, rounded), flush=True)


if __name__ == "__main__":
    main()

"""Each decoder strategy with integer products (``--dtype w8a8``) against float32 on a real decoder:
the measurements behind which strategies ``--dtype auto`` admits (indexer/model/integer_admission.py).

Usage: python -m tests.benchmarks.integer_admission [--model smollm2|gemma3-270m] [--strategies mean,...]
       [--sts ../shared/eval/stsb/sts-dev.csv] [--max-pairs 200]

One process loads the model twice (float32 and w8a8) and, per strategy, prints the smallest and the
mean cosine between the two dtypes' vectors over the first 24 STS-B dev pairs' 48 sentences and 8
sample-corpus passages of 200 words, and STS-B Spearman x 100 over ``--max-pairs`` pairs in each
dtype. nDCG@10 comes from ``ragidx eval retrieval ... --dtype float32`` and ``--dtype w8a8``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ragidx.app.research.evaluation import evaluate_sts, load_sts
from ragidx.indexer.model.runtime import load_runtime
from ragidx.indexer.strategies import create_strategy
from tests.benchmarks.llama_cpp_anchor import passages
from tests.support.held_weights import decoder_strategies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--strategies", default=",".join(decoder_strategies()))
    parser.add_argument("--sts", type=Path, default=Path("../shared/eval/stsb/sts-dev.csv"))
    parser.add_argument("--max-pairs", type=int, default=200)
    arguments = parser.parse_args()
    pairs = load_sts(arguments.sts, arguments.max_pairs)
    compared = load_sts(arguments.sts, 24)
    texts = list(compared.first) + list(compared.second) + passages(8, 200)
    runtimes = {dtype: load_runtime(arguments.model, "cpu", dtype) for dtype in ("float32", "w8a8")}
    print(f"{arguments.model}: strategy, smallest cosine, mean cosine, STS-B float32, w8a8, difference")
    for name in arguments.strategies.split(","):
        strategies = {dtype: create_strategy(name, runtime) for dtype, runtime in runtimes.items()}
        vectors = {dtype: strategy.encode(texts, "document") for dtype, strategy in strategies.items()}
        cosines = np.sum(vectors["float32"] * vectors["w8a8"], axis=1)
        scores = {dtype: evaluate_sts(pairs, strategy) for dtype, strategy in strategies.items()}
        difference = scores["w8a8"] - scores["float32"]
        print(
            f"{name}, {cosines.min():.4f}, {cosines.mean():.5f}, {scores['float32']:.2f}, "
            f"{scores['w8a8']:.2f}, {difference:+.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()

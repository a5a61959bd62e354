"""A candidate for integer products that keep quality: each activation row rounded to two 7-bit
digits (14 bits) instead of one, multiplied in one fbgemm call over twice the rows, with or
without SmoothQuant's migration. Measures what it would keep on a real decoder
(docs/integer-products.md#two-7-bit-digits; ``--dtype w8a8`` runs one digit). What it costs per
layer: ``python -m tests.benchmarks.cpu_kernels`` times it beside the other products.

Usage: python -m tests.benchmarks.integer_digits [--model smollm2] [--strategies aligned-wva,prompteol]
       [--sts ../shared/eval/stsb/sts-dev.csv] [--max-pairs N]

Quality: float32 against two digits of the same int8 weights, migrated and not (one migrated
digit is ``--dtype w8a8``, measured by tests.benchmarks.integer_admission), over every sentence of
the STS-B dev pairs and 8 passages, printed as the integer_admission benchmark prints them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from ragidx.app.research.evaluation import load_sts
from ragidx.app.research.metrics import spearman
from ragidx.indexer.model.int8_products import (
    ACTIVATION_LEVELS,
    IntegerWeight,
    hold_integer,
    integer_kernel,
    largest_inputs,
    rows_on_levels,
)
from ragidx.indexer.model.int8_weights import float_weight, held_int8
from ragidx.indexer.model.runtime import ModelRuntime, load_runtime
from ragidx.indexer.strategies import create_strategy
from tests.benchmarks.integer_admission import pair_cosines, spearman_difference_spread
from tests.benchmarks.llama_cpp_anchor import passages


def two_digit_product(inputs: torch.Tensor, weight: IntegerWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """:func:`integer_product` with each row's remainder after its first 7-bit digit rounded again:
    ``x = lowest + step * (q1 + q2 / 127 - 1/2)``, so the product is ``step * (q1 @ W.T + q2 @ W.T /
    127 - row_sums / 2) + lowest * row_sums``, both digits in one call over the stacked rows."""
    scaled, lowest, step = rows_on_levels(inputs, weight)
    first = scaled.round()
    rest = scaled.sub_(first).add_(0.5).mul_(ACTIVATION_LEVELS)
    both = integer_kernel()(torch.cat([first, rest], -2), 1.0, 0, weight.packed)
    result, remainder = both.chunk(2, -2)
    result = result.add(remainder, alpha=1 / ACTIVATION_LEVELS).sub_(weight.row_sums, alpha=0.5)
    result.mul_(step).addcmul_(lowest, weight.row_sums)
    return result if bias is None else result.add_(bias)


def integer_model(model: str, migrate: bool) -> ModelRuntime:
    """``model`` in int8 weights turned into integer products as ``--dtype w8a8`` turns them,
    migrated or not, each multiplying two digits."""
    runtime = load_runtime(model, "cpu", "int8")
    linears = [module for module in runtime.model.modules() if isinstance(module, torch.nn.Linear)]
    largest = largest_inputs(runtime.model, runtime.tokenizer) if migrate else {}
    for module in linears:
        hold_integer(module, float_weight(held_int8(module)), largest.get(module), two_digit_product)
    return runtime


def quality(arguments: argparse.Namespace) -> None:
    """Float32 against two digits of the same int8 weights, migrated and not."""
    pairs = load_sts(arguments.sts, arguments.max_pairs)
    count, gold = len(pairs.gold), np.array(pairs.gold)
    texts = list(pairs.first) + list(pairs.second) + passages(8, 200)
    reference = load_runtime(arguments.model, "cpu", "float32")
    variants = {"two digits, migrated": True, "two digits, not migrated": False}
    names = arguments.strategies.split(",")
    expected = {name: create_strategy(name, reference).encode(texts, "document") for name in names}
    print(
        f"{arguments.model}, {count} pairs: strategy, variant, smallest cosine, mean cosine, "
        "STS-B float32, integer"
    )
    for variant, migrate in variants.items():
        runtime = integer_model(arguments.model, migrate)
        for name in names:
            vectors = create_strategy(name, runtime).encode(texts, "document")
            cosines = np.sum(vectors * expected[name], axis=1)
            similarities = [pair_cosines(each, count) for each in (expected[name], vectors)]
            scores = [100.0 * spearman(each.tolist(), pairs.gold) for each in similarities]
            spread = spearman_difference_spread(*similarities, gold)
            print(
                f"{name}, {variant}, {cosines.min():.4f}, {cosines.mean():.5f}, {scores[0]:.2f}, "
                f"{scores[1]:.2f}, {scores[1] - scores[0]:+.2f} (spread {spread:.2f})",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--strategies", default="aligned-wva,prompteol")
    parser.add_argument("--sts", type=Path, default=Path("../shared/eval/stsb/sts-dev.csv"))
    parser.add_argument("--max-pairs", type=int, default=None)
    arguments = parser.parse_args()
    quality(arguments)


if __name__ == "__main__":
    main()

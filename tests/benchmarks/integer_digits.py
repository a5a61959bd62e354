"""A candidate for integer products that keep quality: each activation row rounded to two 7-bit
digits (14 bits) instead of one, multiplied in one fbgemm call over twice the rows, with or
without SmoothQuant's migration. Measures what it would keep and what it would cost
(docs/integer-products.md#two-7-bit-digits); ``--dtype w8a8`` runs one digit.

Usage: python -m tests.benchmarks.integer_digits [--model smollm2] [--strategies aligned-wva,prompteol]
       [--sts ../shared/eval/stsb/sts-dev.csv] [--max-pairs N]
       python -m tests.benchmarks.integer_digits --kernels [--shapes 576x1536,2048x8192] [--rows 12,256]

Quality: float32 against two digits of the same int8 weights, migrated and not (one migrated
digit is ``--dtype w8a8``, measured by tests.benchmarks.integer_admission), over every sentence of
the STS-B dev pairs and 8 passages, printed as the integer_admission benchmark prints them.
``--kernels``: GFLOP/s of one random layer in float16 weights (what ``auto`` holds on a CPU without
bf16), one digit and two digits.
"""

from __future__ import annotations

import argparse
import functools
import itertools
from pathlib import Path

import numpy as np
import torch

from ragidx.app.research.evaluation import load_sts
from ragidx.app.research.metrics import spearman
from ragidx.indexer.model.half_weights import hold_half
from ragidx.indexer.model.int8_products import (
    ACTIVATION_LEVELS,
    IntegerWeight,
    hold_integer,
    integer_kernel,
    integer_product,
    integer_weight,
    largest_inputs,
    rows_on_levels,
)
from ragidx.indexer.model.int8_weights import float_weight, held_int8
from ragidx.indexer.model.runtime import ModelRuntime, load_runtime
from ragidx.indexer.strategies import create_strategy
from tests.benchmarks.cpu_kernels import CACHE_DEFEATING_BYTES, best_seconds
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


def kernels(arguments: argparse.Namespace) -> None:
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {capability}")
    for shape in arguments.shapes.split(","):
        inputs, outputs = (int(size) for size in shape.split("x"))
        layers = []
        for _ in range(max(1, CACHE_DEFEATING_BYTES // (4 * inputs * outputs))):
            weight = torch.randn(outputs, inputs) * 0.02
            half = torch.nn.Linear(inputs, outputs, bias=False).requires_grad_(False)
            half.weight.copy_(weight)
            hold_half(half)
            held = integer_weight(weight)
            layers.append(
                {
                    "float16 weights": half,
                    "one digit": functools.partial(integer_product, weight=held, bias=None),
                    "two digits": functools.partial(two_digit_product, weight=held, bias=None),
                }
            )
        for rows in (int(each) for each in arguments.rows.split(",")):
            batch = torch.randn(rows, inputs)
            line = []
            for name in layers[0]:
                cycle = itertools.cycle(layer[name] for layer in layers)
                with torch.inference_mode():
                    took = best_seconds(lambda cycle=cycle, batch=batch: next(cycle)(batch), 1.0)
                line.append(f"{name} {2 * rows * inputs * outputs / took / 1e9:.0f} GFLOP/s")
            print(f"{inputs}->{outputs}, {rows} rows: " + ", ".join(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--strategies", default="aligned-wva,prompteol")
    parser.add_argument("--sts", type=Path, default=Path("../shared/eval/stsb/sts-dev.csv"))
    parser.add_argument("--max-pairs", type=int, default=None)
    parser.add_argument("--kernels", action="store_true")
    parser.add_argument("--shapes", default="576x1536,1536x576,2048x8192,8192x2048")
    parser.add_argument("--rows", default="12,256")
    arguments = parser.parse_args()
    kernels(arguments) if arguments.kernels else quality(arguments)


if __name__ == "__main__":
    main()

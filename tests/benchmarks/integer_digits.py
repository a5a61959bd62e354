"""Candidates for integer products that keep quality: activation rows rounded to two 7-bit digits
(14 bits) instead of one, multiplied in one fbgemm call over twice the rows, in every layer (with
or without SmoothQuant's migration) or only in the MLP's down-projections, whose inputs (after the
gated activation) are the widest, the other layers one migrated digit; or one migrated digit without
the rotation ``--dtype w8a8`` applies (``unrotated``, what ``w8a8`` was before it). None of these
variants rotates: they are the candidates the rotation was measured against
(docs/integer-products.md#one-digit-after-a-rotation). Measures what each keeps on a real decoder
(docs/integer-products.md#two-7-bit-digits) and, with ``--speed``, what a build costs in it;
``python -m tests.benchmarks.cpu_kernels`` times one layer.

Usage: python -m tests.benchmarks.integer_digits [--model smollm2] [--strategies aligned-wva,prompteol]
       [--variants all-migrated,all,down,unrotated] [--sts ../shared/eval/stsb/sts-dev.csv] [--max-pairs N]
       python -m tests.benchmarks.integer_digits --speed [--model smollm2|FILE.gguf] [--variants down]

Quality: float32 against each variant of the same int8 weights (one migrated digit everywhere is
``--dtype w8a8``, measured by tests.benchmarks.integer_admission), over every sentence of the STS-B
dev pairs and 8 passages, printed as the integer_admission benchmark prints them. ``--speed``: the
best of 3 builds of 8 passages of 200 words (``mean``), float16 weights (what ``auto`` holds on a
CPU without bf16), ``--dtype w8a8`` and each variant alternating in one process.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ragidx.app.research.evaluation import load_sts
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
from tests.benchmarks.integer_admission import compared_texts, comparison
from tests.benchmarks.llama_cpp_anchor import passages

SPEED_ROUNDS = 3


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


@dataclass(frozen=True)
class Variant:
    """Which layers multiply two digits (``all``, a layer's name, or None: none) and whether layers
    are migrated (two-digit layers only where all are); no layer is rotated."""

    description: str
    two_digits: str | None
    migrate: bool

    def takes_two_digits(self, layer: str) -> bool:
        return self.two_digits is not None and self.two_digits in ("all", *layer.split("."))


VARIANTS = {
    "all-migrated": Variant("two digits, migrated", "all", True),
    "all": Variant("two digits, not migrated", "all", False),
    "down": Variant("two digits in down_proj, one migrated elsewhere", "down_proj", True),
    "unrotated": Variant("one digit, migrated, not rotated", None, True),
}


def integer_model(model: str, variant: Variant) -> ModelRuntime:
    """``model`` in int8 weights turned into integer products as ``--dtype w8a8`` turns them, but
    not rotated, with two digits where ``variant`` says."""
    runtime = load_runtime(model, "cpu", "int8")
    largest = largest_inputs(runtime.model, runtime.tokenizer) if variant.migrate else {}
    for name, module in runtime.model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        weight = float_weight(held_int8(module))
        if variant.takes_two_digits(name):
            migrated = largest.get(module) if variant.two_digits == "all" else None
            hold_integer(module, weight, migrated, two_digit_product, rotate=False)
        else:
            hold_integer(module, weight, largest.get(module), rotate=False)
    return runtime


def chosen_variants(arguments: argparse.Namespace) -> dict[str, Variant]:
    """The variants named by ``--variants``, in its order."""
    return {key: VARIANTS[key] for key in arguments.variants.split(",")}


def quality(arguments: argparse.Namespace) -> None:
    """Float32 against each variant of the same int8 weights."""
    pairs = load_sts(arguments.sts, arguments.max_pairs)
    texts = compared_texts(pairs)
    reference = load_runtime(arguments.model, "cpu", "float32")
    names = arguments.strategies.split(",")
    expected = {name: create_strategy(name, reference).encode(texts, "document") for name in names}
    print(
        f"{arguments.model}, {len(pairs.gold)} pairs: strategy, variant, smallest cosine, mean cosine, "
        "STS-B float32, integer, difference"
    )
    for variant in chosen_variants(arguments).values():
        runtime = integer_model(arguments.model, variant)
        for name in names:
            vectors = create_strategy(name, runtime).encode(texts, "document")
            print(f"{name}, {variant.description}, {comparison(expected[name], vectors, pairs)}", flush=True)


def speed(arguments: argparse.Namespace) -> None:
    """Best build time of float16 weights, of one digit everywhere (w8a8) and of each variant,
    alternating."""
    texts = passages(8, 200)
    strategies = {
        dtype: create_strategy("mean", load_runtime(arguments.model, "cpu", dtype))
        for dtype in ("float16", "w8a8")
    }
    for variant in chosen_variants(arguments).values():
        strategies[variant.description] = create_strategy("mean", integer_model(arguments.model, variant))
    best = dict.fromkeys(strategies, float("inf"))
    for _ in range(SPEED_ROUNDS):
        for description, strategy in strategies.items():
            started = time.perf_counter()
            strategy.encode(texts, "document")
            best[description] = min(best[description], time.perf_counter() - started)
    print(
        f"{arguments.model}, 8 passages of 200 words, best of {SPEED_ROUNDS}, "
        f"{torch.get_num_threads()} threads:"
    )
    for description, seconds in best.items():
        print(f"{description}: {seconds:.2f} s ({best['float16'] / seconds:.2f}x float16 weights)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--strategies", default="aligned-wva,prompteol")
    parser.add_argument("--sts", type=Path, default=Path("../shared/eval/stsb/sts-dev.csv"))
    parser.add_argument("--max-pairs", type=int, default=None)
    parser.add_argument("--variants", default="all-migrated,all,down,unrotated")
    parser.add_argument("--speed", action="store_true")
    arguments = parser.parse_args()
    speed(arguments) if arguments.speed else quality(arguments)


if __name__ == "__main__":
    main()

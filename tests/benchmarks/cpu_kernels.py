"""One linear layer through each CPU product ragidx has or could have, at a query's and a build's
rows: the numbers behind ``--dtype``'s choices on a CPU (docs/precision.md).

Usage: python -m tests.benchmarks.cpu_kernels [--shapes 576x1536,2048x8192,8192x2048]
       [--rows 12,256,2048] [--seconds 1]

Per shape (inputs x outputs) and row count, the best time of: float32 (torch's product), float32
packed for oneDNN (what a loaded model runs where that is faster), int8 weights upcast a tile at a
time (``--dtype int8``), float16 weights in fbgemm's product (``--dtype float16`` on a CPU),
int8 x int8 products (``--dtype w8a8``: 7-bit activations rounded per row, per-row int8 weights;
docs/integer-products.md), and the same with two 7-bit digits per activation (a candidate, not a
dtype: tests.benchmarks.integer_digits). Each runs on enough copies of the layer to fill 64 MB, one
after another, so weights come from memory as a model's do, not from cache. Relative error is to
float32. Hold the kernels to AVX2 as a laptop without AVX-512 would run them with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
FBGEMM_ENABLE_INSTRUCTIONS=AVX2`` (fbgemm reads the last one, not torch's).
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable

import torch

from ragidx.indexer.model.half_weights import hold_half
from ragidx.indexer.model.int8_products import hold_integer
from ragidx.indexer.model.int8_weights import hold_int8
from ragidx.indexer.model.packed_linear import can_pack_linear_weights, pack_linear_weights
from tests.benchmarks.integer_digits import two_digit_product

CACHE_DEFEATING_BYTES = 64 * 2**20


def best_seconds(step: Callable[[], object], seconds: float) -> float:
    step()
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - started)
    return best


def products(inputs: int, outputs: int) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Each way of multiplying by one random layer's weight (``float32`` first: the reference)."""
    weight = torch.randn(outputs, inputs) * 0.02
    layers: dict[str, torch.nn.Linear] = {}
    kinds = (
        "float32",
        "packed float32",
        "int8 weights",
        "float16 weights",
        "int8 x int8 (w8a8)",
        "two 7-bit digits",
    )
    for name in kinds:
        layer = torch.nn.Linear(inputs, outputs, bias=False).requires_grad_(False)
        layer.weight.copy_(weight)
        layers[name] = layer
    if can_pack_linear_weights("float32"):
        pack_linear_weights(layers["packed float32"])
    else:
        del layers["packed float32"]
    hold_int8(layers["int8 weights"])
    hold_half(layers["float16 weights"])
    hold_integer(layers["int8 x int8 (w8a8)"], weight, None)
    hold_integer(layers["two 7-bit digits"], weight, None, two_digit_product)
    return layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="576x1536,2048x8192,8192x2048")
    parser.add_argument("--rows", default="12,256,2048")
    parser.add_argument("--seconds", type=float, default=1.0)
    arguments = parser.parse_args()
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {capability}")
    for shape in arguments.shapes.split(","):
        inputs, outputs = (int(size) for size in shape.split("x"))
        copies = max(1, CACHE_DEFEATING_BYTES // (4 * inputs * outputs))
        kinds = [products(inputs, outputs) for _ in range(copies)]
        for rows in (int(each) for each in arguments.rows.split(",")):
            batch = torch.randn(rows, inputs)
            reference = kinds[0]["float32"](batch)
            line = []
            for name in kinds[0]:
                cycle = itertools.cycle(kind[name] for kind in kinds)
                with torch.inference_mode():
                    took = best_seconds(
                        lambda cycle=cycle, batch=batch: next(cycle)(batch), arguments.seconds
                    )
                    error = (kinds[0][name](batch) - reference).norm() / reference.norm()
                line.append(f"{name} {2 * rows * inputs * outputs / took / 1e9:.0f} GFLOP/s ({error:.0e})")
            print(f"{inputs}->{outputs}, {rows} rows: " + ", ".join(line), flush=True)


if __name__ == "__main__":
    main()

"""int8 weights with float32 products against float32 itself: forward time, in one process.

Usage: python -m tests.benchmarks.int8_weights [--model smollm2] [--batch 32x256] [--query 12]
       [--rounds 4]

Loads the model twice (``--dtype float32`` and ``--dtype int8``) and times a forward pass on a
build-sized batch (rows x tokens of random ids) and on one query-sized row, the two dtypes
alternating round by round so they share the machine's noise; prints the best of the rounds and
the ratio int8 / float32. Peak memory needs a process per dtype:
``/usr/bin/time -f %M ragidx embed --model M --dtype D "text"``.
"""

from __future__ import annotations

import argparse
import time

DTYPES = ("float32", "int8")


def main() -> None:
    import torch

    from ragidx.indexer.model.runtime import Batch, load_runtime

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch", default="32x256", help="rows x tokens of the build-sized batch")
    parser.add_argument("--query", type=int, default=12, help="tokens of the one-row forward")
    parser.add_argument("--rounds", type=int, default=4)
    arguments = parser.parse_args()
    rows, tokens = (int(part) for part in arguments.batch.split("x"))
    runtimes = {dtype: load_runtime(arguments.model, device="cpu", dtype=dtype) for dtype in DTYPES}
    generator = torch.Generator().manual_seed(0)
    shapes = {arguments.batch: (rows, tokens), f"1x{arguments.query}": (1, arguments.query)}
    print(f"{arguments.model}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, (height, width) in shapes.items():
        ids = torch.randint(100, 20_000, (height, width), generator=generator)
        batch = Batch(list(range(height)), ids, torch.ones_like(ids))
        best = dict.fromkeys(runtimes, float("inf"))
        for _ in range(arguments.rounds):
            for dtype, runtime in runtimes.items():
                started = time.perf_counter()
                runtime.forward(batch)
                best[dtype] = min(best[dtype], time.perf_counter() - started)
        times = ", ".join(f"{dtype} {1000 * seconds:.1f} ms" for dtype, seconds in best.items())
        print(f"forward {name}: {times}; int8 / float32 {best['int8'] / best['float32']:.3f}")


if __name__ == "__main__":
    main()

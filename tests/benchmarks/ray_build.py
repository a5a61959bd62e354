"""`ragidx build --ray` against a local build: wall time, embedding time and vectors.

Usage: python -m tests.benchmarks.ray_build [--model smollm2] [--docs 40] [--strategy S] [--workers 1,2]
       [--dtype auto|float32|bfloat16]

Documents are SciFact abstracts (../shared/eval/scifact/corpus.jsonl), one .txt file each. The
corpus is built once in one process (the reference), then with ``--ray --ray-workers N`` for each
N, each build in its own process (which starts a Ray cluster on this machine and stops it). Prints
seconds end to end and in the embedding step, the speed-up of the embedding step over the local
build, and the lowest cosine between a Ray vector and the local one of the same chunk; beside
them a second local build with ``--batch-size 8``, whose cosine is how far batch composition
alone moves vectors in this precision.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.benchmarks.build_memory import DEFAULT_JSONL, RAGIDX, write_corpus


def vectors(index: Path) -> dict[int, object]:
    """Chunk id -> stored vector (a Ray build gives its chunks the ids a local build does)."""
    from ragidx.indexer.storage.reader import IndexReader

    reader = IndexReader(index)
    ids, stored = reader.load_vectors().live_vectors()
    reader.close()
    return dict(zip(ids.tolist(), stored, strict=True))


def timed_build(corpus: Path, index: Path, args: argparse.Namespace, extra: list[str]) -> tuple[float, dict]:
    command = [RAGIDX, "build", str(corpus), "--index", str(index), "--model", args.model, "--json"]
    command += ["--dtype", args.dtype]
    if args.strategy:
        command += ["--strategy", args.strategy]
    started = time.perf_counter()
    done = subprocess.run([*command, "--no-tune", *extra], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"build failed: {done.stderr[-500:]}")
    return time.perf_counter() - started, json.loads(done.stdout)


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--docs", type=int, default=40)
    parser.add_argument("--strategy", default=None)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--jsonl", type=Path, default=DEFAULT_JSONL)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ragidx-ray-") as scratch:
        corpus = Path(scratch) / "corpus"
        write_corpus(args.jsonl, corpus, args.docs)
        seconds, report = timed_build(corpus, Path(scratch) / "local", args, [])
        reference = vectors(Path(scratch) / "local")
        local_embed = report["embed_seconds"]
        print(
            f"{args.model}, {report['documents']} documents, {report['chunks']} chunks, "
            f"{report['strategy']}, {report['dtype']}"
        )
        print(f"local build:          {seconds:6.1f} s, embedding {local_embed:6.1f} s")
        runs = [("local, batch size 8", ["--batch-size", "8"])]
        runs += [(f"ray, {n} worker(s)", ["--ray", "--ray-workers", n]) for n in args.workers.split(",")]
        for number, (label, extra) in enumerate(runs):
            index = Path(scratch) / f"run-{number}"
            seconds, report = timed_build(corpus, index, args, extra)
            ours = vectors(index)
            lowest = min(float(np.dot(ours[key], reference[key])) for key in reference)
            print(
                f"{label + ':':<21} {seconds:6.1f} s, embedding {report['embed_seconds']:6.1f} s "
                f"(x{local_embed / report['embed_seconds']:.2f} of local), lowest cosine {lowest:.6f}"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Peak memory of `ragidx build` on a corpus and on ten times that corpus.

Usage: python -m tests.benchmarks.build_memory --model DIR [--docs 300] [--scale 10] [--jsonl FILE]

Documents are SciFact abstracts (../shared/eval/scifact/corpus.jsonl), one .txt file each; the
larger corpus holds ``scale`` times as many distinct documents. Each build runs in its own
process and its peak RSS comes from the kernel (``wait4``). Growth beyond the vectors is
(peak_large - peak_small - (vector_bytes_large - vector_bytes_small)) / peak_small; the issue's
target is < 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAGIDX = str(Path(sys.executable).with_name("ragidx"))  # the console script of this environment
DEFAULT_JSONL = Path(__file__).resolve().parents[3] / "shared" / "eval" / "scifact" / "corpus.jsonl"


def write_corpus(jsonl: Path, folder: Path, count: int) -> None:
    folder.mkdir(parents=True)
    with jsonl.open() as lines:
        for written, line in enumerate(lines):
            if written == count:
                break
            row = json.loads(line)
            (folder / f"{row['_id']}.txt").write_text(f"{row.get('title', '')}\n\n{row['text']}\n")


def measured_build(corpus: Path, index: Path, model: str, extra: list[str]) -> dict:
    command = [
        RAGIDX,
        "build",
        str(corpus),
        "--index",
        str(index),
        "--model",
        model,
    ]
    started = time.perf_counter()
    process = subprocess.Popen(
        [*command, "--json", *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise SystemExit(f"build failed: {output.decode()[-500:]}")
    report = json.loads(output)
    dimension = json.loads(
        subprocess.run(
            [RAGIDX, "info", "--index", str(index), "--json"],
            capture_output=True,
            check=True,
        ).stdout
    )["dimension"]
    return {
        "documents": report["total_documents"],
        "chunks": report["total_chunks"],
        "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "vector_mb": round(report["total_chunks"] * dimension * 4 / 2**20, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--jsonl", type=Path, default=DEFAULT_JSONL)
    parser.add_argument("build_options", nargs="*", help="Extra `ragidx build` options, after --.")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for count in (args.docs, args.docs * args.scale):
            corpus = Path(folder) / f"corpus-{count}"
            write_corpus(args.jsonl, corpus, count)
            rows.append(
                measured_build(corpus, Path(folder) / f"index-{count}", args.model, args.build_options)
            )
            print(json.dumps(rows[-1]), flush=True)
    small, large = rows
    growth = (
        large["peak_rss_mb"] - small["peak_rss_mb"] - (large["vector_mb"] - small["vector_mb"])
    ) / small["peak_rss_mb"]
    print(json.dumps({"growth_beyond_vectors": round(growth, 4)}))


if __name__ == "__main__":
    main()

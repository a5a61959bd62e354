"""Where a build spends its time: model forward vs everything else, step by step.

Usage: python -m tests.benchmarks.build_profile [--model smollm2] [--strategy S] [--dtype auto]
       [--corpus DIR] [--copies 1]

Builds the corpus (default: ragidx's sample corpus; ``--copies N`` indexes N renamed copies of
it) into a temporary index twice in this process: once plain, for the wall time, and once under
cProfile, whose cumulative times per step give the shares. The model is loaded and converted
before either build, so neither pays for it.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

# (label, function name, defining file): cumulative time of each, as cProfile records it
STEPS = (
    ("whole build", "build", "pipeline.py"),
    ("  scan and hash files", "scan", "sources.py"),
    ("  load model (cached)", "load_runtime", "runtime.py"),
    ("  read files again", "read_document", "sources.py"),
    ("  chunk (spaCy sentences + token counts)", "chunk", "chunking.py"),
    ("  embed: prepare (template + tokenise)", "prepare", ""),
    ("  embed: pad batches", "pad", "runtime.py"),
    ("  embed: model forward", "forward", "runtime.py"),
    ("  embed: readout (forward included)", "readout", ""),
    ("  embed: whole encode", "encode", "base.py"),
    ("  store: add rows", "add", "store.py"),
    ("  store: commit", "commit", "store.py"),
)


def copy_corpus(source: Path, target: Path, copies: int) -> Path:
    for copy in range(copies):
        shutil.copytree(source, target / f"copy-{copy}")
    return target


def cumulative(stats: pstats.Stats, name: str, filename: str) -> float:
    """Seconds spent in (and under) every ragidx function ``name`` defined in ``filename``."""
    import ragidx

    root = str(Path(ragidx.__file__).resolve().parent)
    return sum(
        row[3]
        for (path, _, function), row in stats.stats.items()  # type: ignore[attr-defined]
        if function == name and path.startswith(root) and path.endswith(filename)
    )


def main() -> None:
    from ragidx.app.research.calibrate import SAMPLE_CORPUS
    from ragidx.indexer.build.pipeline import BuildOptions, build
    from ragidx.indexer.model.runtime import load_runtime

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--strategy", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--corpus", type=Path, default=SAMPLE_CORPUS)
    parser.add_argument("--copies", type=int, default=1)
    args = parser.parse_args()
    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {' '.join(sys.argv[1:])}")
    load_runtime(args.model, "cpu", "float32")  # converts a GGUF model once, outside the timings
    with tempfile.TemporaryDirectory() as scratch:
        corpus = copy_corpus(args.corpus, Path(scratch) / "corpus", args.copies)
        options = {"model": args.model, "strategy": args.strategy, "dtype": args.dtype, "progress": False}
        started = time.perf_counter()
        report = build([corpus], BuildOptions(index_dir=Path(scratch) / "plain", **options))
        wall = time.perf_counter() - started
        print(
            f"{report.model} ({report.dtype}), {report.strategy}: {report.documents} documents, "
            f"{report.chunks} chunks, {report.tokens} chunk tokens; build {wall:.2f} s, "
            f"embedding {report.embed_seconds:.2f} s ({report.tokens / report.embed_seconds:.0f} tokens/s)"
        )
        profiler = cProfile.Profile()
        profiler.enable()
        build([corpus], BuildOptions(index_dir=Path(scratch) / "profiled", **options))
        profiler.disable()
    stats = pstats.Stats(profiler)
    total = cumulative(stats, "build", "pipeline.py")
    print(f"{'step (under cProfile)':<44}{'seconds':>9}{'share':>8}")
    for label, name, filename in STEPS:
        seconds = cumulative(stats, name, filename)
        print(f"{label:<44}{seconds:>9.2f}{seconds / total:>8.1%}")
    forward = cumulative(stats, "forward", "runtime.py")
    print(f"{'everything but the model forward':<44}{total - forward:>9.2f}{(total - forward) / total:>8.1%}")


if __name__ == "__main__":
    main()

"""What an update of one document costs in a large index: seconds, bytes written, files.

Usage: python -m tests.benchmarks.segment_update [--chunks 200000] [--dimension 576]
       [--updates 6] [--index-type auto] [--root CHECKOUT] [--dir DIR]

Builds an index of ``--chunks`` random unit vectors (10 chunks per document; 576 is SmolLM2's
width) through ``IndexWriter.commit``, the call every build ends in, then replaces one document
``--updates`` times, one commit each, and prints per update: seconds, bytes the process wrote
(``wchar`` of /proc/self/io: every write() call, SQLite's and FAISS's), the vector files on disk
and their total size, and the median dense search time of 50 queries afterwards. No model is
loaded: embedding costs the same before and after segments, the commit is what changed.
``--root`` runs the same against another checkout (e.g. a worktree of the commit before
segments), to print both sides on one machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CHUNKS_PER_DOCUMENT = 10


def use_checkout(root: Path) -> None:
    """Import ``ragidx`` from ``root`` instead of the installed one."""
    link_dir = Path(tempfile.mkdtemp(prefix="ragidx-root-"))
    (link_dir / "ragidx").symlink_to(root.resolve())
    sys.path.insert(0, str(link_dir))


def written_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


def unit_vectors(n: int, dimension: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, dimension), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def document(name: str) -> object:
    from ragidx.indexer.ingest.chunking import Chunk
    from ragidx.indexer.ingest.sources import SourceDocument
    from ragidx.indexer.storage.database import DocumentRecord

    texts = [f"{name} chunk {i}" for i in range(CHUNKS_PER_DOCUMENT)]
    source = SourceDocument(f"/docs/{name}", " ".join(texts), f"hash-{name}", 100, 0.0, name, "text")
    chunks, cursor = [], 0
    for i, text in enumerate(texts):
        chunks.append(Chunk(i, text, cursor, cursor + len(text), 4, [(cursor, cursor + len(text))]))
        cursor += len(text) + 1
    return DocumentRecord(source, chunks, {})


def vector_files(directory: Path) -> tuple[int, int]:
    files = list(directory.glob("vectors-*"))
    return len(files), sum(p.stat().st_size for p in files)


def search_ms(directory: Path, dimension: int) -> float:
    from ragidx.indexer.storage.reader import IndexReader
    from ragidx.indexer.storage.vector_store import VectorQuery

    reader = IndexReader(directory)
    vectors = reader.load_vectors()
    queries = unit_vectors(50, dimension, 99)
    times = []
    for query in queries:
        started = time.perf_counter()
        vectors.search(VectorQuery(query[None], 10))
        times.append(time.perf_counter() - started)
    reader.close()
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=200_000)
    parser.add_argument("--dimension", type=int, default=576)
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--index-type", default="auto")
    parser.add_argument("--root", type=Path, help="a ragidx checkout to measure instead")
    parser.add_argument("--dir", type=Path, help="where to build (default: a temporary folder)")
    args = parser.parse_args()
    if args.root:
        use_checkout(args.root)
    from ragidx.indexer.storage.index_settings import VectorIndexSettings
    from ragidx.indexer.storage.writer import IndexWriter

    directory = args.dir or Path(tempfile.mkdtemp(prefix="ragidx-segments-"))
    meta = {"model": "random", "strategy": "mean", "strategy_params": {}, "dimension": args.dimension}
    settings = VectorIndexSettings(requested=args.index_type)
    n_docs = args.chunks // CHUNKS_PER_DOCUMENT
    print(
        f"ragidx from {Path(sys.modules['ragidx.indexer.storage.writer'].__file__).parents[2]}; "
        f"index in {directory}"
    )
    started = time.perf_counter()
    with IndexWriter(directory) as writer:
        records = [document(f"d{i}") for i in range(n_docs)]
        vectors = unit_vectors(n_docs * CHUNKS_PER_DOCUMENT, args.dimension, 0)
        committed = writer.commit(records, vectors, meta, replace=True, vector_index=settings)
        del records, vectors
    files, size = vector_files(directory)
    print(
        f"built {args.chunks} chunks x {args.dimension}: {time.perf_counter() - started:.1f} s, "
        f"{committed.vector_index.describe()}, {files} vector file(s), {size / 2**20:.1f} MiB"
    )
    print(f"search p50 {search_ms(directory, args.dimension):.2f} ms")
    print("update  seconds  written_MiB  vector_files  vector_MiB  search_ms")
    for update in range(1, args.updates + 1):
        name = f"d{update}"
        before, started = written_bytes(), time.perf_counter()
        with IndexWriter(directory) as writer:
            doc_id = writer.documents()[f"/docs/{name}"][0]
            writer.commit(
                [document(name)], unit_vectors(CHUNKS_PER_DOCUMENT, args.dimension, update), meta, [doc_id]
            )
        seconds, written = time.perf_counter() - started, written_bytes() - before
        files, size = vector_files(directory)
        print(
            f"{update:>6}  {seconds:7.2f}  {written / 2**20:11.3f}  {files:>12}  {size / 2**20:10.1f}  "
            f"{search_ms(directory, args.dimension):9.2f}"
        )


if __name__ == "__main__":
    main()

"""Vector index types at scale: build time, memory, single-query latency and recall@10.

Usage: python -m tests.benchmarks.vector_index [--n 1000000] [--types hnsw,ivf] [--flat-sizes ...]

Vectors are synthetic but clustered, like embeddings: N/100 random centres in 896 dimensions,
each point its centre plus isotropic noise of the same norm (--spread 1), L2-normalised (cosine ~0.5 within a
cluster, ~0 across). Queries are fresh points from the same clusters, so their true top 10 are
near-ties inside one cluster and an ANN index must rank them, not just find the cluster.
Recall@10 is measured against exact inner-product search. Indexes are built and searched through
``ragidx.indexer.storage.local.faiss_index`` (the code path `ragidx build` and `ragidx query` use), one query
per call, as a server answers them. The flat sweep gives the latency that sets FLAT_SCAN_BYTES.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace

import numpy as np
import psutil

DIMENSION = 896
POINTS_PER_CLUSTER = 100
BLOCK = 50_000


def clustered(n: int, n_clusters: int, seed: int, spread: float = 1.0) -> np.ndarray:
    """``n`` unit vectors around ``n_clusters`` centres (centres fixed by seed 0); ``spread`` is
    the noise's norm relative to a centre's."""
    centres = np.random.default_rng(0).standard_normal((n_clusters, DIMENSION), dtype=np.float32)
    rng = np.random.default_rng(seed)
    out = np.empty((n, DIMENSION), dtype=np.float32)
    for start in range(0, n, BLOCK):
        rows = min(BLOCK, n - start)
        block = centres[rng.integers(0, n_clusters, rows)] + spread * rng.standard_normal(
            (rows, DIMENSION), dtype=np.float32
        )
        out[start : start + rows] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    import faiss

    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    return flat.search(queries, k)[1]


def timed_queries(index, queries: np.ndarray, k: int, **tuning) -> tuple[np.ndarray, list[float]]:
    from ragidx.indexer.storage.vector_store import VectorQuery

    found, times = [], []
    for query in queries:
        started = time.perf_counter()
        _, ids = index.search(VectorQuery(query[None, :], k, **tuning))
        times.append((time.perf_counter() - started) * 1000)
        found.append(ids[0])
    return np.array(found), times


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]))


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def built(kind: str, vectors: np.ndarray):
    """A vector index of ``kind`` over ``vectors``, made as a build's first commit makes it."""
    from ragidx.indexer.storage.index_settings import VectorIndexSettings
    from ragidx.indexer.storage.local.faiss_index import new_vector_index

    ids = np.arange(len(vectors), dtype=np.int64)
    return new_vector_index(VectorIndexSettings(requested=kind), vectors, ids)


def flat_sweep(sizes: list[int], queries: np.ndarray, spread: float) -> list[dict]:
    rows = []
    for size in sizes:
        index = built("flat", clustered(size, max(1, size // POINTS_PER_CLUSTER), seed=1, spread=spread))
        _, times = timed_queries(index, queries, 10)
        rows.append(
            {
                "type": "flat",
                "n": size,
                "p50_ms": np.percentile(times, 50),
                "p95_ms": np.percentile(times, 95),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        del index
    return rows


def ann_rows(
    kind: str, vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray, sweep: list[int]
) -> list[dict]:
    import faiss

    before = rss_mb()
    started = time.perf_counter()
    index = built(kind, vectors)
    settings = index.settings
    build_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "index.faiss")
        faiss.write_index(index.index, path)
        file_mb = os.path.getsize(path) / 2**20
    common = {
        "type": kind,
        "n": len(vectors),
        "build_s": round(build_s, 1),
        "index_rss_mb": round(rss_mb() - before),
        "file_mb": round(file_mb),
        "vectors_mb": round(vectors.nbytes / 2**20),
    }
    if kind == "ivf":
        common["lists"] = settings.ivf_lists
    rows = []
    knob = "ef_search" if kind == "hnsw" else "nprobe"
    for value in sweep:
        index.settings = replace(settings, **{knob: value})
        found, times = timed_queries(index, queries, 10)
        rows.append(
            {
                **common,
                knob: value,
                "recall@10": round(recall(found, truth), 4),
                "p50_ms": round(float(np.percentile(times, 50)), 3),
                "p95_ms": round(float(np.percentile(times, 95)), 3),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--types", default="hnsw,ivf")
    parser.add_argument("--flat-sizes", default="25000,50000,100000,200000,400000")
    parser.add_argument("--ef-search", default="16,32,64,128,256")
    parser.add_argument("--nprobe", default="4,8,16,32,64,128")
    parser.add_argument("--spread", type=float, default=1.0, help="Noise relative to the centres.")
    args = parser.parse_args()
    import faiss

    print(
        f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} threads, {os.cpu_count()} cores",
        flush=True,
    )
    n_clusters = max(1, args.n // POINTS_PER_CLUSTER)
    queries = clustered(args.queries, n_clusters, seed=2, spread=args.spread)
    if args.flat_sizes:
        flat_sweep([int(s) for s in args.flat_sizes.split(",")], queries[:200], args.spread)
    types = [t for t in args.types.split(",") if t]
    if not types:
        return
    started = time.perf_counter()
    vectors = clustered(args.n, n_clusters, seed=1, spread=args.spread)
    truth = exact_top(vectors, queries, 10)
    print(
        json.dumps({"n": args.n, "exact_ground_truth_s": round(time.perf_counter() - started, 1)}), flush=True
    )
    for kind in types:
        sweep = [int(v) for v in (args.ef_search if kind == "hnsw" else args.nprobe).split(",")]
        ann_rows(kind, vectors, queries, truth, sweep)


if __name__ == "__main__":
    main()

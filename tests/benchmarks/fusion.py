"""How well tuning's pseudo-queries track real queries: the fusion grid scored both ways.

For an index built by ``ragidx eval retrieval DIR --index INDEX`` (one file per BEIR document)
and tuned (by its build, or ``ragidx tune --index INDEX``), prints, for every dense weight of the
tuning grid, nDCG@10 on the pseudo-queries (from the index's meta) and on the dataset's real
queries, then the fusion tuning picked and what it scores on the real queries against the best
RRF weight in hindsight, dense, lexical, equal-weight RRF and equal-weight min-max.

    python -m tests.benchmarks.fusion ../shared/eval/scifact --split train \
        --max-docs 300 --max-queries 60 --index /tmp/fx/smollm2-prompteol [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragidx.app import Index
from ragidx.app.research.evaluation import document_id, load_beir, subsample
from ragidx.app.research.metrics import ndcg_at
from ragidx.indexer.build.tuning import DENSE_WEIGHTS, TuningReport
from ragidx.indexer.search.fusion import Fusion

DEPTH = 320  # what hybrid search fuses when eval asks for ~160 chunks


def real_scores(index: Index, dataset, fusions: list[Fusion]) -> list[float]:
    """Mean document nDCG@10 of the real queries under each fusion (a document = its best chunk)."""
    query_ids = list(dataset.queries)
    rankings = index.rankings([dataset.queries[q] for q in query_ids], DEPTH)
    chunks = {chunk for lists in rankings for ranking in lists.values() for chunk, _ in ranking}
    paths = {chunk: row["path"] for chunk, row in index.reader.chunk_rows(sorted(chunks)).items()}
    means = []
    for fusion in fusions:
        scores = []
        for query, lists in zip(query_ids, rankings, strict=True):
            best: dict[str, float] = {}
            for chunk, score in fusion.fuse(lists):
                doc = document_id(paths[chunk])
                best[doc] = max(best.get(doc, score), score)
            scores.append(ndcg_at(list(best.items()), dataset.qrels[query], 10))
        means.append(sum(scores) / len(scores))
    return means


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-docs", type=int)
    parser.add_argument("--max-queries", type=int)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    dataset = subsample(load_beir(args.directory, args.split), args.max_docs, args.max_queries)
    with Index.open(args.index) as index:
        if not index.meta.get("fusion"):
            raise SystemExit(f"{args.index} was never tuned: run `ragidx tune --index {args.index}` first")
        report = TuningReport.from_meta(index.meta["fusion"])
        fusions = [Fusion(w, 1.0 - w) for w in DENSE_WEIGHTS] + [Fusion(method="minmax"), report.fusion]
        *grid, minmax_equal, at_chosen = real_scores(index, dataset, fusions)
        real = dict(zip(DENSE_WEIGHTS, grid, strict=True))
        meta = index.meta
    pseudo = {float(weight): value for weight, value in report.grid.items()}
    print(
        f"{meta['model']} {meta['strategy']}: {report.queries} pseudo-queries "
        f"(tuned in {report.seconds:.1f} s), {len(dataset.queries)} real queries"
    )
    print(f"{'dense w':>8}{'pseudo':>9}{'real':>9}")
    for weight in DENSE_WEIGHTS:
        print(f"{weight:>8.2f}{pseudo.get(weight, float('nan')):>9.4f}{real[weight]:>9.4f}")
    chosen = report.fusion.normalised()
    oracle = max(real, key=real.get)
    summary = {
        "model": meta["model"],
        "strategy": meta["strategy"],
        "pseudo_queries": report.queries,
        "tune_seconds": report.seconds,
        "chosen": {"method": chosen.method, **chosen.weights()},
        "real_at_chosen": round(at_chosen, 4),
        "best_rrf_dense_weight": oracle,
        "real_at_best_rrf": round(real[oracle], 4),
        "real_minmax_equal": round(minmax_equal, 4),
        "real_dense": round(real[1.0], 4),
        "real_lexical": round(real[0.0], 4),
        "real_equal": round(real[0.5], 4),
        "pseudo": {f"{w:g}": round(v, 4) for w, v in pseudo.items()},
        "real": {f"{w:g}": round(v, 4) for w, v in real.items()},
    }
    print(json.dumps({k: v for k, v in summary.items() if k not in ("pseudo", "real")}))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()

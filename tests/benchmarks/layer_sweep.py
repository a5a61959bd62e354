"""Which layers to read on a real model: every layer's readout from one pass, scored on dev data.

Usage: python -m tests.benchmarks.layer_sweep --model smollm2 --strategy aligned-wva [--sweep OPTION=V1;V2]
       [--docs 500] [--queries 200] [--pairs 400] [--dtype auto] [--json FILE] [OPTION=VALUE ...]

For the value-aggregation strategies (``aligned-wva``, ``wva``, ``va``) each layer's reading is
the strategy's own with S = {that layer}, and a band [a, b] averages those readings (no per-layer
normalisation), exactly as ``--layers a-b`` would. For ``htp``/``tp`` each layer is the exit layer
(the rewiring window fixed; a layer never sees rewiring after it, so one pass serves all). Every
reading is scored by dense nDCG@10 on a SciFact train subsample (chunks as ``ragidx build`` cuts
them, a document scored by its best chunk, queries in the query template) and by Spearman x 100
on STS-B train pairs (both sides as documents, as ``ragidx eval sts``). STS-B *train* and SciFact
*train* are used so that the dev figures reported in docs/choosing.md stay untouched by the choice.
Prints one row per layer, then the best contiguous bands and the relative-depth defaults.
Extra OPTION=VALUE pairs go to the strategy (e.g. ``rewire=1-1``: no rewiring, i.e. plain mean
pooling of that layer over the text's own tokens).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tests.support.real_models import EVAL_DATA

VALUE_AGGREGATION = ("aligned-wva", "wva", "va")


def per_layer_vectors(strategy, texts, role, sentences=None) -> np.ndarray:
    """[layers, texts, dim] raw (un-normalised) readings of every layer for ``texts``."""
    import torch

    layers = list(range(strategy.runtime.arch.num_layers))
    prepared = strategy.prepare(texts, role, sentences)
    out = None
    sequences = [row.ids for row in prepared]
    done = 0
    for batch in strategy.runtime.batches(sequences, strategy.batch.max_rows, strategy.batch.max_tokens):
        rows = [prepared[i] for i in batch.indices]
        if strategy.name in VALUE_AGGREGATION:
            stacked = strategy.layer_readings(batch, layers)
        else:
            stacked = torch.stack(strategy.layer_readings(batch, rows, layers))
        readings = stacked.float().cpu().numpy()
        if out is None:
            out = np.zeros((len(layers), len(texts), readings.shape[-1]), dtype=np.float32)
        out[:, batch.indices] = readings
        done += len(batch.indices)
        print(f"\r{role}s: {done}/{len(texts)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return out


def typed(value: str) -> str | int | float:
    """A command-line value as the strategy takes it: a number where it reads as one."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def normalised(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def retrieval_ndcg(chunks: np.ndarray, owners: Sequence[str], queries: np.ndarray, dataset) -> float:
    from ragidx.app.research.metrics import mean_retrieval_metrics

    scores = normalised(queries) @ normalised(chunks).T
    documents = sorted(set(owners))
    column = {doc: i for i, doc in enumerate(documents)}
    best = np.full((len(queries), len(documents)), -np.inf, dtype=np.float32)
    owner_index = np.array([column[o] for o in owners])
    for chunk in range(scores.shape[1]):
        np.maximum(best[:, owner_index[chunk]], scores[:, chunk], out=best[:, owner_index[chunk]])
    rankings = {
        q: list(zip(documents, map(float, row), strict=True))
        for q, row in zip(dataset.queries, best, strict=True)
    }
    return mean_retrieval_metrics(rankings, dataset.qrels)["ndcg@10"]


def sts_spearman(first: np.ndarray, second: np.ndarray, gold: Sequence[float]) -> float:
    from ragidx.app.research.metrics import spearman

    return 100 * spearman((normalised(first) * normalised(second)).sum(axis=-1).tolist(), list(gold))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--strategy", default="aligned-wva")
    parser.add_argument("--docs", type=int, default=500)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", default=None)
    parser.add_argument("--sweep", default=None, help="OPTION=V1;V2;...: one strategy per value instead")
    parser.add_argument("options", nargs="*", help="OPTION=VALUE for the strategy")
    args = parser.parse_args()
    from ragidx.app.research.evaluation import document_text, load_beir, load_sts, subsample
    from ragidx.indexer.ingest.chunking import Chunker
    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy, strategy_class

    options = {key: typed(value) for key, value in (option.split("=", 1) for option in args.options)}
    runtime = load_runtime(args.model, "cpu", args.dtype)
    strategy = create_strategy(args.strategy, runtime, **options)
    dataset = subsample(load_beir(EVAL_DATA / "scifact", "train"), args.docs, args.queries)
    chunker = Chunker(runtime.tokenizer, strategy_class(args.strategy).default_chunk_tokens, 1, None)
    texts, owners, sentences = [], [], []
    for doc, (title, text) in dataset.corpus.items():
        for chunk in chunker.chunk(document_text(title, text)):
            texts.append(chunk.text)
            owners.append(doc)
            sentences.append([(start - chunk.start, end - chunk.start) for start, end in chunk.sentences])
    pairs = load_sts(EVAL_DATA / "stsb" / "sts-train.csv", args.pairs)
    sizes = f"{len(dataset.corpus)} documents ({len(texts)} chunks), {len(dataset.queries)} queries"
    print(
        f"{args.model} ({runtime.dtype}), {args.strategy} {options or ''}: {sizes}, {len(pairs.gold)} pairs"
    )
    if args.sweep:
        report = sweep_option(args, runtime, options, dataset, (texts, owners, sentences), pairs)
    else:
        report = sweep_layers(args, strategy, dataset, (texts, owners, sentences), pairs)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")


def sweep_layers(args, strategy, dataset, corpus, pairs) -> dict:
    """Every layer's reading from one pass; for value aggregation, every contiguous band too, raw
    and with each layer normalised, and the relative-depth bands a default could be."""
    from ragidx.indexer.strategies.layers import relative_layers

    texts, owners, sentences = corpus
    num_layers = strategy.runtime.arch.num_layers
    chunks = per_layer_vectors(strategy, texts, "document", sentences)
    queries = per_layer_vectors(strategy, [dataset.queries[q] for q in dataset.queries], "query")
    first = per_layer_vectors(strategy, pairs.first, "document")
    second = per_layer_vectors(strategy, pairs.second, "document")

    def score(layers: Sequence[int], normalise: bool = False) -> tuple[float, float]:
        """Scores of the band's mean reading (``normalise``: each layer L2-normalised first, as
        ``--normalize-layers`` does)."""
        pick = list(layers)

        def mean(readings: np.ndarray) -> np.ndarray:
            return (normalised(readings[pick]) if normalise else readings[pick]).mean(0)

        ndcg = retrieval_ndcg(mean(chunks), owners, mean(queries), dataset)
        return ndcg, sts_spearman(mean(first), mean(second), pairs.gold)

    rows = {layer: score([layer]) for layer in range(num_layers)}
    print(f"{'layer':>5} {'depth':>6} {'nDCG@10':>8} {'STS':>6}")
    for layer, (ndcg, sts) in rows.items():
        print(f"{layer:>5} {layer / num_layers:>6.2f} {ndcg:>8.4f} {sts:>6.2f}")
    report = {
        "model": args.model,
        "strategy": args.strategy,
        "options": args.options,
        "layers": rows,
        "bands": {},
    }
    if args.strategy not in VALUE_AGGREGATION:
        return report
    spans = [(a, b) for a in range(num_layers) for b in range(a + 1, num_layers)]
    for normalise in (False, True):
        kind = "normalised" if normalise else "raw"
        bands = {span: score(range(span[0], span[1] + 1), normalise) for span in spans}
        report["bands"][kind] = {f"{a}-{b}": value for (a, b), value in bands.items()}
        for metric, name in ((0, "nDCG@10"), (1, "STS")):
            best = sorted(bands.items(), key=lambda item: -item[1][metric])[:5]
            listed = ", ".join(f"{a}-{b} ({v[0]:.4f}, {v[1]:.1f})" for (a, b), v in best)
            print(f"{kind} layers, best bands by {name}: {listed}")
        for low, high in ((0.65, 0.85), (0.65, 1.0), (0.7, 1.0), (0.5, 1.0)):
            band = relative_layers(num_layers, low, high)
            ndcg, sts = score(band, normalise)
            where = f"depth {low:.2f}-{high:.2f} = {band[0]}-{band[-1]}"
            print(f"{kind} layers, {where}: nDCG@10 {ndcg:.4f}, STS {sts:.2f}")
    return report


def sweep_option(args, runtime, options, dataset, corpus, pairs) -> dict:
    """``--sweep OPTION=V1;V2``: the strategy built once per value, scored on its final vectors."""
    from ragidx.indexer.strategies import create_strategy

    texts, owners, sentences = corpus
    name, _, values = args.sweep.partition("=")
    rows = {}
    print(f"{name:>12} {'nDCG@10':>8} {'STS':>6}")
    for value in values.split(";"):
        strategy = create_strategy(args.strategy, runtime, **{**options, name: typed(value)})
        chunks = strategy.encode(texts, "document", sentences=sentences)
        queries = strategy.encode([dataset.queries[q] for q in dataset.queries], "query")
        ndcg = retrieval_ndcg(chunks, owners, queries, dataset)
        sts = sts_spearman(strategy.encode(pairs.first), strategy.encode(pairs.second), pairs.gold)
        rows[value] = (ndcg, sts)
        print(f"{value:>12} {ndcg:>8.4f} {sts:>6.2f}", flush=True)
    return {"model": args.model, "strategy": args.strategy, "options": options, "sweep": {name: rows}}


if __name__ == "__main__":
    main()

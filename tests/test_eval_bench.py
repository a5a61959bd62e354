"""`ragidx eval retrieval|sts` and `ragidx bench` with the tiny models, against independent computations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragidx.app.research.evaluation import document_text, load_beir, load_sts, subsample
from ragidx.app.research.metrics import mean_retrieval_metrics, spearman
from ragidx.indexer.errors import RagidxError
from tests.support.cli import assert_one_line_error, ragidx


@pytest.fixture(scope="module")
def beir(tmp_path_factory, sample_corpus) -> Path:
    """A BEIR folder made from the sample corpus: one document per file, queries from their sentences."""
    folder = tmp_path_factory.mktemp("beir")
    files = sorted(p for p in sample_corpus.rglob("*.md") if p.is_file())
    corpus, queries, qrels = [], [], ["query-id\tcorpus-id\tscore"]
    for number, path in enumerate(files):
        text = path.read_text(encoding="utf-8")
        corpus.append({"_id": f"doc/{number}", "title": path.stem, "text": text})
        sentence = next(line for line in text.splitlines() if len(line.split()) > 6)
        queries.append({"_id": f"q{number}", "text": sentence})
        qrels += [f"q{number}\tdoc/{number}\t2", f"q{number}\tdoc/{(number + 1) % len(files)}\t1"]
    queries.append({"_id": "unjudged", "text": "nothing judges this query"})
    (folder / "corpus.jsonl").write_text("\n".join(map(json.dumps, corpus)), encoding="utf-8")
    (folder / "queries.jsonl").write_text("\n".join(map(json.dumps, queries)), encoding="utf-8")
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    return folder


def test_eval_retrieval_equals_exact_search_over_whole_documents(beir, tiny_models, tmp_path):
    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    report_path, plot = tmp_path / "report.json", tmp_path / "metrics.png"
    model = tiny_models["llama"]
    ragidx("eval", "retrieval", beir, "--model", model, "--strategy", "mean,prompteol", "--mode",
           "dense,lexical", "--chunk-tokens", "100000", "--json", report_path, "--plot", plot)  # fmt: skip
    report = json.loads(report_path.read_text())
    dataset = load_beir(beir, "test")
    assert (report["documents"], report["queries"]) == (len(dataset.corpus), len(dataset.queries) - 1)
    assert [(r["strategy"], r["mode"]) for r in report["rows"]] == [
        ("mean", "dense"), ("mean", "lexical"), ("prompteol", "dense"), ("prompteol", "lexical")
    ]  # fmt: skip
    assert report["fusion"] == {"mean": None, "prompteol": None}  # no hybrid mode asked: nothing tuned
    assert plot.read_bytes()[:4] == b"\x89PNG"
    runtime = load_runtime(str(tiny_models["llama"]), device="cpu", dtype="float32")
    for row in report["rows"][::2]:
        strategy = create_strategy(row["strategy"], runtime)
        ids = list(dataset.corpus)
        documents = strategy.encode([document_text(*dataset.corpus[d]) for d in ids])
        judged = [q for q in dataset.queries if q in dataset.qrels]
        scores = strategy.encode([dataset.queries[q] for q in judged], "query") @ documents.T
        rankings = {
            q: list(zip(ids, map(float, row_scores), strict=True))
            for q, row_scores in zip(judged, scores, strict=True)
        }
        expected = mean_retrieval_metrics(rankings, dataset.qrels)
        assert {k: row[k] for k in expected} == pytest.approx(expected, abs=1e-6)
    assert report["rows"][1]["ndcg@10"] == report["rows"][3]["ndcg@10"]  # BM25 does not depend on the model


def test_eval_reports_tuned_hybrid_beside_equal_weights(beir, tiny_models, tmp_path):
    """With the index's weights set to lexical only, ``hybrid`` ranks documents as ``lexical`` does."""
    from ragidx.app.research.evaluation import EVAL_MODES, evaluate_retrieval
    from ragidx.indexer.storage.writer import IndexWriter

    index, dataset = tmp_path / "index", load_beir(beir, "test")
    options = {"model": str(tiny_models["llama"]), "device": "cpu", "progress": False}
    evaluate_retrieval(dataset, "test", ["mean"], ["dense"], index, **options)
    with IndexWriter(index) as writer:
        writer.update_meta({"fusion": {**writer.meta["fusion"], "weights": {"dense": 0.0, "lexical": 1.0}}})
    report = evaluate_retrieval(dataset, "test", ["mean"], list(EVAL_MODES), index, **options)
    rows = {row.mode: row.metrics for row in report.rows}
    assert list(rows) == ["dense", "lexical", "hybrid-equal", "hybrid"]
    assert report.fusion["mean"]["weights"] == {"dense": 0.0, "lexical": 1.0}
    for metric in ("ndcg@10", "recall@10", "mrr@10"):  # lexical's order, dense-only hits only after it
        assert rows["hybrid"][metric] >= rows["lexical"][metric]
    assert rows["hybrid-equal"] != rows["hybrid"]


def test_subsample_keeps_every_judged_document(beir):
    dataset = load_beir(beir, "test")
    small = subsample(dataset, max_docs=None, max_queries=2)
    assert len(small.queries) == 2 and set(small.qrels) == set(small.queries)
    judged = {doc for q in small.queries for doc in dataset.qrels[q]}
    assert set(small.corpus) == set(dataset.corpus)  # no max_docs: every document
    assert subsample(dataset, None, 2) == small
    larger = subsample(dataset, max_docs=len(judged) + 2, max_queries=2)
    assert len(larger.corpus) == len(judged) + 2 and judged <= set(larger.corpus)
    assert set(larger.queries) == set(small.queries)


def test_subsample_below_the_judged_documents_keeps_whole_queries(beir):
    """Fewer documents than the queries judge (a few long documents, each answering many
    questions): queries whose documents fit, every one of their documents, nothing else."""
    dataset = load_beir(beir, "test")
    everything = {doc for docs in dataset.qrels.values() for doc in docs}
    assert len(everything) > 2
    small = subsample(dataset, max_docs=3, max_queries=None)  # each query judges two neighbours
    assert (len(small.corpus), len(small.queries)) == (3, 2) and set(small.qrels) == set(small.queries)
    assert set(small.corpus) == {doc for q in small.queries for doc in dataset.qrels[q]}
    left_out = set(dataset.qrels) - set(small.queries)
    assert all(not set(dataset.qrels[q]) <= set(small.corpus) for q in left_out)  # none that would fit
    assert subsample(dataset, 3, None) == small


def test_beir_errors_name_what_is_missing(beir, tmp_path):
    with pytest.raises(RagidxError, match=r"no qrels for split 'dev'.*--split test"):
        load_beir(beir, "dev")
    with pytest.raises(RagidxError, match="no qrels/ folder"):
        load_beir(tmp_path, "test")


def test_sts_formats_and_score(tmp_path, tiny_models):
    stsb = tmp_path / "sts-dev.csv"
    rows = [("A man is dancing.", "A man dances.", 4.8), ("A dog runs.", "The stock market fell.", 0.2),
            ("Kids play.", "Children are playing.", 4.1), ("Rain falls.", "It is raining.", 3.9)]  # fmt: skip
    stsb.write_text(
        "".join(
            f"main\tMSRvid\t2012\t{i:04d}\t{s}\t{a}\t{b}\textra\tcols\n" for i, (a, b, s) in enumerate(rows)
        ),
        encoding="utf-8",
    )
    sick = tmp_path / "SICK.txt"
    sick.write_text(
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
        + "".join(f"{i}\t{a}\t{b}\t{s}\tNEUTRAL\n" for i, (a, b, s) in enumerate(rows)),
        encoding="utf-8",
    )
    assert load_sts(stsb) == load_sts(sick)
    assert load_sts(stsb).first[1] == "A dog runs." and load_sts(stsb, max_pairs=2).gold == [4.8, 0.2]
    out = json.loads(ragidx("eval", "sts", stsb, "--model", tiny_models["qwen2"], "--strategy", "mean,last",
                            "--json").stdout)  # fmt: skip
    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    runtime = load_runtime(str(tiny_models["qwen2"]), device="cpu", dtype="float32")
    for row in out["rows"]:
        strategy = create_strategy(row["strategy"], runtime)
        a = strategy.encode([r[0] for r in rows])
        b = strategy.encode([r[1] for r in rows])
        assert row["spearman"] == pytest.approx(100 * spearman((a * b).sum(1), [r[2] for r in rows]))


@pytest.fixture(scope="module")
def stsb(tmp_path_factory) -> tuple[Path, list[tuple[str, str, float]]]:
    """A small STS-B-layout file of pairs written for the tests."""
    rows = [
        ("A man is dancing on a stage.", "A man dances.", 4.8),
        ("A dog runs in the park.", "Stocks fell.", 0.2),
        ("Kids play in the yard. They laugh.", "Children are playing.", 4.1),
        ("Rain falls.", "It is raining.", 3.9),
        ("A cat sleeps.", "The train left early.", 0.4),
        ("She cooks pasta.", "A woman is cooking.", 3.2),
    ]
    path = tmp_path_factory.mktemp("sts") / "sts.csv"
    lines = "".join(f"main\tx\t2012\t{i}\t{s}\t{a}\t{b}\n" for i, (a, b, s) in enumerate(rows))
    path.write_text(lines, encoding="utf-8")
    return path, rows


def test_eval_sts_sweeps_repeated_options_row_by_row(stsb, tiny_models, tmp_path):
    """``--rewire`` twice: one htp row per value, mean once (it takes no --rewire), each equal to
    that strategy built with that value alone; --json FILE writes what --json prints."""
    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    path, rows = stsb
    report_path, plot = tmp_path / "sts.json", tmp_path / "sts.png"
    args = ("eval", "sts", path, "--model", tiny_models["llama"], "--strategy", "mean,htp", "--rewire", "1-1",
            "--rewire", "1-3", "--exit-layer", "-1", "--device", "cpu", "--dtype", "float32")  # fmt: skip
    printed = json.loads(ragidx(*args, "--json").stdout)
    result = ragidx(*args, "--json", report_path, "--plot", plot)
    written = json.loads(report_path.read_text())
    for report in (written, printed):
        for row in report["rows"]:
            row.pop("seconds")
    assert written == printed
    assert [row["label"] for row in printed["rows"]] == [
        "mean", "htp rewire=1-1 exit_layer=-1", "htp rewire=1-3 exit_layer=-1"
    ]  # fmt: skip
    assert "htp rewire=1-3 exit_layer=-1" in result.stdout and plot.read_bytes()[:4] == b"\x89PNG"
    runtime = load_runtime(str(tiny_models["llama"]), device="cpu", dtype="float32")
    firsts = []
    for row in printed["rows"]:
        strategy = create_strategy(row["strategy"], runtime, **row["options"])
        a, b = strategy.encode([r[0] for r in rows]), strategy.encode([r[1] for r in rows])
        assert row["spearman"] == pytest.approx(100 * spearman((a * b).sum(1), [r[2] for r in rows]))
        firsts.append(a)
    assert np.abs(firsts[1] - firsts[2]).max() > 1e-3  # the swept values give different vectors
    model = tiny_models["llama"]
    unused = ragidx(
        "eval", "sts", path, "--model", model, "--strategy", "mean", "--layers", "1-2", check=False
    )
    assert_one_line_error(unused, r"--layers does not apply to strategy mean")


def test_eval_retrieval_sweeps_and_prints_json(beir, tiny_models):
    """A swept retrieval eval builds one index per value; ``--json`` alone prints the report."""
    args = ("eval", "retrieval", beir, "--model", tiny_models["llama"], "--strategy", "aligned-wva", "--mode",
            "dense", "--layers", "1", "--layers", "4-5", "--json")  # fmt: skip
    report = json.loads(ragidx(*args).stdout)
    assert [(r["label"], r["options"]) for r in report["rows"]] == [
        ("aligned-wva layers=1", {"layers": "1"}), ("aligned-wva layers=4-5", {"layers": "4-5"})
    ]  # fmt: skip
    assert report["rows"][0]["ndcg@10"] != report["rows"][1]["ndcg@10"]
    assert set(report["fusion"]) == {"aligned-wva layers=1", "aligned-wva layers=4-5"}


def test_bench_reports_layers_and_counted_flops(tiny_models):
    import torch

    from ragidx.indexer.model.runtime import load_runtime

    args = ("--max-texts", "1", "--queries", "3", "--device", "cpu", "--dtype", "float32,bfloat16", "--json")
    out = json.loads(ragidx("bench", "--model", tiny_models["llama"], "--strategy", "mean,htp", *args).stdout)
    mean, htp, mean16, _ = out["rows"]
    assert (out["texts"], mean["texts"], mean["strategy"], htp["strategy"]) == (1, 1, "mean", "htp")
    assert [row["dtype"] for row in out["rows"]] == ["float32", "float32", "bfloat16", "bfloat16"]
    assert mean["fraction_of_layers"] == 1.0 and htp["fraction_of_layers"] == pytest.approx(5 / 6)
    runtime = load_runtime(str(tiny_models["llama"]), device="cpu", dtype="float32")
    linear = sum(
        m.weight.numel()
        for layer in runtime.arch.layers
        for m in layer.modules()
        if isinstance(m, torch.nn.Linear)
    )
    assert mean["flops"] == 2 * mean["tokens"] * linear  # one text: no padding; CPU SDPA is not counted
    assert mean16["flops"] == mean["flops"] and mean16["tokens"] == mean["tokens"]
    peaks = out["matmul_peaks"]
    # bf16 products are emulated on CPUs without AVX-512 (here under 1 GFLOP/s): only float32's is bounded.
    assert set(peaks) == {"float32", "bfloat16"} and peaks["float32"] > 1e9 and peaks["bfloat16"] > 0
    for row in out["rows"]:
        assert row["vectors_per_second"] == pytest.approx(1 / row["seconds"])
        assert row["matmul_peak_flops_per_second"] == peaks[row["dtype"]]
        assert row["fraction_of_peak"] == pytest.approx(row["flops"] / row["seconds"] / peaks[row["dtype"]])
        assert row["fraction_of_best_peak"] == pytest.approx(
            row["flops"] / row["seconds"] / max(peaks.values())
        )
        assert row["anchor"] == "transformers forward + mean"
        anchor_rate = row["anchor_tokens_per_second"]
        assert row["ratio_to_anchor"] == pytest.approx(row["tokens_per_second"] / anchor_rate)
        assert 0 < row["query_p50_ms"] <= row["query_p95_ms"] and row["peak_rss_mib"] > 100
        # one text: no padding; a CPU's fixed batch; no GPU memory to count
        batching = (row["padding"], row["batch_rows"], row["batch_tokens"], row["peak_device_mib"])
        assert batching == (0, 32, 16384, 0)
    assert out["probe_size"] == 1024
    wrong = ragidx("bench", "--model", tiny_models["llama"], "--dtype", "float32,int4", check=False)
    assert_one_line_error(wrong, r"unknown dtype 'int4'")


def test_bench_counts_the_padding_of_the_batches_it_ran(tiny_models):
    """Texts of unequal length: the padded share equals the one planned from their lengths."""
    from ragidx.app.research.bench import Anchor, bench_strategy
    from ragidx.indexer.model.runtime import load_runtime, plan_batches
    from ragidx.indexer.strategies import BatchSettings, create_strategy

    runtime = load_runtime(str(tiny_models["llama"]), device="cpu", dtype="float32")
    batch = BatchSettings(max_rows=3, max_tokens=16384)
    strategy = create_strategy("mean", runtime, batch=batch)
    texts = [" ".join(["tide"] * words) + "." for words in (3, 9, 4, 20, 7, 5, 11)]
    row = bench_strategy(strategy, "mean", texts, texts[:1], {}, Anchor("none", 1, 1.0))
    lengths = [len(ids) for ids in runtime.tokenize(texts)]
    groups = plan_batches(lengths, batch.max_rows, batch.max_tokens)
    cells = sum(len(group) * max(lengths[i] for i in group) for group in groups)
    assert row.tokens == sum(lengths) and row.padding == pytest.approx(1 - sum(lengths) / cells)
    assert row.padding > 0.1 and (row.batch_rows, row.batch_tokens) == (3, 16384)


@pytest.mark.parametrize("packs", [True, False])
def test_a_cpu_peak_is_the_faster_of_the_plain_and_the_packed_product(monkeypatch, packs):
    """A model whose float32 weights are packed runs oneDNN's product, which can beat torch's
    square product: the peak it is set against is then the packed one."""
    from ragidx.app.research import bench

    packed_sizes = []

    def packed(dtype, inputs, outputs, tokens, seconds, packed=False):
        packed_sizes.append((dtype, inputs, outputs, tokens, packed))
        return 5e12

    monkeypatch.setattr(bench, "can_pack_linear_weights", lambda dtype: packs)
    monkeypatch.setattr(bench, "linear_flops_per_second", packed)
    peak = bench.matmul_peak_flops("float32", "cpu", seconds=0.05)
    if packs:
        assert peak == 5e12 and packed_sizes == [("float32", 1024, 1024, 1024, True)]
    else:
        assert 1e6 < peak < 5e12 and packed_sizes == []  # torch's own product, really timed

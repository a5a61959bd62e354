"""Hybrid weights tuned per index on pseudo-queries: drawn right, scored right, stored and followed."""

from __future__ import annotations

import json
import math
import re
import shutil
import sqlite3

import numpy as np
import pytest

from ragidx.app import Index
from ragidx.indexer.build.pipeline import BuildOptions, build
from ragidx.indexer.build.tuning import (
    DENSE_WEIGHTS,
    MAX_WORDS,
    MIN_WORDS,
    build_queries,
    choose_fusion,
    pseudo_queries,
    tune,
)
from ragidx.indexer.search.fusion import Fusion
from ragidx.indexer.storage.writer import IndexWriter
from tests.support.cli import assert_one_line_error, ragidx
from tests.support.search_checks import independent_dense, independent_fusion, porter_bm25


def options(model, folder, **extra) -> BuildOptions:
    """Build options for ``folder``; ``model`` None keeps the index's. float32, so that a batch's
    padding changes no vector (the precision probe may pick bf16 on a busy machine)."""
    settings = {"device": "cpu", "dtype": "float32", "progress": False, **extra}
    return BuildOptions(index_dir=folder, model=model and str(model), **settings)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, sample_corpus):
    """72 documents of three sentences each, cut from the sample corpus (tuning needs 50)."""
    from bs4 import BeautifulSoup

    folder = tmp_path_factory.mktemp("tuning") / "docs"
    folder.mkdir()
    number = 0
    for path in sorted(p for p in sample_corpus.rglob("*") if p.is_file()):
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".html":
            text = BeautifulSoup(text, "html.parser").get_text(" ")
        sentences = [s for s in re.split(r"(?<=[.?!])\s+", " ".join(text.split())) if len(s.split()) >= 5]
        for first in range(0, len(sentences) - 2, 3):
            (folder / f"{path.stem}-{number}.txt").write_text(" ".join(sentences[first : first + 3]) + "\n")
            number += 1
    return folder


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_models, corpus):
    """The 72 documents indexed (one chunk each), tuned by their build."""
    folder = tmp_path_factory.mktemp("tuned") / "index"
    build([corpus], options(tiny_models["llama"], folder))
    with Index.open(folder, device="cpu") as opened:
        yield opened


def chunks_of(index: Index) -> dict[int, tuple[int, str]]:
    with sqlite3.connect(index.reader.directory / "ragidx.db") as db:
        return {i: (doc, text) for i, doc, text in db.execute("select id, document_id, text from chunks")}


def independent_lexical(
    index: Index, text: str, db: sqlite3.Connection | None = None
) -> list[tuple[int, float]]:
    """BM25 top 101 for the query's content words OR-ed (all its words if it has none), from
    ``db`` (default: the index's own file)."""
    from spacy.lang.en.stop_words import STOP_WORDS

    every = list(dict.fromkeys(w.lower() for w in re.findall(r"\w+", text)))
    words = [w for w in every if w not in STOP_WORDS] or every
    connection = db or sqlite3.connect(index.reader.directory / "ragidx.db")
    found = porter_bm25(connection, words, 101)
    if db is None:
        connection.close()
    return found


def test_equal_weights_are_kept_only_above_the_better_list_on_both_halves_or_on_all():
    rng = np.random.default_rng(1)
    base = rng.uniform(0.2, 0.8, 200)
    odd = np.arange(200) % 2 == 1

    def chosen(lexical: np.ndarray, dense: np.ndarray, equal: np.ndarray, minmax: np.ndarray) -> Fusion:
        rrf = {w: lexical if w == 0.0 else dense if w == 1.0 else equal for w in DENSE_WEIGHTS}
        rrf[0.2] = lexical + 0.3  # a weight far ahead on the pseudo-queries is not a candidate
        fusion, how = choose_fusion(rrf, minmax)
        assert fusion == independent_choice(rrf, minmax), how
        return fusion

    # Above both lists on both halves: equal weights, by min-max where it scores at least RRF.
    assert chosen(base, base * 0.8, base + 0.05, base + 0.1) == Fusion(0.5, 0.5, "minmax")
    assert chosen(base, base * 0.8, base + 0.1, base + 0.05) == Fusion(0.5, 0.5)
    # At or below the better single list: that list alone (a tie goes to the list).
    assert chosen(base, base * 0.95, base, base - 0.01) == Fusion(0.0, 1.0)
    assert chosen(base * 0.9, base, base - 0.02, base - 0.01) == Fusion(1.0, 0.0)
    # The halves disagree: all of them decide, either way.
    ahead_on_even = base + np.where(odd, -0.05, 0.1)
    assert chosen(base, base * 0.5, ahead_on_even, ahead_on_even - 0.1) == Fusion(0.5, 0.5)
    ahead_on_odd = base + np.where(odd, 0.05, -0.1)
    assert chosen(base, base * 0.5, ahead_on_odd, ahead_on_odd - 0.1) == Fusion(0.0, 1.0)


def test_pseudo_queries_cut_a_sentence_out_of_their_chunk(index):
    chunks = chunks_of(index)
    usable = {q.chunk_id for q in pseudo_queries(index.reader, 1000)}  # chunks with a sentence to cut out
    assert usable <= set(chunks) and len(usable) > 60
    assert {q.chunk_id for q in pseudo_queries(index.reader, 100)} == usable  # fewer than 100: taken in turns
    queries = pseudo_queries(index.reader, 60)
    assert queries == pseudo_queries(index.reader, 60)  # a fixed seed
    assert len({q.chunk_id for q in queries}) == 60  # one per chunk while chunks outnumber the limit
    for query in queries:
        assert MIN_WORDS <= len(re.findall(r"\w+", query.text)) <= MAX_WORDS
        document, text = chunks[query.chunk_id]
        assert document == query.document_id and query.text in text and query.text not in query.remainder
        start = text.index(query.text)
        assert query.remainder.strip() == (text[:start] + text[start + len(query.text) :]).strip()
        rest = [query.remainder[a:b].strip() for a, b in query.remainder_sentences]
        assert rest and all(sentence in text for sentence in rest)


def test_the_tuning_grid_equals_an_independent_computation(index, tmp_path):
    report = tune(index.engine, lambda: index.strategy, 40)
    assert (report.queries, report.reason, report.level) == (40, "", "documents")
    chunks = chunks_of(index)
    assert_grid_is_independent(
        report, index, pseudo_queries(index.reader, 40), lambda c: chunks[c][0], tmp_path
    )


def assert_grid_is_independent(report, index, queries, answer_of, tmp_path) -> None:
    """Each query's chunk replaced by its remainder, in a copy of the database and re-embedded;
    each fused list ranked by answers (``answer_of``: chunk id -> document id, or -> itself)."""
    copy = tmp_path / "copy.db"
    with sqlite3.connect(index.reader.directory / "ragidx.db") as source, sqlite3.connect(copy) as target:
        source.backup(target)  # the committed state, write-ahead log included
    strategy = index.strategy
    vectors = strategy.encode([q.text for q in queries], "query")
    # One batch, as tuning embeds them: a row's padding must not be what differs (bf16 is not exact).
    rests = strategy.encode(
        [q.remainder for q in queries], "document", sentences=[q.remainder_sentences for q in queries]
    )
    lists = []
    for query, vector, rest in zip(queries, vectors, rests, strict=True):
        dense = dict(independent_dense(index, query.text, 1000))
        dense[query.chunk_id] = float(vector @ rest)
        with sqlite3.connect(copy) as db:
            db.execute("update chunks set text = ? where id = ?", [query.remainder, query.chunk_id])
            lexical = independent_lexical(index, query.text, db)
            db.rollback()
        lists.append((sorted(dense.items(), key=lambda p: -p[1])[:101], lexical))
    per_query = {}
    for weight in DENSE_WEIGHTS:
        scores = []
        for query, (dense, lexical) in zip(queries, lists, strict=True):
            fused = independent_fusion(dense, lexical, weight, 1 - weight)
            scores.append(gain_at_10(fused, answer_of, query))
        assert report.grid[f"{weight:g}"] == pytest.approx(np.mean(scores), abs=1e-6), weight
        per_query[weight] = np.array(scores)
    minmax = np.array([
        gain_at_10(independent_fusion(dense, lexical, 0.5, 0.5, "minmax"), answer_of, query)
        for query, (dense, lexical) in zip(queries, lists, strict=True)
    ])  # fmt: skip
    chosen = independent_choice(per_query, minmax)
    assert report.fusion == chosen
    tuned = minmax if chosen.method == "minmax" else per_query[chosen.dense]
    assert report.ndcg == pytest.approx({
        "dense": report.grid["1"], "lexical": report.grid["0"], "equal": report.grid["0.5"],
        "minmax": np.mean(minmax), "tuned": np.mean(tuned),
    })  # fmt: skip


def independent_choice(rrf: dict, minmax: np.ndarray) -> Fusion:
    """Tuning's rule, written again: on a set of pseudo-queries, equal weights (min-max where it
    scores at least RRF there) if they score above the better single list (lexical on a tie), else
    that list; taken where the even- and the odd-numbered pseudo-queries agree, else on all."""

    def decide(rows: slice) -> Fusion:
        method, equal = (
            ("minmax", minmax) if minmax[rows].mean() >= rrf[0.5][rows].mean() else ("rrf", rrf[0.5])
        )
        single = 1.0 if rrf[1.0][rows].mean() > rrf[0.0][rows].mean() else 0.0
        return (
            Fusion(0.5, 0.5, method)
            if equal[rows].mean() > rrf[single][rows].mean()
            else Fusion(single, 1 - single)
        )

    even, odd = decide(slice(0, None, 2)), decide(slice(1, None, 2))
    return even if even == odd else decide(slice(None))


def gain_at_10(fused, answer_of, query) -> float:
    """1/log2(rank + 1) of the query's answer among the fused list's answers, 0 past 10 or absent."""
    answers = list(dict.fromkeys(answer_of(c) for c, _ in fused))
    answer = answer_of(query.chunk_id)
    rank = answers.index(answer) + 1 if answer in answers else math.inf
    return 1 / math.log2(rank + 1) if rank <= 10 else 0.0


def test_a_build_stores_the_tuned_weights_and_search_uses_them(index):
    stored = index.meta["fusion"]
    chunks = index.reader.counts()["chunks"]
    afforded = build_queries(chunks)  # a fifth of the chunks, at least what tuning needs
    assert afforded == max(20, chunks // 5) and build_queries(1000) == 200 and build_queries(5000) == 200
    assert stored["pseudo_queries"] == len(pseudo_queries(index.reader, afforded)) and not stored["reason"]
    tuned = tune(index.engine, lambda: index.strategy, afforded)
    assert Fusion.of_index(index.meta) == tuned.fusion.normalised()
    query = "how do I return a bicycle"
    explicit = index.search(query, k=10, weights=stored["weights"])
    assert [h.chunk_id for h in index.search(query, k=10)] == [h.chunk_id for h in explicit]


def test_an_open_index_follows_weights_stored_after_it_opened(tiny_models, tmp_path, corpus):
    folder = tmp_path / "index"
    build([corpus], options(tiny_models["llama"], folder))
    query = "how do I return a bicycle"
    with Index.open(folder, device="cpu") as opened:
        opened.search(query)
        with IndexWriter(folder) as writer:
            writer.update_meta(
                {"fusion": {**writer.meta["fusion"], "weights": {"dense": 0.0, "lexical": 1.0}}}
            )
        opened.engine.embed = lambda texts: pytest.fail("a query was embedded for a list weighted 0")
        hybrid = [h.chunk_id for h in opened.search(query, k=5)]
        lexical = [h.chunk_id for h in opened.search(query, k=5, mode="lexical")]
        assert lexical and hybrid == lexical  # the vectors take no part: the query is not embedded


def test_a_few_long_documents_are_tuned_on_their_chunks(tiny_models, tmp_path, corpus):
    """Three long documents in 50+ chunks: each pseudo-query's answer is its own chunk, and no
    sentence that overlapping chunks share is cut (the neighbour would hold it verbatim)."""
    docs = tmp_path / "long"
    docs.mkdir()
    texts = sorted(path.read_text() for path in corpus.glob("*.txt"))
    for number in range(3):
        (docs / f"meeting{number}.txt").write_text(" ".join(text.strip() for text in texts[number::3]) + "\n")
    folder = tmp_path / "index"
    report = build(
        [docs], options(tiny_models["llama"], folder, chunk_tokens=128, overlap_sentences=1)
    ).tuning
    assert report is not None and (report.level, report.reason) == ("chunks", "")
    assert "answered by chunks" in report.describe()
    with Index.open(folder, device="cpu") as opened:
        assert opened.meta["fusion"]["answers"] == "chunks"
        counts = opened.reader.counts()
        assert counts["documents"] == 3 and counts["chunks"] >= 50
        queries = pseudo_queries(opened.reader, 40, level="chunks")
        assert len(queries) == 40 and len({q.chunk_id for q in queries}) >= 20
        with sqlite3.connect(folder / "ragidx.db") as db:
            spans = {i: (doc, start, end) for i, doc, start, end in db.execute(
                "select id, document_id, char_start, char_end from chunks")}  # fmt: skip
        for query in queries:
            document, start, _ = spans[query.chunk_id]
            chunk_text = chunks_of(opened)[query.chunk_id][1]
            at = start + chunk_text.index(query.text)
            holders = [i for i, (d, s, e) in spans.items() if d == document and s <= at < e]
            assert holders == [query.chunk_id], query.text  # in no other chunk
        assert pseudo_queries(opened.reader, 40) != queries  # by documents, shared sentences may be cut
        chunk_report = tune(opened.engine, lambda: opened.strategy, 40)
        assert chunk_report.level == "chunks"
        assert_grid_is_independent(chunk_report, opened, queries, lambda c: c, tmp_path)


def test_small_or_terse_corpora_keep_equal_weights(tiny_models, tmp_path, sample_corpus):
    report = build([sample_corpus], options(tiny_models["llama"], tmp_path / "small", chunk_tokens=1024))
    assert report.tuning is not None
    assert re.search(
        r"^13 documents in \d\d chunks are too few to tune on \(50 needed\)$", report.tuning.reason
    )
    assert report.fusion["weights"] == {"dense": 0.5, "lexical": 0.5}
    docs = tmp_path / "docs"
    docs.mkdir()
    for number in range(60):
        (docs / f"{number}.txt").write_text(f"Note {number} says the kettle is blue. It boils fast.\n")
    report = build([docs], options(tiny_models["llama"], tmp_path / "terse"))
    assert report.tuning is not None and "too little text for pseudo-queries" in report.tuning.reason


def test_incremental_builds_retune_only_after_a_large_change(tiny_models, tmp_path, corpus):
    docs = tmp_path / "docs"
    shutil.copytree(corpus, docs)
    folder = tmp_path / "index"
    first = build([docs], options(tiny_models["llama"], folder))
    assert first.tuning is not None and first.fusion["chunks"] == first.total_chunks
    (docs / "small.txt").write_text("One more short note about kettles.\n")
    small = build([docs], options(None, folder))
    assert small.tuning is None and small.fusion == first.fusion
    for number, path in enumerate(sorted(docs.glob("*.txt"))[:10]):
        shutil.copy(path, docs / f"copy{number}.txt")
    large = build([docs], options(None, folder))
    assert (
        large.tuning is not None and large.fusion["chunks"] == large.total_chunks > first.total_chunks * 1.1
    )
    rebuilt = build([docs], options(tiny_models["llama"], folder, rebuild=True, tune=False))
    assert rebuilt.tuning is None and rebuilt.fusion is None
    with Index.open(folder, device="cpu") as opened:
        assert Fusion.of_index(opened.meta) == Fusion()


def test_cli_build_tune_info_and_query_weights(tiny_models, tmp_path, corpus):
    folder = tmp_path / "index"
    built = ragidx(
        "build",
        corpus,
        "--model",
        tiny_models["llama"],
        "--index",
        folder,
        env={"RAGIDX_PROGRESS_SECONDS": "0"},
    )
    summary = (
        r"hybrid fusion (rrf|minmax), dense [\d.]+, lexical [\d.]+, tuned on (\d+) pseudo-queries in [\d.]+ s"
    )
    queries = int(re.search(summary, built.stdout).group(2))
    assert re.search(rf"^tuning: {2 * queries}/{2 * queries} texts \(100%\), \d+ s$", built.stderr, re.M)
    tuned = json.loads(ragidx("tune", "--index", folder, "--json", "--queries", "30").stdout)
    assert tuned["pseudo_queries"] == 30 and sum(tuned["weights"].values()) == pytest.approx(1)
    with Index.open(folder, device="cpu") as opened:
        assert opened.meta["fusion"] == tuned
        lexical = [h.chunk_id for h in opened.search("bicycle refund", mode="lexical")]
    assert "fusion.weights" in ragidx("info", "--index", folder).stdout
    search = ("query", "bicycle refund", "--index", folder, "--json")
    hits = json.loads(ragidx(*search, "--weights", "lexical=1").stdout)
    assert [h["chunk_id"] for h in hits][: len(lexical)] == lexical  # then dense fills k
    bad = ragidx("query", "x", "--index", folder, "--weights", "dense=1,sparse=2", check=False)
    assert_one_line_error(bad, "weights look like dense=0.3,lexical=0.7")
    missing = tmp_path / "nothing"
    assert_one_line_error(ragidx("tune", "--index", missing, check=False), "no index at")
    assert not missing.exists()


def test_a_tuning_that_switched_the_vectors_off_says_so_in_plain_words(tiny_models, tmp_path, corpus):
    from ragidx.indexer.build.tuning import TuningReport

    off = TuningReport(Fusion(0.0, 1.0), 100, 2.0, 500, ndcg={"dense": 0.2, "lexical": 0.6})
    assert "the vectors added nothing over keyword search" in off.finding()
    assert TuningReport(Fusion(0.5, 0.5), 100, 2.0, 500).finding() is None
    assert TuningReport(Fusion(0.0, 1.0), 0, 0.1, 5, reason="too few").finding() is None
    folder = tmp_path / "index"
    build([corpus], options(tiny_models["llama"], folder))
    with IndexWriter(folder) as writer:
        writer.update_meta({"fusion": off.to_meta()})
    shown = ragidx("info", "--index", folder).stdout
    assert shown.rstrip().splitlines()[-1] == f"note: {off.finding()}"

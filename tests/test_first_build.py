"""The first build of a real corpus: a sample decides whether vectors are kept, a lexical index
lives without them until asked, and an interrupted build resumes from its journal."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from ragidx.app import Index
from ragidx.indexer.build import journal, pipeline
from ragidx.indexer.build.pipeline import BuildOptions, build
from ragidx.indexer.build.sampling import SAMPLE_CHUNKS, SAMPLE_GROUP_CHUNKS, vectors_help
from ragidx.indexer.build.tuning import TuningReport
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.faults import JOURNAL_KILL_POINT
from ragidx.indexer.search.fusion import Fusion
from ragidx.indexer.storage.location import JOURNAL_NAME
from ragidx.indexer.wording import counted
from tests.support.child_setup import interruptible
from tests.support.cli import assert_one_line_error, ragidx, ragidx_after
from tests.support.index_files import stored_vectors

CHUNK_TOKENS = 64  # small chunks: a corpus of a few hundred short files is over twice the sample
QUERIES = ["why are there two tides a day", "how do I reset my password", "lighthouse keepers"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, sample_corpus) -> Path:
    """400 files of three sentences each, drawn in turn from the sample corpus's sentences."""
    from bs4 import BeautifulSoup

    sentences = []
    for path in sorted(p for p in sample_corpus.rglob("*") if p.is_file()):
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".html":
            text = BeautifulSoup(text, "html.parser").get_text(" ")
        sentences += [s for s in re.split(r"(?<=[.?!])\s+", " ".join(text.split())) if len(s.split()) >= 5]
    folder = tmp_path_factory.mktemp("first-build") / "docs"
    folder.mkdir()
    for number in range(400):
        chosen = [sentences[(number * 7 + step * 13) % len(sentences)] for step in range(3)]
        (folder / f"note-{number:03}.txt").write_text(f"Note {number}. " + " ".join(chosen) + "\n")
    return folder


def options(model: Path | None, index: Path, **extra) -> BuildOptions:
    """float32, so that how chunks are batched changes no vector; ``model`` None: the index's."""
    given = {"device": "cpu", "dtype": "float32", "progress": False, "chunk_tokens": CHUNK_TOKENS, **extra}
    return BuildOptions(index_dir=index, model=model and str(model), **given)


@pytest.fixture(scope="module")
def dense_index(tmp_path_factory, tiny_models, corpus) -> Path:
    """The corpus with vectors asked for: no sample, every chunk embedded."""
    index = tmp_path_factory.mktemp("dense") / "index"
    report = build([corpus], options(tiny_models["llama"], index, dense=True))
    assert report.sample is None and report.dense and report.embedded_tokens == report.tokens
    return index


def chunk_rows(index: Path) -> list[tuple[str, int, str]]:
    with sqlite3.connect(index / "ragidx.db") as db:
        query = "select d.path, c.ordinal, c.text from chunks c join documents d on d.id = c.document_id"
        return sorted(db.execute(query).fetchall())


def assert_same_vectors(index: Path, expected_index: Path) -> None:
    found, expected = stored_vectors(index), stored_vectors(expected_index)
    assert found.keys() == expected.keys()
    for key, (_, vector) in found.items():
        np.testing.assert_allclose(vector, expected[key][1], atol=1e-5)


@pytest.mark.parametrize("helps", [True, False])
def test_a_new_index_tunes_a_sample_first_and_keeps_vectors_only_where_they_help(
    helps, tmp_path, tiny_models, corpus, dense_index, monkeypatch
):
    seen: list[TuningReport] = []

    def verdict(tuning: TuningReport) -> bool:
        seen.append(tuning)
        return helps

    monkeypatch.setattr(pipeline, "vectors_help", verdict)
    index = tmp_path / "index"
    report = build([corpus], options(tiny_models["llama"], index))
    sample = report.sample
    assert sample is not None and seen == [sample.tuning] and sample.keep_vectors is helps
    assert SAMPLE_CHUNKS <= sample.chunks < report.chunks / 2 and sample.tuning.queries >= 20
    assert sample.documents + sample.rest_documents == report.documents == 400
    rest = report.tokens - sample.tokens
    assert 0.7 * rest <= sample.rest_tokens <= 1.3 * rest  # estimated from bytes at the sample's rate
    assert chunk_rows(index) == chunk_rows(dense_index)  # every chunk indexed either way
    meta = Index.open(index).meta
    assert meta["dense"] is helps and report.dense is helps
    if helps:
        assert_same_vectors(index, dense_index)  # the sample's vectors kept as they are
        assert report.embedded_tokens == report.tokens and report.tuning is not sample.tuning
        return
    assert report.embedded_tokens == sample.tokens  # the rest was never embedded
    assert meta["fusion"]["weights"] == {"dense": 0.0, "lexical": 1.0}
    assert meta["fusion"]["ndcg@10"] == {k: round(v, 4) for k, v in sample.tuning.ndcg.items()}
    with sqlite3.connect(index / "ragidx.db") as db:
        assert db.execute("select count(*) from segments").fetchone() == (0,)
    with Index.open(index) as opened:
        for query in QUERIES:
            hybrid = opened.search(query, k=5)
            assert [h.chunk_id for h in hybrid] == [
                h.chunk_id for h in opened.search(query, k=5, mode="lexical")
            ]
        with pytest.raises(RagidxError, match=r"keeps no vectors.*--dense"):
            opened.search(QUERIES[0], mode="dense")
    summary = ragidx("build", corpus, "--index", index).stdout
    assert "vectors: none (a lexical index: the vectors added nothing on a sample of" in summary
    assert_one_line_error(
        ragidx("query", "tides", "--index", index, "--mode", "dense", check=False), "--dense"
    )
    assert_one_line_error(ragidx("tune", "--index", index, check=False), "keeps no vectors")
    assert json.loads(ragidx("check", "--index", index, "--json").stdout)["healthy"]


def test_the_vectors_are_kept_where_they_beat_keyword_search_and_come_near_it_alone():
    untuned = TuningReport(Fusion(), 0, 0.0, reason="too few")
    assert vectors_help(untuned)  # a sample too small to judge proves nothing: vectors kept

    def verdict(dense: float, equal: float, minmax: float) -> bool:
        figures = {"dense": dense, "lexical": 0.5, "equal": equal, "minmax": minmax, "tuned": dense}
        return vectors_help(TuningReport(Fusion(1.0, 0.0), 100, 1.0, ndcg=figures))

    assert verdict(0.45, 0.52, 0.40) and verdict(0.45, 0.40, 0.52)  # either fusion above keywords
    assert verdict(0.425, 0.52, 0.52)  # the dense list at the floor, 0.85 of keyword search's
    assert not verdict(0.42, 0.52, 0.52)  # below it: a weak list the pseudo-queries flatter
    assert not verdict(0.5, 0.5, 0.499)  # a tie goes to keyword search, which costs nothing


def test_a_small_corpus_or_options_that_ask_for_vectors_embed_everything(
    tmp_path, tiny_models, corpus, sample_corpus
):
    small = build([sample_corpus], options(tiny_models["llama"], tmp_path / "small"))
    assert small.sample is None and small.dense and small.embedded_tokens == small.tokens
    asked = build([corpus], options(tiny_models["llama"], tmp_path / "asked", strategy="mean"))
    assert asked.sample is None and asked.dense and asked.embedded_tokens == asked.tokens


def test_a_lexical_index_adds_files_without_the_model_and_gets_vectors_when_asked(
    tmp_path, tiny_models, corpus, dense_index, monkeypatch
):
    index = tmp_path / "index"
    given = build([corpus], options(tiny_models["llama"], index, dense=False))
    assert given.sample is None and not given.dense and given.embedded_tokens == 0
    assert Index.open(index).meta["dense_reason"] == "--no-dense"
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "late.txt").write_text("A late note about the lighthouse keeper and the tides.\n")

    def refused(*_args, **_kwargs):
        raise AssertionError("a lexical index loaded the model")

    monkeypatch.setattr(pipeline, "load_runtime", refused)
    added = build([extra], options(None, index, chunk_tokens=None))
    assert added.documents == 1 and not added.dense
    monkeypatch.undo()
    assert (
        Index.open(index)
        .search("lighthouse keeper late note", k=1, mode="lexical")[0]
        .path.endswith("late.txt")
    )
    # hybrid asked of a lexical index runs keyword search, and says so: in each hit, and once
    found = ragidx("query", "lighthouse keeper late note", "--index", index, "--mode", "hybrid", "--json")
    assert {(hit["mode"], hit["mode_reason"]) for hit in json.loads(found.stdout)} == {
        ("lexical", "the index keeps no vectors")
    }
    assert found.stderr == "note: --mode hybrid searched keywords alone: the index keeps no vectors\n"
    with pytest.raises(RagidxError, match=r"keeps no vectors \(--no-dense\), and --strategy would add them"):
        build([corpus], options(tiny_models["llama"], index, strategy="mean"))  # not silently
    with Index.open(index) as opened:
        opened.remove([extra / "late.txt"])
    vectorised = build([corpus], options(tiny_models["llama"], index, dense=True))
    assert vectorised.dense and vectorised.vectorised == len(chunk_rows(index)) and vectorised.tuning
    assert_same_vectors(index, dense_index)
    assert Index.open(index).meta["dense_reason"] == "asked for"


def test_no_dense_is_refused_where_it_would_drop_vectors_or_shape_none(tmp_path, tiny_models, dense_index):
    refused = ragidx("build", "x", "--index", dense_index, "--no-dense", check=False)
    assert_one_line_error(refused, "keeps vectors; pass --rebuild with --no-dense")
    model = tiny_models["llama"]
    both = ragidx("build", "x", "--index", tmp_path / "i", "--model", model, "--no-dense",
                  "--strategy", "mean", check=False)  # fmt: skip
    assert_one_line_error(both, "--no-dense builds no vectors, so --strategy would shape nothing")
    contradicting = ragidx("build", "x", "--index", tmp_path / "i", "--no-dense", "--dense", check=False)
    assert_one_line_error(contradicting, "--dense and --no-dense contradict each other: give one")
    assert contradicting.returncode == 2


def test_a_build_stopped_by_ctrl_c_says_what_it_kept_and_resumes_while_the_previous_index_answers(
    tmp_path, tiny_models, corpus, dense_index, sample_corpus
):
    """Ctrl-C (SIGINT) after the first journalled group: the build says what it kept and how to
    resume; query and info on the index say a build is pending, and the old index answers."""
    model, index = tiny_models["llama"], tmp_path / "index"
    flags = ("--model", model, "--index", index, "--dtype", "float32", "--chunk-tokens", CHUNK_TOKENS)
    ragidx("build", sample_corpus, *flags)
    before = ragidx("query", "tides", "--index", index, "--json").stdout
    stopped = ragidx_after(interruptible, "build", corpus, *flags, "--rebuild", "--dense", "--no-tune",
                           env={"RAGIDX_INTERRUPT_AT": JOURNAL_KILL_POINT})  # fmt: skip
    kept = journal.pending(index)
    assert stopped.returncode == 130 and kept is not None and kept.chunks > 0
    told = f"it kept {counted(kept.chunks, 'embedded chunk')} of {counted(kept.documents, 'document')} ("
    assert stopped.stderr.startswith(f"interrupted; an interrupted build is pending: {told}")
    assert "the same `ragidx build` resumes from them" in stopped.stderr
    asked = ragidx("query", "tides", "--index", index, "--json")
    assert asked.stdout == before  # the old index answers
    assert asked.stderr.startswith(f"note: an interrupted build is pending: {told}")
    assert f"note: an interrupted build is pending: {told}" in ragidx("info", "--index", index).stdout
    resumed = json.loads(ragidx("build", corpus, *flags, "--rebuild", "--dense", "--json").stdout)
    done = resumed["resumed"]
    assert 0 < done["chunks"] < resumed["chunks"] and done["documents"] < 400
    assert resumed["embedded_tokens"] == resumed["tokens"] - done["tokens"]
    assert not (index / JOURNAL_NAME).exists() and journal.pending(index) is None
    assert_same_vectors(index, dense_index)


def test_a_long_document_is_journalled_in_parts_and_resumes_where_it_stopped(tmp_path, tiny_models, corpus):
    """One long file (a quarter of the corpus's notes) is embedded a sixteenth of its bytes at a
    time: killed after its first part, the build run again takes that part from the journal,
    embeds only the rest, and stores the vectors an uninterrupted build stores."""
    long = tmp_path / "long"
    long.mkdir()
    notes = sorted(corpus.iterdir())[:100]
    (long / "all-notes.txt").write_text("\n".join(path.read_text() for path in notes))
    model, index = tiny_models["llama"], tmp_path / "index"
    whole = build([long], options(model, tmp_path / "whole", dense=True, tune=False))
    flags = ("--model", model, "--index", index, "--dtype", "float32", "--chunk-tokens", CHUNK_TOKENS,
             "--dense", "--no-tune")  # fmt: skip
    killed = ragidx("build", long, *flags, check=False, env={"RAGIDX_KILL_AT": JOURNAL_KILL_POINT})
    assert killed.returncode == -9 and (index / JOURNAL_NAME).is_file()
    resumed = build([long], options(model, index, dense=True, tune=False))
    done = resumed.resumed
    assert done.documents == 1 and 0 < done.chunks <= whole.chunks // 8
    assert resumed.embedded_tokens == whole.tokens - done.tokens
    # the summary adds up: what was taken and what was embedded make the whole, and the rate is
    # of what was embedded
    taken, embedded = done.chunks, whole.chunks - done.chunks
    assert resumed.summary().startswith(
        f"indexed 1 document as {whole.chunks} chunks ({whole.tokens} tokens): {taken} chunks taken from "
        f"the journal, {embedded} embedded ({whole.tokens - done.tokens} tokens) in "
    )
    assert resumed.vectors_per_second == pytest.approx(embedded / resumed.embed_seconds)
    assert_same_vectors(index, tmp_path / "whole")


def test_a_build_killed_during_its_sample_keeps_the_groups_it_embedded(tmp_path, tiny_models, corpus):
    """The sample is journalled an eighth at a time: killed after its first group, the build run
    again takes that group from the journal and embeds the rest of the sample."""
    flags = ("--model", tiny_models["llama"], "--index", tmp_path / "index", "--dtype", "float32",
             "--chunk-tokens", CHUNK_TOKENS)  # fmt: skip
    killed = ragidx("build", corpus, *flags, check=False, env={"RAGIDX_KILL_AT": JOURNAL_KILL_POINT})
    assert killed.returncode == -9
    again = json.loads(ragidx("build", corpus, *flags, "--json").stdout)
    done, sample = again["resumed"], again["sample"]
    assert SAMPLE_GROUP_CHUNKS <= done["chunks"] < 2 * SAMPLE_GROUP_CHUNKS < sample["chunks"]
    embedded_by_sample = again["embedded_tokens"] - (
        again["tokens"] - sample["tokens"] if again["dense"] else 0
    )
    assert embedded_by_sample == sample["tokens"] - done["tokens"]


def test_a_journal_of_other_settings_is_not_taken(tmp_path, tiny_models, sample_corpus):
    model, index = tiny_models["llama"], tmp_path / "index"
    flags = ("--model", model, "--index", index, "--dtype", "float32", "--dense", "--no-tune")
    killed = ragidx("build", sample_corpus, *flags, "--chunk-tokens", CHUNK_TOKENS, check=False,
                    env={"RAGIDX_KILL_AT": JOURNAL_KILL_POINT})  # fmt: skip
    assert killed.returncode == -9 and (index / JOURNAL_NAME).is_file()
    again = json.loads(
        ragidx("build", sample_corpus, *flags, "--chunk-tokens", CHUNK_TOKENS + 8, "--json").stdout
    )
    assert again["resumed"] is None and again["embedded_tokens"] == again["tokens"]
    assert "resumed" not in ragidx("build", sample_corpus, *flags).stdout


def test_a_copy_in_the_same_build_is_embedded_once_and_not_called_resumed(
    tmp_path, tiny_models, sample_corpus
):
    """Two files with the same content (a page installed under two names) are embedded once: the
    second takes the first's vectors, and a first build says so, not that an interrupted build was
    resumed (it said "resumed: ... embedded by an interrupted build" of every such copy)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    originals = sorted(p for p in sample_corpus.rglob("*.md"))[:3]
    for path in originals:
        (docs / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    (docs / "copy.md").write_text(originals[0].read_text(encoding="utf-8"), encoding="utf-8")
    model = tiny_models["llama"]
    report = build([docs], options(model, tmp_path / "index", dense=True, tune=False))
    alone = build([docs / originals[0].name], options(model, tmp_path / "alone", dense=True, tune=False))
    copy = report.copied
    assert report.resumed is None and copy is not None
    # a long file is journalled in parts: its copy takes the parts saved before it comes up
    assert copy.documents == 1 and 0 < copy.chunks <= alone.chunks and 0 < copy.tokens <= alone.tokens
    assert report.embedded_tokens == report.tokens - copy.tokens
    assert report.summary().startswith(
        f"indexed 4 documents as {report.chunks} chunks ({report.tokens} tokens): {copy.chunks} chunks of 1 "
        f"document the same as another file's, not embedded twice, {report.chunks - copy.chunks} embedded "
    )
    assert report.to_dict()["copied"] == {"documents": 1, "chunks": copy.chunks, "tokens": copy.tokens}
    vectors = stored_vectors(tmp_path / "index")
    for ordinal in range(alone.chunks):
        np.testing.assert_array_equal(
            vectors[(str(docs / "copy.md"), ordinal)][1], vectors[(str(docs / originals[0].name), ordinal)][1]
        )

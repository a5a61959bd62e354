"""Index lifecycle: incremental builds, rm, check --repair, --strategy auto, crashes and concurrency."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from ragidx.indexer.faults import KILL_POINTS, MERGE_KILL_POINTS
from tests.support.cli import RAGIDX, assert_one_line_error, child_env, ragidx
from tests.support.index_files import segment_vectors, stored_vectors
from tests.support.lifecycle import QUERIES, build, search_all


def test_incremental_build_embeds_only_what_changed(workspace, tiny_models, tmp_path):
    corpus, index = workspace
    model = tiny_models["qwen2"]
    before = stored_vectors(index)
    first = json.loads(ragidx("info", "--index", index, "--json").stdout)["strategy_notes"]
    (corpus / "faq" / "shipping.txt").write_text("Parcels ship within two days by bicycle courier.\n")
    (corpus / "notes" / "tides.md").unlink()
    (corpus / "notes" / "new-note.md").write_text("# Kites\n\nA kite flies because air pushes on it.\n")
    summary = build(corpus, index, model)
    assert (summary["new"], summary["updated"], summary["unchanged"], summary["removed"]) == (1, 1, 11, 1)
    assert summary["documents"] == 2 and summary["generation"] == 2
    assert summary["strategy_notes"]["layer_source"] == first["layer_source"] != "--layers"  # not given
    after = stored_vectors(index)
    changed = {str(corpus / "faq" / "shipping.txt"), str(corpus / "notes" / "new-note.md")}
    for key, (chunk_id, vector) in after.items():
        if key[0] not in changed:
            assert before[key][0] == chunk_id
            np.testing.assert_array_equal(before[key][1], vector)
    assert not any(path.endswith("tides.md") for path, _ in after)
    # the same corpus built from scratch gives the same vectors for every chunk
    fresh = stored_vectors(Path(build(corpus, tmp_path / "fresh", model)["index"]))
    assert fresh.keys() == after.keys()
    for key, (_, vector) in fresh.items():
        np.testing.assert_allclose(after[key][1], vector, atol=1e-5)
    lexical = ragidx("query", "bicycle courier", "--index", index, "--mode", "lexical", "--json").stdout
    assert json.loads(lexical)[0]["path"].endswith("shipping.txt")


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_an_incremental_build_embeds_in_the_dtype_the_index_was_built_in(
    corpus, tiny_models, tmp_path, dtype
):
    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    model, index = tiny_models["qwen2"], tmp_path / "index"
    built = build(corpus, index, model, "--dtype", dtype, "--strategy", "prompteol")
    assert built["dtype"] == dtype
    note = corpus / "notes" / "kites.md"
    note.write_text("A kite flies because the wind pushes on its sail.\n")
    assert build(corpus, index, model)["dtype"] == dtype  # auto: the index's dtype
    (_, stored), *more = [v for (path, _), v in stored_vectors(index).items() if path == str(note)]
    assert not more
    text = note.read_text()
    for each, expected in ((dtype, 0.99999), ("float32", None)):
        runtime = load_runtime(str(model), device="cpu", dtype=each)
        cosine = float(create_strategy("prompteol", runtime).encode([text])[0] @ stored)
        if expected:
            assert cosine > expected
        else:
            print(f"{dtype} to float32: {cosine}")
            assert cosine < 0.9999  # float32 would give a visibly different vector on this model


def test_a_build_streams_groups_and_skips_files_unreadable_on_the_second_read(
    built, tiny_models, tmp_path, monkeypatch
):
    """Groups of 2 chunks go to the store one at a time and give the same vectors as the fixture's
    one-process build; a file that cannot be read again after the scan is skipped and reported."""
    from ragidx.indexer.build import embedding, pipeline
    from ragidx.indexer.build.settings import BuildOptions
    from ragidx.indexer.ingest.sources import SkippedFile

    monkeypatch.setattr(pipeline, "EMBED_SLICE", 2)
    reread = embedding.read_document
    lost = built / "corpus" / "notes" / "tides.md"

    def read_again(path: Path, **options):
        return SkippedFile(str(path), "unreadable: gone") if path == lost else reread(path, **options)

    monkeypatch.setattr(embedding, "read_document", read_again)
    options = BuildOptions.of(tmp_path / "index", model=str(tiny_models["qwen2"]), progress=False)
    report = pipeline.build([built / "corpus"], options)
    assert report.skipped == [SkippedFile(str(lost), "unreadable: gone")] and report.total_documents == 12
    streamed, whole = stored_vectors(tmp_path / "index"), stored_vectors(built / "index")
    assert streamed.keys() == {key for key in whole if key[0] != str(lost)}
    for key, (_, vector) in streamed.items():
        np.testing.assert_allclose(vector, whole[key][1], atol=1e-5)


def test_an_unchanged_rebuild_does_not_load_the_model_or_commit(workspace, tiny_models):
    corpus, index = workspace
    started = time.perf_counter()
    result = ragidx("build", corpus, "--index", index, env={"RAGIDX_MODEL": "/no/such/model"})
    seconds = time.perf_counter() - started
    assert result.stdout.splitlines()[0] == "0 new, 0 updated, 13 unchanged, 0 removed", result.stdout
    assert "(generation 1)" in result.stdout and seconds < 60
    template = json.loads(ragidx("info", "--index", index, "--json").stdout)["strategy_params"][
        "query_template"
    ]
    same = build(corpus, index, tiny_models["qwen2"], "--query-template", template)  # loads the model, equal
    assert (same["generation"], same["unchanged"], same["chunks"]) == (1, 13, 0)
    # settings not given are the index's own; other settings are refused without --rebuild
    refused = ragidx("build", corpus, "--index", index, "--chunk-tokens", "40", check=False)
    assert_one_line_error(refused, "other settings.*--rebuild")


def test_building_one_folder_keeps_documents_elsewhere(workspace, tiny_models):
    corpus, index = workspace
    (corpus / "faq" / "returns.md").unlink()
    summary = build(corpus / "faq", index, tiny_models["qwen2"])
    assert (summary["new"], summary["updated"], summary["unchanged"], summary["removed"]) == (0, 0, 4, 1)
    assert summary["total_documents"] == 12


def test_rm_removes_documents_from_every_search(workspace):
    corpus, index = workspace
    out = ragidx("rm", corpus / "notes", corpus / "faq" / "warranty.md", "--index", index).stdout
    assert out.count("removed ") == 6 and "6 documents removed; generation 2" in out
    for mode in ("dense", "lexical", "hybrid"):
        hits = json.loads(
            ragidx(
                "query", "warranty tides espresso", "--index", index, "--mode", mode, "--json", "-k", "50"
            ).stdout
        )
        assert hits and not any("/notes/" in h["path"] or h["path"].endswith("warranty.md") for h in hits)
    assert ragidx("check", "--index", index).stdout.strip() == "generation 2: ok"
    assert_one_line_error(
        ragidx("rm", corpus / "notes", "--index", index, check=False), "no indexed document"
    )


def live_vectors(index: Path) -> dict[int, np.ndarray]:
    """Chunk id -> stored vector of every chunk, through the index's own reader."""
    from ragidx.indexer.storage.reader import IndexReader

    reader = IndexReader(index)
    ids, vectors = reader.load_vectors().live_vectors()
    reader.close()
    return dict(zip(ids.tolist(), vectors, strict=True))


def test_index_types_convert_without_the_model_and_delete_per_type(workspace):
    corpus, index = workspace
    before, hits = live_vectors(index), search_all(index, QUERIES)
    no_model = {"RAGIDX_MODEL": "/no/such/model"}
    for kind in ("hnsw", "ivf", "flat"):
        out = ragidx("build", corpus, "--index", index, "--index-type", kind, "--json", env=no_model).stdout
        summary = json.loads(out)
        assert summary["vector_index"]["kind"] == kind and summary["vector_index_rebuilt"].startswith(
            "index type"
        )
        assert summary["unchanged"] == 13 and summary["chunks"] == 0  # nothing re-embedded
        after = live_vectors(index)
        assert after.keys() == before.keys()
        assert all(np.array_equal(after[i], before[i]) for i in before)
        assert search_all(index, QUERIES) == hits  # a few dozen chunks: efSearch and IVF's one list see all
    ragidx("build", corpus, "--index", index, "--index-type", "hnsw", "--ef-search", "7", env=no_model)
    assert json.loads(ragidx("info", "--index", index, "--json").stdout)["vector_index"]["ef_search"] == 7
    out = ragidx("rm", corpus / "faq" / "warranty.md", "--index", index).stdout
    assert "1 document removed" in out
    with sqlite3.connect(index / "ragidx.db") as db:
        tombstones = {row[0] for row in db.execute("select chunk_id from deletions")}
    assert tombstones and tombstones == before.keys() - live_vectors(index).keys()
    assert ragidx("check", "--index", index).stdout.strip().endswith(": ok")
    args = ("query", "warranty", "--index", index, "--mode", "dense", "--json", "-k", "1000")
    for tuning in ((), ("--ef-search", "1"), ("--ef-search", "500")):
        found = {h["chunk_id"] for h in json.loads(ragidx(*args, *tuning).stdout)}
        assert found == before.keys() - tombstones  # k above the chunk count: all live chunks


def test_check_finds_and_repairs_damage(workspace, tiny_models):
    import faiss

    corpus, index = workspace
    assert ragidx("check", "--index", index).returncode == 0
    (index / "vectors-9.faiss.partial").write_bytes(b"left by a crash")
    vectors = faiss.read_index(str(index / "vectors-1.faiss"))
    victim = int(faiss.vector_to_array(vectors.id_map)[0])
    original = vectors.reconstruct(victim)
    vectors.remove_ids(faiss.IDSelectorBatch(np.array([victim], dtype=np.int64)))
    extra = np.ones((1, vectors.d), dtype=np.float32) / np.sqrt(vectors.d)
    vectors.add_with_ids(extra, np.array([999_999], dtype=np.int64))
    faiss.write_index(vectors, str(index / "vectors-1.faiss"))
    with sqlite3.connect(index / "ragidx.db") as db:
        db.execute("delete from chunks_terms where rowid = ?", [victim])
        db.execute(
            "update documents set chunk_count = chunk_count + 5 where id = (select min(id) from documents)"
        )
    found = json.loads(ragidx("check", "--index", index, "--json", check=False).stdout)
    assert not found["healthy"]
    kinds = {p["kind"] for p in found["problems"]}
    assert kinds == {
        "stale-files",
        "lexical-index",
        "chunk-counts",
        "vectors",  # the file was changed behind ragidx's back: its checksum is not the recorded one
        "chunks-without-vectors",  # so none of its vectors is trusted
    }
    assert any("is not the one this index wrote" in p["detail"] for p in found["problems"])
    repaired = ragidx("check", "--repair", "--index", index, check=False)
    assert repaired.returncode == 0, repaired.stdout
    assert ragidx("check", "--index", index).stdout.strip() == "generation 2: ok"
    # the untrusted segment dropped, every chunk re-embedded into a new one from its stored text
    assert sorted(p.name for p in index.glob("vectors-*")) == ["vectors-2.faiss"]
    restored = {chunk_id: vector for chunk_id, vector in stored_vectors(index).values()}
    assert 999_999 not in restored
    np.testing.assert_allclose(restored[victim], original, atol=1e-5)
    assert build(corpus, index, tiny_models["qwen2"])["unchanged"] == 13  # nothing was lost to re-add


def test_auto_strategy_is_the_models_default_at_every_length(tmp_path, tiny_models, sample_corpus):
    short = tmp_path / "short"
    short.mkdir()
    for i, line in enumerate(["Cats purr.", "Dogs bark at night.", "Birds sing at dawn."]):
        (short / f"{i}.txt").write_text(line)
    summary = build(short, tmp_path / "short-index", tiny_models["qwen2"], "--strategy", "auto")
    reason = "auto: default for decoder models, also for long documents (htp lost to it on meetings)"
    assert (summary["strategy"], summary["strategy_reason"]) == ("aligned-wva", reason)
    long_docs = tmp_path / "long"
    long_docs.mkdir()
    for source in sorted(sample_corpus.glob("*/*.md"))[:3]:
        (long_docs / source.name).write_text(source.read_text() * 12)  # over 1,024 tokens each
    long = build(long_docs, tmp_path / "long-index", tiny_models["qwen2"], "--strategy", "auto")
    assert (long["strategy"], long["strategy_reason"]) == ("aligned-wva", reason)
    info = json.loads(ragidx("info", "--index", tmp_path / "long-index", "--json").stdout)
    assert (info["strategy"], info["strategy_reason"]) == ("aligned-wva", reason)
    again = ragidx("build", long_docs, "--index", tmp_path / "long-index", "--strategy", "auto")
    assert again.stdout.startswith("0 new, 0 updated, 3 unchanged, 0 removed")


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_build_killed_inside_the_commit_leaves_the_previous_generation(workspace, tiny_models, point):
    corpus, index = workspace
    before = search_all(index, QUERIES)
    (corpus / "faq" / "shipping.txt").write_text("Parcels ship within two days by bicycle courier.\n")
    args = [RAGIDX, "build", str(corpus), "--model", str(tiny_models["qwen2"]), "--index", str(index)]
    killed = subprocess.run(args, env={**child_env(), "RAGIDX_KILL_AT": point}, capture_output=True)
    assert killed.returncode == -9
    assert search_all(index, QUERIES) == before
    assert json.loads(ragidx("info", "--index", index, "--json").stdout)["generation"] == 1
    summary = build(corpus, index, tiny_models["qwen2"])
    assert summary["generation"] == 2 and summary["updated"] == 1
    assert sorted(p.name for p in index.glob("vectors-*")) == ["vectors-1.faiss", "vectors-2.faiss"]


@pytest.fixture(scope="module")
def segmented(built, tiny_models, tmp_path_factory) -> Path:
    """The built corpus after two one-document updates: a large segment and two of one vector,
    which the next update merges in the background."""
    from ragidx.app import Index

    root = tmp_path_factory.mktemp("segmented")
    shutil.copytree(built / "corpus", root / "corpus")
    shutil.copytree(built / "index", root / "index")
    with sqlite3.connect(root / "index" / "ragidx.db") as db:
        db.execute("update documents set path = replace(path, ?, ?)", [str(built), str(root)])
    for i, text in enumerate(["Parcels ship by bicycle courier.", "Returns are free for thirty days."]):
        (root / "corpus" / "faq" / f"extra{i}.txt").write_text(text + "\n")
        report = Index.update(
            [root / "corpus"], root / "index", model=str(tiny_models["qwen2"]), progress=False
        )
        assert report.segments == 2 + i
    return root


@pytest.mark.parametrize("point", [*MERGE_KILL_POINTS, "sqlite-commit"])
def test_a_build_killed_while_merging_segments_leaves_the_previous_generation(
    segmented, tmp_path, tiny_models, point
):
    """The third update merges the two small segments while it embeds: killed while the merge
    writes its file, after it renamed it, or inside the commit, the third generation never appears."""
    from ragidx.app import Index

    shutil.copytree(segmented / "corpus", tmp_path / "corpus")
    shutil.copytree(segmented / "index", tmp_path / "index")
    corpus, index = tmp_path / "corpus", tmp_path / "index"
    with sqlite3.connect(index / "ragidx.db") as db:
        db.execute("update documents set path = replace(path, ?, ?)", [str(segmented), str(tmp_path)])
    before, vectors = search_all(index, QUERIES), segment_vectors(index)
    (corpus / "faq" / "extra2.txt").write_text("Gift cards never expire.\n")
    args = [RAGIDX, "build", str(corpus), "--model", str(tiny_models["qwen2"]), "--index", str(index)]
    killed = subprocess.run(args, env={**child_env(), "RAGIDX_KILL_AT": point}, capture_output=True)
    assert killed.returncode == -9
    assert search_all(index, QUERIES) == before
    after = segment_vectors(index)
    assert after.keys() == vectors.keys() and all(np.array_equal(after[i], vectors[i]) for i in vectors)
    report = Index.update([corpus], index, model=str(tiny_models["qwen2"]), progress=False)
    assert (report.generation, len(report.changes.new), report.segments) == (4, 1, 3)
    assert report.segments_merged == "2 segments into one of 2 vectors"
    assert Index.check(index).healthy
    assert sorted(p.name for p in index.glob("vectors-*")) == [
        "vectors-1.faiss",
        "vectors-4-merged.faiss",
        "vectors-4.faiss",
    ]


def test_queries_during_a_build_see_the_last_committed_generation(workspace, tiny_models):
    corpus, index = workspace
    old = search_all(index, QUERIES)
    for i in range(4):
        shutil.copytree(corpus / "notes", corpus / f"more{i}")
    # --no-tune: weights tuned after the commit would be a third state, new rows under old weights
    args = [
        RAGIDX,
        "build",
        str(corpus),
        "--model",
        str(tiny_models["qwen2"]),
        "--index",
        str(index),
        "--no-tune",
    ]
    writer = subprocess.Popen(
        [*args, "--batch-size", "2"], env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    seen = []
    try:
        time.sleep(1.0)
        second = ragidx(*args[1:], check=False)
        assert_one_line_error(second, "is locked")
        while writer.poll() is None:
            seen.append(search_all(index, QUERIES))
    finally:
        writer.wait(timeout=300)
    assert writer.returncode == 0, writer.stderr.read()
    new = search_all(index, QUERIES)
    # each search reads one committed generation (the build may commit between two queries)
    per_query = [result for results in seen for result in zip(results, old, new, strict=True)]
    assert seen and all(result in (before, after) for result, before, after in per_query)
    assert seen[0] == old

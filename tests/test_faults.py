"""Faults found by trying ragidx as a fault tester would: unreadable folders, unnormalised paths,
lost and damaged vectors, failed first builds, closed pipes, silent long builds. Through the
real CLI in subprocesses."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sqlite3
import subprocess

import numpy as np
import pytest

from tests.support.child_setup import prepared, without_root_powers
from tests.support.cli import RAGIDX, assert_one_line_error, child_env, ragidx, ragidx_powerless
from tests.support.index_files import stored_vectors
from tests.support.lifecycle import QUERIES, build, search_all

F_SETPIPE_SZ = 1031  # Linux fcntl: a pipe's capacity
PIPE_BYTES = 4096


def test_a_folder_that_cannot_be_read_keeps_its_documents_and_is_reported(workspace, tiny_models):
    corpus, index = workspace
    notes = corpus / "notes"
    notes.chmod(0)
    try:
        probe = subprocess.run(prepared(without_root_powers, ["ls", notes]), capture_output=True)
        if probe.returncode == 0:
            pytest.skip("this machine lets the test's user read a folder with mode 000")
        result = ragidx_powerless(
            "build", corpus, "--index", index, "--model", tiny_models["qwen2"], "--json"
        )
    finally:
        notes.chmod(0o755)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["removed"], summary["total_documents"]) == (0, 13)
    assert summary["skipped"] == [{"path": str(notes), "reason": "unreadable folder: Permission denied"}]
    readable_again = build(corpus, index, tiny_models["qwen2"])
    assert (readable_again["unchanged"], readable_again["removed"], readable_again["new"]) == (13, 0, 0)


def test_the_same_files_under_another_spelling_or_a_link_are_not_indexed_twice(
    workspace, tiny_models, tmp_path
):
    corpus, index = workspace
    (tmp_path / "link").symlink_to(corpus)
    for spelling in (corpus / "." / "faq" / ".." / "faq", tmp_path / "link" / "notes"):
        summary = build(spelling, index, tiny_models["qwen2"])
        assert (summary["new"], summary["removed"], summary["total_documents"]) == (0, 0, 13), spelling
    (corpus / "faq" / "new.md").write_text("# Gift cards\n\nGift cards never expire and can be shared.\n")
    added = ragidx("build", tmp_path / "link" / "faq" / ".." / "faq", "--index", index).stdout
    assert added.startswith("1 new, 0 updated, 5 unchanged, 0 removed\nembedded 1 document as 1 chunk (")
    assert "14 documents" in added and "1 documents" not in added  # counts agree with their nouns
    hits = json.loads(ragidx("query", "gift cards", "--index", index, "--mode", "lexical", "--json").stdout)
    texts = [hit["text"] for hit in hits]  # a file indexed twice would repeat its chunks
    assert hits[0]["path"] == str(corpus / "faq" / "new.md") and len(set(texts)) == len(texts)
    out = ragidx("rm", tmp_path / "link" / "faq" / "new.md", "--index", index).stdout
    assert "1 document removed" in out


def test_a_rebuild_without_model_keeps_the_index_model(workspace, tiny_models):
    corpus, index = workspace
    no_default = {"RAGIDX_MODEL": "/no/such/model"}  # where a rebuild used to go
    summary = json.loads(
        ragidx("build", corpus, "--index", index, "--rebuild", "--json", env=no_default).stdout
    )
    assert summary["model"] == str(tiny_models["qwen2"]) and summary["chunks"] > 0
    assert summary["strategy"] == "aligned-wva"


def test_lost_and_damaged_vectors_are_found_and_re_embedded(workspace, tiny_models):
    import faiss

    corpus, index = workspace
    before, hits = stored_vectors(index), search_all(index, QUERIES)
    (index / "vectors-1.faiss").unlink()
    assert_one_line_error(
        ragidx("query", "tides", "--index", index, "--mode", "dense", check=False),
        r"vectors-1\.faiss is missing.*check --repair",
    )
    found = json.loads(ragidx("check", "--index", index, "--json", check=False).stdout)
    assert {p["kind"] for p in found["problems"]} == {"vectors", "chunks-without-vectors"}
    rebuilt = build(corpus, index, tiny_models["qwen2"])  # nothing changed on disk
    assert rebuilt["restored"] == rebuilt["total_chunks"] == len(before) and rebuilt["unchanged"] == 13
    assert search_all(index, QUERIES) == hits
    vectors = faiss.read_index(str(index / "vectors-2.faiss"))
    first, second = sorted(faiss.vector_to_array(vectors.id_map))[:2]
    damaged = {first: np.full(vectors.d, np.nan), second: np.full(vectors.d, 0.5)}
    vectors.remove_ids(faiss.IDSelectorBatch(np.array(list(damaged), dtype=np.int64)))
    vectors.add_with_ids(np.stack(list(damaged.values())).astype(np.float32), np.array(list(damaged)))
    faiss.write_index(vectors, str(index / "vectors-2.faiss"))
    with sqlite3.connect(index / "ragidx.db") as db:
        db.execute(
            "update documents set chunk_count = chunk_count + 1 where id = (select min(id) from documents)"
        )
    found = ragidx("check", "--index", index, check=False).stdout.splitlines()
    chunks = len(before)  # all in vectors-2.faiss, which no longer has the checksum it was written with
    assert found == [
        "found: chunk-counts: 1 document with a wrong chunk count",
        f"found: vectors: vector file {index}/vectors-2.faiss is not the one this index wrote (its "
        "checksum differs): run `ragidx check --repair` to re-embed its chunks",
        f"found: chunks-without-vectors: {chunks} chunks",
        "generation 2: problems remain",
    ]
    repaired = ragidx("check", "--repair", "--index", index).stdout
    assert f"repaired: re-embedded: {chunks} chunks from their stored text" in repaired
    assert ragidx("check", "--index", index).stdout.strip() == "generation 3: ok"
    after = stored_vectors(index)
    for key, (_, vector) in before.items():
        np.testing.assert_allclose(after[key][1], vector, atol=1e-5)
    assert search_all(index, QUERIES) == hits


def test_a_first_build_that_fails_leaves_nothing_and_one_story(tmp_path, sample_corpus):
    index = tmp_path / "new" / "index"
    assert_one_line_error(
        ragidx("build", sample_corpus, "--model", tmp_path / "no-model", "--index", index, check=False),
        "model",
    )
    assert not (tmp_path / "new").exists()
    for command in ("query", "check", "info"):
        args = (command, "x") if command == "query" else (command,)
        assert_one_line_error(
            ragidx(*args, "--index", index, check=False), "no index at .*no build has completed"
        )


def test_a_closed_pipe_ends_the_output_quietly(workspace):
    _, index = workspace
    args = ["query", "the tides", "--index", str(index), "--mode", "dense", "--jsonl", "-k", "1000"]
    assert len(ragidx(*args).stdout) > 4 * PIPE_BYTES  # more than the pipe holds: the writer must block
    read_end, write_end = os.pipe()
    fcntl.fcntl(read_end, F_SETPIPE_SZ, PIPE_BYTES)
    reader = subprocess.Popen([RAGIDX, *args], stdout=write_end, stderr=subprocess.PIPE, env=child_env())
    os.close(write_end)
    os.read(read_end, 10)
    os.close(read_end)  # as `| head -c 10` does
    assert reader.wait(timeout=120) == 0 and reader.stderr.read() == b""


def test_a_long_build_off_a_terminal_prints_progress_lines(tmp_path, tiny_models, sample_corpus):
    shutil.copytree(sample_corpus / "notes", tmp_path / "notes")
    result = ragidx(
        "build",
        tmp_path / "notes",
        "--model",
        tiny_models["qwen2"],
        "--index",
        tmp_path / "index",
        "--batch-size",
        "2",
        env={"RAGIDX_PROGRESS_SECONDS": "0"},
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("embedding: ")]
    shares = [int(re.search(r"\((\d+)%\)", line).group(1)) for line in lines]
    chunks = [int(re.search(r", chunks (\d+),", line).group(1)) for line in lines if ", chunks " in line]
    assert len(lines) >= 3 and shares == sorted(shares) and shares[-1] == 100, result.stderr
    assert chunks == sorted(chunks) and len(set(chunks)) >= 3  # moves with every forward, not per document
    assert re.match(r"embedding: \d+ kB of \d+ kB \(100%\), chunks \d+, tok/s \d+, \d+ s$", lines[-1])
    summary = int(re.search(r"as (\d+) chunks", result.stdout).group(1))
    assert chunks[-1] == summary  # the last line shows the final count, as the summary does
    assert "\r" not in result.stderr


def test_progress_lines_keep_coming_through_a_long_forward_pass(monkeypatch):
    """A forward pass can take minutes (htp's long inputs): the timer prints the elapsed time
    meanwhile, and the last line has the final counts."""
    import io
    import time

    from ragidx.indexer import progress

    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.1)
    out = io.StringIO()
    with progress.ProgressLines(1000, "embedding", "B", out, interval=0.2, scale=True) as bar:
        time.sleep(0.9)  # no update at all: one long batch
        bar.update(1000)
        bar.set_postfix(chunks=7)
    lines = out.getvalue().splitlines()
    assert len([line for line in lines if line.startswith("embedding: 0 kB of 1 kB (0%)")]) >= 3
    assert re.match(r"embedding: 1 kB of 1 kB \(100%\), chunks 7, \d+ s$", lines[-1])

"""``--store milvus`` on milvus-lite: the same answers as local segments through builds, updates,
removals, filters, hybrid search and repairs; crashes around the commit; bad input; a server
answering while a build writes. Builds and queries run through the Python API in this process
(which lets go of a milvus-lite file on close), kills and error lines through the CLI. Skipped
where pymilvus or milvus-lite is not installed."""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragidx.app import Index, RagidxError
from ragidx.indexer.faults import MILVUS_KILL_POINTS
from tests.support.cli import RAGIDX, assert_one_line_error, child_env, ragidx
from tests.support.lifecycle import QUERIES

pytest.importorskip("pymilvus", reason="--store milvus needs pymilvus")
pytest.importorskip("milvus_lite", reason="the tests run Milvus on milvus-lite")

MODES = ("dense", "hybrid", "lexical")
Answers = dict[str, list[list[tuple[int, float]]]]
MILVUS_CHILD = str(Path(__file__).parent / "support" / "milvus_child.py")  # one pymilvus call per run


def update(corpus: Path, index: Path, model: Path, **options: object) -> dict:
    """A build through the Python API, as ``build --json`` reports it."""
    return Index.update([corpus], index, model=str(model), tune=False, progress=False, **options).to_dict()


def answers(index: Path, path: str | None = None) -> Answers:
    """Each mode's top 5 (chunk id, score) for each query."""
    filters = {"path": [path]} if path else None
    with Index.open(index, device="cpu") as opened:
        return {
            mode: [
                [(h.chunk_id, round(h.score, 4)) for h in opened.search(q, k=5, mode=mode, filters=filters)]
                for q in QUERIES
            ]
            for mode in MODES
        }


def meta(index: Path, key: str) -> object:
    with sqlite3.connect(index / "ragidx.db") as db:
        return json.loads(db.execute("select value from meta where key = ?", [key]).fetchone()[0])


def direct(action: str, uri: str | Path, collection: str = "ragidx", argument: object = None) -> object:
    """One direct pymilvus call (tests/support/milvus_child.py), in a child process: this one must not
    hold a milvus-lite file open."""
    args = [
        sys.executable,
        MILVUS_CHILD,
        action,
        str(uri),
        collection,
    ]
    result = subprocess.run(
        [*args, *([json.dumps(argument)] if argument is not None else [])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def collection_rows(index: Path) -> dict[int, dict]:
    """Every row of the index's collection, read with pymilvus directly."""
    store = meta(index, "store")
    return {int(key): row for key, row in direct("rows", store["uri"], store["collection"]).items()}


def problems(index: Path, repair: bool = False) -> list[tuple[str, str]]:
    return [(p.kind, p.detail) for p in Index.check(index, repair=repair, device="cpu").problems]


@pytest.fixture
def corpus(tmp_path, sample_corpus) -> Path:
    shutil.copytree(sample_corpus, tmp_path / "corpus")
    return tmp_path / "corpus"


@pytest.fixture
def in_milvus(corpus, tmp_path, tiny_models) -> Path:
    """The sample corpus in Milvus (milvus-lite in the index folder)."""
    summary = update(corpus, tmp_path / "milvus", tiny_models["qwen2"], store="milvus")
    assert summary["store"]["kind"] == "milvus" and summary["store"]["uri"] == str(
        tmp_path / "milvus" / "milvus.db"
    )
    return tmp_path / "milvus"


@pytest.fixture
def in_segments(corpus, tmp_path, tiny_models) -> Path:
    update(corpus, tmp_path / "local", tiny_models["qwen2"])
    return tmp_path / "local"


def test_milvus_answers_as_local_segments_do_through_updates(corpus, in_milvus, in_segments, tiny_models):
    assert answers(in_milvus) == answers(in_segments)
    assert answers(in_milvus, "*/faq/*") == answers(in_segments, "*/faq/*")
    rows = collection_rows(in_milvus)
    with Index.open(in_milvus, device="cpu") as opened:
        hit = opened.search("tides", k=1, mode="lexical")[0]
    row = rows[hit.chunk_id]
    assert (row["path"], row["text"]) == (hit.path, hit.text) and len(row["vector"]) == 64
    (corpus / "faq" / "shipping.txt").write_text("Parcels ship within two days by bicycle courier.\n")
    (corpus / "faq" / "gifts.md").write_text("# Gift cards\n\nGift cards never expire.\n")
    (corpus / "notes" / "tides.md").unlink()
    for index in (in_segments, in_milvus):
        summary = update(corpus, index, tiny_models["qwen2"])
        assert (summary["new"], summary["updated"], summary["removed"]) == (1, 1, 1)
        with Index.open(index, device="cpu") as opened:
            opened.remove([corpus / "faq" / "warranty.md"])
    assert answers(in_milvus) == answers(in_segments)
    with Index.open(in_milvus, device="cpu") as opened:
        live = {hit.chunk_id for hit in opened.search("x", k=1000, mode="dense")}
        info = opened.info()
    assert sorted(collection_rows(in_milvus)) == sorted(live)  # the deletions were made
    assert info["generation"] == 3 and info["store"]["collection"] == "ragidx" and info["segments"] == []
    assert problems(in_milvus) == [] and not list(in_milvus.glob("vectors-*"))


def test_check_repairs_the_collection_and_refuses_another_index(in_milvus):
    before = answers(in_milvus)
    store = meta(in_milvus, "store")
    victims = sorted(collection_rows(in_milvus))[:2]
    direct("delete", store["uri"], store["collection"], victims)
    extra = {"chunk_id": 999_999, "vector": [0.125] * 64, "path": "x", "text": "x", "metadata": {}}
    direct("upsert", store["uri"], store["collection"], [extra])
    assert problems(in_milvus) == [
        ("vectors-without-chunks", "1 vector"),
        ("chunks-without-vectors", "2 chunks"),
    ]
    assert ("re-embedded", "2 chunks from their stored text") in problems(in_milvus, repair=True)
    assert problems(in_milvus) == [] and meta(in_milvus, "generation") == 2
    assert answers(in_milvus) == before
    holder = subprocess.Popen(
        [
            sys.executable,
            MILVUS_CHILD,
            "hold",
            store["uri"],
            "ragidx",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == '"holding"'
    locked = ragidx("query", "tides", "--index", in_milvus, check=False)
    holder.communicate("", timeout=60)
    assert_one_line_error(locked, "milvus-lite serves one process at a time")
    direct("owner", store["uri"], store["collection"], "someone-else")
    assert_one_line_error(
        ragidx("query", "tides", "--index", in_milvus, check=False), "belongs to another index"
    )
    direct("owner", store["uri"], store["collection"], store["index_id"])
    assert answers(in_milvus) == before


@pytest.mark.parametrize("point", MILVUS_KILL_POINTS)
def test_a_build_killed_around_the_milvus_commit(corpus, in_milvus, tiny_models, point):
    """Killed while upserting (before the commit): the previous generation, whole. Killed before
    the deletions (after the commit): the new generation, its owed rows excluded; the next
    writer settles them."""
    before = answers(in_milvus)
    (corpus / "faq" / "shipping.txt").write_text("Parcels ship within two days by bicycle courier.\n")
    args = [RAGIDX, "build", corpus, "--model", tiny_models["qwen2"], "--index", in_milvus, "--no-tune"]
    killed = subprocess.run(
        list(map(str, args)), env={**child_env(), "RAGIDX_KILL_AT": point}, capture_output=True
    )
    assert killed.returncode == -9
    committed = point == "milvus-delete"
    assert meta(in_milvus, "generation") == (2 if committed else 1)
    assert bool(meta(in_milvus, "milvus_owed")) == committed
    seen = answers(in_milvus)
    assert (seen == before) != committed
    summary = update(corpus, in_milvus, tiny_models["qwen2"])  # settles what is owed, embeds what is not
    assert summary["generation"] == 2 and meta(in_milvus, "milvus_owed") is None
    assert (answers(in_milvus) == seen) == committed
    assert problems(in_milvus) == [] and len(collection_rows(in_milvus)) == summary["total_chunks"]


def test_bad_milvus_input_is_one_line_and_keeps_the_index(corpus, in_segments, tiny_models, tmp_path):
    fresh = tmp_path / "fresh"
    base = ("build", corpus, "--index", fresh, "--model", tiny_models["qwen2"], "--store", "milvus")
    unreachable = ragidx(*base, "--milvus-uri", "http://127.0.0.1:1", check=False)
    assert_one_line_error(unreachable, r"cannot reach Milvus at http://127\.0\.0\.1:1")
    assert not fresh.exists()
    other = tmp_path / "other.db"
    direct("create-foreign", other, "ragidx", 64)
    taken = ragidx(*base, "--milvus-uri", other, check=False)
    assert_one_line_error(taken, r"collection 'ragidx' at .*other\.db already exists")
    assert not fresh.exists()
    with pytest.raises(
        RagidxError, match="keeps its vectors in local segments; pass --rebuild to move them to Milvus"
    ):
        update(corpus, in_segments, tiny_models["qwen2"], store="milvus")
    with pytest.raises(RagidxError, match="--milvus-uri needs --store milvus"):
        update(corpus, in_segments, tiny_models["qwen2"], store="local", milvus_uri="x.db")
    assert meta(in_segments, "generation") == 1 and problems(in_segments) == []


def scores(found: Answers) -> dict[str, list[list[float]]]:
    return {mode: [[score for _, score in hits] for hits in lists] for mode, lists in found.items()}


def test_a_rebuild_moves_the_vectors_between_stores(corpus, in_segments, tiny_models):
    expected = scores(answers(in_segments))
    moved = update(corpus, in_segments, tiny_models["qwen2"], rebuild=True, store="milvus")
    assert moved["store"]["kind"] == "milvus" and not list(in_segments.glob("vectors-*"))
    assert scores(answers(in_segments)) == expected  # the same vectors under new chunk ids
    back = update(corpus, in_segments, tiny_models["qwen2"], rebuild=True, store="local")
    assert back["store"] == {"kind": "local"} and back["segments"] == 1
    assert scores(answers(in_segments)) == expected
    assert "ragidx" not in direct("collections", in_segments / "milvus.db")  # the moved-from one dropped


@pytest.fixture
def milvus_server(tmp_path):
    """milvus-lite's gRPC server on a free port (what `--milvus-uri http://...` talks to)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        str(Path(sys.executable).with_name("milvus-lite")),
        "server",
        "--data-dir",
        str(tmp_path / "server"),
    ]
    server = subprocess.Popen(
        [*command, "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as client:
            if client.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    else:
        server.kill()
        pytest.skip("milvus-lite's server did not start")
    yield f"http://127.0.0.1:{port}"
    server.kill()
    server.wait()


def hit_sets(found: Answers) -> tuple[frozenset[int], ...]:
    return tuple(frozenset(chunk_id for chunk_id, _ in hits) for mode in MODES for hits in found[mode])


def test_a_milvus_server_answers_queries_while_a_build_writes(milvus_server, corpus, tiny_models, tmp_path):
    index = tmp_path / "index"
    args = ("build", corpus, "--model", tiny_models["qwen2"], "--index", index, "--no-tune")
    exact = ("--index-type", "flat")  # AUTOINDEX may answer approximately, and differently as rows come
    out = ragidx(*args, "--store", "milvus", "--milvus-uri", milvus_server, *exact).stdout
    assert f"vectors: Milvus collection 'ragidx' at {milvus_server}, index FLAT\n" in out
    before = answers(index)
    for i in range(3):
        shutil.copytree(corpus / "notes", corpus / f"more{i}")
    writer = subprocess.Popen(
        [RAGIDX, *map(str, args), "--batch-size", "2"],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen = []
    while writer.poll() is None:  # this process searches the collection the build writes to
        seen.append(hit_sets(answers(index)))
    assert writer.returncode == 0, writer.stderr.read().decode()
    # Each search sees one generation or the next, never a mix (as sets: the server may break
    # ties or round differently as its rows move from memory to segments).
    assert set(seen) <= {hit_sets(before), hit_sets(answers(index))} and hit_sets(before) in seen
    with Index.open(index, device="cpu") as opened:
        paths = {hit.path.split("/")[-2] for hit in opened.search("tides", k=50, mode="lexical")}
    assert paths >= {"notes", "more0", "more1", "more2"} and problems(index) == []


def test_a_search_overtaken_by_a_commit_reads_the_new_generation(
    milvus_server, corpus, tiny_models, tmp_path, monkeypatch
):
    """The race above, made certain: a build commits and deletes the rows of a changed document
    between a reader's snapshot and its Milvus search; the reader notices and searches again."""
    from ragidx.indexer.storage.milvus.store import MilvusVectors

    index = tmp_path / "index"
    args = ("build", corpus, "--model", tiny_models["qwen2"], "--index", index, "--no-tune")
    ragidx(*args, "--store", "milvus", "--milvus-uri", milvus_server, "--index-type", "flat")
    (corpus / "faq" / "password-reset.html").write_text("<p>The password reset link expires in a day.</p>")
    searched = MilvusVectors.search
    calls = []

    def build_first(self, *search_args, **options):
        if not calls:
            ragidx(*args)  # commits, then deletes the changed document's old rows
        calls.append(self.expression)
        return searched(self, *search_args, **options)

    monkeypatch.setattr(MilvusVectors, "search", build_first)
    with Index.open(index, device="cpu") as opened:
        hits = [(h.chunk_id, h.text) for h in opened.search("password reset link", k=200, mode="dense")]
    assert len(calls) == 2 and calls[0] != calls[1]  # read again, with the new generation's filter
    monkeypatch.setattr(MilvusVectors, "search", searched)
    with Index.open(index, device="cpu") as opened:
        again = opened.search("password reset link", k=200, mode="dense")
        assert hits == [(h.chunk_id, h.text) for h in again] and len(hits) == opened.info()["chunks"]
    assert "The password reset link expires in a day." in [text for _, text in hits]  # every chunk

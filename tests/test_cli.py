"""The installed ``ragidx`` console script, end to end, in subprocesses."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import RAGIDX, assert_one_line_error, child_env, ragidx


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_models, sample_corpus):
    """The sample corpus indexed with the tiny Qwen2 model and the default strategy."""
    index = tmp_path_factory.mktemp("cli") / "index"
    result = ragidx("build", sample_corpus, "--model", tiny_models["qwen2"], "--index", index, "--json")
    return index, json.loads(result.stdout)


def top_hit(index: Path, text: str) -> dict:
    return json.loads(ragidx("query", text, "--index", index, "--json", "-k", "3", "--mode", "dense").stdout)[
        0
    ]


def test_help_does_not_import_heavy_libraries():
    code = (
        "import sys\nfrom ragidx import cli\nsys.argv = ['ragidx', '--help']\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'faiss', 'spacy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]")


def test_build_summary_and_info(built, tiny_models, sample_corpus):
    from ragidx.indexer.strategies.value_aggregation import FUTUREEOL_TEMPLATE

    index, summary = built
    n_files = len([p for p in sample_corpus.rglob("*") if p.is_file()])
    assert summary["documents"] == n_files and summary["skipped"] == []
    assert summary["strategy"] == "aligned-wva" and summary["strategy_reason"] == "default for decoder models"
    info = json.loads(ragidx("info", "--index", index, "--json").stdout)
    assert info["model"] == str(tiny_models["qwen2"]) and info["strategy"] == "aligned-wva"
    assert info["strategy_params"]["document_template"] == FUTUREEOL_TEMPLATE
    assert info["strategy_params"]["query_template"] == info["strategy_params"]["document_template"]
    assert info["chunks"] == summary["chunks"] and info["documents"] == n_files and info["dimension"] == 64


def test_a_chunks_own_text_retrieves_it_first(built):
    index, _ = built
    with sqlite3.connect(index / "ragidx.db") as db:
        rows = db.execute(
            "select c.id, c.text, c.char_start, c.char_end, d.path from chunks c "
            "join documents d on d.id = c.document_id order by c.id limit 40"
        ).fetchall()
    for chunk_id, text, start, end, path in rows[::20]:  # each query is a process start and model load
        hit = top_hit(index, text)
        assert hit["chunk_id"] == chunk_id and hit["score"] == pytest.approx(1.0, abs=1e-4)
        assert (hit["path"], hit["span"], hit["text"]) == (path, [start, end], text)
        if path.endswith((".md", ".txt")):
            assert Path(path).read_text(encoding="utf-8")[start:end] == text


def test_human_query_output(built):
    index, _ = built
    out = ragidx("query", "lighthouse lenses", "--index", index, "-k", "2").stdout.splitlines()
    assert len(out) == 4 and re.match(r"^ 1  \d\.\d{4}  \S+:\d+-\d+  ", out[0])
    assert "\x1b[" not in "".join(out)  # not a terminal: plain text


def test_query_explain_in_human_and_json_output(built):
    index, _ = built
    args = ("query", "lighthouse lenses", "--index", index, "-k", "2", "--explain")
    out = ragidx(*args).stdout.splitlines()
    why = r"^    why: dense (#\d+ \S+|-), lexical (#\d+ \S+|-); rrf \d\.\d{4} \("
    assert len(out) == 6 and re.match(why, out[2])
    hits = json.loads(ragidx(*args, "--json").stdout)
    from ragidx.app import Index

    with Index.open(index) as opened:
        expected = opened.search("lighthouse lenses", k=2, explain=True)
    assert [h["explain"] for h in hits] == [hit.to_dict()["explain"] for hit in expected]
    assert out[2] == f"    why: {expected[0].explain.describe()}"


def run_on_terminal(args: list[str], env: dict[str, str] | None = None) -> str:
    """Run ragidx with stdout on a pseudo-terminal and return what it printed."""
    main, child = pty.openpty()
    process = subprocess.Popen(
        [RAGIDX, *args], env={**child_env(), **(env or {})}, stdin=subprocess.DEVNULL, stdout=child
    )
    os.close(child)
    out = b""
    while True:
        try:
            data = os.read(main, 4096)
        except OSError:  # EIO once the child has exited and closed the terminal
            break
        if not data:
            break
        out += data
    process.wait(timeout=120)
    os.close(main)
    assert process.returncode == 0
    return out.decode()


def test_query_words_are_highlighted_on_a_terminal_unless_no_color(built):
    index, _ = built
    args = ["query", "forgot password", "--index", str(index), "-k", "1", "--mode", "lexical"]
    coloured = run_on_terminal(args)
    assert re.search(r"\x1b\[[0-9;]*m(?:forgot|password)\x1b\[0m", coloured, re.IGNORECASE), coloured
    plain = run_on_terminal(args, env={"NO_COLOR": "1"})
    assert "\x1b[" not in plain and "password" in plain.lower()


def test_query_filters_min_score_and_jsonl(built):
    index, _ = built
    lines = ragidx(
        "query",
        "password",
        "--index",
        index,
        "-k",
        "3",
        "--mode",
        "dense",  # the random model's vectors find the account pages that keywords miss
        "--jsonl",
        "--path",
        "faq/*",
        "--ext",
        "html",
        "--ext",
        "markdown",
        "--meta",
        "category=account",
    ).stdout.splitlines()
    hits = [json.loads(line) for line in lines]
    assert sorted(Path(h["path"]).name for h in hits) == ["delete-account.markdown", "password-reset.html"]
    assert all(h["metadata"]["category"] == "account" and h["snippet"]["text"] for h in hits)
    floor = (hits[0]["score"] + hits[1]["score"]) / 2
    account = ("--meta", "category=account", "--mode", "dense", "--json")
    kept = json.loads(ragidx("query", "password", "--index", index, *account, "--min-score", floor).stdout)
    assert [h["chunk_id"] for h in kept] == [hits[0]["chunk_id"]]  # the other is below the floor
    none = ragidx("query", "password", "--index", index, "--meta", "category=none")
    assert none.stdout == "" and none.stderr.strip() == "no results"
    for args, message in (
        (["--meta", "category"], "--meta expects KEY=VALUE"),
        (["--meta", "bad key=x"], "metadata key"),
        (["--json", "--jsonl"], "exclude each other"),
    ):
        assert_one_line_error(ragidx("query", "password", "--index", index, *args, check=False), message)


def test_embed_with_an_index_or_a_model_agree(built, tiny_models):
    index, _ = built
    with_index = json.loads(ragidx("embed", "tides and the moon", "--index", index, "--json").stdout)
    without = json.loads(
        ragidx("embed", "tides and the moon", "--model", tiny_models["qwen2"], "--json").stdout
    )
    assert np.allclose(with_index, without, atol=1e-6) and np.array(with_index).shape == (1, 64)
    plain = ragidx("embed", "a", "b", "--index", index).stdout.splitlines()
    assert len(plain) == 2 and len(plain[0].split()) == 64


def test_strategies_lists_every_strategy():
    out = ragidx("strategies").stdout
    for name in ("mean", "last", "prompteol"):
        assert re.search(rf"^{name}\s+\S", out, re.MULTILINE)
    assert re.search(
        r"^htp .*\n\s+options: --rewire --exit-layer --placeholder-init --sink --block-sentences$",
        out,
        re.MULTILINE,
    )
    listed = {row["name"]: row["options"] for row in json.loads(ragidx("strategies", "--json").stdout)}
    assert listed["mean"] == [] and listed["kv-embedding"] == ["layers", "kv_bias"]


def test_settings_mismatches_are_refused(built, tiny_models, sample_corpus, tmp_path):
    index, _ = built
    assert_one_line_error(
        ragidx("query", "x", "--index", index, "--model", tiny_models["llama"], check=False),
        "--model .* does not match the index",
    )
    assert_one_line_error(
        ragidx("query", "x", "--index", index, "--strategy", "mean", check=False),
        "--strategy 'mean' does not match",
    )
    copy = tmp_path / "copy"
    shutil.copytree(index, copy)
    notes = tmp_path / "notes"
    shutil.copytree(sample_corpus / "notes", notes)
    args = ("build", notes, "--model", tiny_models["qwen2"], "--index", copy, "--strategy", "mean")
    assert_one_line_error(ragidx(*args, check=False), "other settings.*--rebuild")
    ragidx(*args, "--rebuild")
    assert json.loads(ragidx("info", "--index", copy, "--json").stdout)["strategy"] == "mean"


def test_bad_inputs_give_one_line_errors(tiny_models, tmp_path):
    model = tiny_models["qwen2"]
    assert_one_line_error(
        ragidx("build", tmp_path / "missing", "--model", model, "--index", tmp_path / "i", check=False),
        "path not found",
    )
    (tmp_path / "empty").mkdir()
    assert_one_line_error(
        ragidx("build", tmp_path / "empty", "--model", model, "--index", tmp_path / "i", check=False),
        "no readable documents",
    )
    binaries = tmp_path / "bin"
    binaries.mkdir()
    for i in range(3):
        (binaries / f"blob{i}.txt").write_bytes(bytes(range(256)) * 4)
    assert_one_line_error(
        ragidx("build", binaries, "--model", model, "--index", tmp_path / "i", check=False),
        r"no readable documents.*3 binary content",
    )
    readable = tmp_path / "readable"
    readable.mkdir()
    (readable / "a.md").write_text("Some words.")
    assert_one_line_error(
        ragidx("build", readable, "--model", tmp_path / "nomodel", "--index", tmp_path / "i", check=False),
        "does not exist",
    )
    assert_one_line_error(
        ragidx("build", readable, "--model", "no-org/no-model", "--index", tmp_path / "i", check=False),
        r"pass a model folder or a \.gguf file \(--model /path/to/model\)",
    )
    assert_one_line_error(ragidx("query", "x", "--index", tmp_path / "none", check=False), "no index at")
    if not shutil.which("nvidia-smi"):
        assert_one_line_error(
            ragidx(
                "build",
                readable,
                "--device",
                "cuda",
                "--model",
                model,
                "--index",
                tmp_path / "i",
                check=False,
            ),
            "no CUDA GPU",
        )


def test_unreadable_files_are_skipped_and_reported(tiny_models, sample_corpus, tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(sample_corpus / "faq", docs)
    os.symlink(docs / "gone.md", docs / "broken.md")
    (docs / "blob.txt").write_bytes(b"\x00" * 100)
    model = tiny_models["qwen2"]
    result = ragidx("build", docs, "--model", model.name, "--index", tmp_path / "i", cwd=model.parent)
    assert "skipped 2 paths:" in result.stdout
    assert "broken.md: unreadable" in result.stdout and "blob.txt: binary content" in result.stdout
    # The relative model folder is stored absolute, so the index works from any directory.
    assert json.loads(ragidx("info", "--index", tmp_path / "i", "--json").stdout)["model"] == str(
        model.resolve()
    )


def test_faiss_installed_twice_is_a_one_line_error_that_says_how_to_repair_it(built, tmp_path):
    """faiss-cpu and faiss-gpu-cu12 in one environment (what ``pip install faiss-cpu
    faiss-gpu-cu12`` makes) overwrite each other's files and ``import faiss`` raises inside SWIG's
    wrappers; a search that needs vectors names both and how to keep one. The broken package here
    raises what the real pair raised."""
    site = tmp_path / "site"
    (site / "faiss").mkdir(parents=True)
    (site / "faiss" / "__init__.py").write_text(
        "raise AttributeError(\"module 'faiss._swigfaiss' has no attribute 'delete_GpuResourcesVector'\")\n"
    )
    for name, version in (("faiss_cpu", "1.15.1"), ("faiss_gpu_cu12", "1.14.1.post1")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        metadata = f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
        (info / "METADATA").write_text(metadata)
    broken = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    index, _ = built
    query = ["query", "tides", "--index", index, "--no-daemon", "--mode"]
    result = ragidx(*query, "dense", check=False, env=broken)
    assert_one_line_error(
        result,
        r"faiss cannot be imported: faiss-cpu 1\.15\.1 and faiss-gpu-cu12 1\.14\.1\.post1 are installed "
        r"together .*delete_GpuResourcesVector.*; keep one: pip uninstall -y faiss-cpu faiss-gpu-cu12 && "
        r"pip install faiss-cpu \(or faiss-gpu-cu12 on a CUDA host\)$",
    )
    assert "tides" in ragidx(*query, "lexical", env=broken).stdout  # keyword search needs no faiss


def test_corrupt_database_is_a_one_line_error(built, tmp_path):
    index, _ = built
    broken = tmp_path / "broken"
    shutil.copytree(index, broken)
    (broken / "ragidx.db").write_bytes(b"garbage" * 1000)
    for leftover in broken.glob("ragidx.db-*"):
        leftover.unlink()
    for command in ("query", "info"):
        args = (command, "x", "--index", broken) if command == "query" else (command, "--index", broken)
        assert_one_line_error(ragidx(*args, check=False), "is not a ragidx index database")
    debug = ragidx("--debug", "info", "--index", broken, check=False)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def build_until(args: list[str], marker: bytes, timeout: float = 120.0) -> None:
    """Run a build on a pseudo-terminal (so progress bars show); SIGKILL it once ``marker`` is printed."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    process = subprocess.Popen(
        [RAGIDX, *args], env=child_env(), stdin=subprocess.DEVNULL, stdout=child, stderr=child
    )
    os.close(child)
    seen, deadline = b"", time.monotonic() + timeout
    try:
        while not re.search(marker, seen) and time.monotonic() < deadline:
            if select.select([main], [], [], 0.2)[0]:
                seen += os.read(main, 4096)
        assert re.search(marker, seen), seen.decode(errors="replace")[-500:]
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
        os.close(main)


def search_all(index: Path, queries: list[str]) -> list[list[tuple[int, float]]]:
    from ragidx.app import Index

    with Index.open(index) as opened:
        return [[(h.chunk_id, round(h.score, 5)) for h in opened.search(q, k=5)] for q in queries]


@pytest.mark.parametrize("marker", [b"embedding", rb"embedding:\s+[1-9]\d*%"])
def test_killed_build_leaves_the_previous_index_queryable(
    marker, built, tiny_models, sample_corpus, tmp_path
):
    index, _ = built
    copy = tmp_path / "index"
    shutil.copytree(index, copy)
    queries = ["keeping ships off the rocks", "compost heap smells", "password reset link"]
    before = search_all(copy, queries)
    bigger = tmp_path / "bigger"
    for i in range(6):
        shutil.copytree(sample_corpus, bigger / f"copy{i}")
    build_until(
        [
            "build",
            str(bigger),
            "--model",
            str(tiny_models["qwen2"]),
            "--index",
            str(copy),
            "--batch-size",
            "2",
        ],
        marker,
    )
    assert search_all(copy, queries) == before
    assert [p.name for p in copy.glob("vectors-*")] == ["vectors-1.faiss"]


def test_a_new_build_removes_leftovers_of_killed_ones(built, tiny_models, sample_corpus, tmp_path):
    index, _ = built
    copy = tmp_path / "index"
    shutil.copytree(index, copy)
    (copy / "vectors-2.faiss.partial").write_bytes(b"half-written")
    (copy / "vectors-7.faiss").write_bytes(b"from a crash after the FAISS write")
    ragidx("build", sample_corpus / "faq", "--model", tiny_models["qwen2"], "--index", copy)  # nothing to do
    assert [p.name for p in copy.glob("vectors-*")] == ["vectors-1.faiss"]


def test_aligned_wva_round_trip_with_its_settings_stored(tiny_models, sample_corpus, tmp_path):
    index = tmp_path / "index"
    args = ("build", sample_corpus / "faq", "--model", tiny_models["llama"], "--index", index)
    summary = json.loads(ragidx(*args, "--strategy", "aligned-wva", "--layers", "1-3", "--json").stdout)
    assert summary["strategy_notes"] == {"layer_source": "--layers", "exit_layer": 3}
    info = json.loads(ragidx("info", "--index", index, "--json").stdout)
    assert info["strategy_params"]["layers"] == [1, 2, 3] and info["strategy_params"]["prompt"] == "futureeol"
    with sqlite3.connect(index / "ragidx.db") as db:
        chunk_id, text = db.execute("select id, text from chunks order by id desc limit 1").fetchone()
    assert top_hit(index, text)["chunk_id"] == chunk_id
    assert_one_line_error(
        ragidx(*args, "--strategy", "mean", "--layers", "2", "--rebuild", check=False),
        "--layers does not apply to strategy 'mean'",
    )


def test_htp_round_trip_embeds_chunks_with_their_own_sentences(tiny_models, sample_corpus, tmp_path):
    import faiss

    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    index = tmp_path / "index"
    args = ("build", sample_corpus / "articles", "--model", tiny_models["llama"], "--index", index)
    summary = json.loads(ragidx(*args, "--strategy", "htp", "--json").stdout)
    assert summary["strategy_notes"]["exit_layer"] == 4 and summary["strategy_notes"]["rewire_source"]
    info = json.loads(ragidx("info", "--index", index, "--json").stdout)
    params = info["strategy_params"]
    assert params["rewire"] == [1, 2] and params["block_sentences"] == 1 and params["max_length"] == 4096
    assert info["chunker"]["chunk_tokens"] == 1024
    with sqlite3.connect(index / "ragidx.db") as db:
        rows = db.execute("select id, text, char_start, sentences from chunks order by id").fetchall()
    stored = faiss.read_index(str(index / f"vectors-{summary['generation']}.faiss"))
    strategy = create_strategy("htp", load_runtime(str(tiny_models["llama"]), device="cpu", dtype="float32"))
    for chunk_id, text, start, sentences in rows[:3]:
        spans = [(a - start, b - start) for a, b in json.loads(sentences)]
        expected = strategy.encode([text], sentences=[spans])[0]
        np.testing.assert_allclose(stored.reconstruct(chunk_id), expected, atol=1e-5)
    hits = json.loads(
        ragidx("query", "Why do lighthouses flash?", "--index", index, "--json", "--mode", "dense").stdout
    )
    query = strategy.encode(["Why do lighthouses flash?"], "query")[0]
    assert hits[0]["score"] == pytest.approx(
        max(float(stored.reconstruct(i) @ query) for i, *_ in rows), abs=1e-5
    )


def test_cp_settings_are_stored_and_shown(tiny_models, sample_corpus, tmp_path):
    index = tmp_path / "index"
    args = ("build", sample_corpus / "faq", "--model", tiny_models["qwen3"], "--index", index)
    ragidx(*args, "--strategy", "cp", "--prompt", "cot+knowledge", "--cp-mode", "nr", "--cp-layer", "2")
    params = json.loads(ragidx("info", "--index", index, "--json").stdout)["strategy_params"]
    assert (params["prompt"], params["cp_mode"], params["cp_layer"], params["output_layer"]) == (
        "cot+knowledge",
        "nr",
        2,
        4,
    )
    assert [t[:26] for t in params["normal_templates"]["query"]] == [
        "After thinking step by ste",
        "The essence of a sentence ",
    ]
    shown = ragidx("info", "--index", index).stdout
    assert "strategy.cp_mode" in shown and "irrelevant information" in shown
    assert len(json.loads(ragidx("query", "compost", "--index", index, "--json", "-k", "2").stdout)) == 2


def test_calibrate_then_build_kv_embedding_with_the_cached_layers(tiny_models, sample_corpus, tmp_path):
    import faiss

    from ragidx.indexer.model.runtime import load_runtime
    from ragidx.indexer.strategies import create_strategy

    cache = {"RAGIDX_CACHE_DIR": str(tmp_path / "cache")}
    model = tiny_models["qwen3"]
    plot = tmp_path / "curve.png"
    result = ragidx("calibrate", "--model", model, "--n", "150", "--plot", plot, "--json", env=cache)
    calibration = json.loads(result.stdout)
    assert len(calibration["curve"]) == 6 and calibration["text_count"] == 150
    assert calibration["texts_from"] == str(sample_corpus)
    assert calibration["layers"][0] == calibration["minimum_layer"] >= 1
    assert Path(calibration["cache_path"]).parent == tmp_path / "cache" / "calibration"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shown = ragidx("calibrate", "--model", model, "--n", "150", env=cache).stdout
    assert f"re-routing layers {calibration['minimum_layer']}" in shown and "first 20%" in shown

    index = tmp_path / "index"
    args = ("build", sample_corpus / "faq", "--model", model, "--index", index, "--strategy", "kv-embedding")
    summary = json.loads(ragidx(*args, "--kv-bias", "0.5", "--json", env=cache).stdout)
    assert summary["strategy_notes"]["layer_source"].startswith("calibration cache (150 texts")
    params = json.loads(ragidx("info", "--index", index, "--json").stdout)["strategy_params"]
    assert params["layers"] == calibration["layers"] and params["kv_bias"] == 0.5
    assert params["document_template"] == "Context: {text} Compress the Context in one word:"
    with sqlite3.connect(index / "ragidx.db") as db:
        chunk_id, text = db.execute("select id, text from chunks order by id limit 1").fetchone()
    stored = faiss.read_index(str(index / f"vectors-{summary['generation']}.faiss")).reconstruct(chunk_id)
    runtime = load_runtime(str(model), device="cpu", dtype="float32")
    strategy = create_strategy("kv-embedding", runtime, layers=params["layers"], kv_bias=0.5)
    np.testing.assert_allclose(stored, strategy.encode([text])[0], atol=1e-5)
    assert top_hit(index, text)["chunk_id"] == chunk_id
    rebuilt = json.loads(ragidx(*args, "--rebuild", "--json").stdout)["strategy_notes"]["layer_source"]
    # a rebuild keeps the index's layers, cache or not, and says where they came from, not "--layers"
    assert rebuilt == summary["strategy_notes"]["layer_source"]
    fresh = (
        "build",
        sample_corpus / "faq",
        "--model",
        model,
        "--index",
        tmp_path / "fresh",
        "--strategy",
        "kv-embedding",
    )
    fallback = json.loads(ragidx(*fresh, "--json").stdout)["strategy_notes"]["layer_source"]
    assert fallback.startswith("fallback depth")  # a new index without the cache

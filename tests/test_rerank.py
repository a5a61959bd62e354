"""Reranking by a decoder's likelihood of the question (``--rerank``), against transformers' own
loss over the same tokens, through the Python API, the command line and HTTP."""

from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient

from ragidx.app import Index, reranking
from ragidx.app.generation import LocalGenerator
from ragidx.app.http.server import create_app
from ragidx.app.service import served_index
from tests.support.cli import assert_one_line_error, ragidx

QUESTION = "how do I reset my password"
PASSAGES = [
    "Short.",
    "To reset your password, open the link we e-mail you; it expires after an hour, so ask again then.",
    "Tides come twice a day because the Earth turns under two bulges of water.",
    "Compost needs greens, browns, air and water.",
]


def independent_likelihood(model, tokenizer, question: str, passage: str, limit: int) -> float:
    """The mean log-probability of the question's tokens after "Passage: " (with the start token
    where the tokenizer adds one), the passage's first ``limit`` tokens and the cue, as
    transformers' own loss computes it over one unpadded sequence."""
    head = tokenizer("Passage: ")["input_ids"]
    body = tokenizer(passage, add_special_tokens=False)["input_ids"][:limit]
    cue = tokenizer("\n\nA question about this passage: ", add_special_tokens=False)["input_ids"]
    asked = tokenizer(question, add_special_tokens=False)["input_ids"]
    prefix = [*head, *body, *cue]
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([prefix + asked]), labels=torch.tensor([[-100] * len(prefix) + asked])
        )
    return -float(out.loss)


def reference(folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_question_likelihoods_equal_transformers_own_loss(arch, tiny_models, runtimes, monkeypatch):
    monkeypatch.setattr(reranking, "MAX_PASSAGE_TOKENS", 12)  # the long passage is cut
    monkeypatch.setattr(reranking, "BATCH", 3)  # two batches, each padded to its longest
    scores = reranking.question_likelihoods(LocalGenerator(runtimes[arch]), QUESTION, PASSAGES)
    model, tokenizer = reference(tiny_models[arch])
    expected = [independent_likelihood(model, tokenizer, QUESTION, text, 12) for text in PASSAGES]
    assert scores == pytest.approx(expected, abs=1e-4)
    assert len(set(scores)) == len(scores)  # each passage its own score


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_models, sample_corpus):
    folder = tmp_path_factory.mktemp("rerank") / "index"
    options = {"model": str(tiny_models["qwen2"]), "device": "cpu", "progress": False}
    with Index.build([sample_corpus], folder, **options) as opened:
        yield opened


def test_a_reranked_search_orders_its_candidates_by_the_likelihood(index, tiny_models, monkeypatch):
    decoder = str(tiny_models["llama"])
    candidates = index.search(QUESTION, k=reranking.RERANK_DEPTH, mode="dense")  # every chunk a candidate
    model, tokenizer = reference(tiny_models["llama"])
    limit = reranking.MAX_PASSAGE_TOKENS
    likelihood = {
        hit.chunk_id: independent_likelihood(model, tokenizer, QUESTION, hit.text, limit)
        for hit in candidates
    }
    best = sorted(likelihood, key=lambda chunk: -likelihood[chunk])[:4]
    hits = index.search(QUESTION, k=4, mode="dense", rerank=decoder)
    assert [hit.chunk_id for hit in hits] == best and [hit.rank for hit in hits] == [1, 2, 3, 4]
    assert [hit.score for hit in hits] == pytest.approx([likelihood[chunk] for chunk in best], abs=1e-4)
    assert best != [hit.chunk_id for hit in candidates[:4]]  # the order is the model's, not the search's

    shown = ragidx(
        "query",
        QUESTION,
        "--index",
        index.reader.directory,
        "-k",
        "4",
        "--mode",
        "dense",
        "--rerank",
        decoder,
        "--json",
    )
    assert [hit["chunk_id"] for hit in json.loads(shown.stdout)] == best

    scored: list[int] = []  # a served reranking scores a batch per slice of the model's time

    def counted(generator, question, passages):
        scored.append(len(passages))
        return reranking.question_likelihoods(generator, question, passages)

    monkeypatch.setattr(served_index, "question_likelihoods", counted)
    client = TestClient(create_app(index), base_url="http://localhost")
    answered = client.post("/search", json={"query": QUESTION, "k": 4, "mode": "dense", "rerank": decoder})
    assert [hit["chunk_id"] for hit in answered.json()["hits"]] == best
    assert sum(scored) == len(candidates) and max(scored) == reranking.BATCH < len(candidates)
    refused = client.post("/search", json={"query": QUESTION, "rerank": ""})
    assert refused.status_code == 422


def test_an_encoder_cannot_rerank(index, tiny_models):
    found = ragidx(
        "query", QUESTION, "--index", index.reader.directory, "--rerank", tiny_models["bert"], check=False
    )
    assert_one_line_error(found, r"is a bert encoder, not a decoder-only LLM: it cannot answer or rerank")

"""Reranking a search's best candidates with a decoder LLM, without training: each candidate is
scored by how likely the model finds the query as a question about it, the mean log-probability
of the query's tokens after the passage (question likelihood: Sachan et al., 2022, "Improving
Passage Retrieval with Zero-Shot Question Generation"). Any causal LM reads it, base or instruct,
through the same weights ``ragidx ask`` answers with (:class:`~ragidx.app.generation.LocalGenerator`).

It costs one forward pass over each candidate: on two CPU cores, seconds per query with a 135M
model (docs/hybrid-search.md#reranking).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ragidx.app.generation import LocalGenerator
from ragidx.indexer.search.hits import Hit
from ragidx.indexer.search.options import SearchOptions

RERANK_DEPTH = 20  # candidates scored when fewer results are asked for
MAX_PASSAGE_TOKENS = 384  # of each candidate's text: a chunk is 256 tokens by default
BATCH = 8  # candidates scored in one forward pass
PASSAGE, QUESTION = "Passage: ", "\n\nA question about this passage: "


def candidate_options(options: SearchOptions) -> SearchOptions:
    """The search whose hits a reranked search reorders: at least :data:`RERANK_DEPTH` of them."""
    return dataclasses.replace(options, k=max(options.k, RERANK_DEPTH), rerank=None)


def rerank(generator: LocalGenerator, query: str, hits: Sequence[Hit], k: int) -> list[Hit]:
    """The ``k`` of ``hits`` the model finds the query likeliest for (see :func:`ranked`)."""
    return ranked(hits, question_likelihoods(generator, query, [hit.text for hit in hits]), k)


def ranked(hits: Sequence[Hit], scores: Sequence[float], k: int) -> list[Hit]:
    """The ``k`` best of ``hits`` by ``scores`` (their question likelihoods), best first, each with
    its likelihood as its score and its new rank."""
    order = sorted(range(len(hits)), key=lambda n: (-scores[n], n))[:k]
    return [dataclasses.replace(hits[n], rank=rank, score=scores[n]) for rank, n in enumerate(order, start=1)]


def question_likelihoods(generator: LocalGenerator, question: str, passages: Sequence[str]) -> list[float]:
    """Each passage's mean log-probability per token of ``question`` written after it (see the
    module); passages are cut to :data:`MAX_PASSAGE_TOKENS` tokens and scored :data:`BATCH` at a
    time, padded on the right, so a passage's score does not depend on its batch."""
    import torch

    tokenizer = generator.runtime.tokenizer
    asked = tokenizer(question, add_special_tokens=False)["input_ids"]
    head, cue = prompt_frame(tokenizer)
    scores: list[float] = []
    for start in range(0, len(passages), BATCH):
        prefixes = [
            [*head, *tokenizer(text, add_special_tokens=False)["input_ids"][:MAX_PASSAGE_TOKENS], *cue]
            for text in passages[start : start + BATCH]
        ]
        rows = [prefix + asked for prefix in prefixes]
        width = max(len(row) for row in rows)
        ids = torch.tensor([row + [0] * (width - len(row)) for row in rows], device=generator.runtime.device)
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows], device=ids.device)
        with torch.inference_mode():
            logits = generator.model(input_ids=ids, attention_mask=mask).logits.float()
        targets = torch.tensor(asked, device=ids.device)
        for row, prefix in enumerate(prefixes):
            # The logits at position p predict token p + 1: the question's tokens follow the prefix.
            predicted = logits[row, len(prefix) - 1 : len(prefix) - 1 + len(asked)].log_softmax(-1)
            scores.append(float(predicted.gather(1, targets[:, None]).mean()))
    return scores


def prompt_frame(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The tokens around each passage, which the question follows: before it the tokenizer's start
    token where it adds one and :data:`PASSAGE`, after it :data:`QUESTION`."""
    head = tokenizer(PASSAGE, add_special_tokens=True)["input_ids"]
    if head and head[-1] == tokenizer.eos_token_id:  # a tokenizer that ends every text (an embedder's)
        head = head[:-1]
    return head, tokenizer(QUESTION, add_special_tokens=False)["input_ids"]

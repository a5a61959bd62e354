"""Chunks are whole sentences under the token budget, with exact spans and nothing lost."""

from __future__ import annotations

import itertools
import re

import pytest

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.chunking import Chunker
from ragidx.indexer.ingest.sources import scan


def non_space(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.fixture(scope="module")
def documents(sample_corpus):
    return scan([sample_corpus]).documents


@pytest.mark.parametrize(("budget", "overlap"), [(32, 0), (64, 1), (256, 2)])
def test_spans_are_exact_budgets_hold_and_no_text_is_lost(runtimes, documents, budget, overlap):
    chunker = Chunker(runtimes["qwen2"].tokenizer, chunk_tokens=budget, overlap_sentences=overlap)
    for doc in documents:
        chunks = chunker.chunk(doc.text)
        assert [c.ordinal for c in chunks] == list(range(len(chunks)))
        covered = []
        for chunk in chunks:
            assert doc.text[chunk.start : chunk.end] == chunk.text
            assert chunk.token_count == len(
                runtimes["qwen2"].tokenizer(chunk.text, add_special_tokens=False)["input_ids"]
            )
            assert chunk.token_count <= budget
            assert chunk.sentences[0][0] == chunk.start and chunk.sentences[-1][1] == chunk.end
            for start, end in chunk.sentences:
                assert chunk.start <= start < end <= chunk.end
            covered.append((chunk.start, chunk.end))
        # Every non-space character lies in some chunk, and chunks advance through the document.
        mask = [False] * len(doc.text)
        for start, end in covered:
            mask[start:end] = [True] * (end - start)
        missing = "".join(ch for ch, seen in zip(doc.text, mask, strict=True) if not seen)
        assert missing.strip() == ""
        assert [s for s, _ in covered] == sorted(s for s, _ in covered)


def test_overlap_repeats_the_previous_sentences(runtimes):
    text = " ".join(f"Sentence number {i} talks about lighthouse keepers." for i in range(9))
    sentence_tokens = len(runtimes["qwen2"].tokenizer(text.split(". ")[1] + ".")["input_ids"])
    chunker = Chunker(runtimes["qwen2"].tokenizer, chunk_tokens=3 * sentence_tokens + 2, overlap_sentences=1)
    chunks = chunker.chunk(text)
    assert len(chunks) > 3 and all(len(c.sentences) == 3 for c in chunks[:-1])
    for previous, current in itertools.pairwise(chunks):
        assert current.sentences[0] == previous.sentences[-1]
        assert current.sentences[-1][1] > previous.sentences[-1][1]


def test_sentence_longer_than_the_budget_is_split_not_dropped(runtimes):
    long_sentence = "word " * 300 + "end."
    text = "A short opener. " + long_sentence + " A short closer."
    chunker = Chunker(runtimes["qwen2"].tokenizer, chunk_tokens=50, overlap_sentences=0)
    chunks = chunker.chunk(text)
    assert all(c.token_count <= 50 for c in chunks)
    assert non_space("".join(c.text for c in chunks)) == non_space(text)


def test_blank_lines_separate_sentences(runtimes):
    chunker = Chunker(runtimes["qwen2"].tokenizer, chunk_tokens=256)
    text = "# A heading without a full stop\n\nThe first paragraph starts here. It goes on."
    sentences = [text[s:e] for s, e in chunker.sentences(text)]
    assert sentences == ["# A heading without a full stop", "The first paragraph starts here.", "It goes on."]


def test_bad_settings_are_refused(runtimes):
    with pytest.raises(RagidxError, match="at least 8"):
        Chunker(runtimes["qwen2"].tokenizer, chunk_tokens=2)
    with pytest.raises(RagidxError, match="not installed"):
        Chunker(runtimes["qwen2"].tokenizer, spacy_model="xx_no_such_pipeline")


def test_an_over_long_sentence_is_cut_between_words(runtimes):
    tokenizer = runtimes["qwen2"].tokenizer
    words = ["lighthousekeeping", "extraordinarily", "photosynthesising", "counterbalanced", "tides"] * 60
    text = " ".join(words)  # one sentence, no full stop, far over the budget
    assert len(tokenizer(words[0], add_special_tokens=False)["input_ids"]) > 1  # words span tokens
    chunker = Chunker(tokenizer, chunk_tokens=20, overlap_sentences=0)
    pieces = [text[s:e] for s, e in chunker.sentences(text)]
    assert len(pieces) > 10
    assert " ".join(pieces).split() == words  # every word whole, in order, none lost
    assert max(chunker.count_tokens(pieces)) <= 20
    one_word = "x" * 400  # a single word over the budget is still cut, inside the word
    assert "".join(text for text in (one_word[s:e] for s, e in chunker.sentences(one_word))) == one_word

"""Split document text into chunks of whole sentences under a token budget.

Chunks keep exact character spans into the document text and the spans of their sentences
(token prepending needs sentence boundaries). Blank lines are hard sentence boundaries, so a
heading never fuses with the paragraph after it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.sources import PARAGRAPH_BREAK
from ragidx.indexer.ingest.spans import Span, relative_spans

DEFAULT_OVERLAP_SENTENCES = 1  # sentences a chunk repeats from the one before it
RULE_BASED_SENTENCES = "blank:en+sentencizer"  # the spacy_model setting of the default splitter
LONG_RUN = re.compile(r"\S{256,}")  # never handed to spaCy: see _without_long_runs


@dataclass(frozen=True)
class Chunk:
    ordinal: int
    text: str
    start: int
    end: int
    token_count: int
    sentences: list[Span] = field(default_factory=list)  # offsets into the document's text

    @property
    def relative_sentences(self) -> list[Span]:
        """The sentence spans as offsets into the chunk's own text (what strategies read)."""
        return relative_spans(self.sentences, self.start)


def _trim(text: str, start: int, end: int) -> Span:
    """Shrink a span so it neither starts nor ends with whitespace."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


class Chunker:
    """Sentence segmentation with spaCy, token counts with the embedding model's tokenizer."""

    def __init__(
        self,
        tokenizer: Any,
        chunk_tokens: int = 256,
        overlap_sentences: int = DEFAULT_OVERLAP_SENTENCES,
        spacy_model: str | None = None,
    ):
        if chunk_tokens < 8:
            raise RagidxError(f"--chunk-tokens must be at least 8, got {chunk_tokens}")
        if overlap_sentences < 0:
            raise RagidxError(f"--overlap-sentences cannot be negative, got {overlap_sentences}")
        self.tokenizer = tokenizer
        self.chunk_tokens = chunk_tokens
        self.overlap_sentences = overlap_sentences
        self.spacy_model = spacy_model
        self._nlp = _load_spacy(spacy_model)

    @property
    def settings(self) -> dict[str, Any]:
        return {
            "chunk_tokens": self.chunk_tokens,
            "overlap_sentences": self.overlap_sentences,
            "spacy_model": self.spacy_model or RULE_BASED_SENTENCES,
        }

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text with no special tokens: what the budget counts."""
        if not texts:
            return []
        return [len(ids) for ids in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]

    def sentences(self, text: str) -> list[Span]:
        """Non-empty sentence spans in order; sentences over the budget are split at token boundaries."""
        paragraphs: list[Span] = []
        cursor = 0
        for match in PARAGRAPH_BREAK.finditer(text):
            paragraphs.append((cursor, match.start()))
            cursor = match.end()
        paragraphs.append((cursor, len(text)))
        paragraphs = [p for p in (_trim(text, *p) for p in paragraphs) if p[0] < p[1]]
        parts = [part for start, end in paragraphs for part in _without_long_runs(text, start, end)]
        prose = [span for span, is_run in parts if not is_run]
        docs = iter(self._nlp.pipe(text[start:end] for start, end in prose))
        spans: list[Span] = []
        for (offset, end), is_run in parts:
            if is_run:
                spans.append((offset, end))
                continue
            for sent in next(docs).sents:
                start, stop = _trim(text, offset + sent.start_char, offset + sent.end_char)
                if start < stop:
                    spans.append((start, stop))
        counts = self.count_tokens([text[s:e] for s, e in spans])
        result: list[Span] = []
        for span, count in zip(spans, counts, strict=True):
            result.extend(self._split_long(text, span) if count > self.chunk_tokens else [span])
        return result

    def _split_long(self, text: str, span: Span) -> list[Span]:
        """Cut one over-long sentence into pieces of at most ``chunk_tokens`` tokens each, between
        words (inside a word only when one word alone is over the budget)."""
        start, _ = span
        offsets = self.tokenizer(text[slice(*span)], add_special_tokens=False, return_offsets_mapping=True)[
            "offset_mapping"
        ]
        offsets = [(a + start, b + start) for a, b in offsets if b > a]
        pieces: list[Span] = []
        first = 0
        while first < len(offsets):
            stop = min(first + self.chunk_tokens, len(offsets))
            while stop > first + 1 and self.count_tokens([text[offsets[first][0] : offsets[stop - 1][1]]])[
                0
            ] > (self.chunk_tokens):
                stop -= 1
            stop = _word_boundary(text, offsets, first, stop)
            piece = _trim(text, offsets[first][0], offsets[stop - 1][1])
            if piece[0] < piece[1]:
                pieces.append(piece)
            first = stop
        return pieces

    def chunk(self, text: str) -> list[Chunk]:
        """Greedy packing of whole sentences; each chunk repeats up to ``overlap_sentences`` before it."""
        sentences = self.sentences(text)
        sizes = self.count_tokens([text[s:e] for s, e in sentences])
        chunks: list[Chunk] = []
        first = 0
        while first < len(sentences):
            stop, count = self._pack(text, sentences, sizes, first)
            span = (sentences[first][0], sentences[stop - 1][1])
            chunks.append(Chunk(len(chunks), text[slice(*span)], *span, count, sentences[first:stop]))
            if stop == len(sentences):
                break
            first = self._overlap_start(sizes, first, stop)
        return chunks

    def _pack(self, text: str, sentences: list[Span], sizes: list[int], first: int) -> tuple[int, int]:
        """End of the longest run of sentences from ``first`` that fits the budget, and its token count."""
        stop, estimate = first + 1, sizes[first]
        while stop < len(sentences) and estimate + sizes[stop] + 1 <= self.chunk_tokens:
            estimate += sizes[stop] + 1
            stop += 1
        while True:  # the estimate ignores merges at sentence joins: confirm with the real count
            count = self.count_tokens([text[sentences[first][0] : sentences[stop - 1][1]]])[0]
            if count <= self.chunk_tokens or stop == first + 1:
                return stop, count
            stop -= 1

    def _overlap_start(self, sizes: list[int], first: int, stop: int) -> int:
        """Start of the next chunk: up to ``overlap_sentences`` back, leaving room for sentence ``stop``."""
        start = max(first + 1, stop - self.overlap_sentences)
        while start < stop and sum(sizes[start : stop + 1]) + (stop - start) > self.chunk_tokens:
            start += 1
        return start


def _without_long_runs(text: str, start: int, end: int) -> list[tuple[Span, bool]]:
    """A paragraph's parts in order, each marked whether it is a run of :data:`LONG_RUN` or more
    characters without a space. Such a run (a data URI, a wall of punctuation) is a sentence of its
    own, cut by the token budget: spaCy's tokenizer strips its prefix and suffix characters one at a
    time, quadratic in the run's length (a 50 kB run of ``>`` took minutes)."""
    parts: list[tuple[Span, bool]] = []
    cursor = start
    for run in LONG_RUN.finditer(text, start, end):
        before = _trim(text, cursor, run.start())
        if before[0] < before[1]:
            parts.append((before, False))
        parts.append((run.span(), True))
        cursor = run.end()
    rest = _trim(text, cursor, end)
    if rest[0] < rest[1]:
        parts.append((rest, False))
    return parts


def _word_boundary(text: str, offsets: Sequence[Span], first: int, stop: int) -> int:
    """The last cut at or before token ``stop`` that falls between words (whitespace on either
    side of the next token's start); ``stop`` itself when tokens ``first..stop`` are one word."""
    for cut in range(stop, first, -1):
        if cut == len(offsets):
            return cut
        at = offsets[cut][0]
        if text[at].isspace() or text[at - 1].isspace():
            return cut
    return stop


def _load_spacy(name: str | None) -> Any:
    import spacy

    if name in (None, RULE_BASED_SENTENCES):
        nlp = spacy.blank("en")
        nlp.add_pipe("sentencizer")
    else:
        try:
            nlp = spacy.load(name, exclude=["ner", "lemmatizer", "tagger", "attribute_ruler"])
        except OSError as error:
            raise RagidxError(
                f"spaCy pipeline '{name}' is not installed (python -m spacy download {name})"
            ) from error
    nlp.max_length = 10**8  # sentence splitting is linear; long documents are the point of HTP
    return nlp

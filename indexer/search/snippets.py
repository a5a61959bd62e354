"""Snippets: the sentence(s) of a chunk that best match the query, with the query's words marked.

A chunk's words and CJK character pairs are compared with the query's terms as keyword search
analyses them (:mod:`ragidx.indexer.storage.lexical`: stems in the query's language, English by
FTS5's own Porter, and bigrams of Chinese, Japanese and Korean runs), so what is highlighted is
what keyword search matched. Stop words only count when the query has nothing else.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ragidx.indexer.ingest.languages import ENGLISH, ENGLISH_STEMMER, stemmer_name
from ragidx.indexer.ingest.spans import Span
from ragidx.indexer.storage.lexical import CJK_RUN, WORD, bigrams, query_terms, stem

TOKEN = f"({CJK_RUN})|{WORD}"  # what a snippet matches: a run of CJK characters (group 1), or a word
SNIPPET_CHARS = 240


@dataclass(frozen=True)
class Snippet:
    """Text shown for a hit; ``highlights`` are character spans of query words within ``text``."""

    text: str
    highlights: list[Span] = field(default_factory=list)

    def render(self, mark: Callable[[str], str], clean: Callable[[str], str] = str) -> str:
        """The text with each highlighted span passed through ``mark`` (e.g. ANSI bold), and
        every part through ``clean`` first (what a document wrote, never what ``mark`` adds)."""
        parts, last = [], 0
        for start, end in self.highlights:
            parts += [clean(self.text[last:start]), mark(clean(self.text[start:end]))]
            last = end
        return "".join(parts) + clean(self.text[last:])


class _TermMatcher:
    """Which spans of a text hold one of the query's terms, and which term; each distinct word is
    stemmed once per snippet. Porter only rewrites suffixes, so an English word whose first letter
    starts no term is rejected without stemming it (stemming is the cost)."""

    def __init__(self, terms: frozenset[str], language: str = ENGLISH):
        self.terms = terms
        self.language = language
        self.initials = {t[:1] for t in terms} if stemmer_name(language) == ENGLISH_STEMMER else None
        self.seen: dict[str, str | None] = {}

    def term_of(self, word: str) -> str | None:
        """The query term ``word`` stems to, or None."""
        if word not in self.seen:
            folded = unicodedata.normalize("NFKC", word).lower()
            skip = self.initials is not None and folded[:1] not in self.initials
            stemmed = None if skip else stem(folded, self.language)
            self.seen[word] = stemmed if stemmed in self.terms else None
        return self.seen[word]

    def matches(self, text: str) -> Iterator[tuple[int, int, str]]:
        """(start, end, term) of each match in ``text``, in order: whole words, and the pairs
        (or a lone character) of a CJK run."""
        for token in re.finditer(TOKEN, text):
            if token.group(1):
                for offset, pair in enumerate(bigrams(token.group(1))):
                    if pair in self.terms:
                        yield token.start() + offset, token.start() + offset + len(pair), pair
            elif (term := self.term_of(token.group())) is not None:
                yield token.start(), token.end(), term

    def highlights(self, text: str) -> list[Span]:
        """The spans to mark: each matched word, each stretch of matched CJK pairs."""
        spans: list[Span] = []
        for start, end, _ in self.matches(text):
            if spans and spans[-1][1] > start:
                spans[-1] = (spans[-1][0], max(spans[-1][1], end))
            else:
                spans.append((start, end))
        return spans

    def distinct_terms(self, text: str) -> int:
        """How many of the query's terms ``text`` holds (each distinct word looked up once)."""
        words = {self.term_of(word) for word in set(re.findall(WORD, text))} - {None}
        pairs = {pair for run in re.findall(CJK_RUN, text) for pair in bigrams(run) if pair in self.terms}
        return len(words | pairs)


def query_stems(query: str, language: str = ENGLISH) -> frozenset[str]:
    """The terms a snippet should match: the query's as keyword search reads them in ``language``."""
    return frozenset(query_terms(query, language))


def make_snippet(
    text: str, sentences: Sequence[Span], stems: frozenset[str], language: str = ENGLISH
) -> Snippet:
    """The best sentence of ``text`` (most distinct query terms, earliest on ties), extended with
    the sentences after it while they fit in :data:`SNIPPET_CHARS`; whitespace is collapsed."""
    matcher = _TermMatcher(stems, language)
    spans = [(s, e) for s, e in sentences if 0 <= s < e <= len(text)] or [(0, len(text))]
    scores = [matcher.distinct_terms(text[s:e]) for s, e in spans]
    best = max(range(len(spans)), key=lambda i: (scores[i], -i))
    start, end = spans[best]
    for _, next_end in spans[best + 1 :]:
        if _flat_length(text[start:next_end]) > SNIPPET_CHARS:
            break
        end = next_end
    flat = _window(" ".join(text[start:end].split()), matcher)
    return Snippet(flat, matcher.highlights(flat))


def _flat_length(text: str) -> int:
    return len(" ".join(text.split()))


def _window(flat: str, matcher: _TermMatcher) -> str:
    """A sentence longer than the budget is cut to a window that starts near its first match."""
    if len(flat) <= SNIPPET_CHARS:
        return flat
    first = next((start for start, _, _ in matcher.matches(flat)), 0)
    begin = max(0, min(first - SNIPPET_CHARS // 4, len(flat) - SNIPPET_CHARS))
    if begin > 0:
        begin = flat.find(" ", begin) + 1 or begin
    cut = flat[begin : begin + SNIPPET_CHARS]
    if begin + SNIPPET_CHARS < len(flat):
        cut = cut.rsplit(" ", 1)[0] + "…"
    return ("…" if begin > 0 else "") + cut

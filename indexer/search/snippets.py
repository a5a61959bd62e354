"""Snippets: the sentence(s) of a chunk that best match the query, with the query's words marked.

Words are compared by their Porter stems, the same stemmer FTS5's ``porter`` tokenizer uses, so
what is highlighted is what lexical search matched. English stop words only count when the query
has nothing else.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ragidx.indexer.ingest.languages import stop_words
from ragidx.indexer.ingest.spans import Span

WORD = re.compile(r"\w+")
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


@functools.cache
def _stemmer():
    import snowballstemmer

    return snowballstemmer.stemmer("porter")


@functools.lru_cache(maxsize=1 << 16)
def stem(word: str) -> str:
    return _stemmer().stemWord(word.lower())


class _StemMatcher:
    """Whether a word stems to one of the query's stems, and which; each distinct word is stemmed
    once per snippet, and Porter only rewrites suffixes, so a word whose first letter starts no
    stem is rejected without stemming it (stemming is the cost)."""

    def __init__(self, stems: frozenset[str]):
        self.stems = stems
        self.initials = {s[:1] for s in stems}
        self.seen: dict[str, str | None] = {}

    def stem_of(self, word: str) -> str | None:
        """The query stem ``word`` (lower case) matches, or None."""
        if word not in self.seen:
            stemmed = stem(word) if word[:1] in self.initials else None
            self.seen[word] = stemmed if stemmed in self.stems else None
        return self.seen[word]

    def __call__(self, word: str) -> bool:
        return self.stem_of(word.lower()) is not None

    def distinct_stems(self, text: str) -> int:
        """How many of the query's stems ``text`` holds."""
        return len({self.stem_of(word) for word in {w.lower() for w in WORD.findall(text)}} - {None})


def query_stems(query: str) -> frozenset[str]:
    """The stems a snippet should match: the query's content words, or all its words if none."""
    words = [w.lower() for w in WORD.findall(query)]
    content = [w for w in words if w not in stop_words()] or words
    return frozenset(stem(w) for w in content)


def make_snippet(text: str, sentences: Sequence[Span], stems: frozenset[str]) -> Snippet:
    """The best sentence of ``text`` (most distinct query stems, earliest on ties), extended with
    the sentences after it while they fit in :data:`SNIPPET_CHARS`; whitespace is collapsed."""
    matches = _StemMatcher(stems)
    spans = [(s, e) for s, e in sentences if 0 <= s < e <= len(text)] or [(0, len(text))]
    scores = [matches.distinct_stems(text[s:e]) for s, e in spans]
    best = max(range(len(spans)), key=lambda i: (scores[i], -i))
    start, end = spans[best]
    for _, next_end in spans[best + 1 :]:
        if _flat_length(text[start:next_end]) > SNIPPET_CHARS:
            break
        end = next_end
    flat = _window(" ".join(text[start:end].split()), matches)
    return Snippet(flat, [m.span() for m in WORD.finditer(flat) if matches(m.group())])


def _flat_length(text: str) -> int:
    return len(" ".join(text.split()))


def _window(flat: str, matches: Callable[[str], bool]) -> str:
    """A sentence longer than the budget is cut to a window that starts near its first match."""
    if len(flat) <= SNIPPET_CHARS:
        return flat
    first = next((m.start() for m in WORD.finditer(flat) if matches(m.group())), 0)
    begin = max(0, min(first - SNIPPET_CHARS // 4, len(flat) - SNIPPET_CHARS))
    if begin > 0:
        begin = flat.find(" ", begin) + 1 or begin
    cut = flat[begin : begin + SNIPPET_CHARS]
    if begin + SNIPPET_CHARS < len(flat):
        cut = cut.rsplit(" ", 1)[0] + "…"
    return ("…" if begin > 0 else "") + cut

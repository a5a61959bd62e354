"""Search results as context for a prompt: passages merged per document, numbered for citation,
fitted to a token budget.

A RAG application does not want ten overlapping chunks: it wants a few passages it can paste
under a question, each with a number the model can cite and a place the reader can check. Here
the hits of one document whose chunks overlap or follow each other become one passage (their
text joined once, the overlap not repeated), passages whose text another already holds are
dropped, and passages are added best first while the whole context, headers included, stays
within ``max_tokens`` of the named tokenizer: the one that does not fit whole is cut after its
last whole sentence that does, and is dropped when not even one fits.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ragidx.indexer.search.hits import Hit

LOOKS_LIKE_HEADER = re.compile(r"^(\s*)\[(\d+)\]", re.MULTILINE)  # a passage line a header could be

CountTokens = Callable[[str], int]
DEFAULT_MAX_TOKENS = 2000


@dataclass(frozen=True)
class Passage:
    """Consecutive text of one document that the search found, with where it comes from."""

    path: str
    title: str
    span: tuple[int, int]  # character offsets into the document's text
    text: str
    sentences: tuple[tuple[int, int, int], ...]  # start and end in ``text``, end in the document
    chunk_ids: tuple[int, ...]
    rank: int  # the best rank among its hits
    score: float  # that hit's score
    pages: tuple[int, ...] = ()
    cut: bool = False  # shortened to fit the budget

    def header(self, number: int, relative_to: str | None) -> str:
        shown = self.path
        if relative_to and (self.path + os.sep).startswith(relative_to.rstrip(os.sep) + os.sep):
            shown = os.path.relpath(self.path, relative_to)
        pages = f", page {self.pages[0]}" if len(self.pages) == 1 else ""
        if len(self.pages) > 1:
            pages = f", pages {self.pages[0]}-{self.pages[-1]}"
        return f"[{number}] {shown}:{self.span[0]}-{self.span[1]}{pages}" + (
            f" {self.title}" if self.title else ""
        )

    def first_sentences(self, count: int) -> Passage:
        """The passage cut after its ``count``-th sentence."""
        _, end, document_end = self.sentences[count - 1]
        return replace(
            self,
            text=self.text[:end],
            sentences=self.sentences[:count],
            span=(self.span[0], document_end),
            cut=True,
        )

    def to_dict(self, number: int) -> dict[str, Any]:
        return {
            "number": number,
            "path": self.path,
            "title": self.title,
            "span": list(self.span),
            "pages": list(self.pages) or None,
            "text": self.text,
            "chunk_ids": list(self.chunk_ids),
            "rank": self.rank,
            "score": self.score,
            "cut": self.cut,
        }


@dataclass(frozen=True)
class Context:
    """Numbered passages and the text that cites them, within ``max_tokens`` of ``tokenizer``."""

    query: str
    passages: tuple[Passage, ...]
    text: str
    tokens: int
    max_tokens: int
    tokenizer: str
    left_out: tuple[dict[str, Any], ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "text": self.text,
            "tokens": self.tokens,
            "max_tokens": self.max_tokens,
            "tokenizer": self.tokenizer,
            "passages": [passage.to_dict(number) for number, passage in enumerate(self.passages, 1)],
            "left_out": list(self.left_out),
        }


def nothing_fits(context: Mapping[str, Any]) -> str | None:
    """Why a context (``Context.to_dict``) holds no passage although the search found some: the
    budget, said so, rather than "no results"; None when it holds some or none were found."""
    cut = sum(1 for left in context["left_out"] if left["why"] == "budget")
    if context["passages"] or not cut:
        return None
    return (
        f"the search found {cut} passage{'s' if cut != 1 else ''}, but not one sentence of "
        f"{'any' if cut != 1 else 'it'} fits in --max-tokens {context['max_tokens']}: give more tokens"
    )


def render(passages: Sequence[Passage], relative_to: str | None = None) -> str:
    """The context as a prompt takes it: each passage under its numbered header, its own lines
    that look like one (``[4] notes/ledger.md:0-99``) escaped as ``\\[4]``, so a document cannot
    forge a header and have the model's ``[4]`` credited to another passage."""
    return "\n\n".join(
        f"{' '.join(passage.header(number, relative_to).split())}\n{_unforgeable(passage.text)}"
        for number, passage in enumerate(passages, 1)
    )


def _unforgeable(text: str) -> str:
    return LOOKS_LIKE_HEADER.sub(r"\1\\[\2]", text)


def merge_hits(hits: Sequence[Hit], rows: Mapping[int, Mapping[str, Any]]) -> list[Passage]:
    """One passage per run of overlapping or consecutive chunks of a document among ``hits``,
    best rank first. ``rows``: the chunks' stored rows (ordinal and sentence spans), by id; a hit
    whose row is gone (a newer generation) stands alone, as one sentence."""
    by_document: dict[str, list[Hit]] = {}
    for hit in hits:
        by_document.setdefault(hit.path, []).append(hit)
    passages = []
    for found in by_document.values():
        found.sort(key=lambda hit: hit.span[0])
        run = [found[0]]
        for hit in found[1:]:
            if _joins(run[-1], hit, rows):
                run.append(hit)
            else:
                passages.append(_passage(run, rows))
                run = [hit]
        passages.append(_passage(run, rows))
    return sorted(passages, key=lambda passage: passage.rank)


def _joins(before: Hit, after: Hit, rows: Mapping[int, Mapping[str, Any]]) -> bool:
    """Whether ``after`` overlaps or directly follows ``before`` in their document."""
    if after.span[0] <= before.span[1]:
        return True
    first, second = rows.get(before.chunk_id), rows.get(after.chunk_id)
    return bool(first and second and second["ordinal"] == first["ordinal"] + 1)


def _passage(run: Sequence[Hit], rows: Mapping[int, Mapping[str, Any]]) -> Passage:
    """The chunks of ``run`` (in document order) as one text: each chunk's part past the end of
    the text so far, a line break where one chunk ends before the next begins."""
    text, sentences, end = "", [], run[0].span[0]
    for hit in run:
        if text and hit.span[1] <= end:
            continue  # inside what the passage already holds
        skip = max(0, end - hit.span[0])  # characters of this chunk the passage already holds
        if text and hit.span[0] > end:
            text += "\n"
        base = len(text) - skip  # where the chunk's first character would sit in the passage
        text += hit.text[skip:]
        row = rows.get(hit.chunk_id)
        spans = [tuple(span) for span in row["sentences"]] if row else [(0, len(hit.text))]
        sentences += [(base + a, base + b, hit.span[0] + b) for a, b in spans if a >= skip]
        end = hit.span[1]
    best = min(run, key=lambda hit: hit.rank)
    return Passage(
        path=best.path,
        title=best.title,
        span=(run[0].span[0], end),
        text=text,
        sentences=tuple(sentences) or ((0, len(text), end),),
        chunk_ids=tuple(hit.chunk_id for hit in run),
        rank=best.rank,
        score=best.score,
        pages=tuple(sorted({page for hit in run for page in hit.pages or ()})),
    )


def fit(
    query: str,
    passages: Sequence[Passage],
    count_tokens: CountTokens,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    tokenizer: str = "",
    relative_to: str | None = None,
) -> Context:
    """The passages, best first, that fit in ``max_tokens`` counted over the whole rendered text;
    duplicates (the same text as a passage already in) are left out, as is a passage of which not
    one sentence fits."""
    kept: list[Passage] = []
    left_out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for passage in passages:
        normal = " ".join(passage.text.split())
        if normal in seen:
            left_out.append({"path": passage.path, "span": list(passage.span), "why": "duplicate"})
            continue
        fitted = _fitted(kept, passage, count_tokens, max_tokens, relative_to)
        if fitted is None:
            left_out.append({"path": passage.path, "span": list(passage.span), "why": "budget"})
            continue
        seen.add(normal)
        kept.append(fitted)
    text = render(kept, relative_to)
    return Context(
        query, tuple(kept), text, count_tokens(text) if kept else 0, max_tokens, tokenizer, tuple(left_out)
    )


def _fitted(
    kept: list[Passage], passage: Passage, count_tokens: CountTokens, max_tokens: int, relative_to: str | None
) -> Passage | None:
    """``passage`` whole if the context fits with it, else its longest run of first sentences that
    does (found by bisection: the count grows with the sentences kept), else None."""

    def fits(candidate: Passage) -> bool:
        return count_tokens(render([*kept, candidate], relative_to)) <= max_tokens

    if fits(passage):
        return passage
    low, high = 0, len(passage.sentences) - 1  # sentences that surely fit / the most that might
    while low < high:
        middle = (low + high + 1) // 2
        if fits(passage.first_sentences(middle)):
            low = middle
        else:
            high = middle - 1
    return passage.first_sentences(low) if low else None

"""Character spans into a document's text: the type every layer passes around, spans made relative
to a chunk, and the pages of a paged document (PDF) a span touches."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

Span = tuple[int, int]  # [start, end) in characters


def relative_spans(spans: Iterable[Sequence[int]], start: int) -> list[Span]:
    """Spans into a document made relative to a part of it that begins at ``start``."""
    return [(first - start, last - start) for first, last in spans]


def span_pages(page_starts: Sequence[int] | None, start: int, end: int) -> list[int] | None:
    """The 1-based pages a character span of a paged document's text touches; None unpaged."""
    if not page_starts:
        return None
    first = bisect.bisect_right(page_starts, start)
    last = bisect.bisect_right(page_starts, max(start, end - 1))
    return list(range(max(first, 1), last + 1))

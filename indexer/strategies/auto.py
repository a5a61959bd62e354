"""``--strategy auto``: HTP for corpora of long documents, the model's default for shorter ones."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

# A document that fills one HTP chunk. On SciFact abstracts (median 277-294 tokens) every packaged
# decoder's default beat htp (docs/choosing.md), so the boundary is well above them.
LONG_DOCUMENT_TOKENS = 1024


def choose_strategy(token_counts: Sequence[int], short: str, long: str) -> tuple[str, str]:
    """``long`` for a corpus whose median document has at least LONG_DOCUMENT_TOKENS tokens, else
    ``short``, and why."""
    median = statistics.median(token_counts) if token_counts else 0
    if median >= LONG_DOCUMENT_TOKENS:
        return long, f"auto: median document length {median:g} tokens >= {LONG_DOCUMENT_TOKENS}"
    return short, f"auto: median document length {median:g} tokens < {LONG_DOCUMENT_TOKENS}"

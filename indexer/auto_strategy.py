"""``--strategy auto``: HTP for corpora of long documents, AlignedWVA for short ones (methods.md §7)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

LONG_DOCUMENT_TOKENS = 256


def choose_strategy(token_counts: Sequence[int]) -> tuple[str, str]:
    """The strategy for a corpus whose documents have ``token_counts`` tokens, and why."""
    median = statistics.median(token_counts) if token_counts else 0
    if median >= LONG_DOCUMENT_TOKENS:
        return "htp", f"auto: median document length {median:g} tokens >= {LONG_DOCUMENT_TOKENS}"
    return "aligned-wva", f"auto: median document length {median:g} tokens < {LONG_DOCUMENT_TOKENS}"

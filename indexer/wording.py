"""Wording shared by messages and output: counts, excerpts, page labels."""

from __future__ import annotations

import unicodedata


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (regular English plurals: add ``s``)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def excerpt(value: object, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters: errors name bad input without echoing it at length."""
    shown = repr(value)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def encodable(text: str) -> bool:
    """Whether ``text`` can be stored and searched as UTF-8 (JSON and argv can carry lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(text: str) -> str:
    """``text`` safe to print: control characters (a terminal escape sequence in a file name) and
    bytes that are not UTF-8 (lone surrogates from the file system) are escaped, the rest kept."""
    try:  # a file system name's undecodable bytes come back as the bytes they were: \xff
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # other lone surrogates (from JSON): \ud800
        raw = text.encode("utf-8", "backslashreplace")
    escaped = raw.decode("utf-8", "backslashreplace")
    return "".join(
        c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in escaped
    )


def printable_text(text: str) -> str:
    """Document or model text safe for a terminal: control characters (an escape sequence a
    document or a model wrote) are dropped, line breaks and tabs kept."""
    return "".join(
        c if c in "\n\t" or c.isprintable() else " " if unicodedata.category(c) == "Zs" else "" for c in text
    )


def page_label(pages: list[int] | None) -> str:
    """``p. 3`` or ``pp. 3-4`` for a span of a paged document; empty for others."""
    if not pages:
        return ""
    return f"p. {pages[0]}" if len(pages) == 1 else f"pp. {pages[0]}-{pages[-1]}"

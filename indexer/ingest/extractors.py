"""Text out of PDF and DOCX files (the optional ``pdf`` and ``docx`` extras).

Each extractor returns the text (paragraphs separated by blank lines, which the chunker treats
as hard sentence boundaries), the file's own metadata, and for PDFs the character offset at
which each page starts, so a chunk's span tells its page(s). A file that cannot be used raises
``Unusable`` with the reason the build reports; the file is skipped, never fatal.
"""

from __future__ import annotations

import io
import itertools
import logging
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

PDF_HINT = "PDF support not installed: pip install 'ragidx[pdf]'"
DOCX_HINT = "DOCX support not installed: pip install 'ragidx[docx]'"
OLE_SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # what Office writes for encrypted files
PARAGRAPH_GAP = 1.5  # a line further below the last than 1.5 typical line steps starts a paragraph
PDF_METADATA = {"/Title": "title", "/Author": "author", "/Subject": "subject", "/Keywords": "keywords"}
DOCX_METADATA = ("title", "author", "subject", "keywords", "category", "created", "modified")


class Unusable(Exception):
    """The file is skipped; the message is the reason shown to the user."""


@dataclass(frozen=True)
class Extracted:
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    page_starts: list[int] | None = None  # page n (1-based) starts at page_starts[n - 1]


def extract_pdf(data: bytes) -> Extracted:
    """Each page's text in content-stream order (pypdf's plain mode, which keeps columns whole),
    lines of a paragraph joined by spaces, paragraphs split where the vertical gap grows."""
    try:
        from pypdf import PdfReader
        from pypdf.errors import DependencyError, FileNotDecryptedError
    except ImportError:
        raise Unusable(PDF_HINT) from None
    # pypdf logs what it repairs ("invalid pdf header", "EOF marker not found") to stderr, ahead
    # of the build's own one-line report of a file it skips; its errors still come as exceptions
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise Unusable("encrypted PDF (a password is needed to read it)")
        pages = [_page_paragraphs(page) for page in reader.pages]
        info: Mapping[str, Any] = reader.metadata or {}
    except Unusable:
        raise
    except (FileNotDecryptedError, DependencyError) as error:
        raise Unusable(f"encrypted PDF ({error})") from None
    except Exception as error:  # pypdf raises many types on damaged files; none may stop a build
        raise Unusable(f"malformed PDF ({type(error).__name__}: {error})".splitlines()[0]) from None
    if not any(pages):
        raise Unusable("PDF without a text layer (scanned or image-only: OCR it first)")
    text, page_starts = _join_pages(pages)
    metadata = {key: str(info[name]).strip() for name, key in PDF_METADATA.items() if info.get(name)}
    return Extracted(text, {k: v for k, v in metadata.items() if v}, page_starts)


def _page_paragraphs(page: Any) -> list[str]:
    """One page's paragraphs. pypdf reports each text run with its matrices; a line's height is
    read from the first run after a line break."""
    runs: list[tuple[str, float | None]] = []

    def visit(text: str, cm: list[float], tm: list[float], *_: Any) -> None:
        runs.append((text, tm[4] * cm[1] + tm[5] * cm[3] + cm[5] if text.strip() else None))

    page.extract_text(visitor_text=visit)
    lines: list[tuple[str, float | None]] = []
    words: list[str] = []
    height: float | None = None
    for text, y in runs:
        for piece_index, piece in enumerate(text.split("\n")):
            if piece_index:
                lines.append(("".join(words), height))
                words, height = [], None
            words.append(piece)
            if height is None and piece.strip():
                height = y
    lines.append(("".join(words), height))
    return _paragraphs([(" ".join(t.split()), y) for t, y in lines if t.strip()])


def _paragraphs(lines: list[tuple[str, float | None]]) -> list[str]:
    """Lines grouped into paragraphs: a new one where the step down from the previous line is
    well over the page's typical step, or where the text moves up (a new column or block)."""
    steps = [a[1] - b[1] for a, b in itertools.pairwise(lines) if a[1] is not None and b[1] is not None]
    down = [step for step in steps if step > 0] or [0.0]
    # The line step: the smallest step down, ignoring sub- and superscript jiggles.
    typical = min(step for step in down if step >= statistics.median(down) / 2)
    paragraphs: list[list[str]] = []
    previous: float | None = None
    for text, y in lines:
        step = None if previous is None or y is None else previous - y
        if not paragraphs or (step is not None and (step < 0 or step > PARAGRAPH_GAP * typical)):
            paragraphs.append([])
        paragraphs[-1].append(text)
        previous = y if y is not None else previous
    return [" ".join(lines) for lines in paragraphs]


def _join_pages(pages: list[list[str]]) -> tuple[str, list[int]]:
    """All pages as one text; an empty page still gets its start offset."""
    text = ""
    starts = []
    for paragraphs in pages:
        if text and paragraphs:
            text += "\n\n"
        starts.append(len(text))
        text += "\n\n".join(paragraphs)
    return text, starts


def extract_docx(data: bytes) -> Extracted:
    """Paragraphs and tables in document order (a table row is a paragraph of its cells joined by
    `` | ``);
    the core properties (title, author, subject, ...) become metadata."""
    try:
        import docx
        from docx.table import Table
    except ImportError:
        raise Unusable(DOCX_HINT) from None
    if data.startswith(OLE_SIGNATURE):
        raise Unusable("encrypted DOCX (password-protected) or a legacy .doc file")
    try:
        document = docx.Document(io.BytesIO(data))
        blocks = [
            text
            for block in document.iter_inner_content()
            for text in (_table_rows(block) if isinstance(block, Table) else [block.text])
        ]
        properties = document.core_properties
        metadata = {name: _property_value(getattr(properties, name)) for name in DOCX_METADATA}
    except Exception as error:  # python-docx and zipfile raise many types on damaged files
        raise Unusable(f"malformed DOCX ({type(error).__name__}: {error})".splitlines()[0]) from None
    paragraphs = [" ".join(block.split()) for block in blocks if block.strip()]
    return Extracted("\n\n".join(paragraphs), {k: v for k, v in metadata.items() if v})


def _table_rows(table: Any) -> list[str]:
    """Each row as one paragraph; a merged cell is repeated by python-docx, so repeats are dropped."""
    rows = []
    for row in table.rows:
        cells: list[Any] = []
        for cell in row.cells:
            if not cells or cell._tc is not cells[-1]._tc:
                cells.append(cell)
        rows.append(" | ".join(" ".join(cell.text.split()) for cell in cells))
    return [row for row in rows if row.strip(" |")]


def _property_value(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value or "").strip()

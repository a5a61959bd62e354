"""Find documents under the given paths and turn each into plain text, or say why it was skipped."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest import extractors
from ragidx.indexer.ingest.access import FileAccess
from ragidx.indexer.wording import encodable, shown

READERS = {
    ".txt": "text",
    ".rst": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".html": "html",
    ".htm": "html",
    ".pdf": "pdf",
    ".docx": "docx",
}
EXTRACTED_KINDS = ("pdf", "docx")  # binary formats, read by indexer.extractors (optional extras)
HTML_BLOCKS = (
    "address",
    "article",
    "aside",
    "blockquote",
    "br",
    "dd",
    "div",
    "dl",
    "dt",
    "figcaption",
    "figure",
    "footer",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hr",
    "li",
    "main",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "table",
    "td",
    "th",
    "tr",
    "ul",
)
HTML_INVISIBLE = ("script", "style", "noscript", "template", "head", "nav")
BINARY_SNIFF_BYTES = 8192
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)^---[ \t]*(?:\r?\n|\Z)", re.DOTALL | re.MULTILINE)
HTML_META_IGNORED = frozenset({"viewport", "robots", "generator", "theme-color", "color-scheme"})
MAX_METADATA_VALUES = 10_000
MAX_METADATA_CHARS = 64 * 1024
METADATA_TOO_LARGE = (
    f"metadata too large (over {MAX_METADATA_VALUES:,} values or {MAX_METADATA_CHARS // 1024} KiB, "
    "YAML aliases expanded)"
)


@dataclass(frozen=True)
class SourceDocument:
    """A document's extracted text; chunk spans are character offsets into ``text``."""

    path: str
    text: str
    content_hash: str
    size: int
    mtime: float
    title: str
    kind: str
    metadata: dict[str, Any] = field(default_factory=dict)
    page_starts: list[int] | None = None  # PDFs: page n (1-based) starts at page_starts[n - 1]


@dataclass(frozen=True)
class SkippedFile:
    """A file, or a whole folder (``folder``), left out of this scan and why."""

    path: str
    reason: str
    folder: bool = False


@dataclass
class ScanResult:
    documents: list[SourceDocument] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)


def scan(
    paths: Sequence[str | Path],
    exclude: Path | None = None,
    keep_text: bool = True,
    known: Mapping[str, str] | None = None,
    access: FileAccess | None = None,
) -> ScanResult:
    """Read every supported file under ``paths``; files that cannot be used are listed, not fatal.

    ``keep_text=False`` drops each text once it is hashed (``text`` is then empty): a build reads
    the documents it embeds again, one group at a time, so its memory does not grow with the corpus.
    ``known`` maps paths to the content hashes already indexed: a file with the same bytes is
    hashed but not extracted again (PDFs take seconds), and comes back with empty text and title.
    ``access`` says what may be opened (default: regular files under ``paths``; see
    :mod:`.access`); a file name that is not valid UTF-8 cannot be stored and is skipped.
    """
    access = access or FileAccess.under(paths)
    result = ScanResult()
    seen: set[str] = set()
    for found in _walk(paths, exclude):
        if isinstance(found, SkippedFile):
            result.skipped.append(found)
            continue
        file = Path(normal_path(found))
        if not encodable(str(file)):
            result.skipped.append(SkippedFile(shown(str(file)), "file name is not valid UTF-8: rename it"))
            continue
        if str(file) in seen:
            continue
        seen.add(str(file))
        outcome = read_document(file, (known or {}).get(str(file)), access)
        if isinstance(outcome, SkippedFile):
            result.skipped.append(outcome)
        else:
            result.documents.append(outcome if keep_text else dataclasses.replace(outcome, text=""))
    return result


def normal_path(path: str | Path) -> str:
    """The one spelling of a path the index stores: absolute, ``.``/``..`` and symlinked folders
    resolved, so ``docs/./a/../a`` and a link to ``docs`` name the same documents. A file's own
    name is kept (a linked file is indexed where it appears, not where it points)."""
    absolute = Path(os.path.abspath(path))
    if absolute.is_dir() or absolute.parent == absolute:
        return os.path.realpath(absolute)
    return str(Path(os.path.realpath(absolute.parent)) / absolute.name)


def _walk(paths: Sequence[str | Path], exclude: Path | None) -> Iterator[Path | SkippedFile]:
    """Named files as given; directories recursively, skipping hidden entries and ``exclude``.

    A folder that cannot be listed is yielded as skipped, so its indexed documents are kept.
    """
    excluded = exclude.resolve() if exclude else None
    unlistable: list[SkippedFile] = []

    def report(error: OSError) -> None:
        folder = normal_path(error.filename)
        unlistable.append(SkippedFile(folder, f"unreadable folder: {error.strerror or error}", folder=True))

    for given in paths:
        path = Path(given)
        if path.is_symlink() and not path.exists():
            yield path  # a broken link: reported as unreadable by read_document
            continue
        if not path.exists():
            raise RagidxError(f"path not found: {given}")
        if not path.is_dir():
            yield path
            continue
        for root, dirs, files in os.walk(path, onerror=report):
            yield from unlistable
            unlistable.clear()
            root_path = Path(root)
            dirs[:] = sorted(
                d for d in dirs if not d.startswith(".") and (root_path / d).resolve() != excluded
            )
            yield from (root_path / name for name in sorted(files) if not name.startswith("."))
        yield from unlistable
        unlistable.clear()


def read_document(
    path: Path, known_hash: str | None = None, access: FileAccess | None = None
) -> SourceDocument | SkippedFile:
    """Decode and extract one file's text; none when its content hash is ``known_hash``.
    ``access`` says what may be opened (default: this file, if it is a regular one)."""
    kind = READERS.get(path.suffix.lower())
    if kind is None:
        return SkippedFile(normal_path(path), f"unsupported file type '{path.suffix or path.name}'")
    opened = (access or FileAccess.under([path])).read(path)
    if isinstance(opened, str):
        return SkippedFile(normal_path(path), opened)
    data = opened.data
    if not data.strip():
        return SkippedFile(normal_path(path), "empty file")
    content_hash = hashlib.sha256(data).hexdigest()
    found = SourceDocument(normal_path(path), "", content_hash, opened.size, opened.mtime, "", kind)
    if content_hash == known_hash:
        return found
    extracted = _extract(kind, data)
    if isinstance(extracted, str):
        return SkippedFile(found.path, extracted)
    text, metadata, page_starts = extracted
    if not text.strip():
        return SkippedFile(found.path, "no text")
    if not within_bounds(metadata):
        return SkippedFile(found.path, METADATA_TOO_LARGE)
    title = metadata.get("title")
    return dataclasses.replace(
        found,
        text=text,
        title=title if isinstance(title, str) and title.strip() else guess_title(text, path),
        metadata=metadata,
        page_starts=page_starts,
    )


def _extract(kind: str, data: bytes) -> tuple[str, dict[str, Any], list[int] | None] | str:
    """The text, metadata and page starts of a file's bytes, or why it cannot be used."""
    if kind in EXTRACTED_KINDS:
        extract = extractors.extract_pdf if kind == "pdf" else extractors.extract_docx
        try:
            extracted = extract(data)
        except extractors.Unusable as reason:
            return str(reason)
        return extracted.text, extracted.metadata, extracted.page_starts
    text = decode_text(data)
    if text is None:
        return "binary content"
    if kind == "html":
        return *html_to_text(text), None
    if kind == "markdown":
        try:
            return *split_front_matter(text), None
        except TooLarge:
            return METADATA_TOO_LARGE
    return text, {}, None


class TooLarge(Exception):
    """Metadata past :data:`MAX_METADATA_VALUES` or :data:`MAX_METADATA_CHARS`."""


def within_bounds(value: Any) -> bool:
    """Whether metadata stays within :data:`MAX_METADATA_VALUES` values and
    :data:`MAX_METADATA_CHARS` characters, counted as JSON would write it out: YAML aliases make
    a few hundred bytes of front matter stand for millions of values (a "billion laughs"), and every
    hit and filter carries a document's metadata. Stops counting at the bounds."""
    stack, values, chars = [value], 0, 0
    while stack:
        item = stack.pop()
        values += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        else:
            chars += len(str(item))
        if values > MAX_METADATA_VALUES or chars > MAX_METADATA_CHARS:
            return False
    return True


def decode_text(data: bytes) -> str | None:
    """UTF-8 (with or without BOM), UTF-16 with a BOM, else charset detection; None for binary."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            return None
    if b"\x00" in data[:BINARY_SNIFF_BYTES]:
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    matches = from_bytes(data)
    best = matches.best()
    if best is None:
        return None
    # Short texts often fit several code pages equally well; the common Western one wins ties.
    tied = (
        m
        for m in matches
        if (m.chaos, m.coherence) == (best.chaos, best.coherence) and m.encoding == "cp1252"
    )
    return str(next(tied, best))


def html_to_text(markup: str) -> tuple[str, dict[str, Any]]:
    """Visible text of an HTML page, one paragraph per block element, and its metadata.

    The metadata is the ``<title>`` (as ``title``) and every ``<meta name=... content=...>``
    but presentation ones such as ``viewport``.
    """
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(markup, "html.parser")
    metadata: dict[str, Any] = {}
    for tag in soup.find_all("meta", attrs={"name": True, "content": True}):
        name = str(tag["name"]).strip().lower()
        if name and name not in HTML_META_IGNORED:
            metadata[name] = str(tag["content"]).strip()
    if soup.title and soup.title.get_text(strip=True):
        metadata["title"] = soup.title.get_text(" ", strip=True)
    for tag in soup.find_all(HTML_INVISIBLE):
        tag.decompose()
    paragraphs = (" ".join(block.split()) for block in PARAGRAPH_BREAK.split(_block_text(soup)))
    return "\n\n".join(p for p in paragraphs if p), metadata


def _block_text(soup: Any) -> str:
    """The page's text (as ``get_text`` gives it) with a paragraph break before and after every
    block element, in one pass over the tree: linear however deeply the elements nest (inserting
    the breaks into the tree costs a walk to each element's last descendant, quadratic in depth)."""
    from bs4 import CData, NavigableString, Tag

    pieces: list[str] = []
    open_tags: list[Any] = []  # the current element's ancestors below the root, outermost first
    for element in soup.descendants:
        while open_tags and open_tags[-1] is not element.parent:
            if open_tags.pop().name in HTML_BLOCKS:
                pieces.append("\n\n")
        if isinstance(element, Tag):
            if element.name in HTML_BLOCKS:
                pieces.append("\n\n")
            open_tags.append(element)
        elif type(element) in (NavigableString, CData):  # text, not comments or declarations
            pieces.append(str(element))
    pieces.extend("\n\n" for tag in open_tags if tag.name in HTML_BLOCKS)
    return "".join(pieces)


def split_front_matter(text: str) -> tuple[str, dict[str, Any]]:
    """A Markdown file's YAML front matter as metadata, and the text with it blanked out.

    The front matter becomes spaces (its line breaks kept), so chunk offsets still point into the
    file itself. Only a mapping counts as front matter; anything else between ``---`` lines (a
    horizontal rule, broken YAML) stays part of the text. Dates and other non-JSON values become
    strings, so the metadata round-trips through the index's JSON column unchanged.
    """
    match = FRONT_MATTER.match(text)
    if not match:
        return text, {}
    import yaml

    try:
        data = yaml.safe_load(match.group(1))
    except (yaml.YAMLError, RecursionError):  # broken, or nested past Python's stack
        return text, {}
    if not isinstance(data, dict):
        return text, {}
    if not within_bounds(data):  # before json.dumps expands the aliases
        raise TooLarge
    metadata = json.loads(json.dumps({str(k): v for k, v in data.items()}, default=str))
    blanked = re.sub(r"[^\n]", " ", match.group(0))
    return blanked + text[match.end() :], metadata


def guess_title(text: str, path: Path) -> str:
    """A Markdown heading, an underlined reStructuredText title, a short first line, or the file
    name; lines of markup before the text (badges, images, directives) are passed over."""
    lines = _content_lines(text)[:3]
    first = lines[0] if lines else ""
    if first.startswith("#"):
        return first.lstrip("#").strip() or path.stem
    if 0 < len(first) <= 120 and (len(lines) < 2 or not lines[1] or set(lines[1]) <= set("=-~^*#")):
        return first
    return path.stem


MARKUP_LINE = re.compile(
    r"^(?:(?:\|[^|]+\|\s*)+"  # reStructuredText substitutions: |Logo| |build-status|
    r"|\.\.\s.*"  # a directive or comment: .. image:: logo.png
    r"|:\w[\w-]*:.*"  # a directive's option: :target: https://...
    r"|\[?!\[.*"  # Markdown images and badges: [![PyPI](...)](...)
    r"|<[^>]*>.*"  # an HTML tag: <p align="center">
    r"|([=\-~^*#+`])\1{2,})$"  # a title's overline
)


def _content_lines(text: str, scanned: int = 40) -> list[str]:
    """The first ``scanned`` lines, stripped, from the first that is not markup on, markup lines
    (and the indented lines under a directive) left out before it."""
    lines = text.strip().splitlines()[:scanned]
    for number, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not MARKUP_LINE.match(stripped) and not line[:1].isspace():
            return [kept.strip() for kept in lines[number:]]
    return []

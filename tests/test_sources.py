"""Reading files: supported types, binary and empty files, encodings, HTML, hidden folders."""

from __future__ import annotations

import os

import pytest

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.sources import decode_text, html_to_text, read_document, scan, split_front_matter


def test_sample_corpus_reads_every_file(sample_corpus):
    result = scan([sample_corpus])
    assert result.skipped == []
    assert len(result.documents) == len([p for p in sample_corpus.rglob("*") if p.is_file()])
    titles = {d.title for d in result.documents}
    assert "How a heat pump heats a house" in titles and "Dialling in espresso" in titles


def test_skips_are_reported_with_reasons(tmp_path):
    (tmp_path / "good.md").write_text("# Title\n\nSome text.")
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "binary.txt").write_bytes(b"\x00\x01\x02binary\x00" * 10)
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    os.symlink(tmp_path / "gone.txt", tmp_path / "broken.txt")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "secret.md").write_text("not indexed")
    result = scan([tmp_path])
    assert [d.path for d in result.documents] == [str(tmp_path / "good.md")]
    reasons = {os.path.basename(s.path): s.reason for s in result.skipped}
    assert reasons == {
        "binary.txt": "binary content",
        "broken.txt": "unreadable: No such file or directory",
        "empty.txt": "empty file",
        "image.png": "unsupported file type '.png'",
    }


def test_non_utf8_text_is_decoded():
    latin1 = "Crème brûlée à la française, déjà vu, naïve façade.".encode("latin-1")
    assert decode_text(latin1) == "Crème brûlée à la française, déjà vu, naïve façade."
    assert decode_text("\ufeffwith BOM".encode()) == "with BOM"
    assert decode_text("utf-16 text".encode("utf-16")) == "utf-16 text"


def test_html_keeps_visible_text_in_paragraphs():
    text, metadata = html_to_text(
        "<html><head><title>T</title><meta name='Author' content=' Ada '><meta name='viewport' "
        "content='width=device-width'><meta charset='utf-8'><script>var x;</script></head><body>"
        "<nav>menu</nav><h1>Head</h1><p>One <b>bold</b>\n word.</p><ul><li>a</li><li>b</li></ul>"
        "</body></html>"
    )
    assert metadata == {"title": "T", "author": "Ada"}
    assert text == "Head\n\nOne bold word.\n\na\n\nb"


def test_front_matter_becomes_metadata_and_offsets_still_point_into_the_file(tmp_path):
    raw = (
        "---\ntitle: Given title\ntags: [a, b]\ndate: 2026-01-02\ndraft: false\n---\n"
        "# Heading\n\nBody text.\n"
    )
    (tmp_path / "doc.md").write_text(raw)
    document = read_document(tmp_path / "doc.md")
    assert document.metadata == {
        "title": "Given title",
        "tags": ["a", "b"],
        "date": "2026-01-02",
        "draft": False,
    }
    assert document.title == "Given title"
    assert len(document.text) == len(raw) and document.text.index("# Heading") == raw.index("# Heading")
    assert document.text.strip().startswith("# Heading") and document.text.count("\n") == raw.count("\n")


@pytest.mark.parametrize(
    "text",
    [
        "---\n\nA horizontal rule above, not front matter.\n",
        "---\n- a list\n---\nbody\n",
        "---\nkey: [\n---\nx\n",
    ],
)
def test_text_that_only_looks_like_front_matter_is_kept(text):
    assert split_front_matter(text) == (text, {})


def test_missing_path_is_an_error(tmp_path):
    with pytest.raises(RagidxError, match="path not found"):
        scan([tmp_path / "nope"])

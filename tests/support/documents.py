"""Texts and files whose contents a test knows exactly: PDF pages, sentence spans."""

from __future__ import annotations

from pathlib import Path


def spans_of(text: str, sentences: list[str]) -> list[tuple[int, int]]:
    spans, cursor = [], 0
    for sentence in sentences:
        start = text.index(sentence, cursor)
        spans.append((start, start + len(sentence)))
        cursor = start + len(sentence)
    return spans


TIDES = (
    "Tidal power converts the energy of tides into electricity. Barrages hold water behind a dam and "
    "release it through turbines when the tide turns, a sentence long enough to wrap over several lines."
)


LAGOONS = "Lagoons are cheaper than barrages in some estuaries."


KELP = "Kelp forests grow fast in cold water rich in nutrients."


def write_pdf(path: Path, pages: list[list[str]], title: str = "Tidal Notes") -> Path:
    import fpdf  # the dev extra's; the tests that call this skip without it

    pdf = fpdf.FPDF()
    pdf.set_title(title)
    pdf.set_author("A. Writer")
    pdf.set_subject("Energy")
    pdf.set_font("Helvetica", size=12)
    for paragraphs in pages:
        pdf.add_page()
        for paragraph in paragraphs:
            pdf.multi_cell(0, 6, paragraph)
            pdf.ln(6)
    pdf.output(str(path))
    return path

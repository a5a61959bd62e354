"""PDF/DOCX extraction speed and `ragidx watch` latency (a change on disk -> searchable); prints numbers.

    python -m tests.benchmarks.documents [--pages 100] [--model minilm] [--changes 5] [--settle 1.0]

Extraction: a PDF of ``--pages`` pages (and a DOCX of the same paragraphs) written here with
fpdf2 and python-docx from the sample corpus's text, read with ragidx's extractors; best of three.
Watch: `ragidx watch` on a copy of the sample corpus in its own process; each change writes a new
file holding a word no other file has, and the time until a lexical search (the Python API,
polled every 10 ms) finds it is the latency. The JSON line of each build gives its own seconds.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docx
from fpdf import FPDF

from ragidx.app import Index
from ragidx.indexer.ingest.extractors import extract_docx, extract_pdf

SAMPLE = Path(__file__).resolve().parents[2] / "sample_corpus"


def paragraphs() -> list[str]:
    """The sample corpus's paragraphs, headings left out."""
    found = []
    for path in sorted(SAMPLE.rglob("*.md")):
        blocks = path.read_text(encoding="utf-8").split("\n\n")
        found += [
            " ".join(b.split()) for b in blocks if b.strip() and not b.lstrip().startswith(("#", "---"))
        ]
    return [p.encode("latin-1", "replace").decode("latin-1") for p in found]  # the core PDF fonts' range


def write_pdf(pages: int, texts: list[str]) -> bytes:
    pdf = FPDF()
    pdf.set_font("Helvetica", size=11)
    cursor = 0
    for _ in range(pages):
        pdf.add_page()
        while pdf.get_y() < 230:
            pdf.multi_cell(0, 5, texts[cursor % len(texts)])
            pdf.ln(3)
            cursor += 1
    return bytes(pdf.output())


def write_docx(texts: list[str], count: int) -> bytes:
    document = docx.Document()
    for i in range(count):
        document.add_paragraph(texts[i % len(texts)])
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def best_of(runs: int, work) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def extraction(pages: int) -> None:
    texts = paragraphs()
    pdf = write_pdf(pages, texts)
    extracted = extract_pdf(pdf)
    assert len(extracted.page_starts) == pages
    seconds = best_of(3, lambda: extract_pdf(pdf))
    count = extracted.text.count("\n\n") + 1
    print(
        f"PDF  {pages} pages, {len(pdf) / 1e6:.2f} MB, {len(extracted.text):,} chars, {count} paragraphs: "
        f"{seconds:.2f} s, {pages / seconds:.1f} pages/s"
    )
    docx_bytes = write_docx(texts, count)
    seconds = best_of(3, lambda: extract_docx(docx_bytes))
    print(
        f"DOCX {count} paragraphs, {len(docx_bytes) / 1e6:.2f} MB: "
        f"{seconds:.3f} s, {count / seconds:.0f} paragraphs/s"
    )


def watch_latency(model: str, changes: int, settle: float) -> None:
    work = Path(tempfile.mkdtemp(prefix="ragidx-watch-"))
    corpus, index = work / "corpus", work / "index"
    shutil.copytree(SAMPLE, corpus)
    command = [
        str(Path(sys.executable).parent / "ragidx"),
        "watch",
        str(corpus),
        "--index",
        str(index),
        "--model",
        model,
        "--settle",
        str(settle),
        "--json",
    ]
    watcher = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        first = json.loads(watcher.stdout.readline())
        print(f"watch: first build {first['seconds']:.1f} s ({first['total_chunks']} chunks, model {model})")
        searcher = Index.open(index)
        latencies, builds = [], []
        for n in range(changes):
            word = f"zyxword{n}"
            started = time.perf_counter()
            (corpus / f"change-{n}.md").write_text(f"# Change {n}\n\nThe marker {word} appears only here.\n")
            while not searcher.search(word, k=1, mode="lexical"):
                time.sleep(0.01)
            latencies.append(time.perf_counter() - started)
            builds.append(json.loads(watcher.stdout.readline())["seconds"])
        print(
            f"watch (--settle {settle}): change -> searchable median {statistics.median(latencies):.2f} s "
            f"(min {min(latencies):.2f}, max {max(latencies):.2f}) over {changes} changes; "
            f"the build itself median {statistics.median(builds):.2f} s"
        )
    finally:
        watcher.terminate()
        watcher.wait()
        shutil.rmtree(work)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pages", type=int, default=100)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--changes", type=int, default=5)
    parser.add_argument("--settle", type=float, nargs="+", default=[1.0, 0.2])
    args = parser.parse_args()
    extraction(args.pages)
    for settle in args.settle:
        watch_latency(args.model, args.changes, settle)


if __name__ == "__main__":
    main()

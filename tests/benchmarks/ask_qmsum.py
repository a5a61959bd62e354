"""Answers with citations on QMSum meetings: retrieval against closed-book, by ROUGE-L against
the annotators' answers, and whether the passages overlap the turns the answer came from.

    pip install rouge-score
    python -m tests.benchmarks.ask_qmsum ../shared/eval/qmsum [--split dev] [--meetings 4]
        [--questions 24] [--model smollm2] [--llm NAME | --llm-url URL] [-k 10] [--max-tokens 1500]
        [--max-new-tokens 128] [--index DIR] [--json FILE]

Writes the first ``--meetings`` meetings of the split (sorted by id) as one text file each (a line
per turn), builds an index of them with ``--model`` and its default strategy (or reuses
``--index``), and asks each of the first ``--questions`` of their questions twice with the same
model: with the retrieved context (`Index.ask`) and closed-book. Prints mean ROUGE-L F1 (stemmed)
of both against the reference answers; the share of questions whose context holds a passage
overlapping the reference turns; and, of the answers that cite, the share citing such a passage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rouge_score import rouge_scorer

from ragidx.app import Index


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def turn_spans(text: str) -> list[tuple[int, int]]:
    """Each turn's (line's) character span in the meeting's text."""
    spans, start = [], 0
    for line in text.split("\n"):
        spans.append((start, start + len(line)))
        start += len(line) + 1
    return spans


def reference_spans(answer: dict[str, Any], turns: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The character spans of the turns the reference answer was drawn from (inclusive ranges)."""
    found = []
    for first, last in answer["relevant_text_span"]:
        first, last = int(first), min(int(last), len(turns) - 1)
        found.append((turns[first][0], turns[last][1]))
    return found


def overlaps(passage: dict[str, Any], path: str, spans: list[tuple[int, int]]) -> bool:
    start, end = passage["span"]
    return passage["path"] == path and any(start < b and a < end for a, b in spans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--split", default="dev")
    parser.add_argument("--meetings", type=int, default=4)
    parser.add_argument("--questions", type=int, default=24)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--llm", default=None)
    parser.add_argument("--llm-url", default=None)
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=1500)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--index", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    judged = [
        line.split("\t") for line in (args.data / "qrels" / f"{args.split}.tsv").read_text().splitlines()[1:]
    ]
    meetings = sorted({meeting for _, meeting, _ in judged})[: args.meetings]
    corpus = {doc["_id"]: doc for doc in read_jsonl(args.data / "corpus.jsonl")}
    queries = {query["_id"]: query["text"] for query in read_jsonl(args.data / "queries.jsonl")}
    answers = {answer["_id"]: answer for answer in read_jsonl(args.data / "answers.jsonl")}
    asked = [query for query, meeting, _ in judged if meeting in meetings and query in answers][
        : args.questions
    ]

    # Beside a reused index, the same folder every time: a build drops only documents under its paths.
    folder = args.index.with_name(args.index.name + "-meetings") if args.index else None
    folder = folder or Path(tempfile.mkdtemp(prefix="qmsum-ask-"))
    folder.mkdir(parents=True, exist_ok=True)
    for stale in set(folder.glob("*.txt")) - {folder / f"{meeting}.txt" for meeting in meetings}:
        stale.unlink()
    for meeting in meetings:
        (folder / f"{meeting}.txt").write_text(corpus[meeting]["text"], encoding="utf-8")
    index_dir = args.index or folder / "index"
    started = time.perf_counter()
    Index.update([folder], index_dir, model=args.model, progress=False)
    built = time.perf_counter() - started
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    rows = []
    with Index.open(index_dir) as index:
        for query in asked:
            meeting = query.rsplit("-", 1)[0]
            path = str((folder / f"{meeting}.txt").resolve())
            spans = reference_spans(answers[query], turn_spans(corpus[meeting]["text"]))
            settings = {"llm": args.llm, "llm_url": args.llm_url, "max_new_tokens": args.max_new_tokens}
            found = index.ask(queries[query], k=args.k, max_tokens=args.max_tokens, **settings).to_dict()
            closed = index.ask(queries[query], closed_book=True, **settings).to_dict()
            reference = answers[query]["answer"]
            rows.append(
                {
                    "query": query,
                    "rouge_l": scorer.score(reference, found["answer"])["rougeL"].fmeasure,
                    "closed_book_rouge_l": scorer.score(reference, closed["answer"])["rougeL"].fmeasure,
                    "context_overlaps": any(overlaps(p, path, spans) for p in found["passages"]),
                    "cites": bool(found["citations"]),
                    "cited_overlaps": any(overlaps(c, path, spans) for c in found["citations"]),
                    "unknown_citations": found["unknown_citations"],
                    "seconds": found["seconds"],
                    "answer": found["answer"],
                    "closed_book_answer": closed["answer"],
                }
            )
    citing = [row for row in rows if row["cites"]]
    summary = {
        "model": args.model,
        "answering": args.llm or args.llm_url or args.model,
        "meetings": len(meetings),
        "questions": len(rows),
        "build_seconds": round(built, 1),
        "rouge_l": statistics.mean(row["rouge_l"] for row in rows),
        "closed_book_rouge_l": statistics.mean(row["closed_book_rouge_l"] for row in rows),
        "retrieval_wins": sum(row["rouge_l"] > row["closed_book_rouge_l"] for row in rows),
        "context_overlap_rate": statistics.mean(row["context_overlaps"] for row in rows),
        "answers_citing": len(citing),
        "cited_overlap_rate": statistics.mean(row["cited_overlaps"] for row in citing) if citing else None,
        "answers_with_unknown_citations": sum(bool(row["unknown_citations"]) for row in rows),
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()

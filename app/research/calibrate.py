"""``ragidx calibrate``: gather calibration texts, measure the intrinsic-dimension curve with a
progress bar, and cache it where KV-Embedding's default layer set looks for it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.chunking import Chunker
from ragidx.indexer.ingest.sources import scan
from ragidx.indexer.model.runtime import ModelRuntime, load_runtime
from ragidx.indexer.strategies.layer_calibration import (
    MAX_TEXT_TOKENS,
    Calibration,
    cache_path,
    calibrate,
    save_calibration,
)

SAMPLE_CORPUS = Path(__file__).resolve().parents[2] / "sample_corpus"
MIN_SENTENCE_WORDS = 4


def calibration_texts(source: Path | None, count: int, tokenizer: Any) -> tuple[list[str], str]:
    """Up to ``count`` distinct texts and a description of where they came from.

    A ``.txt`` file gives one text per line and a ``.jsonl`` file the "text" field of each line;
    a folder or any other document gives its sentences (split as ``build`` splits them), keeping
    those of at least four words. Without a source: the sentences of ragidx's sample corpus.
    A larger pool is subsampled with a fixed seed, so a calibration can be repeated exactly.
    """
    source = source or SAMPLE_CORPUS
    if not source.exists():
        raise RagidxError(f"calibration texts not found: {source} (give a file or folder with --texts)")
    if source.is_file() and source.suffix == ".txt":
        texts = [line.strip() for line in source.read_text(encoding="utf-8", errors="replace").splitlines()]
    elif source.is_file() and source.suffix == ".jsonl":
        texts = _jsonl_texts(source)
    else:
        texts = _document_sentences(source, tokenizer)
    unique = [text for text in dict.fromkeys(texts) if text]
    if len(unique) > count:
        keep = np.sort(np.random.default_rng(0).choice(len(unique), size=count, replace=False))
        unique = [unique[i] for i in keep]
    return unique, str(source)


def _jsonl_texts(path: Path) -> list[str]:
    texts = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                texts.append(str(json.loads(line)["text"]).strip())
            except (ValueError, KeyError, TypeError):
                raise RagidxError(f'{path}:{number}: expected a JSON object with a "text" field') from None
    return texts


def _document_sentences(source: Path, tokenizer: Any) -> list[str]:
    chunker = Chunker(tokenizer, chunk_tokens=MAX_TEXT_TOKENS, overlap_sentences=0)
    sentences = []
    for document in scan([source]).documents:
        for start, end in chunker.sentences(document.text):
            sentence = " ".join(document.text[start:end].split())
            if len(sentence.split()) >= MIN_SENTENCE_WORDS:
                sentences.append(sentence)
    return sentences


def calibrate_model(
    model: str,
    source: Path | None,
    count: int,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
) -> tuple[Calibration, Path]:
    """:func:`calibrate_and_cache` on ``model``, loaded in the precision kv-embedding runs in (its
    layers are what the calibration chooses)."""
    runtime = load_runtime(model, device, dtype, trust_remote_code)
    return calibrate_and_cache(runtime, source, count)


def calibrate_and_cache(
    runtime: ModelRuntime, source: Path | None, count: int, progress: bool = True
) -> tuple[Calibration, Path]:
    """``ragidx calibrate``: gather texts, measure the curve with a progress bar, cache the result."""
    from tqdm import tqdm

    texts, texts_from = calibration_texts(source, count, runtime.tokenizer)
    with tqdm(
        total=len(texts), desc="calibrating", unit="text", disable=None if progress else True, file=sys.stderr
    ) as bar:

        def advance(done: int) -> None:
            bar.update(done)

        calibration = calibrate(runtime, texts, texts_from, advance)
    path = cache_path(calibration.model_key)
    save_calibration(calibration, path)
    return calibration, path

"""Which 16-bit type the GGUF cache should hold: every decoder strategy's float32 vectors from
weights rounded to bfloat16 and to float16, against transformers' own float32 conversion.

Usage: python -m tests.benchmarks.cache_dtype [--model smollm2,gemma3-270m] [--tokens 1200]

Loads the GGUF once through transformers in float32 (what ragidx cached before), then builds the
two rounded copies from it (equal, tensor for tensor, to a cache of that type loaded in float32:
tests/test_gguf.py checks the conversion against transformers'), embeds the sample corpus's first
chunks (up to ``--tokens`` tokens) as documents and the real-weight tests' eight probes as queries,
and prints the lowest and mean cosine to the float32 vectors per strategy and type.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from tests.support.real_models import PROBES, SAMPLE_CORPUS, decoder_strategies

ROUNDED = ("bfloat16", "float16")


def sample_chunks(runtime, chunk_tokens: int, budget: int) -> tuple[list[str], list]:
    """The sample corpus's chunks in document order until ``budget`` tokens, with their sentences."""
    from ragidx.indexer.ingest.chunking import Chunker
    from ragidx.indexer.ingest.sources import SourceDocument, read_document, scan

    chunker = Chunker(runtime.tokenizer, chunk_tokens, 1, None)
    texts, sentences, used = [], [], 0
    for found in scan([SAMPLE_CORPUS], keep_text=False).documents:
        document = read_document(Path(found.path))
        if not isinstance(document, SourceDocument):
            continue
        for chunk in chunker.chunk(document.text)[:2]:
            if used >= budget:
                return texts, sentences
            texts.append(chunk.text)
            sentences.append([(start - chunk.start, end - chunk.start) for start, end in chunk.sentences])
            used += chunk.token_count
    return texts, sentences


def runtimes(model: str) -> dict[str, object]:
    """float32 as transformers converts the GGUF, and the same weights rounded to each type."""
    import torch
    from transformers import AutoModel

    from ragidx.indexer.model.gguf import single_file
    from ragidx.indexer.model.runtime import ModelRuntime, load_tokenizer
    from ragidx.indexer.model.sources import resolve_model

    source = resolve_model(model)
    with tempfile.TemporaryDirectory() as scratch, single_file(source.gguf, Path(scratch)) as path:
        exact = AutoModel.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer = load_tokenizer(source.loadable())  # the cache's tokenizer, as ragidx loads it
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    made = {"float32": ModelRuntime(exact.eval(), tokenizer, model)}
    for name in ROUNDED:
        copy = AutoModel.from_config(exact.config).eval()
        rounded = {key: value.to(getattr(torch, name)).float() for key, value in exact.state_dict().items()}
        copy.load_state_dict(rounded)
        made[name] = ModelRuntime(copy, tokenizer, model)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2,gemma3-270m")
    parser.add_argument("--tokens", type=int, default=1200)
    arguments = parser.parse_args()
    from ragidx.indexer.strategies import create_strategy

    for model in arguments.model.split(","):
        made = runtimes(model)
        print(f"\n{model}: cosine to float32 weights, float32 compute | min / mean per cache type")
        for name in decoder_strategies():
            vectors = {}
            for kind, runtime in made.items():
                strategy = create_strategy(name, runtime)
                texts, sentences = sample_chunks(runtime, strategy.default_chunk_tokens, arguments.tokens)
                vectors[kind] = np.concatenate([
                    strategy.encode(texts, "document", sentences=sentences),
                    strategy.encode(list(PROBES), "query"),
                ])  # fmt: skip
            cells = []
            for kind in ROUNDED:
                cosines = np.sum(vectors[kind] * vectors["float32"], axis=1)
                cells.append(f"{kind} {cosines.min():.5f} / {cosines.mean():.5f}")
            print(f"  {name:14s} " + "   ".join(cells), flush=True)


if __name__ == "__main__":
    main()

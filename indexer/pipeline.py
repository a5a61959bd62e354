"""Build an index: scan sources, chunk, embed in batches with progress, and commit atomically."""

from __future__ import annotations

import collections
import dataclasses
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from ragidx import __version__
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.runtime import default_model, load_runtime
from ragidx.indexer.sources import SkippedFile, SourceDocument, scan
from ragidx.indexer.store import DocumentRecord, IndexWriter, default_index_dir

EMBED_SLICE = 256  # chunks tokenised and embedded per step; bounds memory, not results
# Options only some strategies take (each strategy refuses the ones it does not).
STRATEGY_OPTIONS = (
    "prompt",
    "layers",
    "query_instruction",
    "normalize_layers",
    "rewire",
    "exit_layer",
    "block_sentences",
    "placeholder_init",
    "pool",
    "icl_demo",
    "aux_prompt",
    "cp_layer",
    "cp_mode",
    "cp_alpha",
    "output_layer",
    "kv_bias",
)


@dataclass
class BuildOptions:
    """Everything ``ragidx build`` can be told; ``None`` means the model's or strategy's default."""

    model: str = field(default_factory=default_model)
    strategy: str | None = None
    index_dir: Path = field(default_factory=default_index_dir)
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int = 32
    max_batch_tokens: int = 16384
    max_length: int | None = None
    chunk_tokens: int | None = None
    overlap_sentences: int = 1
    spacy_model: str | None = None
    document_template: str | None = None
    query_template: str | None = None
    strategy_options: dict[str, Any] = field(default_factory=dict)
    rebuild: bool = False
    trust_remote_code: bool = False
    progress: bool = True


def split_strategy_options(options: dict[str, Any]) -> dict[str, Any]:
    """Pop the strategy options out of ``options``, keeping only those given (not None)."""
    given = {name: options.pop(name, None) for name in STRATEGY_OPTIONS}
    return {name: value for name, value in given.items() if value is not None}


def build_options(index_dir: str | Path | None = None, **options: Any) -> BuildOptions:
    """:class:`BuildOptions` from keyword arguments; strategy options may be given flat."""
    strategy_options = {**options.pop("strategy_options", {}), **split_strategy_options(options)}
    known = {f.name for f in dataclasses.fields(BuildOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise RagidxError(f"unknown build option {unknown[0]!r}")
    if index_dir is not None:
        options["index_dir"] = Path(index_dir)
    return BuildOptions(strategy_options=strategy_options, **options)


@dataclass
class BuildReport:
    index_dir: str
    generation: int
    model: str
    strategy: str
    strategy_reason: str
    strategy_notes: dict[str, Any]
    documents: int
    chunks: int
    tokens: int
    truncated_chunks: int
    skipped: list[SkippedFile]
    seconds: float
    embed_seconds: float

    @property
    def vectors_per_second(self) -> float:
        return self.chunks / self.embed_seconds if self.embed_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index_dir,
            "generation": self.generation,
            "model": self.model,
            "strategy": self.strategy,
            "strategy_reason": self.strategy_reason,
            "strategy_notes": self.strategy_notes,
            "documents": self.documents,
            "chunks": self.chunks,
            "tokens": self.tokens,
            "truncated_chunks": self.truncated_chunks,
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
            "seconds": round(self.seconds, 3),
            "vectors_per_second": round(self.vectors_per_second, 2),
        }


def describe_skips(skipped: Sequence[SkippedFile]) -> str:
    reasons = collections.Counter(s.reason for s in skipped)
    return ", ".join(f"{count} {reason}" for reason, count in reasons.most_common())


def build(paths: Sequence[str | Path], options: BuildOptions) -> BuildReport:
    """Index exactly the documents under ``paths`` (the index's previous contents are replaced)."""
    from ragidx.indexer.chunking import Chunker
    from ragidx.indexer.strategies import BatchSettings, create_strategy, default_strategy_name

    started = time.perf_counter()
    if not paths:
        raise RagidxError("nothing to index: give at least one file or folder")
    scanned = scan(paths, exclude=options.index_dir)
    if not scanned.documents:
        detail = (
            f" ({len(scanned.skipped)} skipped: {describe_skips(scanned.skipped)})" if scanned.skipped else ""
        )
        raise RagidxError(f"no readable documents in {', '.join(map(str, paths))}{detail}")
    with IndexWriter(options.index_dir) as writer:
        runtime = load_runtime(options.model, options.device, options.dtype, options.trust_remote_code)
        name = options.strategy or default_strategy_name(runtime)
        reason = (
            "given with --strategy"
            if options.strategy
            else f"default for {'decoder' if runtime.arch.is_decoder else 'encoder'} models"
        )
        strategy = create_strategy(
            name,
            runtime,
            document_template=options.document_template,
            query_template=options.query_template,
            max_length=options.max_length,
            batch=BatchSettings(max_rows=options.batch_size, max_tokens=options.max_batch_tokens),
            **options.strategy_options,
        )
        notes = strategy.notes
        chunker = Chunker(
            runtime.tokenizer,
            options.chunk_tokens or strategy.default_chunk_tokens,
            options.overlap_sentences,
            options.spacy_model,
        )
        settings = {
            "model": runtime.model_id,
            "model_revision": runtime.revision,
            "model_type": runtime.arch.model_type,
            "strategy": name,
            "strategy_params": strategy.params,
            "chunker": chunker.settings,
        }
        _refuse_incompatible(writer.meta, settings, options.rebuild)
        records = _chunk_documents(scanned.documents, chunker, options.progress)
        embed_started = time.perf_counter()
        vectors = _embed(records, strategy, options.progress)
        embed_seconds = time.perf_counter() - embed_started
        meta = {
            **settings,
            "strategy_reason": reason,
            "strategy_notes": notes,
            "dimension": strategy.dimension,
            "dtype": str(runtime.dtype).removeprefix("torch."),
            "ragidx_version": __version__,
        }
        generation = writer.replace_all(records, vectors, meta)
    return BuildReport(
        index_dir=str(options.index_dir),
        generation=generation,
        model=runtime.model_id,
        strategy=name,
        strategy_reason=reason,
        strategy_notes=notes,
        documents=len(records),
        chunks=len(vectors),
        tokens=sum(c.token_count for r in records for c in r.chunks),
        truncated_chunks=strategy.truncated,
        skipped=scanned.skipped,
        seconds=time.perf_counter() - started,
        embed_seconds=embed_seconds,
    )


def _refuse_incompatible(existing: dict[str, Any], settings: dict[str, Any], rebuild: bool) -> None:
    """Replacing an index built with other settings needs ``--rebuild``: its vectors would not mix."""
    if rebuild or not existing.get("generation"):
        return
    differing = [
        key
        for key in ("model", "strategy", "strategy_params", "chunker")
        if existing.get(key) != settings[key]
    ]
    if differing:
        shown = ", ".join(
            f"{k} {existing.get(k)!r} -> {settings[k]!r}" for k in differing if k in ("model", "strategy")
        )
        raise RagidxError(
            f"the index was built with other settings ({shown or ', '.join(differing)}); "
            "pass --rebuild to replace it"
        )


def _chunk_documents(
    documents: Sequence[SourceDocument], chunker: Any, progress: bool
) -> list[DocumentRecord]:
    from tqdm import tqdm

    bar = tqdm(documents, desc="chunking", unit="file", disable=None if progress else True, file=sys.stderr)
    return [DocumentRecord(doc, chunker.chunk(doc.text), doc.metadata) for doc in bar]


def _embed(records: Sequence[DocumentRecord], strategy: Any, progress: bool) -> np.ndarray:
    from tqdm import tqdm

    chunks = [chunk for record in records for chunk in record.chunks]
    texts = [chunk.text for chunk in chunks]
    sentences = [
        [(start - chunk.start, end - chunk.start) for start, end in chunk.sentences] for chunk in chunks
    ]
    out = np.zeros((len(texts), strategy.dimension), dtype=np.float32)
    started = time.perf_counter()
    tokens = 0
    with tqdm(
        total=len(texts), desc="embedding", unit="chunk", disable=None if progress else True, file=sys.stderr
    ) as bar:

        def advance(rows: int, batch_tokens: int) -> None:
            nonlocal tokens
            tokens += batch_tokens
            bar.update(rows)
            bar.set_postfix(tok_s=f"{tokens / max(time.perf_counter() - started, 1e-9):.0f}")

        for first in range(0, len(texts), EMBED_SLICE):
            window = slice(first, first + EMBED_SLICE)
            out[window] = strategy.encode(texts[window], "document", advance, sentences[window])
    return out

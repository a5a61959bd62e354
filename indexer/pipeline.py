"""Build an index: scan sources, chunk, embed in batches with progress, and commit atomically."""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragidx import __version__
from ragidx.indexer.auto_strategy import choose_strategy
from ragidx.indexer.changes import ChangePlan, plan_changes
from ragidx.indexer.chunking import Chunker
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.maintenance import reembed
from ragidx.indexer.models import canonical_model_id, check_same_file, resolve_model
from ragidx.indexer.progress import progress as progress_bar
from ragidx.indexer.runtime import default_model
from ragidx.indexer.sources import ScanResult, SkippedFile, SourceDocument, read_document, scan
from ragidx.indexer.store import Committed, DocumentRecord, IndexWriter, NextGeneration, default_index_dir
from ragidx.indexer.strategies import (
    LONG_DOCUMENT_STRATEGY,
    BatchSettings,
    create_strategy,
    default_strategy,
    load_runtime_for,
    strategy_class,
    strategy_from_index,
)
from ragidx.indexer.tuning import TuningReport, needs_tuning, tune_and_store
from ragidx.indexer.vector_index import VectorIndexSettings

EMBED_SLICE = 256  # chunks tokenised and embedded per step; bounds memory, not results
# Options only some strategies take (each strategy refuses the ones it does not).
STRATEGY_OPTIONS = (
    "prompt",
    "layers",
    "query_instruction",
    "normalize_layers",
    "attention_norm",
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
    "sink",
)


@dataclass
class BuildOptions:
    """Everything ``ragidx build`` can be told; ``None`` means the existing index's setting, else
    the model's or strategy's default."""

    model: str | None = None
    strategy: str | None = None
    index_dir: Path = field(default_factory=default_index_dir)
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int = 32
    max_batch_tokens: int = 16384
    max_length: int | None = None
    chunk_tokens: int | None = None
    overlap_sentences: int | None = None
    spacy_model: str | None = None
    document_template: str | None = None
    query_template: str | None = None
    strategy_options: dict[str, Any] = field(default_factory=dict)
    index_type: str | None = None
    hnsw_m: int | None = None
    ef_construction: int | None = None
    ef_search: int | None = None
    nlist: int | None = None
    nprobe: int | None = None
    rebuild: bool = False
    trust_remote_code: bool = False
    progress: bool = True
    tune: bool = True

    def vector_index(self, meta: dict[str, Any]) -> VectorIndexSettings:
        """The index type and parameters to commit: ``meta``'s, with the ones given replaced."""
        return VectorIndexSettings.from_meta(meta).with_overrides(
            requested=self.index_type,
            hnsw_m=self.hnsw_m,
            ef_construction=self.ef_construction,
            ef_search=self.ef_search,
            nlist=self.nlist,
            nprobe=self.nprobe,
        )


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
    dtype: str
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
    changes: ChangePlan
    total_documents: int
    total_chunks: int
    vector_index: VectorIndexSettings
    vector_index_rebuilt: str
    tuning: TuningReport | None = None  # when this build tuned the hybrid weights
    restored: int = 0  # chunks whose lost vectors this build re-embedded from their stored text
    fusion: dict[str, Any] | None = None  # the index's hybrid weights and the figures behind them

    @property
    def vectors_per_second(self) -> float:
        return self.chunks / self.embed_seconds if self.embed_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index_dir,
            "generation": self.generation,
            "model": self.model,
            "dtype": self.dtype,
            "strategy": self.strategy,
            "strategy_reason": self.strategy_reason,
            "strategy_notes": self.strategy_notes,
            "documents": self.documents,
            "chunks": self.chunks,
            "new": len(self.changes.new),
            "updated": len(self.changes.updated),
            "unchanged": self.changes.unchanged,
            "removed": self.changes.removed,
            "total_documents": self.total_documents,
            "total_chunks": self.total_chunks,
            "vector_index": self.vector_index.to_meta(),
            "vector_index_rebuilt": self.vector_index_rebuilt,
            "fusion": self.fusion,
            "tuned": self.tuning is not None,
            "restored": self.restored,
            "tokens": self.tokens,
            "truncated_chunks": self.truncated_chunks,
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
            "seconds": round(self.seconds, 3),
            "vectors_per_second": round(self.vectors_per_second, 2),
        }


def describe_skips(skipped: Sequence[SkippedFile]) -> str:
    reasons = collections.Counter(s.reason for s in skipped)
    return ", ".join(f"{count} {reason}" for reason, count in reasons.most_common())


def build(
    paths: Sequence[str | Path], options: BuildOptions, loaded: dict[tuple[Any, ...], Any] | None = None
) -> BuildReport:
    """Bring the index up to date with the documents under ``paths``.

    New and changed documents (by SHA-256) are embedded; documents under ``paths`` that are gone
    are removed; documents elsewhere in the index are kept. ``options.rebuild`` re-embeds
    everything and makes the index exactly ``paths``. Settings not given are the index's own.
    ``loaded`` keeps the model between builds of one process (``watch``): it holds the last one.
    """
    started = time.perf_counter()
    if not paths:
        raise RagidxError("nothing to index: give at least one file or folder")
    with IndexWriter(options.index_dir) as writer:
        previous = writer.meta if writer.meta.get("generation") else {}
        stored = previous if not options.rebuild else {}
        inherited = _inherited_settings(options, previous)
        indexed = writer.documents() if stored else {}
        scanned = _scan(paths, options.index_dir, {path: found[1] for path, found in indexed.items()})
        plan = plan_changes(scanned, indexed, paths)
        vector_index = options.vector_index(writer.meta)
        restructure = bool(stored) and vector_index != VectorIndexSettings.from_meta(stored)
        lost = bool(stored) and writer.vectors_lost()  # restored from the chunks' stored text
        if stored and not plan.to_embed and not lost and not _changes_settings(options, stored):
            committed = (
                writer.remove_documents(plan.stale, vector_index=vector_index)
                if plan.stale or restructure
                else None
            )
            return _report(options, writer, plan, scanned.skipped, started, stored, committed)
        source = resolve_model(options.model or inherited.get("model") or default_model())
        if source.model_id == stored.get("model"):
            check_same_file(source, stored.get("model_file"))  # before a changed GGUF is converted
        arguments = (
            source,
            options.device,
            _dtype(options, stored),
            options.trust_remote_code,
            (options.strategy or inherited.get("strategy"),),
        )
        runtime = loaded.get(arguments) if loaded is not None else None
        if runtime is None:
            runtime = load_runtime_for(*arguments)
            if loaded is not None:
                loaded.clear()
                loaded[arguments] = runtime
        name, reason = _choose_strategy(options, inherited, runtime, scanned.documents)
        strategy = _create_strategy(name, runtime, options, inherited)
        chunker = _create_chunker(runtime, strategy, options, inherited)
        settings = {
            "model": runtime.model_id,
            "model_revision": runtime.revision,
            "model_file": runtime.model_file,
            "model_type": runtime.arch.model_type,
            "strategy": name,
            "strategy_params": strategy.params,
            "chunker": chunker.settings,
        }
        _refuse_incompatible(stored, settings)
        if stored and not plan.changes_anything and not restructure and not lost:
            return _report(options, writer, plan, scanned.skipped, started, stored, None)
        with writer.next_generation(plan.stale, replace=not stored) as pending:
            restored = writer.chunk_ids() if lost else []  # the chunks that survive the removals
            if lost:
                pending.restore(restored, reembed(writer, strategy, restored))
            embedded = _embed_documents(plan.to_embed, chunker, strategy, pending, options.progress)
            embedded.restored = len(restored)
            meta = {
                **settings,
                "strategy_reason": reason,
                "strategy_notes": strategy.notes,
                "dimension": strategy.dimension,
                "dtype": str(runtime.dtype).removeprefix("torch."),
                "ragidx_version": __version__,
            }
            committed = pending.commit(meta, vector_index=vector_index, fresh_vectors=lost)
        tuning = _tune(options, writer, strategy, fresh=not stored)
        skipped = scanned.skipped + embedded.skipped
        return _report(options, writer, plan, skipped, started, meta, committed, embedded, tuning)


def _scan(paths: Sequence[str | Path], index_dir: Path, known: dict[str, str]) -> ScanResult:
    """The documents under ``paths`` (texts dropped; files whose hash is ``known`` not extracted)."""
    scanned = scan(paths, exclude=index_dir, keep_text=False, known=known)
    if not scanned.documents:
        detail = (
            f" ({len(scanned.skipped)} skipped: {describe_skips(scanned.skipped)})" if scanned.skipped else ""
        )
        raise RagidxError(f"no readable documents in {', '.join(map(str, paths))}{detail}")
    return scanned


def _inherited_settings(options: BuildOptions, previous: dict[str, Any]) -> dict[str, Any]:
    """The index's settings that a build starts from: all of them, also for ``--rebuild``, unless
    the build names another model (whose layers, templates and token counts differ)."""
    if options.model and canonical_model_id(options.model) != previous.get("model"):
        return {}
    return previous


def _tune(options: BuildOptions, writer: IndexWriter, strategy: Any, fresh: bool) -> TuningReport | None:
    """Tune the hybrid weights of a new index, or of one whose size moved enough since its tuning.

    A fresh index built with ``tune=False`` drops the weights a previous index left in the meta:
    they were measured for other vectors.
    """
    if not options.tune:
        if fresh:
            writer.update_meta({"fusion": None})
        return None
    if not (fresh or needs_tuning(writer.meta, writer.counts()["chunks"])):
        return None
    return tune_and_store(writer, strategy, device=options.device)


def _dtype(options: BuildOptions, stored: dict[str, Any]) -> str:
    """``auto`` adds to an index in the dtype it was built in, so its vectors all come out alike."""
    if options.dtype == "auto" and stored.get("dtype") and not options.rebuild:
        return str(stored["dtype"])
    return options.dtype


def _changes_settings(options: BuildOptions, stored: dict[str, Any]) -> bool:
    """Whether the options name anything that needs the model to compare with the index's settings."""
    if options.model and canonical_model_id(options.model) != stored.get("model"):
        return True
    if options.strategy and options.strategy not in (stored.get("strategy"), "auto"):
        return True
    if options.strategy == "auto" and not str(stored.get("strategy_reason", "")).startswith("auto"):
        return True
    given_chunker = {
        "chunk_tokens": options.chunk_tokens,
        "overlap_sentences": options.overlap_sentences,
        "spacy_model": options.spacy_model,
    }
    if any(v is not None and stored.get("chunker", {}).get(k) != v for k, v in given_chunker.items()):
        return True
    return bool(
        options.strategy_options or options.document_template or options.query_template or options.max_length
    )


def _choose_strategy(
    options: BuildOptions, stored: dict[str, Any], runtime: Any, documents: Sequence[SourceDocument]
) -> tuple[str, str]:
    """The strategy's name and the reason it was chosen (stored in the index and printed)."""
    if options.strategy == "auto":
        if not options.rebuild and str(stored.get("strategy_reason", "")).startswith("auto"):
            return stored["strategy"], stored["strategy_reason"]
        counts = [len(runtime.tokenizer(text)["input_ids"]) for text in _texts(documents)]
        return choose_strategy(counts, default_strategy(runtime.model.config)[0], LONG_DOCUMENT_STRATEGY)
    if options.strategy:
        return options.strategy, "given with --strategy"
    if stored:
        return stored["strategy"], stored.get("strategy_reason", "the index's strategy")
    return default_strategy(runtime.model.config)


def _create_strategy(name: str, runtime: Any, options: BuildOptions, stored: dict[str, Any]) -> Any:
    """The strategy with the index's stored parameters (same strategy), overridden by those given."""
    given = {
        "document_template": options.document_template,
        "query_template": options.query_template,
        "max_length": options.max_length,
        **options.strategy_options,
    }
    given = {key: value for key, value in given.items() if value is not None}
    batch = BatchSettings(max_rows=options.batch_size, max_tokens=options.max_batch_tokens)
    if stored.get("strategy") == name:
        return strategy_from_index(name, runtime, stored.get("strategy_params", {}), batch=batch, **given)
    return create_strategy(name, runtime, batch=batch, **given)


def _create_chunker(runtime: Any, strategy: Any, options: BuildOptions, stored: dict[str, Any]) -> Any:

    previous = stored.get("chunker", {}) if stored.get("strategy") == strategy.name else {}
    return Chunker(
        runtime.tokenizer,
        options.chunk_tokens or previous.get("chunk_tokens") or strategy.default_chunk_tokens,
        _first_given(options.overlap_sentences, previous.get("overlap_sentences"), 1),
        options.spacy_model or previous.get("spacy_model"),
    )


def _first_given(*values: Any) -> Any:
    return next(v for v in values if v is not None)


def _report(
    options: BuildOptions,
    writer: IndexWriter,
    plan: ChangePlan,
    skipped: list[SkippedFile],
    started: float,
    meta: dict[str, Any],
    committed: Committed | None,
    embedded: Embedded | None = None,
    tuning: TuningReport | None = None,
) -> BuildReport:
    totals = writer.counts()
    return BuildReport(
        index_dir=str(options.index_dir),
        generation=int(writer.meta["generation"]),
        model=meta["model"],
        dtype=meta.get("dtype", ""),
        strategy=meta["strategy"],
        strategy_reason=meta.get("strategy_reason", ""),
        strategy_notes=meta.get("strategy_notes", {}),
        documents=embedded.documents if embedded else 0,
        chunks=embedded.chunks if embedded else 0,
        tokens=embedded.tokens if embedded else 0,
        truncated_chunks=embedded.truncated if embedded else 0,
        skipped=skipped,
        seconds=time.perf_counter() - started,
        embed_seconds=embedded.seconds if embedded else 0.0,
        changes=plan,
        total_documents=totals["documents"],
        total_chunks=totals["chunks"],
        vector_index=VectorIndexSettings.from_meta(writer.meta),
        vector_index_rebuilt=committed.rebuilt if committed else "",
        tuning=tuning,
        fusion=writer.meta.get("fusion"),
        restored=embedded.restored if embedded else 0,
    )


def _refuse_incompatible(existing: dict[str, Any], settings: dict[str, Any]) -> None:
    """Adding to an index built with other settings needs ``--rebuild``: its vectors would not mix."""
    if not existing:
        return

    if existing.get("strategy") == settings["strategy"]:
        upgraded = strategy_class(settings["strategy"]).upgrade_params(existing.get("strategy_params", {}))
        existing = {**existing, "strategy_params": upgraded}
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
            "pass --rebuild to re-embed everything with the new ones"
        )


def _texts(documents: Sequence[SourceDocument]) -> Iterator[str]:
    """The documents' texts, read again one at a time (the scan keeps none); unreadable ones are left out."""
    for document in documents:
        fresh = read_document(Path(document.path))
        if isinstance(fresh, SourceDocument):
            yield fresh.text


@dataclass
class Embedded:
    """What the embedding pass did."""

    documents: int = 0
    chunks: int = 0
    tokens: int = 0
    truncated: int = 0
    seconds: float = 0.0
    skipped: list[SkippedFile] = field(default_factory=list)
    restored: int = 0  # chunks already indexed whose lost vectors were re-embedded


def _embed_documents(
    documents: Sequence[SourceDocument], chunker: Any, strategy: Any, pending: NextGeneration, progress: bool
) -> Embedded:
    """Re-read, chunk and embed ``documents`` a group at a time, handing each group's rows and
    vectors to ``pending`` at once, so memory holds one group's texts, not the corpus's.

    A file that became unreadable since the scan is skipped and reported.
    """
    embedded = Embedded()
    started = time.perf_counter()
    group: list[DocumentRecord] = []
    fed = 0  # templated tokens through the model, for the rate shown
    with progress_bar(len(documents), "embedding", "documents", progress) as bar:

        def advance(rows: int, batch_tokens: int) -> None:
            nonlocal fed
            fed += batch_tokens
            bar.set_postfix(tok_s=f"{fed / max(time.perf_counter() - started, 1e-9):.0f}")

        def flush() -> None:
            pending.add(group, _embed(group, strategy, advance))
            bar.update(len(group))
            group.clear()

        for document in documents:
            fresh = read_document(Path(document.path))
            if isinstance(fresh, SkippedFile):
                embedded.skipped.append(fresh)
                bar.update(1)
                continue
            record = DocumentRecord(fresh, chunker.chunk(fresh.text), fresh.metadata)
            group.append(record)
            embedded.documents += 1
            embedded.chunks += len(record.chunks)
            embedded.tokens += sum(chunk.token_count for chunk in record.chunks)
            if sum(len(r.chunks) for r in group) >= EMBED_SLICE:
                flush()
        if group:
            flush()
    embedded.seconds = time.perf_counter() - started
    embedded.truncated = strategy.truncated
    return embedded


def _embed(records: Sequence[DocumentRecord], strategy: Any, advance: Any) -> np.ndarray:
    """One vector per chunk of ``records``, in order; sentence spans are made chunk-relative."""
    chunks = [chunk for record in records for chunk in record.chunks]
    if not chunks:
        return np.zeros((0, strategy.dimension), dtype=np.float32)
    sentences = [
        [(start - chunk.start, end - chunk.start) for start, end in chunk.sentences] for chunk in chunks
    ]
    return strategy.encode([chunk.text for chunk in chunks], "document", advance, sentences)

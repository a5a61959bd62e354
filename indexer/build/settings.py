"""The one place a build's options meet an index's settings
(:class:`~ragidx.indexer.storage.index_settings.IndexSettings`), and loading the strategy they name.

:func:`resolve` owns every rule of "given versus stored": what a build inherits, when it needs the
model, which strategy, parameters and chunker it uses, and what it refuses without ``--rebuild``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.access import DEFAULT_MAX_FILE_BYTES, FileAccess
from ragidx.indexer.ingest.chunking import DEFAULT_OVERLAP_SENTENCES, Chunker
from ragidx.indexer.model.batch_size import device_batch
from ragidx.indexer.model.choices import default_model
from ragidx.indexer.model.runtime import ModelRuntime, load_runtime, model_tokenizer
from ragidx.indexer.model.sources import canonical_model_id, check_same_file, resolve_model
from ragidx.indexer.storage.index_settings import VectorIndexSettings
from ragidx.indexer.storage.location import default_index_dir
from ragidx.indexer.storage.settings import IndexSettings
from ragidx.indexer.storage.stores import resolve_store
from ragidx.indexer.storage.vector_store import StoreSpec
from ragidx.indexer.strategies import (
    OPTION_SPECS,
    Strategy,
    auto_strategy,
    create_strategy,
    default_strategy,
    model_for,
    strategy_class,
    strategy_from_index,
)

# Options only some strategies take (each strategy refuses the ones it does not).
STRATEGY_OPTIONS = tuple(spec.name for spec in OPTION_SPECS)
DENSE_ASKED = "asked for"  # --dense, or an option that shapes vectors: kept on --rebuild too
DENSE_REFUSED = "--no-dense"
COMPARED_KEYS = ("model", "strategy", "strategy_params", "chunker")  # vectors mix only if these agree


def load_strategy(
    settings: IndexSettings, device: str = "auto", dtype: str | None = None, trust_remote_code: bool = False
) -> Strategy:
    """The model and strategy an index was built with, loaded; a changed GGUF file is refused.
    ``dtype`` (default: the index's own) may differ, as a query may run in another precision."""
    source = resolve_model(settings.model)
    check_same_file(source, settings.model_file)
    chosen = dtype or settings.dtype or "auto"
    runtime = load_runtime(source, device, chosen, trust_remote_code, strategy=settings.strategy)
    return strategy_from_index(settings.strategy, runtime, settings.strategy_params)


@dataclass
class BuildOptions:
    """Everything ``ragidx build`` can be told; ``None`` means the existing index's setting, else
    the model's or strategy's default."""

    model: str | None = None
    strategy: str | None = None
    index_dir: Path = field(default_factory=default_index_dir)
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int | None = None  # None: the device's (indexer.model.batch_size)
    max_batch_tokens: int | None = None
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
    ray: str | None = None  # a Ray cluster's address, or "local": embed on its workers
    ray_workers: int | None = None
    store: str | None = None  # "local" (segments) or "milvus"
    milvus_uri: str | None = None
    milvus_collection: str | None = None
    max_file_mb: float | None = None  # files larger than this are skipped (default: the index's, else 64)
    dense: bool | None = None  # vectors always (True), never (False), or as a sample decides (None)

    @classmethod
    def of(cls, index_dir: str | Path | None = None, **options: Any) -> BuildOptions:
        """The options of ``ragidx build`` in Python spelling, checked: an unknown name is refused;
        strategy options may be given flat (``layers="20-27"``) or as ``strategy_options``."""
        strategy_options = {**options.pop("strategy_options", {}), **split_strategy_options(options)}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise RagidxError(f"unknown build option {unknown[0]!r}")
        if options.get("ray_workers") is not None and not options.get("ray"):
            raise RagidxError("--ray-workers needs --ray")
        if index_dir is not None:
            options["index_dir"] = Path(index_dir)
        return cls(strategy_options=strategy_options, **options)


def split_strategy_options(options: dict[str, Any]) -> dict[str, Any]:
    """Pop the strategy options out of ``options``, keeping only those given (not None)."""
    given = {name: options.pop(name, None) for name in STRATEGY_OPTIONS}
    return {name: value for name, value in given.items() if value is not None}


class Resolved(NamedTuple):
    """A build's strategy, chunker and the settings its index records (:meth:`Resolution.resolved`)."""

    strategy: Strategy
    chunker: Chunker
    settings: IndexSettings


@dataclass(frozen=True)
class Resolution:
    """A build's options against the index's settings; see :func:`resolve`."""

    given: BuildOptions
    previous: IndexSettings | None  # the index's committed settings (None: a new index)
    stored: IndexSettings | None  # the settings the build adds to (None: a new index, or --rebuild)
    inherited: IndexSettings | None  # what settings not given default to
    store: StoreSpec  # where the vectors go: the index's store unless --store or its options say otherwise

    @property
    def model(self) -> str:
        inherited = self.inherited.model if self.inherited else None
        return self.given.model or inherited or model_for([self.given.strategy])

    @property
    def chose_decoder(self) -> bool:
        """Whether no model was named and the default decoder was taken for the strategy asked."""
        return not self.given.model and not self.inherited and self.model != default_model()

    @property
    def strategy_asked(self) -> str | None:
        """The strategy named or inherited (``None``: the model's default, known once it is loaded)."""
        return self.given.strategy or (self.inherited.strategy if self.inherited else None)

    @property
    def dtype(self) -> str:
        """``auto`` adds to an index in the dtype it was built in, so its vectors all come out alike."""
        if self.given.dtype == "auto" and self.stored and self.stored.dtype:
            return self.stored.dtype
        return self.given.dtype

    @property
    def vector_index(self) -> VectorIndexSettings:
        """The index type and parameters to commit: the index's, with the ones given replaced."""
        given = self.given
        previous = self.previous.vector_index if self.previous else VectorIndexSettings()
        return previous.with_overrides(
            requested=given.index_type,
            hnsw_m=given.hnsw_m,
            ef_construction=given.ef_construction,
            ef_search=given.ef_search,
            nlist=given.nlist,
            nprobe=given.nprobe,
        )

    def access(self, paths: Sequence[str | Path]) -> FileAccess:
        """What this build may open: regular files under ``paths``, up to the size limit given,
        else the index's own."""
        if self.given.max_file_mb is not None:
            limit = int(self.given.max_file_mb * 2**20)
        else:
            limit = self.previous.max_file_bytes if self.previous else DEFAULT_MAX_FILE_BYTES
        return FileAccess.under(paths, limit)

    def roots(self, access: FileAccess) -> tuple[str, ...]:
        """The index's roots after this build: its own and this build's (only this build's when it
        replaces the index)."""
        kept = self.stored.roots if self.stored else ()
        return tuple(sorted({*kept, *access.roots}))

    @property
    def vector_options(self) -> list[str]:
        """The options given that shape vectors, and so ask for them."""
        given = self.given
        named = {
            "--strategy": given.strategy not in (None, "auto"),
            "strategy options": bool(given.strategy_options),
            "--document-template": given.document_template is not None,
            "--query-template": given.query_template is not None,
            "--max-length": given.max_length is not None,
            "--ray": bool(given.ray),
            "--store milvus": given.store == "milvus",
            "vector index options": any(
                value is not None
                for value in (
                    given.index_type,
                    given.hnsw_m,
                    given.ef_construction,
                    given.ef_search,
                    given.nlist,
                    given.nprobe,
                )
            ),
        }
        return [name for name, asked in named.items() if asked]

    @property
    def dense(self) -> bool | None:
        """Whether the index keeps vectors after this build: as ``--dense``/``--no-dense`` or an
        option that shapes vectors says, else as the index does (a ``--rebuild`` too, where the
        user chose), else None: a sample decides (:mod:`ragidx.indexer.build.sampling`)."""
        chosen = self._dense_choice()
        return chosen[0] if chosen else None

    @property
    def dense_reason(self) -> str:
        chosen = self._dense_choice()
        return chosen[1] if chosen else ""

    def _dense_choice(self) -> tuple[bool, str] | None:
        given = self.given
        if given.dense is not None:
            return given.dense, DENSE_ASKED if given.dense else DENSE_REFUSED
        if self.vector_options:
            return True, DENSE_ASKED
        if self.stored is not None:
            return self.stored.dense, self.stored.dense_reason
        inherited = self.inherited
        if inherited is not None and inherited.dense_reason in (DENSE_ASKED, DENSE_REFUSED):
            return inherited.dense, inherited.dense_reason
        return None

    @property
    def stays_lexical(self) -> bool:
        """Whether this build adds to a lexical index without changing a setting: it chunks with
        the model's tokenizer alone and embeds nothing."""
        return self.stored is not None and self.dense is False and not self.changes_settings

    def lexical_chunker(self) -> Chunker:
        """The chunker of the lexical index being added to, with its model's tokenizer alone."""
        assert self.stored is not None
        return Chunker(model_tokenizer(self.stored.model), **self.stored.chunker)

    @property
    def restructures(self) -> bool:
        """Whether the vector index type or parameters given differ from the index's own."""
        return self.stored is not None and self.vector_index != self.stored.vector_index

    @property
    def changes_settings(self) -> bool:
        """Whether the options name anything that needs the model to compare with the index's settings."""
        given, stored = self.given, self.stored
        if stored is None:
            return True
        if self.dense and not stored.dense:  # a lexical index gets vectors
            return True
        if given.model and canonical_model_id(given.model) != stored.model:
            return True
        if given.strategy and given.strategy not in (stored.strategy, "auto"):
            return True
        if given.strategy == "auto" and not stored.chosen_automatically:
            return True
        chunker = {
            "chunk_tokens": given.chunk_tokens,
            "overlap_sentences": given.overlap_sentences,
            "spacy_model": given.spacy_model,
        }
        if any(value is not None and stored.chunker.get(key) != value for key, value in chunker.items()):
            return True
        return bool(
            given.strategy_options or given.document_template or given.query_template or given.max_length
        )

    def resolved(
        self, runtime: ModelRuntime, vector_index: VectorIndexSettings, access: FileAccess
    ) -> Resolved:
        """What the build embeds with once the model is loaded: the strategy (named, or the index's,
        or the model's default) with its parameters, the chunker, and the settings the index will
        record; an index built with other settings is refused (its vectors would not mix)."""
        name, reason = self._strategy_name(runtime)
        strategy = self._strategy(name, runtime)
        chunker = self._chunker(runtime, strategy)
        settings = IndexSettings(
            model=runtime.model_id,
            strategy=name,
            strategy_params=strategy.params,
            chunker=chunker.settings,
            model_revision=runtime.revision,
            model_file=runtime.model_file,
            model_type=runtime.arch.model_type,
            strategy_reason=reason,
            strategy_notes=kept_notes(self.inherited, name, strategy),
            dimension=strategy.dimension,
            dtype=runtime.precision,
            dtype_reason=runtime.precision_reason,
            vector_index=vector_index,
            store=self.store,
            roots=self.roots(access),
            max_file_bytes=access.max_bytes,
            dense=self.dense is not False,
            dense_reason=self.dense_reason,
        )
        self._refuse_incompatible(settings)
        return Resolved(strategy, chunker, settings)

    def _strategy_name(self, runtime: ModelRuntime) -> tuple[str, str]:
        """The strategy's name and the reason it was chosen (stored in the index and printed)."""
        given, inherited = self.given, self.inherited
        if given.strategy == "auto":
            if not given.rebuild and inherited and inherited.chosen_automatically:
                return inherited.strategy, inherited.strategy_reason
            return auto_strategy(runtime.model.config, runtime.card)
        if given.strategy:
            if self.chose_decoder:
                return given.strategy, f"given with --strategy, on the default decoder {self.model}"
            return given.strategy, "given with --strategy"
        if inherited:
            return inherited.strategy, inherited.strategy_reason
        return default_strategy(runtime.model.config, runtime.card)

    def _strategy(self, name: str, runtime: ModelRuntime) -> Strategy:
        """The strategy with the index's stored parameters (same strategy), overridden by those given."""
        given = {
            "document_template": self.given.document_template,
            "query_template": self.given.query_template,
            "max_length": self.given.max_length,
            **self.given.strategy_options,
        }
        given = {key: value for key, value in given.items() if value is not None}
        batch = device_batch(runtime, self.given.batch_size, self.given.max_batch_tokens)
        if self.inherited and self.inherited.strategy == name:
            return strategy_from_index(name, runtime, self.inherited.strategy_params, batch=batch, **given)
        return create_strategy(name, runtime, batch=batch, **given)

    def _chunker(self, runtime: ModelRuntime, strategy: Strategy) -> Chunker:
        """The chunker given, else the index's (same strategy), else the strategy's default."""
        same = self.inherited is not None and self.inherited.strategy == strategy.name
        previous = self.inherited.chunker if same and self.inherited else {}
        overlaps = (
            self.given.overlap_sentences,
            previous.get("overlap_sentences"),
            DEFAULT_OVERLAP_SENTENCES,
        )
        return Chunker(
            runtime.tokenizer,
            self.given.chunk_tokens or previous.get("chunk_tokens") or strategy.default_chunk_tokens,
            next(overlap for overlap in overlaps if overlap is not None),
            self.given.spacy_model or previous.get("spacy_model"),
        )

    def _refuse_incompatible(self, settings: IndexSettings) -> None:
        """Adding to an index built with other settings needs ``--rebuild``: its vectors would not mix."""
        stored = self.stored
        if stored is None:
            return
        if stored.strategy == settings.strategy:
            upgraded = strategy_class(settings.strategy).upgrade_params(stored.strategy_params)
            stored = dataclasses.replace(stored, strategy_params=upgraded)
        differing = [key for key in COMPARED_KEYS if getattr(stored, key) != getattr(settings, key)]
        shown = [
            f"{key} {getattr(stored, key)!r} -> {getattr(settings, key)!r}"
            for key in differing
            if key in ("model", "strategy")
        ]
        _refuse(shown or differing)

    def refuse_early(self) -> None:
        """The conflicts the options and the stored settings show without the model (another model,
        strategy or chunking), refused before anything loads; :meth:`resolved` compares
        the rest (strategy options, which a strategy resolves against its model: ``--exit-layer -2``
        is stored as 28) once it has."""
        given, stored = self.given, self.stored
        if given.dense is False and self.vector_options:
            raise RagidxError(
                f"--no-dense builds no vectors, so {', '.join(self.vector_options)} would shape nothing: "
                "give one or the other"
            )
        if stored is None:
            return
        if given.dense is False and stored.dense:
            raise RagidxError(
                "the index keeps vectors; pass --rebuild with --no-dense to make it a lexical index"
            )
        if given.dense is None and not stored.dense and self.vector_options:
            raise RagidxError(
                f"the index keeps no vectors ({stored.dense_reason or 'a lexical index'}), and "
                f"{', '.join(self.vector_options)} would add them: pass --dense too to embed its chunks"
            )
        shown = []
        if given.model and canonical_model_id(given.model) != stored.model:
            shown.append(f"model {stored.model!r} -> {canonical_model_id(given.model)!r}")
        if given.strategy not in (None, "auto", stored.strategy):
            shown.append(f"strategy {stored.strategy!r} -> {given.strategy!r}")
        chunker = {
            "chunk_tokens": given.chunk_tokens,
            "overlap_sentences": given.overlap_sentences,
            "spacy_model": given.spacy_model,
        }
        shown += [
            f"{key} {stored.chunker.get(key)!r} -> {value!r}"
            for key, value in chunker.items()
            if value is not None and stored.chunker.get(key) != value
        ]
        _refuse(shown)


def _refuse(differing: Sequence[str]) -> None:
    if differing:
        raise RagidxError(
            f"the index was built with other settings ({', '.join(differing)}); "
            "pass --rebuild to re-embed everything with the new ones"
        )


def resolve(given: BuildOptions, previous: IndexSettings | None) -> Resolution:
    """``given`` against the index's ``previous`` settings: a build adds to them unless
    ``--rebuild``, and inherits them (also on ``--rebuild``) unless it names another model, whose
    layers, templates and token counts differ. Options the named strategy does not declare, or
    values its declaration refuses, are refused here."""
    stored = previous if not given.rebuild else None
    other_model = given.model and previous and canonical_model_id(given.model) != previous.model
    store_options = {"milvus_uri": given.milvus_uri, "milvus_collection": given.milvus_collection}
    store = resolve_store(given.store, store_options, previous.store if previous else None, given.index_dir)
    resolution = Resolution(given, previous, stored, None if other_model else previous, store)
    if stored is not None and store != stored.store:
        raise RagidxError(
            f"the index keeps its vectors in {stored.store.label}; "
            f"pass --rebuild to move them to {store.label}"
        )
    named = resolution.strategy_asked
    if named not in (None, "auto"):  # refuse bad options in milliseconds, before the model loads
        strategy_class(named).Options.given(given.strategy_options, named)
    resolution.refuse_early()
    return resolution


def kept_notes(inherited: IndexSettings | None, name: str, strategy: Strategy) -> dict[str, Any]:
    """What the strategy says of how its settings were chosen: as the build that chose them said,
    when this build (incremental or ``--rebuild``) took them from the index unchanged (its options
    then come from the index, and would all read as given: ``layer source: --layers`` for layers
    the user never gave)."""
    if inherited and inherited.strategy == name and inherited.strategy_params == strategy.params:
        return {**strategy.notes, **inherited.strategy_notes}
    return strategy.notes

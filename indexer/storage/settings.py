"""An index's settings as one typed value, read without the build package or a model: what its
vectors were made with, how they are indexed and where they are stored.

The ``meta`` table stores the settings as JSON under fixed keys (docs/index-on-disk.md);
:class:`IndexSettings` reads and writes exactly those keys, so the format on disk is unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.ingest.access import DEFAULT_MAX_FILE_BYTES, FileAccess
from ragidx.indexer.storage.index_settings import VectorIndexSettings
from ragidx.indexer.storage.location import no_index
from ragidx.indexer.storage.stores import store_from_meta
from ragidx.indexer.storage.vector_store import StoreSpec
from ragidx.indexer.wording import excerpt

MODEL_KEYS = ("model", "model_file", "strategy", "strategy_params")  # what a loaded strategy depends on


@dataclass(frozen=True)
class IndexSettings:
    """What an index's vectors were made with, and how they are indexed."""

    model: str
    strategy: str
    strategy_params: dict[str, Any]
    chunker: dict[str, Any]
    model_revision: str | None = None
    model_file: dict[str, Any] | None = None
    model_type: str | None = None
    strategy_reason: str = "the index's strategy"
    strategy_notes: dict[str, Any] = field(default_factory=dict)
    dimension: int = 0
    dtype: str = ""  # empty for indexes written before the dtype was stored
    dtype_reason: str = ""  # why --dtype auto gave way to memory ("" where it did not)
    vector_index: VectorIndexSettings = field(default_factory=VectorIndexSettings)
    store: StoreSpec = field(default_factory=lambda: store_from_meta({}))
    roots: tuple[str, ...] = ()  # the real paths of what was indexed: nothing outside is ever read
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    dense: bool = True  # False: a lexical index, whose chunks have no vectors
    dense_reason: str = ""  # why it keeps vectors or not: DENSE_ASKED, DENSE_REFUSED, or the sample's verdict

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> IndexSettings | None:
        """The settings of a committed index; None where nothing was committed yet."""
        if not meta.get("generation"):
            return None
        try:
            return cls._read(meta)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            what = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
            raise RagidxError(
                f"the index's settings are damaged ({excerpt(what)} is missing or wrong): "
                "`ragidx build PATH... --rebuild` makes the index again from your documents"
            ) from None

    @classmethod
    def _read(cls, meta: Mapping[str, Any]) -> IndexSettings:
        return cls(
            model=meta["model"],
            strategy=meta["strategy"],
            strategy_params=dict(meta.get("strategy_params") or {}),
            chunker=dict(meta.get("chunker") or {}),
            model_revision=meta.get("model_revision"),
            model_file=meta.get("model_file"),
            model_type=meta.get("model_type"),
            strategy_reason=meta.get("strategy_reason", cls.strategy_reason),
            strategy_notes=dict(meta.get("strategy_notes") or {}),
            dimension=int(meta.get("dimension") or 0),
            dtype=str(meta.get("dtype") or ""),
            dtype_reason=str(meta.get("dtype_reason") or ""),
            vector_index=VectorIndexSettings.from_meta(meta),
            store=store_from_meta(meta),
            roots=tuple(meta.get("roots") or ()),
            max_file_bytes=int(meta.get("max_file_bytes") or DEFAULT_MAX_FILE_BYTES),
            dense=bool(meta.get("dense", True)),
            dense_reason=str(meta.get("dense_reason") or ""),
        )

    @classmethod
    def of_index(cls, meta: Mapping[str, Any], directory: str | Path) -> IndexSettings:
        """The settings of an index that must have a committed generation."""
        settings = cls.from_meta(meta)
        if settings is None:
            raise no_index(Path(directory))
        return settings

    def to_meta(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {
            **values,
            "vector_index": self.vector_index.to_meta(),
            "store": self.store.to_meta(),
            "roots": list(self.roots),
        }

    @property
    def model_identity(self) -> dict[str, Any]:
        """What the loaded model and strategy depend on: a change means loading them again."""
        return {key: getattr(self, key) for key in MODEL_KEYS}

    def access(self, documents: Sequence[str] = ()) -> FileAccess:
        """What serving this index may open again: regular files inside its roots (an index written
        before roots were stored: the folders of its ``documents``)."""
        roots = self.roots or tuple(sorted({str(Path(path).parent) for path in documents}))
        return FileAccess(roots, self.max_file_bytes)

    @property
    def chosen_automatically(self) -> bool:
        """Whether ``--strategy auto`` picked the strategy (it is then re-picked only on ``--rebuild``)."""
        return self.strategy_reason.startswith("auto")

"""Vectors, chunk text and metadata in a Milvus collection (``ragidx build --store milvus``).

SQLite stays the index's catalogue (meta, documents, chunks) and its lexical search: BM25 runs on
the same FTS5 tables as with local vectors, so hybrid scores and tuned fusion weights mean the
same whichever store holds the vectors (the collection itself: :mod:`.collection`).

Milvus has no transaction shared with SQLite, so a commit goes: upsert the new vectors (their
chunk ids are above every committed one, so readers, who search ``chunk_id < next_chunk_id``,
cannot see them yet); commit SQLite with the deletions still owed to Milvus recorded in ``meta``
(readers exclude them); then delete them from Milvus and clear the record (:meth:`finish_commit`). A
build killed at any point leaves the previous generation as it was; the next writer finishes owed
deletions.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ragidx.indexer.faults import checkpoint
from ragidx.indexer.storage.database import in_batches
from ragidx.indexer.storage.index_settings import VectorIndexSettings, default_nlist
from ragidx.indexer.storage.milvus.collection import INDEX_TYPES, MAX_TOP_K, MilvusCollection
from ragidx.indexer.storage.vector_store import (
    GenerationStart,
    Inspection,
    LoadedVectors,
    StoreKind,
    StoreSpec,
    VectorChange,
    VectorQuery,
    Written,
)

if TYPE_CHECKING:
    from sqlite_utils import Database

DEFAULT_COLLECTION = "ragidx"
LOCAL_FILE = "milvus.db"  # milvus-lite's file in the index folder when no --milvus-uri is given
OWED = "milvus_owed"  # meta key: the deletions a committed generation still owes the collection


@dataclass(frozen=True)
class MilvusLocation:
    """Where an index's vectors live: server or milvus-lite file, collection, and the id that ties
    the collection to this index (a collection property)."""

    kind: ClassVar[str] = "milvus"
    option_names: ClassVar[frozenset[str]] = frozenset({"milvus_uri", "milvus_collection"})

    uri: str
    collection: str = DEFAULT_COLLECTION
    index_id: str = ""

    @classmethod
    def from_meta(cls, stored: Mapping[str, Any]) -> MilvusLocation:
        return cls(stored["uri"], stored["collection"], stored["index_id"])

    @classmethod
    def resolve(
        cls, options: Mapping[str, Any], previous: StoreSpec | None, index_dir: Path
    ) -> MilvusLocation:
        """The index's own location unless the options name another; a new one gets a fresh id
        and, without ``--milvus-uri``, a milvus-lite file in the index folder."""
        uri, collection = options.get("milvus_uri"), options.get("milvus_collection")
        if isinstance(previous, MilvusLocation):
            if (uri is None or normal_uri(uri) == previous.uri) and collection in (None, previous.collection):
                return previous
            uri = uri or previous.uri
        return cls(
            normal_uri(uri or os.path.join(index_dir, LOCAL_FILE)),
            collection or DEFAULT_COLLECTION,
            uuid.uuid4().hex,
        )

    def to_meta(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}

    @property
    def where(self) -> str:
        return f"collection {self.collection!r} at {self.uri}"

    @property
    def label(self) -> str:
        return f"Milvus {self.where}"

    def describe(self, vector_index: VectorIndexSettings, parts: int) -> str:
        return f"{self.label}, index {describe_index(vector_index)}"

    def open(self, directory: Path) -> MilvusStore:
        return MilvusStore(self)


def normal_uri(uri: str) -> str:
    """A server's URL as given; a milvus-lite file as an absolute path (builds run from anywhere)."""
    return uri if "://" in uri else os.path.abspath(uri)


def describe_index(settings: VectorIndexSettings) -> str:
    """The collection's index as Milvus names it, with what ragidx set, e.g. ``HNSW (M 32, ...)``."""
    details = {
        "hnsw": f"M {settings.hnsw_m}, efConstruction {settings.ef_construction}, ef {settings.ef_search}",
        "ivf": f"nlist {settings.nlist or default_nlist(MAX_TOP_K)}, nprobe {settings.nprobe}",
    }.get(settings.requested)
    return INDEX_TYPES[settings.requested] + (f" ({details})" if details else "")


def visible(meta: Mapping[str, Any]) -> str:
    """The filter a reader of this committed generation searches with: rows of committed chunks
    (ids below ``next_chunk_id``) less the deletions still owed to Milvus."""
    expression = f"chunk_id < {int(meta.get('next_chunk_id', 1))}"
    owed = meta.get(OWED)
    return f"{expression} and not ({owed})" if owed else expression


def id_list(ids: Sequence[int] | np.ndarray) -> str:
    return f"chunk_id in [{', '.join(str(int(i)) for i in ids)}]"


def structure(settings: VectorIndexSettings) -> tuple[Any, ...]:
    """What a vector index is built with (query-time parameters left out)."""
    return (settings.requested, settings.hnsw_m, settings.ef_construction, settings.nlist)


class MilvusStore:
    """An index's vectors in its Milvus collection (see :class:`~.vector_store.VectorStore`)."""

    deletes_in_place: ClassVar[bool] = True

    def __init__(self, spec: MilvusLocation):
        self.spec = spec
        self._collection: MilvusCollection | None = None
        self._verified = False

    def collection(self) -> MilvusCollection:
        """The collection, connected once per store."""
        if self._collection is None:
            self._collection = MilvusCollection(self.spec)
        return self._collection

    def _verified_collection(self, meta: Mapping[str, Any]) -> MilvusCollection:
        collection = self.collection()
        if not self._verified:
            collection.verify(int(meta.get("dimension") or 0))
            self._verified = True
        return collection

    def load(
        self, db: Database, meta: Mapping[str, Any], reuse: LoadedVectors | None = None
    ) -> MilvusVectors:
        collection = self._verified_collection(meta)
        return MilvusVectors(collection, VectorIndexSettings.from_meta(meta), visible(meta))

    def parts(self, db: Database, meta: Mapping[str, Any]) -> list[dict[str, Any]]:
        return []  # one collection; Milvus keeps its own segments

    def lost(self, db: Database, meta: Mapping[str, Any]) -> list[str]:
        return []

    def begin(self, start: GenerationStart) -> MilvusWrite:
        return MilvusWrite(self, start.db, start.meta, start.requested, start.previous != self.spec)

    def release(self, db: Database, meta: Mapping[str, Any]) -> None:
        """Nothing: SQLite records no Milvus rows."""

    def retire(self) -> None:
        self.collection().drop()

    def finish_commit(self, meta: Mapping[str, Any]) -> dict[str, Any]:
        owed = meta.get(OWED)
        if not owed:
            return {}
        checkpoint("milvus-delete")
        self.collection().delete(owed)
        return {OWED: None}

    def inspect(self, db: Database, meta: Mapping[str, Any]) -> Inspection:
        ids, vectors = self._verified_collection(meta).scan("chunk_id >= 0")
        return Inspection(ids, vectors)

    def close(self) -> None:
        if self._collection is not None:
            self._collection.close()
            self._collection = None
            self._verified = False


class MilvusWrite:
    """A generation's vectors going into the collection: upserted inside the SQLite transaction
    (above every committed chunk id, so unseen), deletions owed until it commits."""

    def __init__(
        self,
        store: MilvusStore,
        db: Database,
        meta: Mapping[str, Any],
        requested: VectorIndexSettings,
        creates: bool,
    ):
        self.store = store
        self.db = db
        self.stored = VectorIndexSettings.from_meta(meta)
        self.requested = requested
        self.creates = creates  # the collection is new to this index (a new index, or --rebuild)
        # Connected (and a taken collection refused) now, before the build embeds anything.
        if creates:
            store.collection().refuse_taken()
        else:
            store.collection()

    def kept_ids(self) -> np.ndarray:
        return np.zeros(0, np.int64)  # nothing is lost in Milvus, so nothing is restored

    def write(self, change: VectorChange) -> Written:
        collection = self.store.collection()
        rebuilt = ""
        if self.creates:
            collection.create(change.dimension, change.model, self.requested)
        else:
            collection.verify(change.dimension)
            if structure(self.requested) != structure(self.stored):
                collection.reindex(self.requested)
                rebuilt = f"Milvus index {self.stored.requested} -> {self.requested.requested}"
        collection.delete(f"chunk_id >= {change.first_id}")  # rows a killed build upserted, never committed
        if change.added is not None:
            collection.upsert(change.ids, change.added, self._chunk_payloads(change.ids))
        if change.replace:
            owed = f"chunk_id < {change.first_id}" if change.first_id > 1 else None
        else:
            gone = np.setdiff1d(change.removed, change.ids)  # a restored chunk's upsert replaced its vector
            owed = id_list(gone) if len(gone) else None
        settings = replace(self.requested, kind=self.requested.requested, ivf_lists=0, trained_on=0)
        return Written(settings, {OWED: owed}, rebuilt)

    def _chunk_payloads(self, ids: np.ndarray) -> dict[int, tuple[str, str, str]]:
        """Each chunk's (path, text, metadata JSON) as this transaction reads them."""
        found: dict[int, tuple[str, str, str]] = {}
        for batch in in_batches(ids.tolist()):
            marks = ",".join("?" for _ in batch)
            sql = (
                "select c.id, d.path, c.text, d.metadata from chunks c join documents d "
                f"on d.id = c.document_id where c.id in ({marks})"
            )
            found.update((row[0], row[1:]) for row in self.db.execute(sql, batch))
        return found

    def abandon(self) -> None:
        """Nothing: rows upserted for a generation that never commits are deleted by the next write."""


@dataclass
class MilvusVectors:
    """A committed generation's vectors in Milvus, searched through the same calls as segments."""

    collection: MilvusCollection
    settings: VectorIndexSettings
    expression: str

    def use_gpu(self) -> bool:
        return False  # the Milvus server decides where it searches

    def search(self, query: VectorQuery) -> tuple[np.ndarray, np.ndarray]:
        allowed = query.allowed
        expression = self.expression if allowed is None else f"{self.expression} and {id_list(allowed)}"
        params: dict[str, Any] = {}
        if self.settings.requested == "hnsw":
            params["ef"] = max(query.ef_search or self.settings.ef_search, min(query.limit, MAX_TOP_K))
        elif self.settings.requested == "ivf":
            params["nprobe"] = query.nprobe or self.settings.nprobe
        return self.collection.search(query.queries, query.limit, expression, params)

    def live_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        return self.collection.scan(self.expression)


if TYPE_CHECKING:  # mypy checks here that the store implements vector_store's protocols
    _implements: StoreKind = MilvusLocation

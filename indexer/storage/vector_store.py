"""Where an index's vectors live, behind one interface.

SQLite holds every index's documents, chunks, lexical tables and settings; its vectors live in a
*vector store*: local segment files (:mod:`.local`, the default) or a Milvus collection
(:mod:`.milvus`), each a sub-package. Code outside this package reaches a store only through
:class:`StoreSpec`, :class:`VectorStore` and :class:`LoadedVectors`; :mod:`.stores` is the one
place that maps the kind an index records to its class. A new store (pgvector, Qdrant, LanceDB) is
one sub-package implementing these protocols and one entry in :data:`.stores.STORE_KINDS`.

The reader and the writer (:mod:`.reader`, :mod:`.writer`) keep the commit protocol: a store's
:meth:`VectorWrite.write` runs inside the generation's SQLite transaction and must leave what it
writes invisible to readers of the previous generation until that transaction commits;
:meth:`VectorStore.finish_commit` then finishes what had to wait for the commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import numpy as np
    from sqlite_utils import Database

    from ragidx.indexer.storage.index_settings import VectorIndexSettings


@dataclass(frozen=True)
class VectorQuery:
    """One search of a generation's vectors, as every store takes it: the query vectors (a row
    each), how many chunks each finds, the chunk ids it may find (ascending; None: any live one)
    and an ANN index's breadth for this search (None: the index's own ``ef_search``/``nprobe``)."""

    queries: np.ndarray
    limit: int
    allowed: np.ndarray | None = None
    ef_search: int | None = None
    nprobe: int | None = None


@dataclass(frozen=True)
class GenerationStart:
    """A generation a store starts writing, as every store takes it: the index's SQLite database
    (in the generation's transaction) and its settings as last committed, the generation's number,
    the vector index ``requested``, the parts ``dropped`` (their chunks are restored by the caller),
    whether it ``replace``s every part, and the store the index's vectors were in (None for a new
    index)."""

    db: Database
    meta: Mapping[str, Any]
    generation: int
    requested: VectorIndexSettings
    dropped: Sequence[str]
    replace: bool
    previous: StoreSpec | None


class LoadedVectors(Protocol):
    """A committed generation's vectors, ready to search."""

    def search(self, query: VectorQuery) -> tuple[np.ndarray, np.ndarray]:
        """Inner-product scores and chunk ids, best first, per query row; the query's ``allowed``
        ids restrict the search itself; -1 ids pad rows with fewer hits."""
        ...

    def live_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """Every live vector's chunk id (ascending) and the vector."""
        ...

    def use_gpu(self) -> bool:
        """Search on the GPU where the store can; whether anything moved."""
        ...


@dataclass(frozen=True)
class VectorChange:
    """What a commit changes in the vectors."""

    added: np.ndarray | None  # new vectors, one row per id
    ids: np.ndarray
    removed: np.ndarray  # chunk ids whose vectors go (a restored chunk may be both)
    first_id: int  # the first chunk id this generation assigns: rows at or above it are new
    replace: bool  # every vector of the previous generation goes
    dimension: int
    model: str


@dataclass(frozen=True)
class Written:
    """What a store wrote: the vector index settings now in use, settings of the store's own to
    record in ``meta`` (with the generation), why everything was rebuilt, what was merged, and
    how many parts (segments) there are."""

    settings: VectorIndexSettings
    meta: dict[str, Any] = field(default_factory=dict)
    rebuilt: str = ""
    merged: str = ""
    parts: int = 0


@dataclass
class Inspection:
    """What ``check`` found in a store: every vector it could read (ids ascending, with their
    vectors), the parts it could not read (name, why), and a repair of the store's own records
    (of the ``misrecorded`` parts) to make before a repair commits (None when they are right)."""

    ids: np.ndarray
    vectors: np.ndarray
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    fix_records: Callable[[], None] | None = None
    misrecorded: list[str] = field(default_factory=list)  # parts whose records the fix rewrites


class VectorWrite(Protocol):
    """The vectors of a generation being written (see :meth:`VectorStore.begin`)."""

    def kept_ids(self) -> np.ndarray:
        """Chunk ids whose vectors the new generation keeps from the previous one."""
        ...

    def write(self, change: VectorChange) -> Written:
        """Add and delete, inside the generation's SQLite transaction; nothing written may be seen
        by readers of the previous generation."""
        ...

    def abandon(self) -> None:
        """The generation will not commit: undo what the store started for it."""
        ...


class VectorStore(Protocol):
    """One index's vectors in one store."""

    # True when a commit deletes rows that a reader of the previous generation may be searching at
    # that moment (Milvus: one collection for every generation); such a reader, seeing a newer
    # generation committed once it has read, reads again. Segment files are never changed in place.
    deletes_in_place: ClassVar[bool]

    @property
    def spec(self) -> StoreSpec:
        """Where it is."""
        ...

    def load(
        self, db: Database, meta: Mapping[str, Any], reuse: LoadedVectors | None = None
    ) -> LoadedVectors | None:
        """The committed generation's vectors (parts ``reuse`` already holds are not read again),
        or None when a newer generation already replaced them: read the new one."""
        ...

    def parts(self, db: Database, meta: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Each stored part (segment file) with its kind and counts, largest first, for ``info``."""
        ...

    def lost(self, db: Database, meta: Mapping[str, Any]) -> list[str]:
        """Parts whose data is gone (a cheap test every build makes: it re-embeds their chunks)."""
        ...

    def begin(self, start: GenerationStart) -> VectorWrite:
        """Start writing the generation ``start`` describes."""
        ...

    def release(self, db: Database, meta: Mapping[str, Any]) -> None:
        """Inside the transaction of a commit that moves the vectors to another store: forget
        what this store recorded in SQLite."""
        ...

    def retire(self) -> None:
        """After that commit: delete what this store held for the index."""
        ...

    def finish_commit(self, meta: Mapping[str, Any]) -> dict[str, Any]:
        """Finish what the committed generation still owes the store (a commit, or a build
        stopped after one); the ``meta`` values that change once it is done."""
        ...

    def inspect(self, db: Database, meta: Mapping[str, Any]) -> Inspection:
        """Read every stored vector for ``check``; raise :class:`RagidxError` when the store
        cannot be read at all."""
        ...

    def close(self) -> None: ...


class StoreSpec(Protocol):
    """Where an index's vectors are, as its ``meta`` records it (``{"kind": ..., ...}``)."""

    kind: ClassVar[str]
    option_names: ClassVar[frozenset[str]]  # the build options that configure this kind

    def to_meta(self) -> dict[str, Any]: ...

    @property
    def label(self) -> str:
        """Where, in a few words: ``local segments``, ``Milvus collection 'ragidx' at URI``."""
        ...

    def describe(self, vector_index: VectorIndexSettings, parts: int) -> str:
        """One line for ``build``, e.g. ``flat (exact; auto), 2 segments``."""
        ...

    def open(self, directory: Path) -> VectorStore: ...


class StoreKind(Protocol):
    """A store's spec class: how a kind is read back and chosen."""

    @property
    def kind(self) -> str: ...

    @property
    def option_names(self) -> frozenset[str]: ...

    def from_meta(self, stored: Mapping[str, Any]) -> StoreSpec: ...

    def resolve(self, options: Mapping[str, Any], previous: StoreSpec | None, index_dir: Path) -> StoreSpec:
        """The spec a build with these options (``option_names``, not None) uses, given the
        index's ``previous`` one."""
        ...

"""The default vector store: segment files in the index folder (``--store local``).

Segments (:mod:`.segments`) are FAISS files written once; the ``segments`` and ``deletions``
tables list a generation's files and the ids deleted from each, inside the same SQLite
transaction as the rows, so a commit is atomic with no step after it but deleting unlisted files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ragidx.indexer.storage.index_settings import VectorIndexSettings
from ragidx.indexer.storage.local.faiss_index import stored_ids
from ragidx.indexer.storage.local.segments import (
    BackgroundMerge,
    Segment,
    SegmentedVectors,
    SegmentUnreadable,
    file_checksum,
    file_generation,
    index_settings,
    load_segments,
    new_segment,
    plan_merge,
    read_segments,
    segment_file,
    segment_files,
    write_segments,
)
from ragidx.indexer.storage.vector_store import (
    GenerationStart,
    Inspection,
    LoadedVectors,
    StoreKind,
    StoreSpec,
    VectorChange,
    Written,
)
from ragidx.indexer.wording import counted

if TYPE_CHECKING:
    from sqlite_utils import Database


@dataclass(frozen=True)
class LocalSegments:
    """The spec of the local store: it needs nothing but the index folder."""

    kind: ClassVar[str] = "local"
    option_names: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_meta(cls, stored: Mapping[str, Any]) -> LocalSegments:
        return cls()

    @classmethod
    def resolve(
        cls, options: Mapping[str, Any], previous: StoreSpec | None, index_dir: Path
    ) -> LocalSegments:
        return cls()

    def to_meta(self) -> dict[str, Any]:
        return {"kind": self.kind}

    @property
    def label(self) -> str:
        return "local segments"

    def describe(self, vector_index: VectorIndexSettings, parts: int) -> str:
        return f"{vector_index.describe()}, {counted(parts, 'segment')}"

    def open(self, directory: Path) -> SegmentStore:
        return SegmentStore(self, directory)


class SegmentStore:
    """An index's segment files (see :class:`~.vector_store.VectorStore`)."""

    deletes_in_place: ClassVar[bool] = False

    def __init__(self, spec: LocalSegments, directory: Path):
        self.spec = spec
        self.directory = directory

    def load(
        self, db: Database, meta: Mapping[str, Any], reuse: LoadedVectors | None = None
    ) -> SegmentedVectors | None:
        earlier = reuse if isinstance(reuse, SegmentedVectors) else None
        segments = read_segments(db, meta, self.directory)
        try:
            return load_segments(self.directory, segments, VectorIndexSettings.from_meta(meta), earlier)
        except SegmentUnreadable as error:
            # A file is deleted only after a newer one is committed: else it was lost, not replaced.
            if error.missing and self._newer_files(int(meta["generation"])):
                return None
            raise

    def _newer_files(self, generation: int) -> list[Path]:
        """Vector files (complete or being written) of generations after ``generation``."""
        return [
            path
            for path in self.directory.glob("vectors-*.faiss*")
            if (file_generation(path.name) or 0) > generation
        ]

    def parts(self, db: Database, meta: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [
            {"file": s.file, "kind": s.kind, "vectors": len(s.ids), "deleted": len(s.deleted)}
            for s in read_segments(db, meta, self.directory)
        ]

    def lost(self, db: Database, meta: Mapping[str, Any]) -> list[str]:
        if not meta.get("generation"):
            return []
        return [name for name in segment_files(db, meta) if not (self.directory / name).exists()]

    def begin(self, start: GenerationStart) -> SegmentWrite:
        return SegmentWrite(self.directory, start)

    def release(self, db: Database, meta: Mapping[str, Any]) -> None:
        write_segments(db, read_segments(db, meta, self.directory), [])

    def retire(self) -> None:
        """Nothing: the files are no longer listed, so the commit's clean-up deletes them."""

    def finish_commit(self, meta: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def inspect(self, db: Database, meta: Mapping[str, Any]) -> Inspection:
        """Each segment read on its own, so one damaged file leaves the others' vectors readable.
        A file whose checksum is not the one recorded when it was written (another index's file
        copied over it, or damaged bytes) is untrusted: a repair drops it and re-embeds its chunks.
        Where the recorded ids alone are wrong (a damaged record, or an index written before
        checksums), a repair corrects the record, so that deletions find what the file holds."""
        readable, unreadable, misrecorded = [], [], []
        settings = VectorIndexSettings.from_meta(meta)
        for segment in read_segments(db, meta, self.directory):
            path = self.directory / segment.file
            if segment.checksum and path.is_file() and file_checksum(path) != segment.checksum:
                why = (
                    f"vector file {path} is not the one this index wrote (its checksum differs): "
                    "run `ragidx check --repair` to re-embed its chunks"
                )
                unreadable.append((segment.file, why))
                continue
            try:
                loaded = load_segments(self.directory, [segment], settings)
            except SegmentUnreadable as error:
                unreadable.append((segment.file, str(error)))
                continue
            readable.append(loaded.live_vectors())
            held = stored_ids(loaded.parts[0].index)
            if segment.record_damaged or not np.array_equal(held, segment.ids):
                misrecorded.append((segment, held))
        ids = np.concatenate([i for i, _ in readable]) if readable else np.zeros(0, np.int64)
        vectors = np.concatenate([v for _, v in readable]) if readable else np.zeros((0, 0), np.float32)

        def fix_records() -> None:
            for segment, held in misrecorded:
                record_segment_ids(db, segment, held)

        names = [segment.file for segment, _ in misrecorded]
        return Inspection(ids, vectors, unreadable, fix_records if misrecorded else None, names)

    def close(self) -> None:
        """Nothing is held open between calls."""


def record_segment_ids(db: Database, segment: Segment, ids: np.ndarray) -> None:
    """Record the ids a segment's file holds (searches already go by the file's ids)."""
    gone = np.setdiff1d(segment.deleted, ids)
    with db.atomic():
        db.execute(
            "update segments set ids = ? where file = ?",
            [np.sort(ids).astype(np.int64).tobytes(), segment.file],
        )
        db.conn.executemany(
            "delete from deletions where segment = ? and chunk_id = ?",
            ((segment.file, int(i)) for i in gone),
        )


class SegmentWrite:
    """A generation's segments being written: a background merge planned from the committed
    segments runs while the build embeds; :meth:`write` swaps its result in, records deletions
    and writes the added vectors as one new segment."""

    def __init__(self, directory: Path, start: GenerationStart):
        self.directory = directory
        self.db = db = start.db
        self.generation = start.generation
        self.requested = requested = start.requested
        self.before = read_segments(db, start.meta, directory)
        dropped = set(start.dropped)
        self.kept = [] if start.replace else [s for s in self.before if s.file not in dropped]
        plan = plan_merge(self.kept, requested, VectorIndexSettings.from_meta(start.meta))
        self.merge = BackgroundMerge(directory, start.generation, plan, requested) if plan else None

    def kept_ids(self) -> np.ndarray:
        live = [s.live_ids() for s in self.kept]
        return np.concatenate(live) if live else np.zeros(0, np.int64)

    def write(self, change: VectorChange) -> Written:
        segments, rebuilt, merged = list(self.kept), "", ""
        if self.merge is not None:
            result, plan = self.merge.result(), self.merge.plan
            sources = {s.file for s in plan.sources}
            segments = [s for s in segments if s.file not in sources] + ([result] if result else [])
            rebuilt, merged = plan.reason, "" if plan.reason else plan.describe()
        segments = [segment.deleting(change.removed) for segment in segments]
        if change.added is not None:
            file = segment_file(self.generation)
            segments.append(new_segment(self.directory, file, change.added, change.ids, self.requested))
        segments.sort(key=lambda s: (-s.live, s.file))
        write_segments(self.db, self.before, segments)
        return Written(index_settings(segments, self.requested), {}, rebuilt, merged, len(segments))

    def abandon(self) -> None:
        """Stop waiting for a merge this generation will not commit, and delete its file."""
        if self.merge is not None:
            self.merge.abandon()
            self.merge = None


if TYPE_CHECKING:  # mypy checks here that the store implements vector_store's protocols
    _implements: StoreKind = LocalSegments

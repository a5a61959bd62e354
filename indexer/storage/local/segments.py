"""A generation's vectors as segments: immutable FAISS files, each with the ids deleted from it.

One file per generation made every update read and rewrite the whole index. Here a commit writes
its new vectors as one new segment file, deletions are rows in SQLite, and a search merges the
segments' best hits. Segments are merged while a later build embeds (:class:`BackgroundMerge`):
the smallest ones once the two smallest are within :data:`MERGE_SIZE_RATIO` of each other, so an
index of N vectors keeps O(log N) segments and a vector is rewritten O(log N) times in its life,
and any segment whose deleted share passes :data:`DELETED_FRACTION`. The bytes an update writes
thus follow its size (plus its share of merges), not the index's.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.faults import checkpoint
from ragidx.indexer.storage.faiss_module import faiss_module
from ragidx.indexer.storage.index_settings import VectorIndexSettings
from ragidx.indexer.storage.local.faiss_index import VectorIndex, new_vector_index, stored_ids
from ragidx.indexer.storage.vector_store import VectorQuery

if TYPE_CHECKING:
    import faiss
    from sqlite_utils import Database

SEGMENT_FILE = re.compile(r"vectors-(\d+)(-merged)?\.faiss(?:\.partial)?")
# Merge the two smallest segments while the larger holds at most this many times the smaller.
MERGE_SIZE_RATIO = 2.0
DELETED_FRACTION = 0.2  # a segment with this share of its vectors deleted is rewritten without them


def segment_file(generation: int, merged: bool = False) -> str:
    """A generation writes at most two files: its new vectors, and the merge it ran."""
    return f"vectors-{generation}{'-merged' if merged else ''}.faiss"


def file_generation(name: str) -> int | None:
    """The generation that wrote a vector file (complete or partial), None for other names."""
    found = SEGMENT_FILE.fullmatch(name)
    return int(found.group(1)) if found else None


@dataclass(frozen=True, eq=False)  # compared by identity: its arrays have no single truth value
class Segment:
    """One FAISS file of the generation: how it was built, the ids it stores, the ones deleted."""

    file: str
    kind: str
    ids: np.ndarray  # ascending
    deleted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # ascending, among ids
    ivf_lists: int = 0
    trained_on: int = 0
    record_damaged: bool = False  # its row's ids could not be read: ``ids`` are the file's own
    checksum: str = ""  # SHA-256 of the file as written ("" in indexes written before checksums)

    @property
    def live(self) -> int:
        return len(self.ids) - len(self.deleted)

    def live_ids(self) -> np.ndarray:
        return np.setdiff1d(self.ids, self.deleted, assume_unique=True)

    def settings(self, index: VectorIndexSettings) -> VectorIndexSettings:
        """The index's settings (query parameters included) with this segment's structure."""
        return replace(index, kind=self.kind, ivf_lists=self.ivf_lists, trained_on=self.trained_on)

    def deleting(self, chunk_ids: np.ndarray) -> Segment:
        """This segment with those of ``chunk_ids`` it stores deleted."""
        return replace(self, deleted=np.union1d(self.deleted, np.intersect1d(chunk_ids, self.ids)))


def create_segment_tables(db: Database) -> None:
    db.table("segments").create(
        {"file": str, "kind": str, "ivf_lists": int, "trained_on": int, "ids": bytes, "checksum": str},
        pk="file",
        if_not_exists=True,
    )
    if "checksum" not in db["segments"].columns_dict:  # added to tell another index's files apart
        db.table("segments").add_column("checksum", str)
    db.table("deletions").create(
        {"segment": str, "chunk_id": int}, pk=("segment", "chunk_id"), if_not_exists=True
    )


class SegmentUnreadable(RagidxError):
    """A segment's file is missing or FAISS cannot read it."""

    def __init__(self, path: Path, error: Exception):
        self.path, self.missing = path, not path.exists()
        state = "missing" if self.missing else f"unreadable ({str(error).splitlines()[0]})"
        super().__init__(f"vector file {path} is {state}: run `ragidx check --repair` to re-embed it")


def segment_files(db: Database, meta: Mapping[str, Any]) -> list[str]:
    """The committed generation's file names (no ids read)."""
    if meta.get("segmented"):
        return [row[0] for row in db.execute("select file from segments")]
    return [segment_file(int(meta["generation"]))] if meta.get("generation") else []


def stale_segment_files(directory: Path, db: Database, meta: Mapping[str, Any]) -> list[Path]:
    """Segment files in ``directory`` the committed generation does not list: replaced segments,
    leftovers of crashed builds, and a local store's files after its vectors moved to another store."""
    current = set(segment_files(db, meta))
    found = (path for path in directory.iterdir() if SEGMENT_FILE.fullmatch(path.name))
    return sorted(path for path in found if path.name not in current)


def read_segments(db: Database, meta: Mapping[str, Any], directory: Path) -> list[Segment]:
    """The committed segments, largest first. An index written before segments has one file,
    ``vectors-<generation>.faiss``, with its deletions in ``tombstones``; its ids are read from the
    file (once: the next commit stores them), and are empty when it cannot be read."""
    if meta.get("segmented"):
        deletions: dict[str, list[int]] = {}
        for segment, chunk_id in db.execute("select segment, chunk_id from deletions"):
            deletions.setdefault(segment, []).append(chunk_id)
        found = []
        checksum = "checksum" if "checksum" in db["segments"].columns_dict else "''"
        rows = db.execute(f"select file, kind, ivf_lists, trained_on, ids, {checksum} from segments")
        for file, kind, ivf_lists, trained_on, blob, written in rows:
            ids, damaged = _recorded_ids(blob, directory / file)
            deleted = np.array(sorted(deletions.get(file, [])), dtype=np.int64)
            found.append(Segment(file, kind, ids, deleted, ivf_lists, trained_on, damaged, written or ""))
        return sorted(found, key=lambda s: (-s.live, s.file))
    if not meta.get("generation"):
        return []
    settings = VectorIndexSettings.from_meta(meta)
    file = segment_file(int(meta["generation"]))
    tombstones = (
        [row[0] for row in db.execute("select chunk_id from tombstones")] if db["tombstones"].exists() else []
    )
    try:
        ids = stored_ids(read_faiss(directory / file))
    except RuntimeError:
        ids = np.zeros(0, np.int64)
    return [
        Segment(
            file,
            settings.kind,
            ids,
            np.intersect1d(np.array(tombstones, dtype=np.int64), ids),
            settings.ivf_lists,
            settings.trained_on,
        )
    ]


def _recorded_ids(blob: object, path: Path) -> tuple[np.ndarray, bool]:
    """A row's ids (int64 bytes) and False; where the record is damaged (a truncated blob), the ids
    the file holds and True, so that ``check --repair`` writes the record again."""
    if isinstance(blob, bytes) and len(blob) % 8 == 0:
        return np.frombuffer(blob, dtype=np.int64).copy(), False
    try:
        return stored_ids(read_faiss(path)), True
    except RuntimeError:
        return np.zeros(0, np.int64), True


def write_segments(db: Database, before: Sequence[Segment], after: Sequence[Segment]) -> None:
    """Make the tables hold ``after`` (inside the caller's transaction), writing only what changed:
    rows of new segments, and deletions new to a kept one."""
    kept = {s.file: s for s in before}
    for segment in before:
        if segment.file not in {s.file for s in after}:
            db.execute("delete from segments where file = ?", [segment.file])
            db.execute("delete from deletions where segment = ?", [segment.file])
    stored = {row[0] for row in db.execute("select file from segments")}
    for segment in after:
        if segment.file not in stored:
            db.table("segments").insert(
                {
                    "file": segment.file,
                    "kind": segment.kind,
                    "ivf_lists": segment.ivf_lists,
                    "trained_on": segment.trained_on,
                    "ids": np.ascontiguousarray(segment.ids, dtype=np.int64).tobytes(),
                    "checksum": segment.checksum,
                }
            )
        old = (
            kept[segment.file].deleted
            if segment.file in stored and segment.file in kept
            else np.zeros(0, np.int64)
        )
        new = np.setdiff1d(segment.deleted, old)
        db.conn.executemany(
            "insert or ignore into deletions (segment, chunk_id) values (?, ?)",
            ((segment.file, int(i)) for i in new),
        )
    if db["tombstones"].exists():  # an index from before segments: its deletions now live in `deletions`
        db.execute("drop table tombstones")


def index_settings(segments: Sequence[Segment], requested: VectorIndexSettings) -> VectorIndexSettings:
    """What the index reports and stores: the requested settings with its largest segment's structure."""
    return segments[0].settings(requested) if segments else replace(requested, kind="flat")


def write_faiss_file(path: Path, index: faiss.Index, written: str, renamed: str) -> str:
    """``index`` under ``path``: written as ``.partial``, fsynced, renamed, the folder fsynced;
    returns the file's checksum. ``written`` and ``renamed`` name the crash-test checkpoints
    between the steps."""
    faiss = faiss_module()

    partial = path.with_name(path.name + ".partial")
    faiss.write_index(index, str(partial))
    checkpoint(written)
    checksum = file_checksum(partial)
    _fsync(partial)
    os.replace(partial, path)
    _fsync(path.parent)
    checkpoint(renamed)
    return checksum


def file_checksum(path: Path) -> str:
    """SHA-256 of a file's bytes: a segment's file is written once, so a different checksum means
    a file that is not the one this index wrote (another index's, copied over it, or damaged)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_segment(
    directory: Path, file: str, vectors: np.ndarray, ids: np.ndarray, requested: VectorIndexSettings
) -> Segment:
    """Write ``vectors`` as a segment of the type ``requested`` resolves to at their count."""
    built = new_vector_index(requested, vectors, ids)
    checksum = write_faiss_file(directory / file, built.index, "faiss-write", "faiss-renamed")
    return segment_of(file, built, ids, checksum)


def segment_of(file: str, built: VectorIndex, ids: np.ndarray, checksum: str) -> Segment:
    settings = built.settings
    return Segment(
        file,
        settings.kind,
        np.sort(ids),
        ivf_lists=settings.ivf_lists,
        trained_on=settings.trained_on,
        checksum=checksum,
    )


def read_faiss(path: Path) -> faiss.Index:
    faiss = faiss_module()

    return faiss.read_index(str(path))


def read_segment(directory: Path, segment: Segment) -> faiss.Index:
    """A segment's FAISS structure; :class:`SegmentUnreadable` when its file is missing or damaged."""
    path = directory / segment.file
    try:
        return read_faiss(path)
    except RuntimeError as error:
        raise SegmentUnreadable(path, error) from error


@dataclass(frozen=True)
class MergePlan:
    """Segments to merge into one, and why (a restructure names it; size merges say nothing)."""

    sources: tuple[Segment, ...]
    reason: str = ""

    def describe(self) -> str:
        live = sum(s.live for s in self.sources)
        return self.reason or f"{len(self.sources)} segments into one of {live} vectors"


def plan_merge(
    segments: Sequence[Segment], requested: VectorIndexSettings, stored: VectorIndexSettings
) -> MergePlan | None:
    """What the next commit merges: everything when the index type or its build parameters
    changed; else mostly deleted segments and the smallest ones within the size ratio."""
    reason = restructure_reason(segments, requested, stored)
    if reason:
        return MergePlan(tuple(segments), reason)
    chosen = [s for s in segments if len(s.deleted) > DELETED_FRACTION * max(len(s.ids), 1)]
    by_size = sorted((s for s in segments if all(s is not c for c in chosen)), key=lambda s: (s.live, s.file))
    sizes = [s.live for s in by_size]
    while len(sizes) >= 2 and sizes[1] <= MERGE_SIZE_RATIO * sizes[0]:
        sizes = sorted([sizes[0] + sizes[1], *sizes[2:]])
    if len(sizes) < len(by_size):  # the merged ones are always the smallest: a prefix
        chosen += by_size[: len(by_size) - len(sizes) + 1]
    return MergePlan(tuple(chosen)) if chosen else None


def restructure_reason(
    segments: Sequence[Segment], requested: VectorIndexSettings, stored: VectorIndexSettings
) -> str:
    """Why every segment must be rebuilt for ``requested`` ("" when none need be)."""
    kinds = {s.kind for s in segments}
    total = sum(s.live for s in segments)
    if requested.requested != "auto" and kinds - {requested.requested}:
        return f"index type {stored.kind} -> {requested.requested} at {total} vectors"
    if "hnsw" in kinds and (requested.hnsw_m, requested.ef_construction) != (
        stored.hnsw_m,
        stored.ef_construction,
    ):
        return "new HNSW build parameters"
    if "ivf" in kinds and requested.nlist != stored.nlist:
        return f"IVF lists {stored.nlist or 'auto'} -> {requested.nlist or 'auto'}"
    return ""


class BackgroundMerge:
    """A :class:`MergePlan` carried out in a thread while the build embeds; :meth:`result` waits.

    The thread only reads the source files and writes the merged one (``vectors-<G>-merged.faiss``);
    the commit swaps it in. Deletions committed later than the plan stay recorded against the
    merged segment, so nothing deleted comes back.
    """

    def __init__(self, directory: Path, generation: int, plan: MergePlan, requested: VectorIndexSettings):
        self.directory = directory
        self.plan = plan
        self.file = segment_file(generation, merged=True)
        self._requested = requested
        self._merged: Segment | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ragidx-merge", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._merged = self._merge()
        except BaseException as error:  # re-raised in the committing thread
            self._error = error

    def _merge(self) -> Segment | None:
        ids, vectors = [], []
        for source in self.plan.sources:
            live = source.live_ids()
            if len(live):
                ids.append(live)
                vectors.append(read_segment(self.directory, source).reconstruct_batch(live))
        if not ids:
            return None  # every source was fully deleted: they are dropped, nothing is written
        all_ids = np.concatenate(ids)
        largest = max(self.plan.sources, key=lambda s: s.live)
        previous = None if self.plan.reason else largest.settings(self._requested)
        built = new_vector_index(self._requested, np.concatenate(vectors), all_ids, previous)
        del vectors
        checksum = write_faiss_file(self.directory / self.file, built.index, "merge-write", "merge-renamed")
        return segment_of(self.file, built, all_ids, checksum)

    def result(self) -> Segment | None:
        """The merged segment (None when its sources held nothing live); raises what the merge raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._merged

    def abandon(self) -> None:
        """Wait for the thread and delete what it wrote: the build is not committing."""
        self._thread.join()
        for name in (self.file, self.file + ".partial"):
            (self.directory / name).unlink(missing_ok=True)


@dataclass
class SegmentedVectors:
    """The loaded segments of one generation, searched as one index."""

    files: list[str]
    parts: list[VectorIndex]
    live: list[np.ndarray]  # each part's live ids, ascending

    @property
    def ntotal(self) -> int:
        return sum(part.ntotal for part in self.parts)

    @property
    def live_count(self) -> int:
        return sum(len(ids) for ids in self.live)

    def use_gpu(self) -> bool:
        """Search flat segments on the GPU (see :meth:`VectorIndex.use_gpu`); whether any moved."""
        return any([part.use_gpu() for part in self.parts])

    def search(self, query: VectorQuery) -> tuple[np.ndarray, np.ndarray]:
        """Each segment's best ``limit`` (``allowed`` cut to its live ids), merged by score."""
        found = []
        for part, live in zip(self.parts, self.live, strict=True):
            allowed = query.allowed
            scoped = None if allowed is None else np.intersect1d(allowed, live, assume_unique=True)
            if scoped is None or len(scoped):
                found.append(part.search(replace(query, allowed=scoped)))
        return merge_hits(found, len(query.queries), query.limit)

    def live_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """Ids (ascending) and vectors of every live vector."""
        ids = [live for live in self.live if len(live)]
        if not ids:
            dimension = self.parts[0].index.d if self.parts else 0
            return np.zeros(0, np.int64), np.zeros((0, dimension), np.float32)
        vectors = [
            part.index.reconstruct_batch(live)
            for part, live in zip(self.parts, self.live, strict=True)
            if len(live)
        ]
        all_ids = np.concatenate(ids)
        order = np.argsort(all_ids, kind="stable")
        return all_ids[order], np.concatenate(vectors)[order]


def load_segments(
    directory: Path,
    segments: Sequence[Segment],
    index: VectorIndexSettings,
    reuse: SegmentedVectors | None = None,
) -> SegmentedVectors:
    """Read each segment's file; :class:`SegmentUnreadable` names the first that cannot be read.

    Segments ``reuse`` (an earlier generation's) already holds are taken from it with this
    generation's deletions, not read again: files never change, so a server following updates
    reads only the new segments."""
    loaded = dict(zip(reuse.files, reuse.parts, strict=True)) if reuse else {}
    parts = [
        replace(loaded[s.file], settings=s.settings(index), tombstones=s.deleted)
        if s.file in loaded
        else VectorIndex(read_segment(directory, s), s.settings(index), s.deleted)
        for s in segments
    ]
    # Ids as the files hold them (the recorded ones differ only in a damaged file; check says so).
    live = [np.setdiff1d(stored_ids(part.index), part.tombstones) for part in parts]
    return SegmentedVectors([s.file for s in segments], parts, live)


def merge_hits(
    found: list[tuple[np.ndarray, np.ndarray]], n_queries: int, limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """The best ``limit`` of several (scores, ids) results per query; -1 ids pad short rows."""
    if len(found) == 1:
        return found[0]
    if not found:
        empty = np.zeros((n_queries, 0))
        return empty.astype(np.float32), empty.astype(np.int64)
    scores = np.concatenate([s for s, _ in found], axis=1)
    ids = np.concatenate([i for _, i in found], axis=1)
    scores = np.where(ids >= 0, scores, -np.inf)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :limit]
    best_scores, best_ids = np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
    return best_scores.astype(np.float32), np.where(np.isfinite(best_scores), best_ids, -1)

"""The FAISS structure behind a generation: exact (flat), HNSW graph, or inverted lists (IVF).

Each type stores the full float32 vectors, so any index can be rebuilt as any other type
without re-embedding. A structure is written once and never changed (see
:mod:`ragidx.indexer.storage.local.segments`): deleted ids become *tombstones*, kept in SQLite and excluded at
search time by an ``IDSelectorNot``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.storage.faiss_module import faiss_module
from ragidx.indexer.storage.index_settings import VectorIndexSettings, default_nlist
from ragidx.indexer.storage.vector_store import VectorQuery

if TYPE_CHECKING:
    import faiss

IVF_TRAIN_POINTS_PER_LIST = 64  # k-means sample per list: enough for good lists, fast on 2 cores
IVF_MIN_POINTS_PER_LIST = 39  # FAISS warns below this many training points per list
EXACT_FILTER_LIMIT = 4096  # filtered searches over at most this many chunks are done exactly
EXACT_BLOCK = 16_384  # stored vectors read at once by an exact search among allowed ids


@dataclass
class VectorIndex:
    """A loaded FAISS index with its settings and the ids it must not return (deleted since written)."""

    index: faiss.Index
    settings: VectorIndexSettings
    tombstones: np.ndarray
    gpu: Any = field(default=None, repr=False)  # a GPU copy of a flat index (see use_gpu)

    def use_gpu(self) -> bool:
        """Search a flat index on the GPU from now on (needs faiss built with CUDA: faiss-gpu-cu12
        in place of faiss-cpu).

        Only unfiltered exact search moves: filtered searches keep using the CPU index, whose
        id selectors the GPU copy lacks. False (and nothing changes) when no GPU can be used.
        """
        faiss = faiss_module()

        if self.gpu is not None:  # a segment kept from an earlier generation
            return True
        if self.settings.kind != "flat" or not hasattr(faiss, "StandardGpuResources"):
            return False
        if faiss.get_num_gpus() < 1:
            return False
        resources = faiss.StandardGpuResources()
        flat = faiss.index_cpu_to_gpu(resources, 0, faiss.downcast_index(self.index.index))
        self.gpu = (resources, flat, faiss.vector_to_array(self.index.id_map))
        return True

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def live_count(self) -> int:
        return self.ntotal - len(self.tombstones)

    def search(self, query: VectorQuery) -> tuple[np.ndarray, np.ndarray]:
        """Inner-product scores and ids, best first (-1 ids pad rows with fewer hits).

        ``allowed`` (ascending chunk ids) restricts the search; a small allowed set, or an ANN
        search that found fewer than ``limit`` of them, is answered exactly from the stored
        vectors, so a filter never costs results.
        """
        queries, limit, allowed = query.queries, query.limit, query.allowed
        if queries.shape[1] != self.index.d:
            raise RagidxError(
                f"the query has {queries.shape[1]} dimensions and the stored vectors {self.index.d}: the "
                "index's vector files are not the ones its settings describe (`ragidx check` says more)"
            )
        pool = self.live_count if allowed is None else min(self.live_count, len(allowed))
        if pool <= 0:  # below 0 where recorded deletions are not this file's
            empty = np.zeros((len(queries), 0))
            return empty.astype(np.float32), empty.astype(np.int64)
        limit = min(limit, pool)
        with one_thread_for_one_query(len(queries)):
            return self._search(queries, limit, allowed, query.ef_search, query.nprobe)

    def _search(
        self,
        queries: np.ndarray,
        limit: int,
        allowed: np.ndarray | None,
        ef_search: int | None,
        nprobe: int | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        if allowed is not None and self.settings.kind != "flat" and len(allowed) <= EXACT_FILTER_LIMIT:
            return exact_among(self.index, queries, allowed, limit)
        if self.gpu is not None and allowed is None:
            _, flat, row_ids = self.gpu
            scores, rows = flat.search(np.ascontiguousarray(queries, dtype=np.float32), limit)
            return scores, np.where(rows >= 0, row_ids[np.maximum(rows, 0)], -1)
        params = self._parameters(limit, allowed, ef_search, nprobe)
        scores, ids = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), limit, params=params)
        if allowed is not None and self.settings.kind != "flat" and (ids < 0).any():
            return exact_among(self.index, queries, allowed, limit)
        return scores, ids

    def _parameters(
        self, limit: int, allowed: np.ndarray | None, ef_search: int | None, nprobe: int | None
    ) -> faiss.SearchParameters:
        faiss = faiss_module()

        if allowed is not None:
            selector = faiss.IDSelectorBatch(allowed)  # live ids only (see SegmentedVectors.search)
        elif len(self.tombstones):
            selector = faiss.IDSelectorNot(faiss.IDSelectorBatch(self.tombstones))
        else:
            selector = None
        if self.settings.kind == "hnsw":
            ef = max(ef_search or self.settings.ef_search, limit)
            params = faiss.SearchParametersHNSW(efSearch=ef)
        elif self.settings.kind == "ivf":
            params = faiss.SearchParametersIVF(
                nprobe=min(nprobe or self.settings.nprobe, self.settings.ivf_lists)
            )
        else:
            params = faiss.SearchParameters()
        if selector is not None:
            params.sel = selector
            params._selector = selector  # the parameters object does not keep its selector alive
        return params


@contextlib.contextmanager
def one_thread_for_one_query(queries: int) -> Iterator[None]:
    """Run FAISS on one OpenMP thread for a single query, as it would use one anyway (each index
    type shares its work out by query): its other threads only wake, spin after the search and
    take a core from the model's next operators: a Gemma 3 query's hybrid search took 35-36 ms
    with FAISS's two threads, 31-32 ms with one, its embedding alone 28-30 ms (2 cores, held to
    AVX2; tests/benchmarks/thread_pools.py, docs/precision.md)."""
    if queries != 1:
        yield
        return
    faiss = faiss_module()

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def exact_among(
    index: faiss.Index, queries: np.ndarray, allowed: np.ndarray, limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top ``limit`` among the ``allowed`` ids' stored vectors, read
    :data:`EXACT_BLOCK` at a time so a large allowed set never sits in memory at once."""
    queries = np.asarray(queries, dtype=np.float32)
    best_scores = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_ids = np.zeros((len(queries), 0), dtype=np.int64)
    for start in range(0, len(allowed), EXACT_BLOCK):
        block = np.ascontiguousarray(allowed[start : start + EXACT_BLOCK], dtype=np.int64)
        scores = np.concatenate([best_scores, queries @ index.reconstruct_batch(block).T], axis=1)
        ids = np.concatenate([best_ids, np.broadcast_to(block, (len(queries), len(block)))], axis=1)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :limit]
        best_scores, best_ids = np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
    return best_scores, best_ids


def stored_ids(index: faiss.Index) -> np.ndarray:
    """Every id the FAISS index holds (tombstoned ones included), ascending."""
    faiss = faiss_module()

    if isinstance(index, faiss.IndexIDMap2):
        return np.sort(faiss.vector_to_array(index.id_map))
    ivf = faiss.extract_index_ivf(index)
    found = [list_ids(ivf.invlists, list_no) for list_no in range(ivf.nlist)]
    return np.sort(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def list_ids(lists: faiss.InvertedLists, list_no: int) -> np.ndarray:
    """The ids stored in one IVF list."""
    faiss = faiss_module()

    size = lists.list_size(list_no)
    return faiss.rev_swig_ptr(lists.get_ids(list_no), size).copy() if size else np.zeros(0, dtype=np.int64)


def create_index(settings: VectorIndexSettings, vectors: np.ndarray, ids: np.ndarray) -> faiss.Index:
    """A new index of ``settings.kind`` holding ``vectors`` under ``ids`` (IVF trains on them)."""
    faiss = faiss_module()

    dimension = vectors.shape[1]
    if settings.kind == "ivf":
        index = faiss.IndexIVFFlat(
            faiss.IndexFlatIP(dimension), dimension, settings.ivf_lists, faiss.METRIC_INNER_PRODUCT
        )
        index.cp.max_points_per_centroid = IVF_TRAIN_POINTS_PER_LIST
        if len(vectors):
            index.train(np.ascontiguousarray(vectors, dtype=np.float32))
        index.set_direct_map_type(faiss.DirectMap.Hashtable)
    elif settings.kind == "hnsw":
        graph = faiss.IndexHNSWFlat(dimension, settings.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = settings.ef_construction
        index = faiss.IndexIDMap2(graph)
    else:
        index = faiss.IndexIDMap2(faiss.IndexFlatIP(dimension))
    add(index, vectors, ids)
    return index


def add(index: faiss.Index, vectors: np.ndarray, ids: np.ndarray) -> None:
    if len(ids):
        index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), ids.astype(np.int64))


def sized_settings(
    requested: VectorIndexSettings, total: int, dimension: int, previous: VectorIndexSettings | None
) -> VectorIndexSettings:
    """The settings a structure of ``total`` vectors is built with: ``auto`` resolved (``previous``,
    the structure it replaces, keeps an ANN type near the limit), IVF lists chosen for ``total``."""
    kind = replace(requested, kind=previous.kind if previous else "flat").resolved_kind(total, dimension)
    if kind != "ivf":
        return replace(requested, kind=kind, ivf_lists=0, trained_on=0)
    lists = min(requested.nlist or default_nlist(total), max(1, total // IVF_MIN_POINTS_PER_LIST))
    return replace(requested, kind=kind, ivf_lists=lists, trained_on=total)


def new_vector_index(
    requested: VectorIndexSettings,
    vectors: np.ndarray,
    ids: np.ndarray,
    previous: VectorIndexSettings | None = None,
) -> VectorIndex:
    """A structure holding ``vectors`` under ``ids``, of the type ``requested`` resolves to at their
    count (see :func:`sized_settings`)."""
    settings = sized_settings(requested, len(ids), vectors.shape[1], previous)
    return VectorIndex(create_index(settings, vectors, ids), settings, np.zeros(0, np.int64))

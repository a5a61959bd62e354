"""How an index's vectors are indexed (exact, HNSW or IVF) and its parameters: the settings alone,
without FAISS or numpy, so choosing them (the CLI's menus, a build's options) loads neither."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from ragidx.indexer.errors import RagidxError

INDEX_TYPES = ("auto", "flat", "hnsw", "ivf")
# Exact search reads every vector for each query, so its latency follows the bytes scanned:
# tests/benchmarks/vector_index.py on 2 cores measured 5.2 ms for 25k and 14 ms for 50k 896-d
# vectors (90-180 MB). 128 MiB keeps it near 10 ms: 37k vectors at 896-d, 87k at 384-d.
FLAT_SCAN_BYTES = 128 * 2**20
AUTO_ANN_TYPE = "hnsw"


@dataclass(frozen=True)
class VectorIndexSettings:
    """How the vectors are indexed; ``requested`` is what the user asked for (``auto`` or a type),
    ``kind`` what it resolved to. ``ef_search``/``nprobe`` are defaults a query may override."""

    requested: str = "auto"
    kind: str = "flat"
    hnsw_m: int = 32
    ef_construction: int = 80
    ef_search: int = 64
    nlist: int = 0  # IVF lists asked for; 0 = about sqrt(N)
    nprobe: int = 16
    ivf_lists: int = 0  # IVF lists in use, and the vector count they were trained on
    trained_on: int = 0

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> VectorIndexSettings:
        """The index's stored settings (``auto`` for indexes from before index types: they are flat)."""
        return cls(**meta.get("vector_index", {}))

    def to_meta(self) -> dict[str, Any]:
        return asdict(self)

    def with_overrides(self, **overrides: Any) -> VectorIndexSettings:
        """These settings with the given (not None) options replaced, after validating them."""
        given = {key: value for key, value in overrides.items() if value is not None}
        if given.get("requested", self.requested) not in INDEX_TYPES:
            raise RagidxError(
                f"unknown index type {given['requested']!r}: choose one of {', '.join(INDEX_TYPES)}"
            )
        for key, value in given.items():
            if key != "requested" and (not isinstance(value, int) or value < (0 if key == "nlist" else 1)):
                raise RagidxError(f"{key.replace('_', '-')} must be a positive integer, got {value!r}")
        return replace(self, **given)

    def describe(self) -> str:
        """One line for ``build`` and ``info``, e.g. ``hnsw (M 32, efConstruction 80, efSearch 64; auto)``."""
        details = {
            "flat": "exact",
            "hnsw": f"M {self.hnsw_m}, efConstruction {self.ef_construction}, efSearch {self.ef_search}",
            "ivf": f"{self.ivf_lists} lists trained on {self.trained_on} vectors, nprobe {self.nprobe}",
        }[self.kind]
        chosen = "; auto" if self.requested == "auto" else ""
        return f"{self.kind} ({details}{chosen})"

    def resolved_kind(self, n_vectors: int, dimension: int) -> str:
        """``auto``: exact up to :func:`flat_limit` vectors, :data:`AUTO_ANN_TYPE` above; a shrinking
        ANN index goes back to flat only below half the limit, so sizes near it do not flip."""
        if self.requested != "auto":
            return self.requested
        limit = flat_limit(dimension)
        if self.kind != "flat" and n_vectors >= limit // 2:
            return self.kind
        return "flat" if n_vectors <= limit else AUTO_ANN_TYPE


def flat_limit(dimension: int) -> int:
    """The most vectors ``auto`` searches exactly: :data:`FLAT_SCAN_BYTES` of float32 rows."""
    return FLAT_SCAN_BYTES // (4 * max(dimension, 1))


def default_nlist(n_vectors: int) -> int:
    """About √N lists (a power of two), so a probe scans ~√N vectors; at least 1."""
    return max(1, 2 ** round(math.log2(max(1.0, math.sqrt(n_vectors)))))

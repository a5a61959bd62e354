"""Open an index and answer queries with the same model, strategy and templates it was built with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from ragidx.indexer.errors import RagidxError
from ragidx.indexer.store import IndexReader, default_index_dir

if TYPE_CHECKING:
    from ragidx.indexer.strategies import Role, Strategy

SNIPPET_CHARS = 240


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk; ``start``/``end`` are character offsets into the document's text."""

    rank: int
    score: float
    chunk_id: int
    path: str
    title: str
    start: int
    end: int
    text: str
    metadata: dict[str, Any]

    @property
    def snippet(self) -> str:
        flat = " ".join(self.text.split())
        return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1].rsplit(" ", 1)[0] + "…"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Index:
    """A committed index; the model is loaded on first use, so settings can be read without it."""

    def __init__(self, reader: IndexReader, device: str = "auto", dtype: str | None = None):
        self.reader = reader
        self.device = device
        self.dtype = dtype or reader.meta.get("dtype", "auto")
        self._strategy: Strategy | None = None
        self._vectors: Any = None

    @classmethod
    def open(
        cls, directory: str | Path | None = None, *, device: str = "auto", dtype: str | None = None
    ) -> Index:
        return cls(IndexReader(directory or default_index_dir()), device, dtype)

    @property
    def meta(self) -> dict[str, Any]:
        return self.reader.meta

    @property
    def strategy(self) -> Strategy:
        if self._strategy is None:
            from ragidx.indexer.runtime import load_runtime
            from ragidx.indexer.strategies import create_strategy

            runtime = load_runtime(self.meta["model"], self.device, self.dtype)
            self._strategy = create_strategy(self.meta["strategy"], runtime, **self.meta["strategy_params"])
        return self._strategy

    def check_compatible(self, model: str | None = None, strategy: str | None = None) -> None:
        """Refuse a query that names another model or strategy than the index was built with."""
        from ragidx.indexer.runtime import canonical_model_id

        model = canonical_model_id(model) if model else None
        for option, given, stored in (
            ("--model", model, self.meta["model"]),
            ("--strategy", strategy, self.meta["strategy"]),
        ):
            if given is not None and given != stored:
                raise RagidxError(
                    f"{option} {given!r} does not match the index, which was built with {stored!r}; "
                    "queries must use the index's own settings"
                )

    def embed(self, texts: Sequence[str], role: Role = "query") -> np.ndarray:
        """Vectors as this index would store (documents) or search with (queries)."""
        return self.strategy.encode(list(texts), role)

    def search(self, query: str, k: int = 10) -> list[Hit]:
        """The ``k`` chunks whose vectors have the highest inner product with the query's."""
        if k < 1:
            raise RagidxError(f"k must be at least 1, got {k}")
        if not query.strip():
            raise RagidxError("the query is empty")
        if self._vectors is None:
            self._vectors = self.reader.load_vectors()
        vector = self.embed([query], "query")
        scores, ids = self._vectors.search(vector, min(k, max(self._vectors.ntotal, 1)))
        found = [(float(s), int(i)) for s, i in zip(scores[0], ids[0], strict=True) if i >= 0]
        rows = self.reader.chunk_rows([i for _, i in found])
        hits = [(score, rows[i]) for score, i in found if i in rows]
        return [
            Hit(
                rank=rank,
                score=score,
                chunk_id=row["chunk_id"],
                path=row["path"],
                title=row["title"],
                start=row["char_start"],
                end=row["char_end"],
                text=row["text"],
                metadata=row["metadata"],
            )
            for rank, (score, row) in enumerate(hits, start=1)
        ]

    def info(self) -> dict[str, Any]:
        files = sorted(self.reader.directory.glob("*"))
        return {
            "index": str(self.reader.directory),
            **self.meta,
            **self.reader.counts(),
            "bytes_on_disk": sum(f.stat().st_size for f in files if f.is_file()),
        }

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

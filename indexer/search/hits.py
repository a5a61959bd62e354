"""What a search returns: hits, and (when asked) why each ranks where it does. Plain values, with
no model or index behind them, so a hit read back from JSON (the daemon's answer) is the same
object the search made."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ragidx.indexer.search.snippets import Snippet


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk; ``span`` is its (start, end) character offsets into the document's text.

    ``score`` depends on the mode: cosine (dense), -BM25 (lexical), the fused value (hybrid).
    """

    rank: int
    score: float
    chunk_id: int
    path: str
    title: str
    span: tuple[int, int]
    text: str
    snippet: Snippet
    metadata: dict[str, Any]
    dense_rank: int | None = None
    lexical_rank: int | None = None
    pages: list[int] | None = None  # PDFs: the 1-based pages the chunk's span touches
    explain: Explanation | None = None  # with ``explain``: how each list and the fusion scored it
    # The mode the search ran in: the one asked, or the one list a hybrid search read, and why
    # ("" where it ran as asked): a lexical index, a fusion that weighs vectors 0, a query in a
    # language the index's model does not read.
    mode: str = ""
    mode_reason: str = ""

    @property
    def page(self) -> int | None:
        """The page the chunk starts on (PDFs only)."""
        return self.pages[0] if self.pages else None

    def to_dict(self) -> dict[str, Any]:
        found = {**asdict(self), "page": self.page}
        if self.explain is None:
            del found["explain"]
        return found


@dataclass(frozen=True)
class Listed:
    """A chunk's place in one candidate list: its rank and the list's own score."""

    rank: int
    score: float


@dataclass(frozen=True)
class Explanation:
    """Why a hit ranks where it does: its place in the dense and the lexical list (None where it
    is not among that list's candidates), and for hybrid search the fusion method, the weights
    and the fused score."""

    dense: Listed | None
    lexical: Listed | None
    fusion: str | None = None
    weights: dict[str, float] | None = None
    fused: float | None = None

    def describe(self) -> str:
        """One line, e.g. ``dense #3 0.6123, lexical #1 12.3400; rrf 0.0325 (dense 0.5, lexical 0.5)``."""
        parts = [
            f"{name} #{listed.rank} {listed.score:.4f}" if listed else f"{name} -"
            for name, listed in (("dense", self.dense), ("lexical", self.lexical))
        ]
        line = ", ".join(parts)
        if self.fusion is not None and self.weights is not None and self.fused is not None:
            weights = ", ".join(f"{name} {weight:g}" for name, weight in self.weights.items())
            line += f"; {self.fusion} {self.fused:.4f} ({weights})"
        return line


def hit_from_dict(found: dict[str, Any]) -> Hit:
    """A hit as :meth:`Hit.to_dict` wrote it (through JSON: tuples came back as lists)."""
    explain = found.get("explain")
    return Hit(
        rank=found["rank"],
        score=found["score"],
        chunk_id=found["chunk_id"],
        path=found["path"],
        title=found["title"],
        span=(found["span"][0], found["span"][1]),
        text=found["text"],
        snippet=Snippet(found["snippet"]["text"], [(a, b) for a, b in found["snippet"]["highlights"]]),
        metadata=found["metadata"],
        dense_rank=found["dense_rank"],
        lexical_rank=found["lexical_rank"],
        pages=found["pages"],
        explain=_explanation(explain) if explain else None,
        mode=found.get("mode", ""),
        mode_reason=found.get("mode_reason", ""),
    )


def _explanation(found: dict[str, Any]) -> Explanation:
    def listed(name: str) -> Listed | None:
        return Listed(**found[name]) if found[name] else None

    return Explanation(listed("dense"), listed("lexical"), found["fusion"], found["weights"], found["fused"])


@dataclass(frozen=True)
class Found:
    """A search's hits as every door answers it, with what an interrupted build of the index left
    for the next one to resume ("" where nothing is pending)."""

    hits: list[Hit]
    pending_build: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"hits": [hit.to_dict() for hit in self.hits], "pending_build": self.pending_build}

    @classmethod
    def from_dict(cls, answer: dict[str, Any]) -> Found:
        """As :meth:`to_dict` wrote it (the daemon's answer, through JSON)."""
        return cls([hit_from_dict(hit) for hit in answer["hits"]], answer.get("pending_build") or "")

"""Hybrid fusion: how the dense and the lexical ranking of one query become a single ranking.

Two methods, each with per-list weights: ``rrf``, weighted reciprocal rank fusion,
Σ_list w_list / (60 + rank) (equal weights are plain RRF), and ``minmax``, Σ_list w_list · the
score min-max normalised over the list's candidates (cosine for dense, -BM25 for lexical), which
keeps how far apart the scores are and not only their order. The method and weights an index
uses come from its tuning (see :mod:`ragidx.indexer.build.tuning`), because how far each list can be
trusted depends on the model and the corpus.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ragidx.indexer.errors import RagidxError

LISTS = ("dense", "lexical")
Method = Literal["rrf", "minmax"]
METHODS: tuple[str, ...] = get_args(Method)
RRF_K = 60

Ranking = Sequence[tuple[int, float]]


@dataclass(frozen=True)
class Fusion:
    """Per-list weights (any non-negative scale: only their ratio matters) and the method."""

    dense: float = 1.0
    lexical: float = 1.0
    method: str = "rrf"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise RagidxError(f"unknown fusion method {self.method!r}: choose {' or '.join(METHODS)}")
        weights = self.weights()
        if any(not math.isfinite(w) or w < 0 for w in weights.values()) or not any(weights.values()):
            raise RagidxError(
                f"fusion weights must be finite, non-negative and not all zero, got {self.describe()}"
            )

    def weights(self) -> dict[str, float]:
        return {"dense": self.dense, "lexical": self.lexical}

    def normalised(self) -> Fusion:
        """The same fusion with weights summing to 1 (how it is stored and shown)."""
        total = self.dense + self.lexical
        return Fusion(round(self.dense / total, 4), round(self.lexical / total, 4), self.method)

    def describe(self) -> str:
        return ",".join(f"{name}={weight:g}" for name, weight in self.weights().items())

    def fuse(self, rankings: Mapping[str, Ranking], k: int = RRF_K) -> list[tuple[int, float]]:
        """Every item of every list weighted above 0, by the weighted sum of its parts (see the
        module), best first. An item absent from a list gets nothing from it; a list weighted 0
        takes no part at all (its items do not fill up the ranking with zero scores, and search
        does not even read it: :meth:`searched`). Ties are broken by the equal-weight RRF value of
        the lists taking part, then by id."""
        weights = self.weights()
        fused: dict[int, float] = {}
        equal: dict[int, float] = {}
        for name, ranking in rankings.items():
            if not weights[name]:
                continue
            parts = _min_max(ranking) if self.method == "minmax" else None
            for rank, (item, _) in enumerate(ranking, start=1):
                part = parts[rank - 1] if parts is not None else 1.0 / (k + rank)
                fused[item] = fused.get(item, 0.0) + weights[name] * part
                equal[item] = equal.get(item, 0.0) + 1.0 / (k + rank)
        return sorted(fused.items(), key=lambda pair: (-pair[1], -equal[pair[0]], pair[0]))

    def searched(self) -> tuple[str, ...]:
        """The lists this fusion takes part from: a list weighted 0 need not be searched (with
        ``dense=0`` a hybrid query is not embedded and costs what a lexical one costs)."""
        return tuple(name for name, weight in self.weights().items() if weight)

    @classmethod
    def parse(cls, text: str) -> Fusion:
        """``dense=0.3,lexical=0.7`` (a list left out weighs 0)."""
        weights: dict[str, float] = {}
        for part in filter(None, (piece.strip() for piece in text.split(","))):
            name, sep, value = part.partition("=")
            name = name.strip()
            if not sep or name not in LISTS:
                raise RagidxError(f"weights look like dense=0.3,lexical=0.7; got {text!r}")
            try:
                weights[name] = float(value)
            except ValueError:
                raise RagidxError(f"weight of {name} is not a number: {value.strip()!r}") from None
        return cls.from_weights(weights)

    @classmethod
    def from_weights(cls, weights: Mapping[str, Any], method: str = "rrf") -> Fusion:
        unknown = sorted(set(weights) - set(LISTS))
        if unknown:
            raise RagidxError(f"unknown list {unknown[0]!r} in weights: the lists are {', '.join(LISTS)}")
        if not weights:
            raise RagidxError("weights name at least one of dense, lexical")
        return cls(**{name: float(weights.get(name, 0.0)) for name in LISTS}, method=method)

    @classmethod
    def of_index(cls, meta: Mapping[str, Any]) -> Fusion:
        """The index's tuned method and weights, or equal-weight RRF when it was never tuned."""
        stored = meta.get("fusion") or {}
        weights = stored.get("weights")
        return cls.from_weights(weights, stored.get("method", "rrf")) if weights else cls()


def _min_max(ranking: Ranking) -> list[float]:
    """The list's scores mapped onto [0, 1] (all 1 when they are equal)."""
    scores = [score for _, score in ranking]
    low, high = min(scores, default=0.0), max(scores, default=0.0)
    return [(score - low) / (high - low) if high > low else 1.0 for score in scores]

"""A search's options, declared once.

:class:`SearchOptions` is the only place a search option is named, typed, bounded, defaulted and
explained. Every door derives from its fields (:data:`SEARCH_OPTION_SPECS`): the CLI's ``query``
flags, the HTTP request schema, the MCP ``search`` tool's arguments, and the keywords of
``Index.search``; :meth:`SearchOptions.of` checks what any of them was given. A new option is
one field here, with its :func:`described` metadata (and its use in the engine).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.search.fusion import Fusion, Method
from ragidx.indexer.storage.filters import Filters
from ragidx.indexer.wording import encodable, excerpt

Mode = Literal["hybrid", "dense", "lexical"]
MODES: tuple[str, ...] = typing.get_args(Mode)
MAX_K = 1000
MAX_SEARCH_BREADTH = 65_536  # efSearch / nprobe: beyond this a request is a denial of service, not tuning
MIN_CANDIDATES = 100  # per list before fusion: enough that fusion can promote a chunk from far down
# How an option is given on each door, beyond a plain value of its annotation.
COMPOSITE_KINDS = ("filters", "weights")
MAX_OPTION_TEXT = 4096  # a text option's characters (a model name or path)


def described(
    help: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    kind: str | None = None,
    flags: tuple[str, ...] = (),
    metavar: str | None = None,
) -> dict[str, Any]:
    """A :class:`SearchOptions` field's metadata: its help (every door shows it), bounds of a
    whole number, a composite ``kind`` (filters, weights), and the CLI's flags where not
    ``--name`` and the name of its value in their help where not its type's."""
    return {
        "help": help,
        "minimum": minimum,
        "maximum": maximum,
        "kind": kind,
        "flags": flags,
        "metavar": metavar,
    }


@dataclass(frozen=True)
class SearchOptions:
    """How to search: everything but the query text."""

    k: int = field(
        default=10, metadata=described("Number of results.", minimum=1, maximum=MAX_K, flags=("-k",))
    )
    mode: Mode = field(
        default="hybrid",
        metadata=described(
            "hybrid: vectors and BM25 fused; dense: vectors alone; lexical: SQLite FTS5 BM25 alone."
        ),
    )
    filters: Filters = field(
        default_factory=Filters,
        metadata=described(
            "Only documents whose path matches a glob, with an extension, or whose metadata KEY has VALUE.",
            kind="filters",
        ),
    )
    min_score: float | None = field(
        default=None, metadata=described("Drop hits scoring below this (on the mode's own scale).")
    )
    weights: Fusion | None = field(
        default=None,
        metadata=described(
            "Hybrid fusion weights, e.g. dense=0.3,lexical=0.7; a list left out weighs 0 "
            "(default: the index's tuned weights).",
            kind="weights",
            metavar="WEIGHTS",
        ),
    )
    fusion: Method | None = field(
        default=None,
        metadata=described(
            "Hybrid fusion method: rrf (reciprocal rank) or minmax (min-max normalised scores); "
            "default: the index's."
        ),
    )
    ef_search: int | None = field(
        default=None,
        metadata=described(
            "HNSW: candidate list size for this search.", minimum=1, maximum=MAX_SEARCH_BREADTH
        ),
    )
    nprobe: int | None = field(
        default=None,
        metadata=described("IVF: lists scanned for this search.", minimum=1, maximum=MAX_SEARCH_BREADTH),
    )
    explain: bool = field(
        default=False,
        metadata=described("With each hit, its rank and score in each list and the fused score."),
    )
    rerank: str | None = field(
        default=None,
        metadata=described(
            "Rerank the best candidates (k, at least 20) by how likely this decoder LLM finds the query "
            "as a question about each (smollm2, gemma3-270m, a GGUF file or model folder); the score is "
            "then that mean log-probability per query token. A forward pass per candidate: slower.",
            metavar="MODEL",
        ),
    )

    @classmethod
    def of(cls, options: SearchOptions | None = None, **given: Any) -> SearchOptions:
        """``options`` (default: the defaults) with the ``given`` keywords replaced, each checked
        against its declaration; one-line errors name the option."""
        unknown = sorted(set(given) - {spec.name for spec in SEARCH_OPTION_SPECS})
        if unknown:
            raise RagidxError(f"unknown search option {excerpt(unknown[0])}")
        merged = (
            {f.name: getattr(options, f.name) for f in dataclasses.fields(cls)} if options is not None else {}
        )
        merged.update(given)
        values = {
            spec.name: spec.checked(merged[spec.name]) for spec in SEARCH_OPTION_SPECS if spec.name in merged
        }
        weights = merged.get("weights")
        if isinstance(weights, Fusion) and merged.get("fusion") is None:  # a Fusion brings its method
            values["fusion"] = SEARCH_SPECS_BY_NAME["fusion"].checked(weights.method)
        chosen = cls(**values)
        if (chosen.weights is not None or chosen.fusion is not None) and chosen.mode != "hybrid":
            raise RagidxError(f"weights and fusion apply to hybrid search, not to {chosen.mode}")
        return chosen

    @property
    def candidates(self) -> int:
        """How deep each list is read: hybrid fusion needs more than ``k`` to promote from below."""
        return self.k if self.mode != "hybrid" else max(MIN_CANDIDATES, 2 * self.k)

    @property
    def breadth(self) -> dict[str, int | None]:
        """The vector index's search parameters for this search (None: the index's own)."""
        return {"ef_search": self.ef_search, "nprobe": self.nprobe}


def check_queries(queries: typing.Sequence[str]) -> None:
    """Refuse what no index can search, before any work."""
    if any(not isinstance(query, str) or not query.strip() for query in queries):
        raise RagidxError("the query is empty")
    if not all(encodable(query) for query in queries):
        raise RagidxError("the query is not valid Unicode text (it holds a lone surrogate)")


@dataclass(frozen=True)
class SearchOptionSpec:
    """One search option as the doors see it: name, help, default, and what values it takes."""

    name: str
    help: str
    default: Any
    kind: str  # int, float, bool, choice, text, or a composite kind (filters, weights)
    optional: bool  # None is a value (the index's own setting)
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    flags: tuple[str, ...] = ()
    metavar: str | None = None

    @property
    def cli_flags(self) -> tuple[str, ...]:
        return self.flags or ("--" + self.name.replace("_", "-"),)

    def checked(self, value: Any) -> Any:
        """``value`` as the option holds it, or a one-line error naming the option."""
        name = self.name
        if value is None:
            if not self.optional and self.kind not in COMPOSITE_KINDS:
                raise RagidxError(f"{name} needs a value")
            return Filters() if self.kind == "filters" else None
        if self.kind == "filters":
            return value if isinstance(value, Filters) else Filters.from_mapping(value)
        if self.kind == "weights":
            if isinstance(value, Fusion):
                return value
            if isinstance(value, str):
                return Fusion.parse(value)
            if isinstance(value, Mapping):
                return Fusion.from_weights(value)
            raise RagidxError('weights are {"dense": W, "lexical": W} or "dense=W,lexical=W"')
        if self.kind == "text":
            if not isinstance(value, str) or not value.strip() or len(value) > MAX_OPTION_TEXT:
                wanted = f"1 to {MAX_OPTION_TEXT} characters of text"
                raise RagidxError(f"{name} needs {wanted}, got {excerpt(value)}")
            return value
        if self.kind == "choice":
            if value not in self.choices:
                raise RagidxError(f"unknown {name} {excerpt(value)}: choose one of {', '.join(self.choices)}")
            return value
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise RagidxError(f"{name} is true or false, got {excerpt(value)}")
            return value
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise RagidxError(f"{name} needs a whole number, got {excerpt(value)}")
            if self.minimum is not None and value < self.minimum:
                raise RagidxError(f"{name} must be at least {self.minimum}, got {value}")
            if self.maximum is not None and value > self.maximum:
                raise RagidxError(f"{name} must be at most {self.maximum}, got {value}")
            return value
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise RagidxError(f"{name} needs a finite number, got {excerpt(value)}")
        return float(value)


def _spec(declared: dataclasses.Field[Any], annotation: Any) -> SearchOptionSpec:
    members = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else ()
    )
    optional = type(None) in members
    scalar = next((m for m in members if m is not type(None)), annotation) if members else annotation
    metadata = declared.metadata
    if metadata["kind"]:
        kind, choices = metadata["kind"], ()
    elif typing.get_origin(scalar) is Literal:
        kind, choices = "choice", tuple(typing.get_args(scalar))
    else:
        kind, choices = {bool: "bool", int: "int", float: "float", str: "text"}[scalar], ()
    default = None if declared.default is dataclasses.MISSING else declared.default
    return SearchOptionSpec(
        declared.name,
        metadata["help"],
        default,
        kind,
        optional,
        choices,
        metadata["minimum"],
        metadata["maximum"],
        metadata["flags"],
        metadata["metavar"],
    )


_HINTS = typing.get_type_hints(SearchOptions)  # once: each call evaluates every annotation
SEARCH_OPTION_SPECS: tuple[SearchOptionSpec, ...] = tuple(
    _spec(field, _HINTS[field.name]) for field in dataclasses.fields(SearchOptions)
)
SEARCH_SPECS_BY_NAME = {spec.name: spec for spec in SEARCH_OPTION_SPECS}

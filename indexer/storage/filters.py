"""Which documents a search may return: path globs, file extensions and metadata values.

Filters become one parameterised SQL condition over the ``documents`` table (alias ``d``); no
user text is ever spliced into SQL. Within a kind the values are alternatives (any path glob,
any extension, any value of one metadata key); the kinds, and different metadata keys, must all
hold.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.wording import excerpt

META_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$")
FILTER_KINDS = ("path", "ext", "meta")


def parse_meta(pairs: Sequence[str], given_as: str = "--meta") -> dict[str, list[str]]:
    """``KEY=VALUE`` metadata filters (``--meta``, a URL's ``meta=``: ``given_as`` names it in an
    error) as the filter takes them; a key given twice accepts either value."""
    meta: dict[str, list[str]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise RagidxError(f"{given_as} expects KEY=VALUE, got {excerpt(pair)}")
        meta.setdefault(key.strip(), []).append(value)
    return meta


FILTER_HELP = {  # each kind's values, as the CLI's --path, --ext and --meta take them
    "path": "Only documents whose path matches this glob (repeatable).",
    "ext": "Only documents with this extension, e.g. md (repeatable).",
    "meta": "Only documents whose metadata KEY has VALUE: KEY=VALUE (repeatable).",
}
MAX_FILTER_VALUES = 100  # per kind, metadata keys, and values per key
MAX_FILTER_CHARS = 1000  # per glob, extension or value (SQLite refuses GLOB patterns past 50,000)
# json_each yields a JSON scalar's SQL value; booleans and null are spelled as JSON spells them.
JSON_VALUE_AS_TEXT = (
    "case type when 'true' then 'true' when 'false' then 'false' when 'null' then 'null' "
    "else cast(value as text) end"
)


@dataclass(frozen=True)
class Filters:
    """Normalised filters; build them with :meth:`create` or :meth:`from_mapping`."""

    paths: tuple[str, ...] = ()
    exts: tuple[str, ...] = ()
    meta: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.paths or self.exts or self.meta)

    @classmethod
    def create(
        cls,
        paths: Iterable[str] = (),
        exts: Iterable[str] = (),
        meta: Mapping[str, Any] | None = None,
    ) -> Filters:
        """Validate and normalise: ``./`` dropped from globs, extensions without dot and lower-cased,
        metadata values as strings (a list means any of them)."""
        globs = tuple(dict.fromkeys(_glob(p) for p in _bounded("path", list(paths))))
        extensions = tuple(dict.fromkeys(_extension(e) for e in _bounded("ext", list(exts))))
        pairs = []
        for key, value in _bounded("meta", list((meta or {}).items())):
            if not isinstance(key, str) or len(key) > MAX_FILTER_CHARS or not META_KEY.match(key):
                raise RagidxError(f"metadata key {excerpt(key)} may use only letters, digits and _ . : -")
            values = _bounded(f"meta {key}", value if isinstance(value, list | tuple) else [value])
            if not values:
                raise RagidxError(f"metadata filter {key!r} has no value")
            pairs.append((key, tuple(dict.fromkeys(_meta_value(key, v) for v in values))))
        return cls(globs, extensions, tuple(sorted(pairs)))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> Filters:
        """``{"path": glob or [globs], "ext": ext or [exts], "meta": {key: value or [values]}}``."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise RagidxError("filters must be an object with the keys path, ext and meta")
        unknown = sorted(set(data) - set(FILTER_KINDS))
        if unknown:
            raise RagidxError(f"unknown filter {excerpt(unknown[0])}: use {', '.join(FILTER_KINDS)}")
        meta = data.get("meta") or {}
        if not isinstance(meta, Mapping):
            raise RagidxError('the "meta" filter must map keys to values')
        return cls.create(_strings("path", data.get("path")), _strings("ext", data.get("ext")), meta)

    def to_dict(self) -> dict[str, Any]:
        return {"path": list(self.paths), "ext": list(self.exts), "meta": dict(self.meta)}

    def document_condition(self) -> tuple[str, list[Any]]:
        """A SQL condition on ``documents d`` and its parameters ("1" when there are no filters).

        A relative glob matches at any folder boundary (``faq/*`` matches ``/srv/docs/faq/a.md``);
        SQLite's ``*`` also crosses ``/``, so ``faq/*`` includes sub-folders.
        """
        clauses: list[str] = []
        params: list[Any] = []
        if self.paths:
            alternatives = []
            for glob in self.paths:
                if glob.startswith("/"):
                    alternatives.append("d.path glob ?")
                    params.append(glob)
                else:
                    alternatives.append("(d.path glob ? or d.path glob ?)")
                    params.extend([glob, "*/" + glob])
            clauses.append("(" + " or ".join(alternatives) + ")")
        if self.exts:
            clauses.append("(" + " or ".join("lower(d.path) glob ?" for _ in self.exts) + ")")
            params.extend(f"*.{ext}" for ext in self.exts)
        for key, values in self.meta:
            marks = ",".join("?" for _ in values)
            clauses.append(
                f"exists (select 1 from json_each(d.metadata, ?) where {JSON_VALUE_AS_TEXT} in ({marks}))"
            )
            params.extend([f'$."{key}"', *values])
        return (" and ".join(clauses) or "1"), params


def _bounded(kind: str, values: Sequence[Any]) -> Sequence[Any]:
    """Refuse more alternatives than a search needs (SQLite refuses statements past its limits)."""
    if len(values) > MAX_FILTER_VALUES:
        raise RagidxError(
            f"the {kind} filter has {len(values)} values; at most {MAX_FILTER_VALUES} are allowed"
        )
    return values


def _strings(kind: str, value: Any) -> list[str]:
    if value is None:
        return []
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise RagidxError(f'the "{kind}" filter must be a string or a list of strings')
    return values


def _short(kind: str, value: str) -> str:
    if len(value) > MAX_FILTER_CHARS:
        raise RagidxError(
            f"a {kind} filter value is {len(value):,} characters long; at most {MAX_FILTER_CHARS} are allowed"
        )
    return value


def _glob(pattern: str) -> str:
    glob = _short("path", pattern).strip().removeprefix("./")
    if not glob:
        raise RagidxError("--path needs a glob such as 'faq/*' or '*.md'")
    return glob


def _extension(ext: str) -> str:
    normalised = _short("ext", ext).strip().lower().lstrip(".")
    if not normalised or any(c in normalised for c in "/*?["):
        raise RagidxError(f"--ext expects an extension such as md, got {excerpt(ext)}")
    return normalised


def _meta_value(key: str, value: Any) -> str:
    if isinstance(value, str):
        return _short("meta", value)
    if isinstance(value, bool | int | float) or value is None:
        return json.dumps(value)
    raise RagidxError(f"metadata filter {key!r} compares strings, numbers or booleans")

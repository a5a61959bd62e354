"""The vector stores an index can use, by the kind its settings record: the one factory (see
:mod:`.vector_store` for the interface a store implements; a new store is one entry here)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.storage.vector_store import StoreKind, StoreSpec

# kind -> the spec class (module:name), imported on use: naming the stores (the CLI's --store
# choices) loads none of them.
STORE_KINDS = {
    "local": "ragidx.indexer.storage.local.store:LocalSegments",
    "milvus": "ragidx.indexer.storage.milvus.store:MilvusLocation",
}
STORES = tuple(STORE_KINDS)
DEFAULT_STORE = "local"


def store_kind(kind: str) -> StoreKind:
    try:
        module, name = STORE_KINDS[kind].split(":")
    except KeyError:
        raise RagidxError(f"unknown store {kind!r}: choose one of {', '.join(STORES)}") from None
    return cast(StoreKind, getattr(importlib.import_module(module), name))


def store_from_meta(meta: Mapping[str, Any]) -> StoreSpec:
    """The store an index's settings name (indexes written before stores existed are local)."""
    stored = meta.get("store") or {"kind": DEFAULT_STORE}
    return store_kind(stored["kind"]).from_meta(stored)


def resolve_store(
    kind: str | None, options: Mapping[str, Any], previous: StoreSpec | None, index_dir: Path
) -> StoreSpec:
    """The store a build writes to: ``kind`` if given, else the kind whose options were given,
    else the index's own. Options that configure another kind are refused."""
    given = {name: value for name, value in options.items() if value is not None}
    kinds = [store_kind(name) for name in STORES]
    owner = next((k for k in kinds if given and set(given) <= k.option_names), None)
    chosen = store_kind(kind) if kind else owner or store_kind(previous.kind if previous else DEFAULT_STORE)
    if given and owner is not chosen:
        flags = " and ".join("--" + name.replace("_", "-") for name in sorted(given))
        needed = f"--store {owner.kind}" if owner else "one store"
        raise RagidxError(f"{flags} {'needs' if len(given) == 1 else 'need'} {needed}")
    return chosen.resolve(
        given, previous if previous is not None and previous.kind == chosen.kind else None, index_dir
    )

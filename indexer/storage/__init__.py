"""The index on disk: SQLite rows and lexical tables (:mod:`.database`, :mod:`.lexical`), read and
written a generation at a time (:mod:`.reader`, :mod:`.writer`), and the vectors in one of the
stores behind :mod:`.vector_store`'s interface (local segments, Milvus; :mod:`.stores`)."""

from ragidx.indexer.storage.database import (
    DB_NAME,
    DocumentRecord,
    default_index_dir,
    index_exists,
    no_index,
)
from ragidx.indexer.storage.reader import IndexReader
from ragidx.indexer.storage.stores import STORES, resolve_store, store_from_meta
from ragidx.indexer.storage.vector_store import LoadedVectors, StoreSpec
from ragidx.indexer.storage.writer import Committed, IndexWriter, NextGeneration

__all__ = [
    "DB_NAME",
    "STORES",
    "Committed",
    "DocumentRecord",
    "IndexReader",
    "IndexWriter",
    "LoadedVectors",
    "NextGeneration",
    "StoreSpec",
    "default_index_dir",
    "index_exists",
    "no_index",
    "resolve_store",
    "store_from_meta",
]

"""ragidx's rows in one Milvus collection, through pymilvus: connect, create, verify, upsert,
delete, search, scan (the store built on it is :mod:`.store`). The collection holds one row
per chunk: ``chunk_id`` (primary key), ``vector``, ``path``, ``text`` and ``metadata``, so other
tools can read it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.faults import checkpoint
from ragidx.indexer.storage.index_settings import VectorIndexSettings, default_nlist

if TYPE_CHECKING:
    from pymilvus import MilvusClient

CONNECT_SECONDS = 10.0
MAX_TOP_K = 16_384  # Milvus' largest limit per search
SCAN_BATCH = 4096
UPSERT_BATCH = 1024
FIELDS = {
    "chunk_id": "INT64",
    "vector": "FLOAT_VECTOR",
    "path": "VARCHAR",
    "text": "VARCHAR",
    "metadata": "JSON",
}
INDEX_TYPES = {"flat": "FLAT", "hnsw": "HNSW", "ivf": "IVF_FLAT", "auto": "AUTOINDEX"}


class Address(Protocol):
    """Where a collection is (a :class:`~ragidx.indexer.storage.milvus.store.Address`, whose
    module builds its store on this one: it is not imported here)."""

    @property
    def uri(self) -> str: ...

    @property
    def collection(self) -> str: ...

    @property
    def index_id(self) -> str: ...

    @property
    def where(self) -> str: ...


_LITE_USERS: dict[str, int] = {}  # milvus-lite file -> open collections of this process


def connect(uri: str) -> MilvusClient:
    """A client for ``uri``; one clear error when pymilvus is missing or the server does not answer."""
    try:
        from pymilvus import MilvusClient
        from pymilvus.exceptions import MilvusException
    except ImportError as error:
        raise RagidxError(
            "--store milvus needs pymilvus (and milvus-lite for a local file): pip install 'ragidx[milvus]'"
        ) from error
    # pymilvus and milvus-lite log failures with their tracebacks; ragidx says them in one line itself.
    for name in ("pymilvus", "milvus_lite"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    if "://" not in uri and importlib.util.find_spec("milvus_lite") is None:
        raise RagidxError(
            f"the Milvus file {uri} needs milvus-lite: pip install 'ragidx[milvus]' "
            "(or give --milvus-uri http://HOST:19530 for a Milvus server)"
        )
    try:
        return MilvusClient(uri=uri, timeout=CONNECT_SECONDS)
    except MilvusException as error:
        if "://" not in uri:
            raise RagidxError(
                f"cannot open the milvus-lite file {uri} ({error.message}): milvus-lite serves one "
                "process at a time, so another build, query or server may have it open"
            ) from error
        raise RagidxError(f"cannot reach Milvus at {uri}: {error.message}") from error


@contextlib.contextmanager
def milvus_errors(location: Address) -> Iterator[None]:
    """Milvus' exceptions as one-line errors naming the collection."""
    from pymilvus.exceptions import MilvusException

    try:
        yield
    except MilvusException as error:
        raise RagidxError(f"Milvus {location.where}: {error.message}") from error


class MilvusCollection:
    """ragidx's rows in one Milvus collection."""

    def __init__(self, location: Address):
        self.location = location
        self.client = connect(location.uri)
        self.name = location.collection
        self._lite = "://" not in location.uri
        if self._lite:
            _LITE_USERS[location.uri] = _LITE_USERS.get(location.uri, 0) + 1

    def close(self) -> None:
        """Disconnect; the last collection of this process on a milvus-lite file stops its
        in-process server, whose lock would otherwise keep every other process out until exit."""
        with contextlib.suppress(Exception):
            self.client.close()
        if self._lite:
            self._lite = False
            _LITE_USERS[self.location.uri] -= 1
            if not _LITE_USERS[self.location.uri]:
                from milvus_lite.server_manager import server_manager_instance

                server_manager_instance.release_server(self.location.uri)

    def exists(self) -> bool:
        with milvus_errors(self.location):
            return bool(self.client.has_collection(self.name))

    def verify(self, dimension: int) -> None:
        """Refuse a collection ragidx did not create for this index, or of another dimension."""
        where = self.location.where
        if not self.exists():
            raise RagidxError(f"{where} is gone: rebuild the index (ragidx build PATH --rebuild)")
        with milvus_errors(self.location):
            described = self.client.describe_collection(self.name)
        fields = {f["name"]: (f["type"].name, f.get("params", {})) for f in described["fields"]}
        if {name: kind for name, (kind, _) in fields.items()} != FIELDS:
            raise RagidxError(f"{where} was not created by ragidx (fields: {', '.join(fields)})")
        owner = described.get("properties", {}).get("ragidx.index_id")
        if owner != self.location.index_id:
            raise RagidxError(f"{where} belongs to another index; give this one its own --milvus-collection")
        found = int(fields["vector"][1].get("dim", 0))
        if dimension and found != dimension:
            raise RagidxError(
                f"{where} holds {found}-d vectors, this index {dimension}-d: "
                "give the rebuilt index another --milvus-collection"
            )

        with milvus_errors(self.location):
            self.client.load_collection(self.name)  # a fresh connection finds it released

    def refuse_taken(self) -> None:
        """Refuse a collection that exists already: it may be another index's or tool's."""
        if self.exists():
            raise RagidxError(
                f"{self.location.where} already exists (another index's or tool's): "
                "give --milvus-collection another name, or drop it"
            )

    def create(self, dimension: int, model: str, settings: VectorIndexSettings) -> None:
        """A new collection for this index (an existing one is refused: it may be another tool's)."""
        from pymilvus import DataType, MilvusClient

        self.refuse_taken()
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("chunk_id", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dimension)
        schema.add_field("path", DataType.VARCHAR, max_length=65_535)
        schema.add_field("text", DataType.VARCHAR, max_length=65_535)
        schema.add_field("metadata", DataType.JSON)
        with milvus_errors(self.location):
            self.client.create_collection(self.name, schema=schema, index_params=self._index_params(settings))
            self.client.alter_collection_properties(
                self.name, properties={"ragidx.index_id": self.location.index_id, "ragidx.model": model}
            )
            self.client.load_collection(self.name)

    def drop(self) -> None:
        with milvus_errors(self.location):
            if self.exists():
                self.client.drop_collection(self.name)

    def reindex(self, settings: VectorIndexSettings) -> None:
        """Build the vector index anew with ``settings`` (the stored vectors stay)."""
        with milvus_errors(self.location):
            self.client.release_collection(self.name)
            self.client.drop_index(self.name, "vector")
            self.client.create_index(self.name, self._index_params(settings))
            self.client.load_collection(self.name)

    def _index_params(self, settings: VectorIndexSettings) -> Any:
        params: dict[str, Any] = {}
        if settings.requested == "hnsw":
            params = {"M": settings.hnsw_m, "efConstruction": settings.ef_construction}
        elif settings.requested == "ivf":
            params = {
                "nlist": settings.nlist or default_nlist(MAX_TOP_K)
            }  # 128: sized for a large collection
        index_params = self.client.prepare_index_params()
        index_params.add_index(
            field_name="vector", index_type=INDEX_TYPES[settings.requested], metric_type="IP", params=params
        )
        return index_params

    def upsert(self, ids: np.ndarray, vectors: np.ndarray, rows: dict[int, tuple[str, str, str]]) -> None:
        """Write ``vectors`` under ``ids`` with each chunk's (path, text, metadata JSON)."""
        for start in range(0, len(ids), UPSERT_BATCH):
            batch = [
                {
                    "chunk_id": int(chunk_id),
                    "vector": vector.tolist(),
                    "path": rows[int(chunk_id)][0],
                    "text": rows[int(chunk_id)][1],
                    "metadata": json.loads(rows[int(chunk_id)][2] or "{}"),
                }
                for chunk_id, vector in zip(
                    ids[start : start + UPSERT_BATCH], vectors[start : start + UPSERT_BATCH], strict=True
                )
            ]
            with milvus_errors(self.location):
                self.client.upsert(self.name, batch)
            checkpoint("milvus-upsert")

    def delete(self, expression: str) -> None:
        with milvus_errors(self.location):
            self.client.delete(self.name, filter=expression)

    def search(
        self, queries: np.ndarray, limit: int, expression: str, search_params: dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Inner-product scores and chunk ids, best first, -1 padding rows with fewer hits."""
        limit = min(limit, MAX_TOP_K)
        with milvus_errors(self.location):
            found = self.client.search(
                self.name,
                data=[q.tolist() for q in np.asarray(queries, dtype=np.float32)],
                limit=limit,
                filter=expression,
                output_fields=["chunk_id"],
                search_params={"metric_type": "IP", "params": search_params},
            )
        scores = np.full((len(queries), limit), -np.inf, dtype=np.float32)
        ids = np.full((len(queries), limit), -1, dtype=np.int64)
        for row, hits in enumerate(found):
            for column, hit in enumerate(hits):
                scores[row, column], ids[row, column] = hit["distance"], hit["chunk_id"]
        return scores, ids

    def scan(self, expression: str) -> tuple[np.ndarray, np.ndarray]:
        """Every matching row's id (ascending) and vector: for ``check``."""
        ids: list[int] = []
        vectors: list[list[float]] = []
        with milvus_errors(self.location):
            iterator = self.client.query_iterator(
                self.name, batch_size=SCAN_BATCH, filter=expression, output_fields=["chunk_id", "vector"]
            )
            while batch := iterator.next():
                ids.extend(row["chunk_id"] for row in batch)
                vectors.extend(row["vector"] for row in batch)
            iterator.close()
        order = np.argsort(np.array(ids, dtype=np.int64), kind="stable")
        return np.array(ids, dtype=np.int64)[order], np.array(vectors, dtype=np.float32)[order]
